"""Files of the release layer on a local file system or ``gs://``: the few operations it needs.

Everything a job reads goes through Beam's ``FileSystems`` (so any Beam file system works for
inputs); what the release layer *writes* needs guarantees Beam's interface does not give, so it
is done here directly:

* local: staging folders are created owner-only (0700); a release folder is published by one
  ``os.rename`` of its staging folder (atomic, and it fails if the target exists), after every
  file was fsynced;
* ``gs://``: objects are created with ``if_generation_match=0`` (never overwriting), the release
  marker last; a folder counts as published exactly when its marker exists, so a crash half way
  through publication leaves a folder that a re-run completes (with identical bytes) or that the
  ledger refuses to touch.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from typing import Iterator, Optional

from accounting import durable, gcs


def is_gcs(path: str) -> bool:
    return gcs.is_gcs(path)


def join(base: str, *parts: str) -> str:
    if is_gcs(base):
        return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts if p]])
    return os.path.join(base, *[p for p in parts if p])


def absolute(path: str) -> str:
    """Local paths made absolute (relative globs then work with Beam everywhere); URIs as given.
    The one normalisation of the project: :func:`transforms.file_patterns.normalize_glob` (the
    library readers use it too)."""
    from transforms.file_patterns import normalize_glob

    return normalize_glob(path)


def parent(path: str) -> str:
    if is_gcs(path):
        bucket, name = gcs.split_gcs_uri(path.rstrip("/"))
        head = name.rsplit("/", 1)[0] if "/" in name else ""
        return f"gs://{bucket}/{head}" if head else f"gs://{bucket}"
    return os.path.dirname(os.path.abspath(path))


def exists(path: str) -> bool:
    if is_gcs(path):
        bucket, name = gcs.split_gcs_uri(path)
        return bool(name) and gcs.client().bucket(bucket).get_blob(name) is not None
    return os.path.exists(path)


def unwritable(path: str) -> Optional[str]:
    """Why a local folder could not be created or written (None if it can; ``gs://`` is not
    probed). Nothing is created: the nearest existing ancestor must be a writable folder."""
    if is_gcs(path):
        return None
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        up = os.path.dirname(probe)
        if up == probe:
            break
        probe = up
    if not os.path.isdir(probe):
        return f"{probe} is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def read_bytes(path: str) -> Optional[bytes]:
    """The object's bytes, or None if it does not exist."""
    if is_gcs(path):
        bucket, name = gcs.split_gcs_uri(path)
        blob = gcs.client().bucket(bucket).get_blob(name)
        return None if blob is None else blob.download_as_bytes()
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def write_bytes(path: str, data: bytes, *, exclusive: bool = False) -> bool:
    """Write ``data``; with ``exclusive``, only if ``path`` does not exist (returns False then)."""
    if is_gcs(path):
        from google.api_core import exceptions

        try:
            gcs.blob(path).upload_from_string(data, if_generation_match=0 if exclusive else None)
        except exceptions.PreconditionFailed:
            return False
        return True
    # Through a temporary file and a rename (or a link, when exclusive): a crash or a full disk
    # leaves the old file or none, never an empty or cut one (accounting.durable).
    return durable.write_local(path, data, exclusive=exclusive)


def delete_empty_dirs(path: str) -> None:
    """Remove ``path`` and the folders below it that hold no file (local; bottom up)."""
    if is_gcs(path) or not os.path.isdir(path) or os.path.islink(path):
        return
    for top, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
        try:
            os.rmdir(top)
        except OSError:
            pass  # not empty (or gone)


def list_files(prefix: str) -> list[str]:
    """Every file under a folder (recursively), sorted; empty if it does not exist."""
    if is_gcs(prefix):
        return gcs.list_objects(prefix.rstrip("/") + "/")
    if not os.path.isdir(prefix):
        return []
    return sorted(os.path.join(root, f) for root, _, files in os.walk(prefix) for f in files)


def make_private_dir(path: str) -> None:
    """A folder only its owner can read (staging); a no-op on GCS (use a private bucket)."""
    if not is_gcs(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)


def delete_tree(path: str) -> None:
    if is_gcs(path):
        for uri in list_files(path):
            try:
                gcs.blob(uri).delete()
            except Exception:  # noqa: BLE001 -- already gone
                pass
        return
    shutil.rmtree(path, ignore_errors=True)


def delete_file(path: str) -> None:
    """Remove one file if it exists (local or gs://)."""
    if is_gcs(path):
        try:
            gcs.blob(path).delete()
        except Exception:  # noqa: BLE001 -- already gone
            pass
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    for block in read_chunks(path):
        digest.update(block)
    return "sha256:" + digest.hexdigest()


def read_chunks(path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        while True:
            block = handle.read(chunk_size)
            if not block:
                return
            yield block


def size_and_chunks(path: str):
    """``(size, chunk iterator)`` of one input file (for the input digest)."""
    from apache_beam.io.filesystems import FileSystems

    size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    return size, read_chunks(path)


def fsync_tree(path: str) -> None:
    """Flush every file and folder under a local folder to disk (before an atomic rename)."""
    for root, dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory
        pass
    finally:
        os.close(fd)


def rename_dir(source: str, target: str, root: Optional[str] = None) -> None:
    """Local atomic publication: ``source`` becomes ``target`` (which must not exist).

    With ``root`` (a folder above ``target``), every folder from ``root`` down to ``target``'s
    parent is opened without following symbolic links (and created if missing), and the rename
    is made relative to the parent's descriptor: a symlink planted anywhere below ``root``, even
    while the run computed, cannot carry the release outside ``root`` (``OSError``)."""
    if root is None:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target):
            raise FileExistsError(target)
        os.rename(source, target)
        _fsync_dir(os.path.dirname(target))
        return
    parts = os.path.relpath(target, root).split(os.sep)
    if parts[0] in (os.pardir, os.curdir, ""):
        raise ValueError(f"{target} is not below {root}")
    os.makedirs(root, exist_ok=True)  # the first release of a root (staging lives elsewhere)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        try:
            os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            raise FileExistsError(target)
        os.rename(source, parts[-1], dst_dir_fd=fd)
        try:
            os.fsync(fd)
        except OSError:  # some file systems cannot fsync a directory
            pass
    finally:
        os.close(fd)


def symlink_below(root: str, path: str) -> Optional[str]:
    """The first existing component of local ``path`` below ``root`` that is a symbolic link, or
    ``path`` itself if it is not below ``root`` (``root`` itself may be a link: the operator's
    choice of where the tree lives); None when there is none."""
    parts = os.path.relpath(path, root).split(os.sep)
    if parts[0] == os.pardir or os.path.isabs(parts[0]):
        return path
    current = root
    for part in parts:
        if part in ("", os.curdir):
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            return current
        if not os.path.exists(current):
            return None
    return None


def read_head(path: str, n: int) -> Optional[bytes]:
    """The first ``n`` bytes of a file (None if it does not exist)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return handle.read(n)
    except FileNotFoundError:
        return None
