"""Keyed random streams: one independent, reproducible stream of random bits per output key.

A release's randomness must be (1) cryptographically secure, (2) reproducible: the bits used for
output key K under purpose P depend only on (release key, P, K), never on bundling, worker or
order, and (3) fast: a million keys in well under a second. Construction:

* Each key is encoded canonically (:func:`encode_keys`; Python values and Arrow columns give the
  same bytes) and mapped to a 128-bit lane seed by a length-prefixed CBC-MAC under AES-256 with a
  purpose-specific sub-key. Length-prefixed CBC-MAC is a PRF, so seeds of distinct keys look
  independent and uniformly random to anyone without the release key.
* Lane i's j-th block is AES-256_{K'}(seed_i XOR j) under a second sub-key K' (counter mode): an
  unbounded stream per lane. Samplers draw whole arrays of blocks in one AES call.

AES comes from the ``cryptography`` package (OpenSSL, AES-NI); everything else is numpy.
"""
from __future__ import annotations

import datetime as _dt
import math
import numbers
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from accounting.keys import ReleaseKey

_U64 = np.uint64


def _ecb(key: bytes):
    return Cipher(algorithms.AES(key), modes.ECB()).encryptor()


# --------------------------------------------------------------------------- canonical encoding

def _encode_component(value, out: bytearray) -> None:
    if value is None:
        out += b"N"
    elif isinstance(value, (bool, np.bool_)):
        out += b"B" + (b"\x01" if value else b"\x00")
    elif isinstance(value, numbers.Integral):
        value = int(value)
        magnitude = -value if value < 0 else value
        if magnitude >= 1 << 128:
            raise ValueError(f"integer key component {value} is wider than 128 bits")
        out += b"I" + (b"\x01" if value < 0 else b"\x00") + magnitude.to_bytes(16, "big")
    elif isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            raise ValueError("a key component must not be NaN")
        out += b"F" + np.array([value + 0.0], dtype=">f8").tobytes()
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += b"S" + len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out += b"Y" + len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, _dt.datetime):
        raw = value.isoformat().encode()
        out += b"E" + len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, _dt.date):
        raw = value.isoformat().encode()
        out += b"D" + len(raw).to_bytes(4, "big") + raw
    else:
        raise TypeError(f"unsupported key component type {type(value).__name__}")


def encode_key(key) -> bytes:
    """Canonical bytes of one key; a scalar is the 1-tuple of itself."""
    parts = key if isinstance(key, tuple) else (key,)
    out = bytearray(b"T" + len(parts).to_bytes(4, "big"))
    for part in parts:
        _encode_component(part, out)
    return bytes(out)


def _binary(matrix: np.ndarray) -> pa.Array:
    """Rows of a (n, w) uint8 matrix as an Arrow large_binary array."""
    n, width = matrix.shape
    buffer = pa.py_buffer(np.ascontiguousarray(matrix, dtype=np.uint8).tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, buffer]).cast(pa.large_binary())


def _join(arrays: Sequence[pa.Array]) -> pa.Array:
    """Row-wise concatenation of binary arrays (vectorised in Arrow)."""
    if len(arrays) == 1:
        return arrays[0]
    return pc.binary_join_element_wise(*arrays, pa.scalar(b"", pa.large_binary()))


def _be_bytes(values: np.ndarray, width: int) -> np.ndarray:
    """Big-endian bytes of unsigned integers, shape (n, width)."""
    return values.astype(f">u{width}").view(np.uint8).reshape(-1, width)


def _python_components(column: pa.Array) -> pa.Array:
    return pa.array([encode_key((v,))[5:] for v in column.to_pylist()], pa.large_binary())


def _encode_arrow_column(column: pa.Array) -> pa.Array:
    """The canonical component encoding of every value of one key column (as in encode_key)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    n = len(column)
    typ = column.type
    if column.null_count:
        return _python_components(column)
    if pa.types.is_integer(typ):
        values = column.to_numpy(zero_copy_only=False)
        if pa.types.is_signed_integer(typ):
            values = values.astype(np.int64)
            negative = values < 0
            magnitude = np.where(negative, (-(values + 1)).astype(_U64) + _U64(1), values.astype(_U64))
        else:
            negative = np.zeros(n, dtype=bool)
            magnitude = values.astype(_U64)
        head = np.zeros((n, 10), dtype=np.uint8)
        head[:, 0] = ord("I")
        head[:, 1] = negative
        return _binary(np.hstack([head, _be_bytes(magnitude, 8)]))
    if pa.types.is_boolean(typ):
        matrix = np.empty((n, 2), dtype=np.uint8)
        matrix[:, 0] = ord("B")
        matrix[:, 1] = column.to_numpy(zero_copy_only=False)
        return _binary(matrix)
    if pa.types.is_floating(typ):
        values = column.to_numpy(zero_copy_only=False).astype(np.float64)
        if np.isnan(values).any():
            raise ValueError("a key component must not be NaN")
        matrix = np.empty((n, 9), dtype=np.uint8)
        matrix[:, 0] = ord("F")
        matrix[:, 1:] = (values + 0.0).astype(">f8").view(np.uint8).reshape(-1, 8)  # -0.0 -> 0.0
        return _binary(matrix)
    if pa.types.is_date(typ):
        text = pc.strftime(column.cast(pa.date32()).cast(pa.timestamp("s")), format="%Y-%m-%d")
        return _encode_varlen(text, b"D")
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return _encode_varlen(column, b"S")
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
        return _encode_varlen(column, b"Y")
    return _python_components(column)


def _encode_varlen(column: pa.Array, tag: bytes) -> pa.Array:
    values = column.cast(pa.large_binary())
    lengths = pc.binary_length(values).to_numpy(zero_copy_only=False)
    head = np.empty((len(values), 5), dtype=np.uint8)
    head[:, 0] = tag[0]
    head[:, 1:] = _be_bytes(lengths.astype(np.uint32), 4)
    return _join([_binary(head), values])


def encode_keys(keys) -> pa.Array:
    """Canonical encodings (large_binary) of many keys: Python keys or Arrow key columns.

    Arrow tables are encoded column by column in Arrow/numpy; the bytes equal
    :func:`encode_key` of the corresponding Python tuples.
    """
    if isinstance(keys, (pa.Table, pa.RecordBatch)):
        n = keys.num_rows
        head = np.empty((n, 5), dtype=np.uint8)
        head[:, 0] = ord("T")
        head[:, 1:] = _be_bytes(np.full(n, keys.num_columns, dtype=np.uint32), 4)
        return _join([_binary(head)] + [_encode_arrow_column(c) for c in keys.columns])
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        return encode_keys(pa.table({"k": keys}))
    return pa.array([encode_key(k) for k in keys], pa.large_binary())


_ZERO_PADS = pa.array([b"\0" * i for i in range(16)], pa.large_binary())


def cbc_mac(mac_key: bytes, messages: pa.Array) -> np.ndarray:
    """Length-prefixed AES CBC-MAC of each message: a (n, 16) uint8 array of PRF outputs."""
    n = len(messages)
    lengths = pc.binary_length(messages).to_numpy(zero_copy_only=False).astype(np.int64)
    # Zero-pad every message to whole blocks (unambiguous: the true length is in block 0).
    padded = _join([messages, _ZERO_PADS.take(pa.array((-lengths) % 16))]).cast(pa.large_binary())
    offsets_buffer, data_buffer = padded.buffers()[1:3]
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[padded.offset:padded.offset + n + 1]
    blocks = np.frombuffer(data_buffer, dtype=np.uint8)
    first = (offsets[:-1] - offsets[0]) // 16
    blocks = blocks[offsets[0]:offsets[-1]].reshape(-1, 16)
    count = np.diff(offsets) // 16
    encryptor = _ecb(mac_key)
    state = np.zeros((n, 16), dtype=np.uint8)
    state[:, :8] = _be_bytes(lengths.astype(_U64), 8)
    state = np.frombuffer(encryptor.update(state.tobytes()), dtype=np.uint8).reshape(n, 16).copy()
    uniform = n and bool(np.all(count == count[0]))
    for j in range(int(count.max()) if n else 0):
        active = slice(None) if uniform else np.nonzero(count > j)[0]
        mixed = state[active] ^ blocks[first[active] + j]
        state[active] = np.frombuffer(encryptor.update(mixed.tobytes()), dtype=np.uint8).reshape(-1, 16)
    return state


# --------------------------------------------------------------------------- streams

class RandomStreams:
    """Independent keyed random streams, one per lane (output key).

    Draws advance per-lane counters, so a sampler that needs a variable number of draws per lane
    (rejection sampling) stays reproducible: lane i's values depend only on its own seed.
    """

    def __init__(self, release_key: ReleaseKey, purpose: str, seeds: np.ndarray):
        if not isinstance(release_key, ReleaseKey):
            raise TypeError("release_key must be a ReleaseKey")
        self.release_key = release_key
        self.purpose = purpose
        self._seeds = seeds.view(np.uint64).reshape(-1, 2).copy()
        self._counters = np.zeros(len(self._seeds), dtype=np.uint64)
        self._encryptor = _ecb(release_key.derive("stream:" + purpose).secret_bytes())

    @classmethod
    def for_keys(cls, release_key: ReleaseKey, purpose: str, keys) -> "RandomStreams":
        mac_key = release_key.derive("key-mac:" + purpose).secret_bytes()
        return cls(release_key, purpose, cbc_mac(mac_key, encode_keys(keys)))

    @classmethod
    def for_range(cls, release_key: ReleaseKey, purpose: str, n: int, offset: int = 0) -> "RandomStreams":
        ids = np.arange(offset, offset + n, dtype=np.int64)
        return cls.for_keys(release_key, purpose, pa.table({"i": ids}))

    @property
    def size(self) -> int:
        return len(self._seeds)

    def __len__(self):
        return self.size

    def draw(self, lanes: np.ndarray = None) -> np.ndarray:
        """One uniform 64-bit word for each of ``lanes`` (all lanes if None)."""
        if lanes is None:
            lanes = np.arange(self.size)
        blocks = self._seeds[lanes].copy()
        blocks[:, 0] ^= self._counters[lanes]
        self._counters[lanes] += _U64(1)
        out = np.frombuffer(self._encryptor.update(blocks.tobytes()), dtype=np.uint64)
        return out[0::2].copy()

    def uniform_uint64(self, lanes: np.ndarray = None) -> np.ndarray:
        return self.draw(lanes)

    def uniform_float(self, lanes: np.ndarray = None) -> np.ndarray:
        """Uniform on the 2^-53 grid of [0, 1)."""
        return (self.draw(lanes) >> _U64(11)).astype(np.float64) * 2.0 ** -53

    def randint(self, bound: np.ndarray, lanes: np.ndarray = None) -> np.ndarray:
        """Exactly uniform integers in [0, bound) per lane (rejection of the biased top range)."""
        if lanes is None:
            lanes = np.arange(self.size)
        bound = np.broadcast_to(np.asarray(bound, dtype=np.uint64), lanes.shape)
        if np.any(bound == 0):
            raise ValueError("randint bound must be positive")
        if bound.size and np.all(bound == bound.flat[0]) and not (int(bound.flat[0]) & (int(bound.flat[0]) - 1)):
            # A common power-of-two bound: the low bits are exactly uniform; no rejection needed.
            return self.draw(lanes) & (bound - _U64(1))
        # Accept x < limit = floor(2^64 / bound) * bound; 2^64 mod bound = (2^64 - bound) mod bound.
        limit_gap = (_U64(0) - bound) % bound
        out = np.empty(lanes.shape, dtype=np.uint64)
        pending = np.arange(lanes.size)
        while pending.size:
            x = self.draw(lanes[pending])
            ok = x <= (np.iinfo(np.uint64).max - limit_gap[pending])
            out[pending[ok]] = x[ok] % bound[pending[ok]]
            pending = pending[~ok]
        return out

    def generator(self) -> np.random.Generator:
        """A numpy Generator keyed from lane 0's stream: for simulations, not release noise."""
        words = self.draw(np.array([0, 0]))
        key = int(words[0]) | (int(words[1]) << 64)
        return np.random.Generator(np.random.Philox(key=key))
