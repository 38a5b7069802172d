"""The wire format: Arrow columns of browser reports and helper outputs, and their checks.

One stream of reports per helper (a table, or files, each holding only that helper's reports):

* aggregation report (Algorithm 2): ``batch_id`` (string, assigned by the ad server),
  ``report_id`` (32 hex digits, random, the same in every helper's copy), ``helper`` (the index
  the report is addressed to), ``key`` (the context the paper's Section 3.3.1 reveals to the
  helpers) and one ``share_<value column>`` (uint64 ring element) per value;
* gradient report (Algorithm 3): ``batch_id``, ``report_id``, ``helper``, features ``x_0`` ..
  ``x_{d-1}`` (bytes, possibly locally noised), ``label_a``/``label_b`` (real and fake label in
  random order), ``mask_a``/``mask_b`` (this helper's mask shares) and ``blind_0`` .. ``blind_d``
  (this helper's share of the zero blinding vector, one per gradient coordinate).

Helper outputs (one table per batch, rows sorted by key or coordinate -- a public order) carry
``batch_id``, ``batch_digest`` (SHA-256 of the batch's sorted report ids: the ad server knows
them, so it reveals nothing, and it proves that all helpers summed the same reports),
``params_digest`` (the public parameters and model), ``helper``, ``num_helpers`` and the noisy
ring sums.

Every uint64 column is accepted as uint64, as int64 (two's complement), or as decimal text (CSV).
A report that does not parse is dropped and counted by the caller; dropping it in one helper's
stream only makes that helper's batch digest differ, so the ad server refuses the combination
instead of decoding garbage.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPORT_ID_HEX = 32
AGGREGATION_OUTPUT_FIXED = ("batch_id", "batch_digest", "params_digest", "helper", "num_helpers",
                            "key")
GRADIENT_OUTPUT_COLUMNS = ("batch_id", "batch_digest", "params_digest", "helper", "num_helpers",
                           "coordinate", "share")

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_HEX_VALUE = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_VALUE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_VALUE[_c] = 10 + _i
_U64_MAX_TEXT = str(2 ** 64 - 1)


class LarkInputError(ValueError):
    """Reports or helper outputs that must not be processed (wrong helper, mixed batches, ...)."""


def share_column(value_column: str) -> str:
    return f"share_{value_column}"


def feature_columns(num_features: int) -> list[str]:
    return [f"x_{j}" for j in range(num_features)]


def blind_columns(dimension: int) -> list[str]:
    return [f"blind_{j}" for j in range(dimension)]


def aggregation_report_columns(value_columns) -> list[str]:
    return ["batch_id", "report_id", "helper", "key"] + [share_column(c) for c in value_columns]


def gradient_report_columns(num_features: int) -> list[str]:
    return (["batch_id", "report_id", "helper"] + feature_columns(num_features)
            + ["label_a", "label_b", "mask_a", "mask_b"] + blind_columns(num_features + 1))


def aggregation_output_schema(value_columns) -> pa.Schema:
    return pa.schema([("batch_id", pa.string()), ("batch_digest", pa.string()),
                      ("params_digest", pa.string()), ("helper", pa.int32()),
                      ("num_helpers", pa.int32()), ("key", pa.string())]
                     + [(share_column(c), pa.uint64()) for c in value_columns])


def gradient_output_schema() -> pa.Schema:
    return pa.schema([("batch_id", pa.string()), ("batch_digest", pa.string()),
                      ("params_digest", pa.string()), ("helper", pa.int32()),
                      ("num_helpers", pa.int32()), ("coordinate", pa.int32()),
                      ("share", pa.uint64())])


# --------------------------------------------------------------------------- report ids

def ids_to_hex(words: np.ndarray) -> pa.Array:
    """(n, 2) uint64 words -> n strings of 32 lowercase hex digits (big-endian)."""
    words = np.ascontiguousarray(words, dtype=np.uint64)
    n = words.shape[0]
    raw = words.astype(">u8").view(np.uint8).reshape(n, 16)
    chars = np.empty((n, 32), dtype=np.uint8)
    chars[:, 0::2] = _HEX_DIGITS[raw >> 4]
    chars[:, 1::2] = _HEX_DIGITS[raw & 15]
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()),
                                       pa.py_buffer(chars.tobytes()))


def hex_to_ids(column) -> tuple[np.ndarray, np.ndarray]:
    """Report ids as (n, 2) uint64 words, and a mask of the rows that hold a valid id."""
    column = _plain(column).cast(pa.string())
    n = len(column)
    words = np.zeros((n, 2), dtype=np.uint64)
    valid = np.asarray(pc.fill_null(pc.equal(pc.utf8_length(column), REPORT_ID_HEX), False))
    if not valid.any():
        return words, valid
    good = column.filter(pa.array(valid)) if not valid.all() else column
    index = np.nonzero(valid)[0]
    data = _fixed_width_bytes(good, REPORT_ID_HEX)
    try:  # the fast path: every id is hex
        raw = np.frombuffer(bytes.fromhex(data.decode("ascii")), dtype=np.uint8).reshape(-1, 16)
        ok = np.ones(len(index), dtype=bool)
    except ValueError:
        values = _HEX_VALUE[np.frombuffer(data, dtype=np.uint8)].reshape(-1, 32)
        ok = np.all(values != 255, axis=1)
        nibbles = np.where(values == 255, 0, values).astype(np.uint8)
        raw = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    words[index] = raw.view(">u8").reshape(-1, 2).astype(np.uint64)
    valid[index[~ok]] = False
    return words, valid


def _fixed_width_bytes(strings: pa.Array, width: int) -> bytes:
    """The concatenated bytes of strings known to be ``width`` bytes each."""
    strings = strings.cast(pa.large_string())
    if strings.offset or strings.null_count:
        strings = pa.concat_arrays([strings])
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int64)[:len(strings) + 1]
    data = strings.buffers()[2]
    raw = memoryview(data)[offsets[0]:offsets[-1]] if data is not None else b""
    out = bytes(raw)
    if len(out) != width * len(strings):  # multi-byte characters
        out = b"".join(s.encode() for s in strings.to_pylist())
        if len(out) != width * len(strings):
            raise LarkInputError("report ids must be ASCII hex digits")
    return out


def batch_digest(sorted_ids: np.ndarray) -> str:
    """SHA-256 of the batch's report ids (sorted (n, 2) uint64, big-endian bytes)."""
    data = np.ascontiguousarray(sorted_ids, dtype=np.uint64).astype(">u8").tobytes()
    return hashlib.sha256(b"masked-lark/batch/v1:" + data).hexdigest()[:32]


def sort_ids(ids: np.ndarray) -> np.ndarray:
    """Rows of (n, 2) uint64 ids in lexicographic order."""
    if len(ids) == 0:
        return ids.reshape(0, 2)
    order = np.argsort(ids[:, 0])
    first = ids[order, 0]
    if np.any(first[1:] == first[:-1]):  # ties in the first word: order by both
        order = np.lexsort((ids[:, 1], ids[:, 0]))
    return ids[order]


def count_duplicates(sorted_ids: np.ndarray) -> int:
    if len(sorted_ids) < 2:
        return 0
    same = np.all(sorted_ids[1:] == sorted_ids[:-1], axis=1)
    return int(same.sum())


# --------------------------------------------------------------------------- column coercion

def _plain(column):
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


def uint64_column(column) -> tuple[np.ndarray, np.ndarray]:
    """Ring elements from a uint64, signed integer or decimal-text column; and a validity mask."""
    column = _plain(column)
    n = len(column)
    typ = column.type
    valid = np.asarray(pc.is_valid(column))
    if pa.types.is_unsigned_integer(typ) or pa.types.is_signed_integer(typ):
        filled = pc.fill_null(column, 0)
        values = filled.to_numpy(zero_copy_only=False)
        if pa.types.is_signed_integer(typ):
            values = values.astype(np.int64).view(np.uint64)
        return values.astype(np.uint64), valid
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        text = pc.utf8_trim_whitespace(column)
        length = pc.utf8_length(text)
        digits = pc.utf8_is_digit(text)
        ok = pc.and_(pc.and_(digits, pc.greater(length, 0)), pc.less_equal(length, 20))
        ok20 = pc.or_(pc.less(length, 20), pc.less_equal(text, _U64_MAX_TEXT))
        ok = np.asarray(pc.fill_null(pc.and_(ok, ok20), False))
        values = np.zeros(n, dtype=np.uint64)
        if ok.any():
            values[ok] = text.filter(pa.array(ok)).cast(pa.uint64()).to_numpy(zero_copy_only=False)
        return values, ok
    raise LarkInputError(f"a share column must hold unsigned 64-bit integers or decimal text, "
                         f"got {typ}")


def int_column(column, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    """Small integers (labels, bytes, helper index) from an integer, float or text column."""
    column = _plain(column)
    typ = column.type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        text = pc.utf8_trim_whitespace(column)
        ok = pc.and_(pc.utf8_is_digit(text), pc.less_equal(pc.utf8_length(text), 6))
        ok = np.asarray(pc.fill_null(ok, False))
        values = np.zeros(len(column), dtype=np.int64)
        if ok.any():
            values[ok] = text.filter(pa.array(ok)).cast(pa.int64()).to_numpy(zero_copy_only=False)
    elif pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        raw = pc.fill_null(column.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
        ok = np.isfinite(raw) & (raw == np.floor(raw))
        values = np.where(ok, raw, 0).astype(np.int64)
    else:
        raise LarkInputError(f"expected an integer column, got {typ}")
    ok &= (values >= low) & (values <= high)
    return values, ok


def string_column(column) -> tuple[pa.Array, np.ndarray]:
    column = _plain(column)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = column.cast(pa.string())
    return column.cast(pa.string()), np.asarray(pc.is_valid(column))


def require_columns(table: pa.Table, columns, what: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise LarkInputError(f"{what} lack column(s) {missing} (have {table.column_names})")
