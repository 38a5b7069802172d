"""Where a budget ledger lives: a local JSON file or one ``gs://`` object, updated transactionally.

Both stores offer ``transact(update, written=None)``: read the current bytes (None if the ledger
does not exist yet), let ``update`` decide ``(result, new bytes or None)``, and write the new
bytes only if nobody else wrote in between; then ``written(generation)`` runs inside the same
transaction (the ledger's witness, :mod:`~accounting.ledger.witness`; ``generation``: the new
object generation on ``gs://``, None locally).

* Local: the read-check-write runs under an exclusive ``fcntl.flock`` on ``<ledger>.lock``, and
  the new ledger replaces the old atomically (:mod:`accounting.durable`: temporary file, fsync,
  ``os.replace``, fsync of the directory). The path is resolved (symbolic links followed) first: replacing a link would turn
  it into a regular file and fork the ledger into two that each show part of the spend.
* GCS: the object is read with its generation and written with ``if_generation_match``; a 412
  (another writer won) re-reads and re-runs ``update``, so two concurrent releases can never both
  spend the last share. (GCS allows about one write per second to one object; the client retries
  429s, so heavy contention only slows the ledger down.)
"""
from __future__ import annotations

import fcntl
import os
import random
import time

from accounting import durable, gcs


class LedgerConflict(RuntimeError):
    """Another writer changed the ledger object (a generation precondition failed)."""


class LedgerStoreError(RuntimeError):
    """The store gave up (too many conflicting writers)."""


class LocalStore:
    """Read-modify-write of a local JSON file under an exclusive flock, replaced atomically."""

    def __init__(self, path: str):
        self.path = os.path.realpath(os.path.abspath(path))
        self.lock_path = self.path + ".lock"

    def transact(self, update, written=None):
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        with open(self.lock_path, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                try:
                    with open(self.path, "rb") as handle:
                        data = handle.read()
                except FileNotFoundError:
                    data = None
                result, new_data = update(data)
                if new_data is not None:
                    durable.write_local(self.path, new_data, mode=0o600)
                    if written is not None:
                        written(None)
                return result
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def read(self):
        try:
            with open(self.path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def changed_since_read(self) -> bool:
        return False  # read and written under one flock


class GcsStore:
    """Optimistic concurrency on one GCS object: read with generation, write if it still matches."""

    def __init__(self, uri: str, max_attempts: int = 100):
        bucket, name = gcs.split_gcs_uri(uri)
        if not name or name.endswith("/"):
            raise ValueError(f"ledger URI must name an object, got {uri!r}")
        self.uri = uri
        self.max_attempts = max_attempts
        self.conflicts = 0
        self.read_generation = None

    def read_with_generation(self):
        """``(bytes or None, generation)``; generation 0 means the object does not exist."""
        from google.api_core import exceptions

        bucket, name = gcs.split_gcs_uri(self.uri)
        blob = gcs.client().bucket(bucket).get_blob(name)
        if blob is None:
            return None, 0
        generation = int(blob.generation)  # downloading may reset blob.generation from headers
        self.read_generation = generation
        try:
            data = blob.download_as_bytes(if_generation_match=generation)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            raise LedgerConflict(f"{self.uri} changed while being read")
        return data, generation

    def write_if_generation(self, data: bytes, generation: int) -> int:
        """Write ``data`` only if the object is still at ``generation`` (0: must not exist);
        returns the new generation."""
        try:
            return durable.write(self.uri, data, generation=generation)
        except durable.GenerationMismatch:
            raise LedgerConflict(f"{self.uri} was changed by another writer (generation "
                                 f"{generation} no longer current)") from None

    def transact(self, update, written=None):
        delay = 0.05
        for _ in range(self.max_attempts):
            try:
                data, generation = self.read_with_generation()
                result, new_data = update(data)
                if new_data is not None:
                    new_generation = self.write_if_generation(new_data, generation)
                    if written is not None:
                        written(new_generation)
                return result
            except LedgerConflict:
                self.conflicts += 1
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
        raise LedgerStoreError(f"gave up updating {self.uri} after {self.max_attempts} conflicting attempts")

    def read(self):
        for _ in range(self.max_attempts):
            try:
                return self.read_with_generation()[0]
            except LedgerConflict:  # replaced while being read: read the new version
                self.conflicts += 1
        raise LedgerStoreError(f"could not read a stable version of {self.uri}")

    def changed_since_read(self) -> bool:
        """Whether another writer replaced the object since this store's last read (a file the
        old version referenced may then be gone: the transaction retries instead of refusing)."""
        bucket, name = gcs.split_gcs_uri(self.uri)
        blob = gcs.client().bucket(bucket).get_blob(name)
        return (0 if blob is None else int(blob.generation)) != (self.read_generation or 0)


# --------------------------------------------------------------------------------------------
# Side files beside the ledger (consumed-id records): write-once, content-addressed
# --------------------------------------------------------------------------------------------

class LocalFiles:
    """Files in a private folder beside a local ledger (``<ledger>.consumed/``)."""

    def __init__(self, folder: str):
        self.folder = folder

    def where(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def read(self, name: str):
        try:
            with open(self.where(name), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        durable.write_local(self.where(name), data, mode=0o600)

    def delete(self, name: str) -> None:
        try:
            os.remove(self.where(name))
        except FileNotFoundError:
            pass


class GcsFiles:
    """Objects under a prefix beside a ``gs://`` ledger (``<ledger>.consumed/``); written once
    (``if_generation_match=0``: a name is its content's SHA-256, so an existing one is the same)."""

    def __init__(self, prefix: str):
        self.prefix = prefix.rstrip("/") + "/"

    def where(self, name: str) -> str:
        return self.prefix + name

    def read(self, name: str):
        from google.api_core import exceptions

        try:
            return gcs.blob(self.where(name)).download_as_bytes()
        except exceptions.NotFound:
            return None

    def write(self, name: str, data: bytes) -> None:
        from google.api_core import exceptions

        try:
            gcs.blob(self.where(name)).upload_from_string(
                data, content_type="application/octet-stream", if_generation_match=0)
        except exceptions.PreconditionFailed:
            pass  # already there: the same bytes (content-addressed)

    def delete(self, name: str) -> None:
        from google.api_core import exceptions

        try:
            gcs.blob(self.where(name)).delete()
        except exceptions.NotFound:
            pass


def store_for(path: str, max_attempts: int = 100):
    """The store of a ledger path (``gs://bucket/object`` or a local file)."""
    return GcsStore(path, max_attempts) if gcs.is_gcs(path) else LocalStore(path)


def files_beside(store, suffix: str):
    """The side-file folder of a ledger store: ``<ledger><suffix>/`` in the same storage."""
    if isinstance(store, GcsStore):
        return GcsFiles(store.uri + suffix)
    return LocalFiles(store.path + suffix)
