"""Where release keys live: a local directory of 0600 files or a ``gs://`` prefix.

A :class:`~transforms.noise.ReleaseKey` determines every random choice of a release, so whoever
holds it can subtract the noise. The budget ledger therefore never holds a key, only a
:class:`KeyRef`: the key's location and its public fingerprint (checked on load, so a swapped or
corrupted key file is caught before it is used). Keys are written once and never overwritten
(``O_EXCL`` locally, ``if_generation_match=0`` on GCS). Testing keys are refused.

A library user who runs releases without the ledger (e.g. a daily release) takes a fresh key per
release from :meth:`KeyStore.issue`: one key per release name, ever, stored before it is used (the
operator can check or reproduce the release later; a second ``issue`` of the name is refused).
A key drives one release: the same secret applied to another day's data is refused in-process
(:class:`~accounting.keys.KeyReuseError`), because the two days' noise would cancel in their
difference. Keys the ledger issues record their release id in the file (``issued-for``): loaded
by anything but the ledger, such a key drives no transform (:mod:`accounting.keys`, "One secret,
one use").

Example (a daily release by a library user, one fresh key per day; tests/accounting/test_keys.py runs it as
written)::

    import apache_beam as beam
    import pyarrow as pa

    from accounting.budget import PrivacyBudget
    from accounting.keys import KeyReuseError
    from accounting.keystore import KeyStore
    from accounting.sensitivity import ContributionBounds
    from transforms.aggregate import Compute, DPAggregate, Keys
    from transforms.keyset import PublicKeyset
    from transforms.metrics import Count

    store = KeyStore("release-keys")  # the operator's secrets (0600 files), apart from outputs

    def release(day, rows, key):
        with beam.Pipeline() as p:
            (p | beam.Create([pa.Table.from_pylist(rows)])
               | DPAggregate(compute=Compute(metrics=[Count()]),
                             keys=Keys(privacy_unit="user", columns=["country"],
                                       keyset=PublicKeyset.from_keys(["DE", "FR"], ["country"])),
                             bounds=ContributionBounds(max_partitions=1,
                                                       max_contributions_per_partition=1),
                             budget=PrivacyBudget(epsilon=1.0), release_key=key)
               | beam.Map(lambda table: print(day, "released", table.num_rows, "rows")))

    days = {"2024-05-01": [{"user": 1, "country": "DE"}, {"user": 2, "country": "FR"}],
            "2024-05-02": [{"user": 1, "country": "DE"}, {"user": 3, "country": "DE"}]}
    keys = {}
    for day, rows in days.items():
        keys[day], ref = store.issue(f"pageviews/{day}")  # fresh, stored before it is used
        release(day, rows, keys[day])

    try:  # the same day again: one key per release name
        store.issue("pageviews/2024-05-01")
    except FileExistsError as err:
        print("refused:", str(err).split(" (")[0])
    try:  # day 1's key on other data: the noise would cancel in the difference
        release("2024-05-03", days["2024-05-02"], keys["2024-05-01"])
    except KeyReuseError:
        print("refused: KeyReuseError")

Through the ledger instead (what every job of this project does): ``BudgetLedger(ledger_path,
key_store_root).reserve(ReleaseRequest(release_id=..., measures=..., input_digest=...))``
charges the release and returns its fresh key (``reservation.key``); a re-run on the same input
gets the same key back and reproduces the release, a corrected input of an unpublished release
gets a fresh one.

Access control of a ``gs://`` key prefix is the bucket's IAM policy: keep it apart from outputs.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from accounting import gcs
from accounting.keys import ReleaseKey

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, kw_only=True)
class KeyRef:
    """A public reference to a stored release key (safe to log and to record)."""

    uri: str
    fingerprint: str

    def to_json(self) -> dict:
        return {"uri": self.uri, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, data: dict) -> "KeyRef":
        return cls(uri=data["uri"], fingerprint=data["fingerprint"])


class KeyStore:
    """Saves and loads release keys under ``root`` (a local directory or ``gs://bucket/prefix``)."""

    def __init__(self, root: str):
        if not isinstance(root, str) or not root:
            raise ValueError(f"key store root must be a non-empty path or gs:// URI, got {root!r}")
        self.root = root.rstrip("/") if gcs.is_gcs(root) else os.path.abspath(root)
        if gcs.is_gcs(self.root):
            gcs.split_gcs_uri(self.root + "/")  # validates the bucket part

    def _uri(self, name: str, fingerprint: str, suffix: str = ".key") -> str:
        filename = f"{_SAFE.sub('_', name).strip('_') or 'release'}.{fingerprint}{suffix}"
        if gcs.is_gcs(self.root):
            return f"{self.root}/{filename}"
        return os.path.join(self.root, filename)

    def save(self, key: ReleaseKey, name: str, *, issued_for: Optional[str] = None) -> KeyRef:
        """Store ``key`` under a file named after ``name`` and its fingerprint; never overwrites.
        ``issued_for``: the budget ledger's release id (recorded in the file: loaded by anything
        but the ledger, the key drives no transform)."""
        if not isinstance(key, ReleaseKey):
            raise TypeError(f"expected a ReleaseKey, got {type(key).__name__}")
        if key.is_testing:
            raise ValueError("refusing to store a testing key (ReleaseKey.for_testing) as a release secret")
        fingerprint = key.fingerprint()
        uri = self._uri(name, fingerprint)
        if gcs.is_gcs(uri):
            from google.api_core import exceptions

            try:
                gcs.blob(uri).upload_from_string(key.to_text(issued_for),
                                                 content_type="text/plain", if_generation_match=0)
            except exceptions.PreconditionFailed:
                raise FileExistsError(f"a key is already stored at {uri}")
        else:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            key.save(uri, issued_for)  # O_CREAT | O_EXCL, mode 0600
        return KeyRef(uri=uri, fingerprint=fingerprint)

    def issue(self, name: str) -> tuple[ReleaseKey, KeyRef]:
        """A fresh secret key for the one release ``name`` (e.g. ``"pageviews/2024-05-01"``),
        stored before it is returned, with its public reference (keep it with the release).

        One key per release name: a name that was issued before is refused (FileExistsError),
        so a scheduled job re-run for the same day cannot silently draw a second key (a second
        release of that day) nor take the first day's key for other data. Names are reduced to
        ``[A-Za-z0-9._-]`` for the file name; names that reduce alike count as one.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a release name is a non-empty string, got {name!r}")
        key = ReleaseKey.generate()
        marker = self._uri(name, "issued", suffix="")
        text = key.fingerprint() + "\n"
        if gcs.is_gcs(marker):
            from google.api_core import exceptions

            try:
                gcs.blob(marker).upload_from_string(text, content_type="text/plain",
                                                    if_generation_match=0)
            except exceptions.PreconditionFailed:
                raise FileExistsError(f"a key was already issued for release {name!r} ({marker})")
        else:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            try:
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                raise FileExistsError(f"a key was already issued for release {name!r} ({marker})")
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        try:
            ref = self.save(key, name)
        except BaseException:
            self._remove(marker)
            raise
        return key, ref

    def load(self, ref: KeyRef) -> ReleaseKey:
        """The key behind ``ref``; raises ValueError if its fingerprint does not match."""
        if gcs.is_gcs(ref.uri):
            try:
                text = gcs.blob(ref.uri).download_as_bytes().decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{ref.uri} does not hold a hex release key")
            key = ReleaseKey.from_text(text, ref.uri)
        else:
            key = ReleaseKey.load(ref.uri)
        if key.fingerprint() != ref.fingerprint:
            raise ValueError(f"the key stored at {ref.uri} has fingerprint {key.fingerprint()}, "
                             f"the ledger expects {ref.fingerprint}: refusing to use it")
        return key

    def named(self, name: str) -> list[str]:
        """The URIs of the keys saved under ``name`` (any fingerprint), sorted; empty when the
        store does not exist yet. Raises OSError when the store cannot be listed."""
        safe = _SAFE.sub("_", name).strip("_") or "release"
        pattern = re.compile(re.escape(safe) + r"\.[0-9a-f]{16}\.key$")
        if gcs.is_gcs(self.root):
            found = gcs.list_objects(f"{self.root}/{safe}.")
            return sorted(u for u in found if pattern.match(u.rsplit("/", 1)[-1]))
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(os.path.join(self.root, n) for n in names if pattern.match(n))

    def delete(self, ref: KeyRef) -> None:
        """Remove a key that no ledger record references (used when a reservation is refused)."""
        self._remove(ref.uri)

    @staticmethod
    def _remove(uri: str) -> None:
        if gcs.is_gcs(uri):
            from google.api_core import exceptions

            try:
                gcs.blob(uri).delete()
            except exceptions.NotFound:
                pass
        else:
            try:
                os.remove(uri)
            except FileNotFoundError:
                pass
