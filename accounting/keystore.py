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
difference. Across processes too: every key issued for a release records it in the file
(``issued-for``; loaded with :meth:`KeyStore.load`, it drives no transform) and is bound durably
to that release and its input digest -- :meth:`KeyStore.issue`'s by its issue record
(:meth:`KeyStore.use` gives it back for that release and input only), the ledger's by a use
record beside the key (:meth:`KeyStore.bind_use`) -- so a second process asking for it for
anything else is refused (:mod:`accounting.keys`, "One secret, one use"). Every reference the
ledger holds is resolved inside the store under the key's own name (:meth:`KeyStore.resolve`).

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

import datetime as _dt
import json
import os
import re
from dataclasses import dataclass
from typing import Optional

from accounting import durable, gcs
from accounting.keys import KeyReuseError, ReleaseKey

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


class KeyOutsideStore(ValueError):
    """A reference names a key outside the key store, or under another name than its own."""


#: The name prefix of a ledger-issued key's use record (the one release and input it drives,
#: across processes); a key of :meth:`KeyStore.issue` has its issue record instead.
USE_PREFIX = "ledger-use-"
USE_FORMAT = "beam-dp-release/key-use/v1"


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

    def issue(self, name: str, *, input_digest: Optional[str] = None) -> tuple[ReleaseKey, KeyRef]:
        """A fresh secret key for the one release ``name`` (e.g. ``"pageviews/2024-05-01"``),
        stored before it is returned, with its public reference (keep it with the release).

        One key per release name: a name that was issued before is refused (FileExistsError),
        so a scheduled job re-run for the same day cannot silently draw a second key (a second
        release of that day) nor take the first day's key for other data. Names are reduced to
        ``[A-Za-z0-9._-]`` for the file name; names that reduce alike count as one.

        The key is bound to ``name`` and ``input_digest`` (e.g. a SHA-256 of the release's
        input) durably, by the name's issue record in the store: another process gets it back only through
        :meth:`use` for the same release and input; loaded with :meth:`load` it drives nothing.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a release name is a non-empty string, got {name!r}")
        _check_digest(input_digest)
        key = ReleaseKey.generate()
        marker = self._uri(name, "issued", suffix="")
        body = _use_body(key.fingerprint(), release=name, input_digest=input_digest)
        try:
            durable.write(marker, body, generation=0, mode=0o600)
        except durable.GenerationMismatch:
            raise FileExistsError(f"a key was already issued for release {name!r} ({marker})") \
                from None
        try:
            ref = self.save(key, name, issued_for=name)
        except BaseException:
            self._remove(marker)
            raise
        return key.bound(f"issued:{name}@{input_digest}", issued_for=name), ref

    def use(self, ref: KeyRef, *, release: str, input_digest: Optional[str] = None) -> ReleaseKey:
        """The key :meth:`issue` made for ``release``, to drive it on the input of
        ``input_digest`` in this process (a re-run, or another process finishing it). Refused
        (:class:`KeyReuseError`) for another release, or for another input than the one it was
        issued for."""
        key = self.load(ref)
        marker = self._uri(release, "issued", suffix="")
        data, _ = durable.read(marker)
        recorded = _use_record(data)
        if key.issued_for != release or not recorded or \
                recorded.get("fingerprint") != ref.fingerprint:
            raise KeyReuseError(f"the key {ref.uri} was not issued for release {release!r} "
                                f"(its issue record {marker}): one key, one release")
        if recorded.get("input_digest") not in (None, input_digest):
            raise KeyReuseError(
                f"the key {ref.uri} was issued for release {release!r} on input "
                f"{recorded['input_digest']} (its issue record {marker}); it cannot drive input "
                f"{input_digest}: one key, one use, in every process")
        return key.bound(f"issued:{release}@{recorded.get('input_digest')}", issued_for=release)

    def bind_use(self, key: ReleaseKey, ref: KeyRef, *, release: str, input_digest: str,
                 binding: str) -> ReleaseKey:
        """THE BUDGET LEDGER ONLY: ``key`` bound to ``release`` and ``input_digest`` (and the
        ledger's ``binding``: ledger, release version, key name) in this process, after the
        key's use record in the store says so: the first use writes it (an exclusive create),
        every later one -- in any process -- must match it. KeyReuseError names the record
        when it does not."""
        if key.issued_for is not None and key.issued_for != release:
            raise KeyReuseError(f"the key {ref.uri} was issued for release {key.issued_for!r}, "
                                f"not {release!r}: one key, one release")
        uri = self.use_record_uri(ref)
        wanted = {"release": release, "input_digest": input_digest, "binding": binding}
        for _ in range(3):
            data, _ = durable.read(uri)
            if data is None:
                try:
                    durable.write(uri, _use_body(ref.fingerprint, **wanted), generation=0,
                                  mode=0o600)
                except durable.GenerationMismatch:
                    continue  # another process recorded its use first: compare with it
                return key.bound(f"{binding}@{input_digest}", issued_for=release)
            recorded = _use_record(data)
            if recorded is None:  # empty or cut: this toolkit's own interrupted write
                self._remove(uri)
                continue
            if {k: recorded.get(k) for k in wanted} != wanted:
                raise KeyReuseError(
                    f"the key {ref.uri} drives release {recorded.get('release')!r} on input "
                    f"{recorded.get('input_digest')} (its use record {uri}); it cannot drive "
                    f"{release!r} on input {input_digest}: one key, one use, in every process")
            return key.bound(f"{binding}@{input_digest}", issued_for=release)
        raise KeyReuseError(f"the use of key {ref.uri} could not be recorded ({uri} keeps "
                            "changing): refusing to use it")

    def use_record_uri(self, ref: KeyRef) -> str:
        """Where the use record of a key the ledger issued lives (beside it, named ``ledger-``
        like the ledger's other files in the store)."""
        name, fingerprint = self._split(ref)
        return self._uri(f"{USE_PREFIX}{name}", fingerprint, suffix=".json")

    def _split(self, ref: KeyRef) -> tuple[str, str]:
        """(safe name, fingerprint) of a reference inside this store (KeyOutsideStore if not)."""
        filename = ref.uri.rsplit("/", 1)[-1]
        suffix = f".{ref.fingerprint}.key"
        if not filename.endswith(suffix) or ref.uri != self._uri(filename[:-len(suffix)],
                                                                  ref.fingerprint):
            raise KeyOutsideStore(f"{ref.uri} is not a key of the key store {self.root}")
        return filename[:-len(suffix)], ref.fingerprint

    def resolve(self, ref: KeyRef, name: str) -> KeyRef:
        """``ref`` if it names the key of ``name`` with its fingerprint inside this store (the
        only place a ledger's keys are looked up), else KeyOutsideStore naming both: a reference
        to another path or ``gs://`` URI is never followed."""
        if not isinstance(ref.fingerprint, str) or not re.fullmatch(r"[0-9a-f]{16}",
                                                                    ref.fingerprint):
            raise KeyOutsideStore(f"the key reference {ref.uri} has no valid fingerprint")
        expected = self._uri(name, ref.fingerprint)
        if ref.uri != expected:
            raise KeyOutsideStore(f"it names the key {ref.uri}, but the key store {self.root} "
                                  f"keeps that key at {expected}: a key outside the key store "
                                  "(or under another name) is never used")
        return ref

    # ----------------------------------------------------------------- control records
    def record_uri(self, name: str) -> str:
        """Where a control record (e.g. a ledger's witness) of ``name`` lives in the store."""
        return self._uri(name, "record", suffix=".json")

    def read_record(self, name: str) -> tuple[Optional[bytes], int]:
        """``(bytes or None, generation)`` of a control record (generation 0: none yet)."""
        return durable.read(self.record_uri(name))

    def write_record(self, name: str, data: bytes, *, generation: Optional[int]) -> int:
        """Write a control record atomically (``generation``: the one read, on gs://; locally
        the caller holds the lock of what it records). Raises durable.GenerationMismatch."""
        if not gcs.is_gcs(self.root):
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            if generation:  # a local file has no generations: it is replaced whole
                generation = None
        return durable.write(self.record_uri(name), data, generation=generation, mode=0o600)

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



def _check_digest(input_digest) -> None:
    if input_digest is not None and (not isinstance(input_digest, str) or not input_digest):
        raise ValueError(f"input_digest is a non-empty string, got {input_digest!r}")


def _use_body(fingerprint: str, **fields) -> bytes:
    return json.dumps({"format": USE_FORMAT, "fingerprint": fingerprint, **fields,
                       "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
                      sort_keys=True).encode("utf-8") + b"\n"


def _use_record(data: Optional[bytes]) -> Optional[dict]:
    """A use or issue record's content, or None for none -- or for an empty or cut one (the
    toolkit's own interrupted write: a cut JSON object binds nothing). An issue record of an
    older version holds the fingerprint alone."""
    if not data:
        return None
    try:
        text = data.decode("utf-8")
        if re.fullmatch(r"[0-9a-f]{16}\n?", text):
            return {"fingerprint": text.strip(), "input_digest": None}
        record = json.loads(text)
    except (UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == USE_FORMAT else {}
