"""Arrow report formats, one per oracle, and their validation (pure pyarrow/numpy).

A report table holds one row per client report. Its schema carries the oracle in the metadata key
``ldp.oracle`` (JSON: oracle, epsilon, domain size[, buckets]) so a report file says how it was
randomized; an aggregator configured differently refuses it. Columns:

==========  =====================================================================================
oracle      columns
==========  =====================================================================================
binary_rr   ``report``: bool -- the randomized bit
grr         ``report``: uint32 -- the randomized value in [0, d)
sue, oue,   ``bits``: fixed_size_binary(ceil(d/8)) -- the randomized unary vector; bit v is
rappor      ``(bits[v >> 3] >> (v & 7)) & 1`` (little-endian bit order within each byte)
olh         ``hash_a``: fixed_size_list<uint32>[k] and ``hash_b``: uint32 -- the client's hash
            function (k = 16-bit digits of the domain, :mod:`transforms.ldp.hashing`);
            ``report``: uint16 -- the randomized bucket in [0, g)
==========  =====================================================================================

Extra columns (e.g. ``group`` for PEM) are allowed and carried along. Validation separates
*schema* faults (missing column, wrong type or width, another oracle), which are errors, from
*row* faults (null or out-of-domain reports), which :func:`report_arrays` either raises on or
drops and counts -- a malformed report depends only on its own client, so dropping it is
post-processing of that client's LDP output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from transforms.ldp.oracles import OLH, Oracle, UnaryEncoding, oracle_from_metadata

METADATA_KEY = b"ldp.oracle"


def report_fields(oracle: Oracle) -> list[pa.Field]:
    if isinstance(oracle, UnaryEncoding):
        return [pa.field("bits", pa.binary(unary_width(oracle.domain_size)), nullable=False)]
    if isinstance(oracle, OLH):
        return [pa.field("hash_a", pa.list_(pa.uint32(), oracle.digits), nullable=False),
                pa.field("hash_b", pa.uint32(), nullable=False),
                pa.field("report", pa.uint16(), nullable=False)]
    if oracle.oracle_name == "binary_rr":
        return [pa.field("report", pa.bool_(), nullable=False)]
    return [pa.field("report", pa.uint32(), nullable=False)]


def report_schema(oracle: Oracle, extra: Optional[list[pa.Field]] = None) -> pa.Schema:
    """The schema of ``oracle``'s reports (plus ``extra`` fields), with the oracle metadata."""
    return pa.schema(report_fields(oracle) + list(extra or []),
                     metadata={METADATA_KEY: oracle.metadata().encode()})


def unary_width(domain_size: int) -> int:
    return -(-domain_size // 8)


def oracle_of(schema: pa.Schema) -> Optional[Oracle]:
    """The oracle a report schema declares in its metadata (None when it declares none)."""
    meta = schema.metadata or {}
    if METADATA_KEY not in meta:
        return None
    return oracle_from_metadata(meta[METADATA_KEY])


def check_schema(oracle: Oracle, schema: pa.Schema) -> None:
    """Raise ValueError naming the problem if ``schema`` cannot hold ``oracle``'s reports."""
    declared = oracle_of(schema)
    if declared is not None and declared.metadata() != oracle.metadata():
        raise ValueError(f"these reports were randomized as {declared.metadata()} but are "
                         f"being aggregated as {oracle.metadata()}")
    for expected in report_fields(oracle):
        if expected.name not in schema.names:
            raise ValueError(f"{oracle.oracle_name} reports need a column {expected.name!r} "
                             f"({expected.type}); the input has {schema.names}")
        actual = schema.field(expected.name).type
        if not _compatible(expected.type, actual):
            raise ValueError(f"{oracle.oracle_name} reports: column {expected.name!r} must be "
                             f"{expected.type}, got {actual}"
                             + _width_hint(oracle, expected.type, actual))


def _compatible(expected: pa.DataType, actual: pa.DataType) -> bool:
    if expected == actual:
        return True
    if pa.types.is_fixed_size_binary(expected):
        return False  # the width is the domain: no silent truncation
    if pa.types.is_fixed_size_list(expected):
        return (pa.types.is_fixed_size_list(actual) and actual.list_size == expected.list_size
                and pa.types.is_integer(actual.value_type))
    if pa.types.is_boolean(expected):
        return pa.types.is_boolean(actual) or pa.types.is_integer(actual)
    return pa.types.is_integer(actual)  # CSV/JSON readers widen integers; values are checked


def _width_hint(oracle, expected, actual) -> str:
    if pa.types.is_fixed_size_binary(expected) and pa.types.is_fixed_size_binary(actual):
        return (f" -- {actual.byte_width * 8} bits per report, but domain {oracle.domain_size} "
                f"needs {expected.byte_width} bytes")
    if pa.types.is_fixed_size_list(expected) and pa.types.is_fixed_size_list(actual):
        return (f" -- hash functions of {actual.list_size} digits, but domain "
                f"{oracle.domain_size} needs {expected.list_size}")
    return ""


@dataclass(frozen=True, kw_only=True)
class ReportArrays:
    """Validated numpy views of a report batch (rows with faults already removed)."""

    n: int
    report: Optional[np.ndarray] = None   # binary_rr (uint8 0/1), grr (uint32), olh (uint16)
    bits: Optional[np.ndarray] = None     # unary: (n, width) uint8
    hash_a: Optional[np.ndarray] = None   # olh: (n, k) uint32
    hash_b: Optional[np.ndarray] = None   # olh: (n,) uint32
    dropped_null: int = 0
    dropped_out_of_domain: int = 0
    keep: Optional[np.ndarray] = None     # row mask of the input that survived (None = all)


def _as_table(batch) -> pa.Table:
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if not isinstance(batch, pa.Table):
        raise TypeError(f"reports must be a pyarrow Table or RecordBatch, got {type(batch).__name__}")
    return batch


def _column(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def report_arrays(oracle: Oracle, batch, *, on_invalid: str = "raise") -> ReportArrays:
    """Check ``batch`` against ``oracle`` and return its reports as numpy arrays.

    ``on_invalid``: "raise" (ValueError on the first null or out-of-domain report) or "drop"
    (such rows are removed and counted in ``dropped_null`` / ``dropped_out_of_domain``).
    """
    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    table = _as_table(batch)
    check_schema(oracle, table.schema)
    n_rows = table.num_rows
    names = [f.name for f in report_fields(oracle)]
    nulls = np.zeros(n_rows, dtype=bool)
    for name in names:
        column = _column(table, name)
        if column.null_count:
            nulls |= column.is_null().to_numpy(zero_copy_only=False)
    bad = np.zeros(n_rows, dtype=bool)
    values = {}
    if isinstance(oracle, UnaryEncoding):
        column = _column(table, "bits")
        width = unary_width(oracle.domain_size)
        raw = _fixed_binary_matrix(column, width)
        spare = width * 8 - oracle.domain_size
        if spare:  # padding bits beyond the domain must be zero
            bad |= (raw[:, -1] >> np.uint8(8 - spare)) != 0
        values["bits"] = raw
    elif isinstance(oracle, OLH):
        column = _column(table, "hash_a")
        flat = column.flatten()  # respects a slice's offset and length
        a = _integers(flat, 0, (1 << 32) - 1, "hash_a").astype(np.uint32)
        values["hash_a"] = a.reshape(n_rows, oracle.digits) if n_rows else a.reshape(0, oracle.digits)
        b_col = _column(table, "hash_b")
        values["hash_b"], bad_b = _checked(b_col, 1 << 32, np.uint32)
        y_col = _column(table, "report")
        values["report"], bad_y = _checked(y_col, oracle.buckets, np.uint16)
        bad |= bad_b | bad_y
    elif oracle.oracle_name == "binary_rr":
        column = _column(table, "report")
        if pa.types.is_boolean(column.type):
            values["report"] = column.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
        else:
            values["report"], bad_r = _checked(column, 2, np.uint8)
            bad |= bad_r
    else:
        column = _column(table, "report")
        values["report"], bad_r = _checked(column, oracle.domain_size, np.uint32)
        bad |= bad_r
    bad &= ~nulls
    if on_invalid == "raise" and (nulls.any() or bad.any()):
        row = int(np.nonzero(nulls | bad)[0][0])
        kind = "null" if nulls[row] else "out of the domain"
        raise ValueError(f"{oracle.oracle_name} report at row {row} is {kind} "
                         f"(domain {oracle.domain_size}"
                         + (f", {oracle.buckets} buckets" if isinstance(oracle, OLH) else "") + ")")
    keep = ~(nulls | bad)
    if keep.all():
        return ReportArrays(n=n_rows, **values)
    return ReportArrays(n=int(keep.sum()), **{k: v[keep] for k, v in values.items()},
                        dropped_null=int(nulls.sum()), dropped_out_of_domain=int(bad.sum()),
                        keep=keep)


def _fixed_binary_matrix(column: pa.Array, width: int) -> np.ndarray:
    n = len(column)
    if n == 0:
        return np.zeros((0, width), dtype=np.uint8)
    data = np.frombuffer(column.buffers()[1], dtype=np.uint8)
    start = column.offset * width
    return data[start:start + n * width].reshape(n, width)


def _integers(column: pa.Array, low: int, high: int, name: str) -> np.ndarray:
    if column.null_count:
        raise ValueError(f"{name} must not contain nulls")
    values = column.to_numpy(zero_copy_only=False)
    if values.size and (values.min() < low or values.max() > high):
        raise ValueError(f"{name} values must be in [{low}, {high}]")
    return values


def _checked(column: pa.Array, bound: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Integer values in [0, bound) as ``dtype``; out-of-range rows flagged (set to 0)."""
    if column.null_count:
        column = column.fill_null(0)
    values = column.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "u":
        bad = values >= np.uint64(bound) if values.dtype.itemsize == 8 else values >= bound
    else:
        values = values.astype(np.int64)
        bad = (values < 0) | (values >= bound)
    if bad.any():
        values = np.where(bad, 0, values)
    return values.astype(dtype), bad
