"""Impression rows (publisher, campaign, virtual person id) in Arrow batches -> partial sketches.

Pure Arrow/numpy, no Beam: one call turns a whole batch into one sketch per (campaign,
publisher) present in it, hashing and bucketing all ids of a group at once. Partial sketches of
the same key from different batches merge into exactly the sketch of all their rows.

Row rules (each dropped row is counted in :class:`RowCounts`, which goes to operator metrics,
never into a release):

* missing person id: null, empty/blank string, or (for ``IdType.INT``) not an integer in the
  int64 range -> dropped, ``missing_id``;
* missing campaign or publisher (null or empty) -> dropped, ``missing_key``;
* campaign or publisher not in the declared domain (when one is given) -> dropped,
  ``undeclared_key``: the set of released keys is public and never read from the data.

Id types: ``IdType.INT`` fingerprints the 64-bit integer; ``IdType.STRING`` fingerprints the
UTF-8 text (integers are first written in decimal). Every publisher of a campaign must use the
same id type or the same person gets two fingerprints.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.sketches.fingerprint import FingerprintSalt, fingerprint
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

__all__ = ["IdType", "ImpressionColumns", "RowCounts", "normalise_ids", "partial_sketches"]

_INT_PATTERN = r"^\s*[+-]?[0-9]+\s*$"


class IdType(str, enum.Enum):
    INT = "int"
    STRING = "string"


@dataclass(frozen=True)
class ImpressionColumns:
    """Column names of the impression log."""

    publisher: str = "publisher"
    campaign: str = "campaign"
    person: str = "vid"

    def names(self) -> list[str]:
        return [self.publisher, self.campaign, self.person]


@dataclass
class RowCounts:
    """Operator-side counts of one batch (never released)."""

    rows: int = 0
    used: int = 0
    missing_id: int = 0
    missing_key: int = 0
    undeclared_key: int = 0

    def __iadd__(self, other: "RowCounts") -> "RowCounts":
        for name in ("rows", "used", "missing_id", "missing_key", "undeclared_key"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


def _as_array(column) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


def _parse_int_strings(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(valid mask, int64 values) of decimal strings; out-of-range values are invalid."""
    valid = pc.fill_null(pc.match_substring_regex(text, _INT_PATTERN), False)
    valid = valid.to_numpy(zero_copy_only=False)
    values = np.zeros(len(text), np.int64)
    rows = np.flatnonzero(valid)
    if rows.size:
        stripped = pc.utf8_trim_whitespace(text.take(pa.array(rows)))
        try:
            values[rows] = pc.cast(stripped, pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, OverflowError):
            # Some value overflows int64: parse this batch's valid rows one by one.
            for i, s in zip(rows, stripped.to_pylist()):
                v = int(s)
                if -2 ** 63 <= v < 2 ** 63:
                    values[i] = v
                else:
                    valid[i] = False
    return valid, values


def normalise_ids(column, id_type: IdType | str):
    """(valid mask, ids) of an id column: int64 numpy ids or an Arrow string array."""
    column = _as_array(column)
    id_type = IdType(id_type)
    typ = column.type
    present = np.ones(len(column), bool) if not column.null_count else \
        column.is_valid().to_numpy(zero_copy_only=False)
    if id_type is IdType.INT:
        if pa.types.is_integer(typ):
            if pa.types.is_uint64(typ):
                big = pc.fill_null(pc.greater(column, pa.scalar(2 ** 63 - 1, pa.uint64())), True)
                present &= ~big.to_numpy(zero_copy_only=False)
            values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            return present, values
        if pa.types.is_floating(typ):
            vals = pc.fill_null(column, np.nan).to_numpy(zero_copy_only=False).astype(np.float64)
            with np.errstate(invalid="ignore"):
                ok = np.isfinite(vals) & (vals == np.floor(vals)) & (np.abs(vals) < 2.0 ** 63)
            return present & ok, np.where(ok, vals, 0).astype(np.int64)
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            valid, values = _parse_int_strings(column)
            return present & valid, values
        raise TypeError(f"id column: cannot read {typ} as integer ids")
    if pa.types.is_integer(typ):
        column = pc.cast(column, pa.large_string())
    elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        column = pc.cast(column, pa.large_binary())
    elif not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise TypeError(f"id column: cannot read {typ} as string ids")
    if pa.types.is_large_binary(column.type):
        nonblank = pc.greater(pc.binary_length(column), 0)
    else:
        nonblank = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0)
    present &= pc.fill_null(nonblank, False).to_numpy(zero_copy_only=False)
    return present, column


def _key_codes(column, declared: Optional[frozenset]):
    """(codes int64 with -1 = missing/undeclared, names, missing mask, undeclared mask)."""
    column = _as_array(column)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = pc.cast(column, pa.string())
    encoded = pc.dictionary_encode(column)
    names = encoded.dictionary.to_pylist()
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    blank = np.array([not (n or "").strip() for n in names] + [True], bool)
    missing = blank[codes]  # index -1 picks the trailing True (nulls)
    undeclared = np.zeros(len(codes), bool)
    if declared is not None:
        outside = np.array([n not in declared for n in names] + [False], bool)
        undeclared = outside[codes] & ~missing
    return codes, names, missing, undeclared


def partial_sketches(batch, *, config: SketchConfig, salt_of: Callable[[str], FingerprintSalt],
                     columns: ImpressionColumns = ImpressionColumns(),
                     id_type: IdType | str = IdType.INT,
                     campaigns: Optional[Iterable[str]] = None,
                     publishers: Optional[Iterable[str]] = None,
                     ) -> tuple[list[tuple[tuple[str, str], LiquidLegionsSketch]], RowCounts]:
    """Sketches of one batch of impression rows, keyed by (campaign, publisher), and row counts.

    ``salt_of(campaign)`` gives the campaign's fingerprint salt (shared by its publishers).
    ``campaigns``/``publishers``: the declared domain; None accepts every non-missing value.
    """
    if isinstance(batch, pa.RecordBatch):
        batch = pa.Table.from_batches([batch])
    missing_cols = [c for c in columns.names() if c not in batch.column_names]
    if missing_cols:
        raise ValueError(f"impression rows: missing column(s) {missing_cols}; "
                         f"have {batch.column_names}")
    counts = RowCounts(rows=batch.num_rows)
    if batch.num_rows == 0:
        return [], counts
    camp_codes, camp_names, camp_missing, camp_undeclared = _key_codes(
        batch.column(columns.campaign), None if campaigns is None else frozenset(campaigns))
    pub_codes, pub_names, pub_missing, pub_undeclared = _key_codes(
        batch.column(columns.publisher), None if publishers is None else frozenset(publishers))
    id_ok, ids = normalise_ids(batch.column(columns.person), id_type)

    key_missing = camp_missing | pub_missing
    undeclared = (camp_undeclared | pub_undeclared) & ~key_missing
    id_missing = ~id_ok & ~key_missing & ~undeclared
    keep = ~(key_missing | undeclared | id_missing)
    counts.missing_key = int(key_missing.sum())
    counts.undeclared_key = int(undeclared.sum())
    counts.missing_id = int(id_missing.sum())
    counts.used = int(keep.sum())

    rows = np.flatnonzero(keep)
    if rows.size == 0:
        return [], counts
    group = camp_codes[rows] * max(len(pub_names), 1) + pub_codes[rows]
    order = np.argsort(group, kind="stable")
    rows, group = rows[order], group[order]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    ends = np.r_[starts[1:], rows.size]
    out = []
    for s, e in zip(starts, ends):
        campaign = camp_names[camp_codes[rows[s]]]
        publisher = pub_names[pub_codes[rows[s]]]
        take = rows[s:e]
        group_ids = ids[take] if isinstance(ids, np.ndarray) else ids.take(pa.array(take))
        salt = salt_of(campaign)
        sketch = LiquidLegionsSketch.from_fingerprints(config, salt, fingerprint(group_ids, salt))
        out.append(((campaign, publisher), sketch))
    return out, counts
