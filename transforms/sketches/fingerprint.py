"""Salted 64-bit fingerprints of virtual-person ids, computed over whole numpy arrays.

Every publisher of a campaign must map the same person to the same register, so the salt is
shared by all publishers and derived from the campaign (plus an optional shared secret); two
campaigns get unrelated fingerprints, so their sketches cannot be joined register by register.

The fingerprint is a keyed mixing function, not a cryptographic secret: the privacy of a release
comes from the noise added to the sketch statistics, never from hiding the hash.

* Integer ids (the WFA virtual person id is an int64): ``fmix64(fmix64(id ^ k0) ^ k1)`` with the
  MurmurHash3 finaliser ``fmix64``, a bijection of 64-bit words, so distinct ids of one campaign
  never share a fingerprint.
* String/bytes ids: the UTF-8 bytes are laid out as little-endian 64-bit words (vectorised over
  all ids of the batch) and absorbed word by word into a keyed fmix64 chain that starts from the
  byte length; ids longer than ``MAX_VECTOR_BYTES`` are hashed one by one with keyed BLAKE2b. The
  rule depends only on the id itself, so an id's fingerprint never depends on its batch.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["FingerprintSalt", "fingerprint", "fmix64", "MAX_VECTOR_BYTES"]

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# Strings up to this many bytes are hashed in the vectorised word loop (a batch costs
# n * ceil(longest/8) word operations); longer ones fall back to per-id BLAKE2b.
MAX_VECTOR_BYTES = 64
# Hash integer ids in slices that stay in cache: fewer passes over main memory.
_CHUNK = 1 << 16


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, in place on a uint64 array (a bijection); returns h."""
    h ^= h >> _S33
    h *= _M1
    h ^= h >> _S33
    h *= _M2
    h ^= h >> _S33
    return h


@dataclass(frozen=True, kw_only=True)
class FingerprintSalt:
    """Two 64-bit keys of the fingerprint; one per campaign, shared by all its publishers."""

    k0: int
    k1: int

    @classmethod
    def for_campaign(cls, campaign: str, shared_secret: bytes | str = b"") -> "FingerprintSalt":
        """Salt of ``campaign``: keyed BLAKE2b of the campaign id under the publishers' secret."""
        if isinstance(shared_secret, str):
            shared_secret = shared_secret.encode("utf-8")
        if len(shared_secret) > 64:
            raise ValueError("shared_secret: at most 64 bytes")
        digest = hashlib.blake2b(str(campaign).encode("utf-8"), digest_size=16,
                                 key=shared_secret, person=b"halo-ll-salt").digest()
        return cls(k0=int.from_bytes(digest[:8], "little"), k1=int.from_bytes(digest[8:], "little"))

    def to_bytes(self) -> bytes:
        return self.k0.to_bytes(8, "little") + self.k1.to_bytes(8, "little")


def _fingerprint_uint64(words: np.ndarray, salt: FingerprintSalt) -> np.ndarray:
    out = np.empty(words.shape[0], dtype=np.uint64)
    k0, k1 = np.uint64(salt.k0), np.uint64(salt.k1)
    for start in range(0, words.shape[0], _CHUNK):
        h = words[start:start + _CHUNK] ^ k0
        fmix64(h)
        h ^= k1
        out[start:start + _CHUNK] = fmix64(h)
    return out


def _as_binary_array(ids) -> pa.Array:
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if not isinstance(ids, pa.Array):
        ids = pa.array(np.asarray(ids).tolist() if isinstance(ids, np.ndarray) else ids)
    if pa.types.is_dictionary(ids.type):
        ids = ids.dictionary_decode()
    if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
        ids = ids.cast(pa.large_binary())
    elif pa.types.is_binary(ids.type):
        ids = ids.cast(pa.large_binary())
    elif not pa.types.is_large_binary(ids.type):
        raise TypeError(f"ids: expected integers or strings, got arrow type {ids.type}")
    if ids.null_count:
        raise ValueError("ids: contains nulls; drop missing ids before fingerprinting")
    return ids


def _fingerprint_bytes(ids: pa.Array, salt: FingerprintSalt) -> np.ndarray:
    n = len(ids)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int64)[ids.offset:ids.offset + n + 1]
    data = np.frombuffer(ids.buffers()[2], dtype=np.uint8) if ids.buffers()[2] else \
        np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    short = lengths <= MAX_VECTOR_BYTES
    rows = np.flatnonzero(short)
    if rows.size:
        s_len = lengths[rows]
        pos = offsets[rows].copy()
        # An unaligned little-endian uint64 view at every byte position of the (zero-padded)
        # data: word j of id i is one gather at offset + 8j, masked to the id's remaining bytes,
        # i.e. the id's bytes zero-padded to a multiple of 8.
        padded = np.zeros(data.size + 8, np.uint8)
        padded[:data.size] = data
        at = np.ndarray((data.size + 1,), dtype="<u8", buffer=padded, strides=(1,))
        h = s_len.astype(np.uint64) * _GOLDEN ^ np.uint64(salt.k0)
        fmix64(h)
        remaining = s_len.copy()
        while True:
            live = np.flatnonzero(remaining > 0)
            if live.size == 0:
                break
            word = at[pos[live]]
            short_tail = remaining[live] < 8
            if short_tail.any():
                bits = (remaining[live][short_tail] * 8).astype(np.uint64)
                word[short_tail] &= (np.uint64(1) << bits) - np.uint64(1)
            # Only ids with bytes left take a round, so an id's hash ignores its batch-mates.
            if live.size == rows.size:
                h ^= word
                h += _GOLDEN
                fmix64(h)
            else:
                part = h[live] ^ word
                part += _GOLDEN
                h[live] = fmix64(part)
            pos += 8
            remaining -= 8
        h ^= np.uint64(salt.k1)
        out[rows] = fmix64(h)
    key = salt.to_bytes()
    for i in np.flatnonzero(~short):
        raw = data[offsets[i]:offsets[i + 1]].tobytes()
        out[i] = int.from_bytes(hashlib.blake2b(raw, digest_size=8, key=key,
                                                person=b"halo-ll-long").digest(), "little")
    return out


def fingerprint(ids, salt: FingerprintSalt) -> np.ndarray:
    """Salted uint64 fingerprint of each id.

    ``ids``: a numpy integer array (int64 ids are reinterpreted as uint64), or strings/bytes
    (numpy ``U``/``S``/object array, list, or pyarrow string/binary array). Nulls raise
    ``ValueError``: the caller decides (and counts) what to do with missing ids.
    """
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu":
        if ids.dtype.itemsize != 8:
            ids = ids.astype(np.int64 if ids.dtype.kind == "i" else np.uint64)
        return _fingerprint_uint64(np.ascontiguousarray(ids).view(np.uint64), salt)
    if isinstance(ids, (pa.Array, pa.ChunkedArray)) and pa.types.is_integer(ids.type):
        if ids.null_count:
            raise ValueError("ids: contains nulls; drop missing ids before fingerprinting")
        return fingerprint(np.asarray(ids.to_numpy(zero_copy_only=False)), salt)
    if isinstance(ids, np.ndarray) and ids.dtype.kind == "f":
        raise TypeError("ids: floating-point ids are ambiguous; cast to int64 or string first")
    return _fingerprint_bytes(_as_binary_array(ids), salt)

