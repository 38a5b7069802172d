"""Client-side local randomizers: values in, Arrow report tables out (pure, vectorised numpy).

``randomize(oracle, values, source=..., ids=...)`` runs the oracle's randomizer for a batch of
clients. The randomness comes from a :class:`~transforms.randomness.RandomSource`: the OS
CSPRNG on a device (:class:`SystemRandomness`, ids not needed), keyed AES streams in a
simulation, a server-side randomizer or a test (:class:`KeyedRandomness`, one integer id per
client: a client's report then depends only on the key, the purpose and its id). Each oracle
consumes a fixed number of 32-bit uniforms per client (plus rare redraws for exact uniform
choices), listed in each function.

Importable without Beam.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from transforms.ldp import hashing
from transforms.ldp.oracles import GRR, OLH, Oracle, UnaryEncoding
from transforms.ldp.randomness import bernoulli_bytes, retry_u32, u32_stream, uniform_below
from transforms.randomness import RandomSource, SystemRandomness
from transforms.ldp.reports import report_schema, unary_width

_UNARY_CHUNK_CELLS = 1 << 23  # clients x domain bits per chunk (8 MB of random bytes)


def client_values(values, domain_size: int, name: str = "value") -> np.ndarray:
    """Validate client values: integers in [0, domain_size), no nulls -> uint64 array."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if values.null_count:
            raise ValueError(f"{name}: null values cannot be randomized (a client without a "
                             "value must not report, or must report a public placeholder)")
        values = values.to_numpy(zero_copy_only=False)
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"{name}: expected a one-dimensional array, got shape {values.shape}")
    if values.dtype == bool:
        values = values.astype(np.uint8)
    if values.dtype.kind not in "iu":
        if values.dtype.kind == "f" and values.size and np.all(np.mod(values, 1) == 0):
            values = values.astype(np.int64)
        else:
            raise ValueError(f"{name}: values must be integers in [0, {domain_size}), got "
                             f"dtype {values.dtype}")
    if values.size:
        low = values.min()
        high = values.max()
        if (values.dtype.kind == "i" and low < 0) or int(high) >= domain_size:
            raise ValueError(f"{name}: values must be in [0, {domain_size}); got "
                             f"[{int(low)}, {int(high)}]")
    return values.astype(np.uint64)


def _ids_for(source: RandomSource, ids, n: int):
    if isinstance(source, SystemRandomness):
        return n  # the OS CSPRNG does not use ids
    if ids is None:
        raise ValueError("keyed randomness needs one integer id per client (ids=...): the "
                         "id makes each client's report independent of batching")
    ids = np.asarray(ids)
    if len(ids) != n:
        raise ValueError(f"got {len(ids)} ids for {n} values")
    return ids


def randomize(oracle: Oracle, values, *, source: Optional[RandomSource] = None, ids=None,
              extra: Optional[dict] = None) -> pa.Table:
    """Randomize one value per client with ``oracle``; returns the report table.

    ``source``: where the bits come from -- by default the OS CSPRNG (a client device); keyed
    streams (:class:`KeyedRandomness`, with ``ids``) for simulations and server-side use,
    ``KeyedRandomness.for_testing(seed)`` for tests.
    ``extra``: columns to carry into the report table unchanged (e.g. ``{"group": groups}``).
    """
    if not isinstance(oracle, Oracle):
        raise TypeError(f"oracle must be an Oracle, got {type(oracle).__name__}")
    v = client_values(values, oracle.domain_size)
    source = SystemRandomness() if source is None else source
    record_ids = _ids_for(source, ids, v.size)
    if isinstance(oracle, UnaryEncoding):
        columns = {"bits": _unary(oracle, v, source, record_ids)}
    elif isinstance(oracle, OLH):
        a, b, y = _olh(oracle, v, source, record_ids)
        columns = {"hash_a": pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)),
                                                               oracle.digits),
                   "hash_b": pa.array(b), "report": pa.array(y)}
    elif oracle.oracle_name == "binary_rr":
        columns = {"report": pa.array(_grr(oracle, v, source, record_ids).astype(bool))}
    elif isinstance(oracle, GRR):
        columns = {"report": pa.array(_grr(oracle, v, source, record_ids).astype(np.uint32))}
    else:
        raise TypeError(f"no randomizer for {type(oracle).__name__}")
    extra_fields = []
    for name, column in (extra or {}).items():
        column = column if isinstance(column, (pa.Array, pa.ChunkedArray)) else pa.array(column)
        columns[name] = column
        extra_fields.append(pa.field(name, column.type))
    return pa.table(columns, schema=report_schema(oracle, extra_fields))


def _grr(oracle: GRR, v: np.ndarray, source: RandomSource, ids) -> np.ndarray:
    """GRR / binary RR: one word per client -- low half: keep if < T; high half: which other."""
    words = source.words(ids, 1, oracle.oracle_name)[:, 0]
    keep = (words & np.uint64(0xFFFFFFFF)) < np.uint64(oracle.keep_threshold)
    d = oracle.domain_size
    if d == 2:
        return np.where(keep, v, v ^ np.uint64(1))
    other = uniform_below(words >> np.uint64(32), d - 1,
                          retry_u32(source, ids, f"{oracle.oracle_name}/other"))
    other += other >= v  # skip the client's own value: uniform over the d - 1 others
    return np.where(keep, v, other)


def _unary(oracle: UnaryEncoding, v: np.ndarray, source: RandomSource, ids) -> pa.Array:
    """SUE / OUE / RAPPOR: one exact Bernoulli per domain bit per client, from one random byte
    per bit (refined with 24 more bits on the 1/256 of ties): ceil(d/8) words per client."""
    d = oracle.domain_size
    width = unary_width(d)
    n = v.size
    out = np.empty((n, width), dtype=np.uint8)
    rows = max(1, _UNARY_CHUNK_CELLS // d)
    ids_is_count = isinstance(ids, int)
    stage = oracle.oracle_name
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        m = r1 - r0
        chunk_ids = m if ids_is_count else ids[r0:r1]
        u8 = source.words(chunk_ids, -(-d // 8), stage).view(np.uint8)[:, :d]
        row_index = np.broadcast_to(np.arange(m)[:, None], (m, d))
        col_index = np.broadcast_to(np.arange(d, dtype=np.uint64)[None, :], (m, d))
        bits = bernoulli_bytes(source, chunk_ids, u8, oracle.zero_threshold, stage,
                               row_index, col_index)
        own = v[r0:r1].astype(np.intp)
        local = np.arange(m)
        bits[local, own] = bernoulli_bytes(source, chunk_ids, u8[local, own].copy(),
                                           oracle.one_threshold, stage, local,
                                           own.astype(np.uint64))
        out[r0:r1] = np.packbits(bits, axis=1, bitorder="little")
    buffer = pa.py_buffer(out.tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, buffer])


def olh_words(oracle: OLH) -> int:
    """64-bit words an OLH client draws: k hash digits + b + keep + other-bucket uniforms."""
    return -(-(oracle.digits + 3) // 2)


def _olh(oracle: OLH, v: np.ndarray, source: RandomSource, ids):
    """OLH: draw h (k+1 words of 32 bits), bucket its value, GRR over the g buckets."""
    k, g = oracle.digits, oracle.buckets
    u = u32_stream(source.words(ids, olh_words(oracle), "olh"))
    a = np.ascontiguousarray(u[:, :k])
    b = np.ascontiguousarray(u[:, k])
    bucket = hashing.bucket_of(hashing.hash16(a, b, v), g).astype(np.uint64)
    keep = u[:, k + 1] < np.uint32(oracle.keep_threshold)
    other = uniform_below(u[:, k + 2].astype(np.uint64), g - 1, retry_u32(source, ids, "olh/other"))
    other += other >= bucket
    y = np.where(keep, bucket, other).astype(np.uint16)
    return a, b, y
