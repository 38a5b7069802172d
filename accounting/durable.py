"""Small files written so that a crash leaves the old version or the new one, never a part.

Control files -- a ledger's witness and a key's use record in the key store, an output root's
ledger binding, a release's marker -- decide what the next run may do. Written in place, a full
disk or a kill in the middle of the write leaves an empty or cut file that the next run cannot
tell from someone else's: so they are written here, through a temporary file in the same folder
(fsynced), then renamed into place (``os.replace``) -- or, for a file that must not exist yet,
hard-linked into place (``os.link`` fails if the name exists: an atomic exclusive create) -- and
the folder fsynced. On ``gs://`` an object is replaced whole by GCS itself; the write carries an
``if_generation_match`` precondition (0: must not exist yet; the generation read: nobody wrote
in between).
"""
from __future__ import annotations

import errno
import os
import tempfile
from typing import Optional

from accounting import gcs


class GenerationMismatch(RuntimeError):
    """A ``gs://`` object changed since it was read (its generation precondition failed)."""


def fsync_dir(directory: str) -> None:
    """Make a rename or link in ``directory`` durable (where the file system allows it)."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    except OSError as err:  # some file systems cannot fsync a directory
        if err.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(dir_fd)


def write_local(path: str, data: bytes, *, exclusive: bool = False, mode: int = 0o644) -> bool:
    """Write ``data`` to ``path`` atomically (see the module docstring); with ``exclusive``,
    only if ``path`` does not exist (returns False then, writing nothing)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.remove(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)
    return True


def read(uri: str) -> tuple[Optional[bytes], int]:
    """``(bytes or None, generation)`` of a local file or ``gs://`` object (generation 0: it
    does not exist; a local file has generation 1 when it exists)."""
    if gcs.is_gcs(uri):
        from google.api_core import exceptions

        bucket, name = gcs.split_gcs_uri(uri)
        blob = gcs.client().bucket(bucket).get_blob(name)
        if blob is None:
            return None, 0
        generation = int(blob.generation)
        try:
            return blob.download_as_bytes(if_generation_match=generation), generation
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            raise GenerationMismatch(f"{uri} changed while being read") from None
    try:
        with open(uri, "rb") as handle:
            return handle.read(), 1
    except FileNotFoundError:
        return None, 0


def write(uri: str, data: bytes, *, generation: Optional[int] = None, mode: int = 0o644,
          content_type: str = "application/json") -> int:
    """Write ``data`` atomically; ``generation``: the version read (0: must not exist yet;
    None: whatever is there). Returns the new generation; raises GenerationMismatch when the
    precondition fails. Locally the caller serialises writers (a lock) unless ``generation``
    is 0 (an exclusive create)."""
    if gcs.is_gcs(uri):
        from google.api_core import exceptions

        blob = gcs.blob(uri)
        try:
            blob.upload_from_string(data, content_type=content_type,
                                    if_generation_match=generation)
        except exceptions.PreconditionFailed:
            raise GenerationMismatch(f"{uri} was changed by another writer") from None
        return int(blob.generation or 0)
    if not write_local(uri, data, exclusive=generation == 0, mode=mode):
        raise GenerationMismatch(f"{uri} exists already")
    return 1
