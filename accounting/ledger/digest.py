"""The input digest a release is bound to: SHA-256 over its input files' contents and its config.

A release key may only ever be applied to the input it was issued for, so the ledger records, per
release, a digest of exactly the files the job reads (the release layer resolves them once and
hands the same list to the readers and to :func:`input_digest`) and of the configuration that
shapes the release. Files are hashed in sorted path order, each as its length and its bytes
(streamed in chunks); only contents count, not names, so moving unchanged inputs keeps the
digest. The byte layout is the ledger's format since its first version, so digests recorded by an
older ledger still compare equal.

The digest is a fingerprint of raw data: it stays in the operator's ledger. What a published
release carries instead is a keyed binding (:func:`keyed_binding`), which nobody without the
release key can test a guess of the input against.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from typing import Callable, Iterable, Iterator, Sequence

_DOMAIN = b"beam-dp-release/input-digest/v1\x00"


def canonical_json(config) -> bytes:
    """Canonical JSON bytes of a configuration mapping (sorted keys, no whitespace)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def input_digest(files: Sequence[str], config=None, *,
                 open_chunks: Callable[[str], tuple[int, Iterator[bytes]]]) -> str:
    """``"sha256:<hex>"`` over the contents of ``files`` and ``config``.

    ``open_chunks(path)`` returns ``(size, iterator of byte chunks)``; a file whose bytes do not
    add up to its size changed while being hashed and raises IOError. ``config`` is a mapping
    (hashed as canonical JSON), raw ``bytes``/``str``, or None.
    """
    files = sorted(files)
    digest = hashlib.sha256(_DOMAIN)
    digest.update(len(files).to_bytes(8, "big"))
    for path in files:
        size, chunks = open_chunks(path)
        digest.update(b"F" + size.to_bytes(8, "big"))
        read = 0
        for block in chunks:
            read += len(block)
            digest.update(block)
        if read != size:
            raise IOError(f"input {path} changed while being hashed ({read} of {size} bytes read)")
    if config is None:
        digest.update(b"N")
    else:
        raw = config.encode("utf-8") if isinstance(config, str) else \
            bytes(config) if isinstance(config, (bytes, bytearray)) else canonical_json(config)
        digest.update(b"C" + len(raw).to_bytes(8, "big") + raw)
    return "sha256:" + digest.hexdigest()


def keyed_binding(secret: bytes, digest: str) -> str:
    """A public commitment to ``digest`` under a release key's secret (HMAC-SHA256).

    Whoever holds the key (the operator) can check a published release against its ledger
    record; nobody else learns anything about the input from it.
    """
    return "hmac-sha256:" + hmac.new(secret, b"input-binding\x00" + digest.encode(),
                                     hashlib.sha256).hexdigest()


def combine(parts: Iterable[str]) -> str:
    """One digest of several digests (order-independent), e.g. of a set of reports."""
    digest = hashlib.sha256(b"beam-dp-release/digest-set/v1\x00")
    for part in sorted(parts):
        digest.update(len(part).to_bytes(4, "big") + part.encode())
    return "sha256:" + digest.hexdigest()
