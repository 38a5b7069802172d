"""Small helpers for ``gs://`` paths shared by the ledger, the key store and the input digest.

The google-cloud-storage client is created lazily (importing this module costs nothing). When
``STORAGE_EMULATOR_HOST`` is set (tests, local runs against an emulator) the client uses anonymous
credentials and a fixed project id, which skips the application-default credential lookup that
otherwise retries for about 25 s before giving up.
"""
from __future__ import annotations

import os
import threading

_CLIENT = None
_CLIENT_LOCK = threading.Lock()
_CLIENT_EMULATOR = None


def is_gcs(path: str) -> bool:
    return isinstance(path, str) and path.startswith("gs://")


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``; raises ValueError for anything else."""
    if not is_gcs(uri):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    rest = uri[len("gs://"):]
    bucket, _, name = rest.partition("/")
    if not bucket:
        raise ValueError(f"gs:// URI without a bucket: {uri!r}")
    return bucket, name


def client():
    """The process-wide storage client, created on first use (re-created if the emulator changes)."""
    global _CLIENT, _CLIENT_EMULATOR
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    with _CLIENT_LOCK:
        if _CLIENT is None or emulator != _CLIENT_EMULATOR:
            from google.cloud import storage

            if emulator:
                from google.auth.credentials import AnonymousCredentials

                project = os.environ.get("GOOGLE_CLOUD_PROJECT", "emulator-project")
                _CLIENT = storage.Client(project=project, credentials=AnonymousCredentials())
            else:
                _CLIENT = storage.Client()
            _CLIENT_EMULATOR = emulator
        return _CLIENT


def blob(uri: str):
    bucket, name = split_gcs_uri(uri)
    if not name:
        raise ValueError(f"gs:// URI names a bucket, not an object: {uri!r}")
    return client().bucket(bucket).blob(name)


def list_objects(prefix_uri: str) -> list[str]:
    """URIs of all objects under ``gs://bucket/prefix`` (sorted)."""
    bucket, prefix = split_gcs_uri(prefix_uri)
    return sorted(f"gs://{bucket}/{b.name}" for b in client().list_blobs(bucket, prefix=prefix)
                  if not b.name.endswith("/"))
