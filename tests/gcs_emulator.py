"""A local Cloud Storage for tests: ``gcp-storage-emulator`` in process, on a free port.

``with storage_emulator("bucket") as bucket:`` starts the emulator with that bucket, points
``STORAGE_EMULATOR_HOST`` at it (the google-cloud-storage client and Beam's GCS IO both honour
it) and restores everything on exit. Two fixes make the emulator behave like GCS for our code:

* It ignores ``ifGenerationMatch`` on uploads (it always overwrites). We add the documented GCS
  rule for object inserts (Cloud Storage JSON API, objects.insert: the write happens only if the
  live object's generation equals ``ifGenerationMatch``, 0 meaning "does not exist", else HTTP
  412) in front of its insert handler. The emulator serves one request at a time, so the check
  and the write are atomic as on GCS.
* Beam looks for application-default credentials first, retrying for about 20 s before it
  connects anonymously (which the emulator accepts). No credentials exist here, so the lookup
  is skipped for the duration.
"""
from __future__ import annotations

import contextlib
import os
import socket
from http import HTTPStatus


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _honour_if_generation_match(insert):
    from gcp_storage_emulator.exceptions import NotFound

    def handler(request, response, storage, *args, **kwargs):
        wanted = request.query.get("ifGenerationMatch")
        if wanted:
            data = request.data  # read the body in every case
            name = request.query.get("name", [None])[0]
            if name is None and isinstance(data, dict):
                name = (data.get("meta") or {}).get("name")
            try:
                current = int(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
            except NotFound:
                current = 0
            if current != int(wanted[0]):
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "Precondition Failed",
                                         "errors": [{"reason": "conditionNotMet",
                                                     "message": "Precondition Failed"}]}})
                return None
        return insert(request, response, storage, *args, **kwargs)

    return handler


@contextlib.contextmanager
def _generation_preconditions():
    from gcp_storage_emulator import server as emulator
    from gcp_storage_emulator.handlers import objects

    original = objects.insert
    patched = _honour_if_generation_match(original)
    replaced = []
    for _, handlers in emulator.HANDLERS:
        for method, fn in list(handlers.items()):
            if fn is original:
                handlers[method] = patched
                replaced.append((handlers, method))
    objects.insert = patched
    try:
        yield
    finally:
        objects.insert = original
        for handlers, method in replaced:
            handlers[method] = original


@contextlib.contextmanager
def _anonymous_beam_credentials():
    try:
        from apache_beam.internal.gcp import auth
    except ImportError:  # Beam's GCP extra absent: nothing to skip
        yield
        return
    saved = {name: auth._Credentials.__dict__[name]
             for name in ("_credentials_init", "_credentials") if name in auth._Credentials.__dict__}
    auth._Credentials._credentials_init = True
    auth._Credentials._credentials = None
    try:
        yield
    finally:
        for name in ("_credentials_init", "_credentials"):
            if name in saved:
                setattr(auth._Credentials, name, saved[name])
            else:
                delattr(auth._Credentials, name)


@contextlib.contextmanager
def storage_emulator(bucket: str):
    """Run the emulator with ``bucket`` (in memory) for the block; yields the bucket name."""
    from gcp_storage_emulator import server as emulator

    with _generation_preconditions(), _anonymous_beam_credentials():
        port = free_port()
        srv = emulator.create_server("localhost", port, in_memory=True, default_bucket=bucket)
        srv.start()
        old_env = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://localhost:{port}"
        try:
            yield bucket
        finally:
            srv.stop()
            if old_env is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = old_env
