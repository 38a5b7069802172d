"""Impression rows (publisher, campaign, virtual person id) in Arrow batches -> partial sketches.

Pure Arrow/numpy, no Beam: one call turns a whole batch into one sketch per (campaign,
publisher) present in it, hashing and bucketing all ids of a group at once. Partial sketches of
the same key from different batches merge into exactly the sketch of all their rows.

Row rules (each dropped row is counted in :class:`RowCounts`, which goes to operator metrics,
never into a release):

* missing person id: null, NaN, empty/blank text, a non-integral number, or (for
  ``IdType.INT``) not an integer in the int64 range -> dropped, ``missing_id``;
* missing campaign or publisher (null or empty) -> dropped, ``missing_key``;
* campaign or publisher not in the declared domain (when one is given) -> dropped,
  ``undeclared_key``: the set of released keys is public and never read from the data.

Person ids are privacy units: each is put in its canonical form first
(:mod:`transforms.privacy_units`), so ``7`` (int64), ``7.0`` (float64), ``"7"``, ``" +007 "``
and ``"７"`` are one person, and ``"Alice"`` and ``"alice"`` too; a column whose type cannot hold
ids (booleans, dates, binary, nested) is refused. Id types: ``IdType.INT`` fingerprints the
canonical integer (rows whose id is not an integer in the int64 range are ``missing_id``);
``IdType.STRING`` fingerprints the canonical text. The id type is one setting per job, so every
publisher of a campaign uses the same one.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.privacy_units import canonical_unit_ids, check_unit_type
from transforms.sketches.fingerprint import FingerprintSalt, fingerprint
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

__all__ = ["IdType", "ImpressionColumns", "RowCounts", "normalise_ids", "partial_sketches"]

_INT_PATTERN = r"^-?[0-9]+$"  # a canonical integer id


class IdType(str, enum.Enum):
    INT = "int"
    STRING = "string"


@dataclass(frozen=True, kw_only=True)
class ImpressionColumns:
    """Column names of the impression log."""

    publisher: str = "publisher"
    campaign: str = "campaign"
    person: str = "vid"

    def names(self) -> list[str]:
        return [self.publisher, self.campaign, self.person]


@dataclass(frozen=True, kw_only=True)
class RowCounts:
    """Operator-side counts of one batch (never released)."""

    rows: int = 0
    used: int = 0
    missing_id: int = 0
    missing_key: int = 0
    undeclared_key: int = 0



def _as_array(column) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


def _parse_int_strings(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(valid mask, int64 values) of canonical decimal strings; out-of-range values are invalid."""
    valid = pc.fill_null(pc.match_substring_regex(text, _INT_PATTERN), False)
    valid = valid.to_numpy(zero_copy_only=False)
    values = np.zeros(len(text), np.int64)
    rows = np.flatnonzero(valid)
    if rows.size:
        digits = text.take(pa.array(rows))
        try:
            values[rows] = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, OverflowError):
            # Some value overflows int64: parse this batch's valid rows one by one.
            for i, s in zip(rows, digits.to_pylist()):
                v = int(s)
                if -2 ** 63 <= v < 2 ** 63:
                    values[i] = v
                else:
                    valid[i] = False
    return valid, values


def canonical_person_ids(column) -> pa.Array:
    """Canonical ids (:mod:`transforms.privacy_units`) of a person-id column, null where a row
    has no usable id (null, NaN, a non-integral or inexact number): those rows are dropped and
    counted by the caller. A column *type* that cannot hold ids raises UnitIdError."""
    column = _as_array(column)
    typ = column.type
    check_unit_type(typ, "person id")
    if pa.types.is_floating(typ):
        values = pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | (np.floor(values) != values) | (np.abs(values) >= 2.0 ** 53)
        if bad.any():
            column = pa.array(np.where(bad, 0.0, values), pa.float64(), mask=bad)
    elif pa.types.is_decimal(typ):
        integral = pc.match_substring_regex(pc.cast(column, pa.string()), r"^[+-]?[0-9]+(\.0*)?$")
        column = pc.if_else(pc.fill_null(integral, False), column, pa.scalar(None, typ))
    return canonical_unit_ids(column, "person id")


def normalise_ids(column, id_type: IdType | str):
    """(valid mask, ids) of an id column: int64 numpy ids or an Arrow string array.

    Every id is first put in its canonical form (so 7, 7.0, "7", " +007 " and fullwidth "７"
    are one person under either id type); ``IdType.INT`` then needs the canonical form to be an
    integer in the int64 range, ``IdType.STRING`` a non-empty text.
    """
    column = _as_array(column)
    id_type = IdType(id_type)
    typ = column.type
    if id_type is IdType.INT and pa.types.is_integer(typ):  # fast path: already canonical
        present = np.ones(len(column), bool) if not column.null_count else \
            column.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_uint64(typ):
            big = pc.fill_null(pc.greater(column, pa.scalar(2 ** 63 - 1, pa.uint64())), True)
            present &= ~big.to_numpy(zero_copy_only=False)
        return present, pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    ids = canonical_person_ids(column)
    present = ids.is_valid().to_numpy(zero_copy_only=False)
    if id_type is IdType.INT:
        valid, values = _parse_int_strings(ids)
        return present & valid, values
    nonblank = pc.fill_null(pc.greater(pc.utf8_length(ids), 0), False)
    return present & nonblank.to_numpy(zero_copy_only=False), ids


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
    counts = RowCounts(rows=batch.num_rows, used=int(keep.sum()), missing_id=int(id_missing.sum()),
                       missing_key=int(key_missing.sum()), undeclared_key=int(undeclared.sum()))

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
