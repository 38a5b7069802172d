"""Where release keys live: a local directory of 0600 files or a ``gs://`` prefix.

A :class:`~transforms.noise.ReleaseKey` determines every random choice of a release, so whoever
holds it can subtract the noise. The budget ledger therefore never holds a key, only a
:class:`KeyRef`: the key's location and its public fingerprint (checked on load, so a swapped or
corrupted key file is caught before it is used). Keys are written once and never overwritten
(``O_EXCL`` locally, ``if_generation_match=0`` on GCS). Testing keys are refused.

Access control of a ``gs://`` key prefix is the bucket's IAM policy: keep it apart from outputs.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

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

    def _uri(self, name: str, fingerprint: str) -> str:
        filename = f"{_SAFE.sub('_', name).strip('_') or 'release'}.{fingerprint}.key"
        if gcs.is_gcs(self.root):
            return f"{self.root}/{filename}"
        return os.path.join(self.root, filename)

    def save(self, key: ReleaseKey, name: str) -> KeyRef:
        """Store ``key`` under a file named after ``name`` and its fingerprint; never overwrites."""
        if not isinstance(key, ReleaseKey):
            raise TypeError(f"expected a ReleaseKey, got {type(key).__name__}")
        if key.is_testing:
            raise ValueError("refusing to store a testing key (ReleaseKey.for_testing) as a release secret")
        fingerprint = key.fingerprint()
        uri = self._uri(name, fingerprint)
        if gcs.is_gcs(uri):
            from google.api_core import exceptions

            try:
                gcs.blob(uri).upload_from_string(key.secret_bytes().hex() + "\n",
                                                 content_type="text/plain", if_generation_match=0)
            except exceptions.PreconditionFailed:
                raise FileExistsError(f"a key is already stored at {uri}")
        else:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            key.save(uri)  # O_CREAT | O_EXCL, mode 0600
        return KeyRef(uri=uri, fingerprint=fingerprint)

    def load(self, ref: KeyRef) -> ReleaseKey:
        """The key behind ``ref``; raises ValueError if its fingerprint does not match."""
        if gcs.is_gcs(ref.uri):
            text = gcs.blob(ref.uri).download_as_bytes().decode("ascii").strip()
            try:
                key = ReleaseKey(bytes.fromhex(text))
            except ValueError:
                raise ValueError(f"{ref.uri} does not hold a hex release key")
        else:
            key = ReleaseKey.load(ref.uri)
        if key.fingerprint() != ref.fingerprint:
            raise ValueError(f"the key stored at {ref.uri} has fingerprint {key.fingerprint()}, "
                             f"the ledger expects {ref.fingerprint}: refusing to use it")
        return key

    def delete(self, ref: KeyRef) -> None:
        """Remove a key that no ledger record references (used when a reservation is refused)."""
        if gcs.is_gcs(ref.uri):
            from google.api_core import exceptions

            try:
                gcs.blob(ref.uri).delete()
            except exceptions.NotFound:
                pass
        else:
            try:
                os.remove(ref.uri)
            except FileNotFoundError:
                pass
