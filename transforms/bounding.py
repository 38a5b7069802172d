"""Contribution bounding on Arrow tables, by keyed random priorities (pure: no Beam).

Each row gets three secret 64-bit values derived from the release key (AES PRF, see
:mod:`transforms.noise.prf`), each a function of the row's *content* only:

* ``__unit``: a PRF of the (canonical) privacy unit (groups a unit's rows; never the raw id);
* ``__pair``: a PRF of (unit, key), which is also the key's priority within its unit: one AES
  block, under its own sub-key, of the unit's 128-bit secret seed XOR the key's (each a PRF of
  its canonical encoding, computed once per distinct unit and per distinct key of a batch).
  Distinct (unit, key) pairs give distinct blocks except with probability ~2^-128 (the seeds
  are secret and uniform) and AES is a permutation, so pair priorities are independent;
* ``__row``: the row's priority, a PRF of (unit, key, value): one AES block of the pair's
  128-bit secret seed with the value's 64 bits folded in, under its own sub-key.

Bounding keeps, per unit, the L0 keys of smallest pair priority and, per (unit, key), the Linf
rows of smallest row priority (and, optionally, the L1 rows of smallest row priority per unit).
Priorities of distinct rows are independent and uniform (no bias towards first rows or small
keys). Byte-identical rows (same unit, key and clamped value) share a priority: they are
interchangeable, so a tie between them may break either way and the kept *multiset* is the same.
Hence:

* bounding is independent of batching, bundling, row order, file layout and runner: the kept
  rows are a function of the rows and the release key only;
* it is *mergeable*: ``bound(concat(bound(A), bound(B))) == bound(A ∪ B)`` (as multisets). So
  each batch is bounded before the shuffle (a unit with ten million rows never sits in memory:
  every batch sends at most L0·Linf of its rows) and partial results are re-bounded as they
  meet. The optional total bound L1 (:func:`bound_total`) is applied once, after all of a
  unit's partials have met.

Vectorised: per batch, one CBC-MAC pass per distinct unit and per distinct key, and one AES
call each for all pair and all row priorities. Bounding sorts by (unit, pair, row) priority; with a small L0 and
many rows per unit it first selects, in linear time, the rows of each unit's L0 smallest pairs
(per-unit minima), so only those are sorted.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.keys import ReleaseKey
from transforms.noise.encoding import encodes_fixed_width
from transforms.noise.prf import ecb, encrypt_words, mac_keys, mac_words

UNIT = "__unit"
PAIR = "__pair"
ROW = "__row"
VALUE = "__value"
INTERNAL = (UNIT, PAIR, ROW, VALUE)


def _distinct(table: pa.Table, columns: Sequence[str]):
    """Per row, a dense code of its values in ``columns``, and one representative row per code.

    Hash-based (Arrow's dictionary encoding, codes in order of first appearance), so a batch
    costs O(rows) rather than a sort; the first row of each code represents it."""
    indices = [_dense_codes(table.column(c).combine_chunks()) for c in columns]
    sizes = [int(i.max()) + 1 if i.size else 1 for i in indices]
    if len(indices) == 1:
        codes = indices[0]
    elif float(np.prod(sizes, dtype=np.float64)) < 2 ** 62:
        combined = np.zeros(table.num_rows, dtype=np.int64)
        for index, size in zip(indices, sizes):
            combined = combined * size + index
        codes = _dense_codes(pa.array(combined))
    else:
        _, first, codes = np.unique(np.stack(indices, axis=1), axis=0, return_index=True,
                                    return_inverse=True)
        return codes.reshape(-1), first
    first = _first_appearances(codes)
    if first is None:  # not in order of first appearance: a sort finds the representatives
        _, first, codes = np.unique(codes, return_index=True, return_inverse=True)
    return codes.reshape(-1), first


def _dense_codes(column: pa.Array) -> np.ndarray:
    """Codes 0, 1, 2, ... in order of first appearance, equal for equal values. A dictionary
    column (canonical unit ids: :func:`~transforms.privacy_units.canonical_unit_dictionary`) is
    coded by its indices: an integer encoding instead of hashing its values again (equal values
    under two indices would only be hashed twice, to the same word)."""
    if pa.types.is_dictionary(column.type):
        column = column.indices
    return pc.dictionary_encode(column).indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _first_appearances(codes: np.ndarray):
    """Row of each code's first appearance when codes 0, 1, 2, ... first appear in that order
    (as dictionary encoding numbers them); None otherwise."""
    if not codes.size:
        return np.zeros(0, dtype=np.int64)
    running = np.maximum.accumulate(codes)
    new = np.empty(codes.size, dtype=bool)
    new[0] = True
    new[1:] = running[1:] > running[:-1]
    first = np.flatnonzero(new)
    return first if np.array_equal(codes[first], np.arange(first.size)) else None


def _keyed_hash(release_key: ReleaseKey, purpose: str, table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """PRF (AES CBC-MAC) of each row's values in ``columns``, as (n, 2) uint64 words.

    Fixed-width keys (integers, booleans, floats: a few AES blocks) are MAC'd row by row, which
    costs less than finding the distinct rows; a dictionary column (canonical unit ids:
    :func:`~transforms.privacy_units.canonical_unit_dictionary`) has its dictionary MAC'd and
    gathered by index; other keys are MAC'd once per distinct value. A MAC is a function of the
    value alone, so all three give the same words."""
    secret = release_key.subkey(purpose).secret_bytes()
    selected = table.select(list(columns))
    if encodes_fixed_width(selected):
        return mac_words(mac_keys(secret, selected))
    if len(columns) == 1:
        column = selected.column(0).combine_chunks()
        if pa.types.is_dictionary(column.type) and not column.null_count \
                and len(column.dictionary) <= len(column):
            words = mac_words(mac_keys(secret, pa.table({"k": column.dictionary})))
            return np.take(words, column.indices.to_numpy(zero_copy_only=False), axis=0)
    codes, first = _distinct(table, columns)
    return np.take(mac_words(mac_keys(secret, selected.take(first))), codes, axis=0)


def _encrypt(key: bytes, blocks: np.ndarray) -> np.ndarray:
    """AES-256 (ECB: independent blocks) of each (n, 2) uint64 block, as (n, 2) uint64."""
    return encrypt_words(ecb(key), np.ascontiguousarray(blocks, dtype=np.uint64))


def _value_words(table: pa.Table, value_column: Optional[str]) -> np.ndarray:
    """The 64 bits of each row's value (float64, -0.0 as 0.0); zeros without a value column."""
    if value_column is None:
        return np.zeros(table.num_rows, dtype=np.uint64)
    values = pc.cast(table.column(value_column), pa.float64()).to_numpy(zero_copy_only=False)
    return (np.asarray(values, dtype=np.float64) + 0.0).view(np.uint64)


def prioritize(table: pa.Table, unit_column: str, key_columns: Sequence[str],
               release_key: ReleaseKey, value_column: Optional[str] = None,
               extra_words: Optional[np.ndarray] = None) -> pa.Table:
    """Add the secret ``__unit``, ``__pair`` and ``__row`` columns to a batch of rows.

    ``unit_column`` must hold canonical ids (:mod:`transforms.privacy_units`); ``value_column``
    (the clamped value, if any) and ``extra_words`` (64 bits per row of other content, e.g. a
    clipped vector: :func:`transforms.vectors.row_words`) enter the row priority, so identical
    rows share one.
    """
    unit_words = _keyed_hash(release_key, "bound:unit", table, [unit_column])
    key_words = _keyed_hash(release_key, "bound:key", table, list(key_columns)) if key_columns \
        else np.zeros_like(unit_words)  # no key: one "key" per unit, its pair seed the unit's
    pair_words = _encrypt(release_key.subkey("bound:pair").secret_bytes(), unit_words ^ key_words)
    # Row priority: AES under its own sub-key of (pair seed XOR value bits, pair seed). Distinct
    # (pair, value) give distinct blocks except with probability ~2^-128 (the seeds are secret
    # and uniform), and AES is a permutation, so distinct rows get independent priorities.
    block = pair_words.copy()
    block[:, 0] ^= _value_words(table, value_column)
    if extra_words is not None:
        block[:, 0] ^= np.asarray(extra_words, dtype=np.uint64)
    row_words = _encrypt(release_key.subkey("bound:row").secret_bytes(), block)
    return table.append_column(UNIT, pa.array(unit_words[:, 0])) \
                .append_column(PAIR, pa.array(pair_words[:, 0])) \
                .append_column(ROW, pa.array(row_words[:, 0]))


def _group_starts(flags: np.ndarray) -> np.ndarray:
    """For each position, the index where its run (started where flags is True) begins."""
    idx = np.arange(flags.size)
    return np.maximum.accumulate(np.where(flags, idx, 0))


def _stable_order(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """Row order sorting by ``columns`` (first column first), stable: ``np.lexsort`` of them
    reversed, computed by Arrow's multi-key sort (about twice as fast on 64-bit priorities)."""
    keys = [(c, "ascending") for c in columns]
    return pc.sort_indices(table.select(list(columns)), sort_keys=keys).to_numpy()


#: Bounds up to this many keys per unit pre-select rows before sorting (:func:`bound`).
PRESELECT_MAX_PARTITIONS = 8
_NO_PAIR = np.uint64(np.iinfo(np.uint64).max)


def _rows_of_smallest_pairs(table: pa.Table, max_partitions: int) -> Optional[np.ndarray]:
    """A mask of rows holding every row of each unit's ``max_partitions`` smallest pair
    priorities (and perhaps a few more), found in O(rows) by per-unit minima; None when that
    would not pay (large bounds, or units with few rows each). Bounding the selected rows keeps
    exactly the rows bounding all of them keeps, in the same order: a unit's kept keys are among
    its smallest pairs, and all of those pairs' rows are selected, in their original order."""
    n = table.num_rows
    if max_partitions > PRESELECT_MAX_PARTITIONS or n < 1024:
        return None
    encoded = pc.dictionary_encode(table.column(UNIT).combine_chunks())
    num_units = len(encoded.dictionary)
    if 4 * num_units * max_partitions > n:
        return None
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    remaining = table.column(PAIR).to_numpy().copy()
    selected = np.zeros(n, dtype=bool)
    for _ in range(max_partitions):
        smallest = np.full(num_units, _NO_PAIR, dtype=np.uint64)
        np.minimum.at(smallest, codes, remaining)
        # A unit without more pairs has _NO_PAIR as its minimum and selects rows again (a
        # superset is harmless, as is a genuine pair priority of 2^64 - 1).
        hit = remaining == smallest[codes]
        selected |= hit
        remaining[hit] = _NO_PAIR
    return selected


def bound(table: pa.Table, max_partitions: int, max_per_partition: int) -> pa.Table:
    """Keep at most ``max_partitions`` keys per unit and ``max_per_partition`` rows per key.

    A table without ``__row`` (rows that are nothing but their unit and key, e.g. for a count,
    after :func:`without_row_priority`) keeps rows of a (unit, key) in any order: they are
    identical, so the kept multiset is the same."""
    n = table.num_rows
    if n == 0:
        return table
    candidates = _rows_of_smallest_pairs(table, max_partitions)
    if candidates is not None:
        table = table.filter(pa.array(candidates))
        n = table.num_rows
    order = _stable_order(table, [UNIT, PAIR] + ([ROW] if ROW in table.column_names else []))
    unit = table.column(UNIT).to_numpy()[order]
    pair = table.column(PAIR).to_numpy()[order]
    new_unit = np.empty(n, dtype=bool)
    new_unit[0] = True
    new_unit[1:] = unit[1:] != unit[:-1]
    new_pair = new_unit.copy()
    new_pair[1:] |= pair[1:] != pair[:-1]
    row_rank = np.arange(n) - _group_starts(new_pair)
    pair_index = np.cumsum(new_pair) - 1
    pair_rank = pair_index - pair_index[_group_starts(new_unit)]
    keep = (row_rank < max_per_partition) & (pair_rank < max_partitions)
    if keep.all():
        return table.take(pa.array(order))
    return table.take(pa.array(order[keep]))


def without_row_priority(table: pa.Table) -> pa.Table:
    """``table`` without its ``__row`` column: for rows whose content is only their unit and key
    (no value, and no total bound L1 that ranks a unit's rows across keys), where every row of a
    (unit, key) has the same row priority and the column only costs 8 bytes per row."""
    return table.drop_columns([ROW]) if ROW in table.column_names else table


def bound_total(table: pa.Table, max_contributions: int) -> pa.Table:
    """Keep at most ``max_contributions`` rows per unit (smallest row priorities)."""
    n = table.num_rows
    if n == 0:
        return table
    order = _stable_order(table, [UNIT, ROW])
    unit = table.column(UNIT).to_numpy()[order]
    new_unit = np.empty(n, dtype=bool)
    new_unit[0] = True
    new_unit[1:] = unit[1:] != unit[:-1]
    keep = (np.arange(n) - _group_starts(new_unit)) < max_contributions
    return table.take(pa.array(order[keep]))


def rebound(tables: Sequence[pa.Table], max_partitions: int, max_per_partition: int) -> list:
    """Tables of bounded rows -> a list of one table of their rows bounded again (mergeability:
    the rows bounding all of them at once would keep); a single table is already bounded and
    returned as it is, [] for no table."""
    if len(tables) <= 1:
        return list(tables)
    table = pa.concat_tables(list(tables), promote_options="permissive")
    return [bound(table, max_partitions, max_per_partition)]


def accumulate(tables: list, table: pa.Table, max_partitions: int, max_per_partition: int,
               min_rows: int = 200_000) -> list:
    """Add a bounded batch to ``tables`` (a list whose first table is the last re-bounding) and
    re-bound them once they hold more than ``max(min_rows, twice that table)`` rows: the cost is
    amortised O(n log n) and the list holds at most about twice the bounded rows of its units."""
    if table is not None and table.num_rows:
        tables.append(table)
        if len(tables) > 1 and sum(t.num_rows for t in tables) > max(min_rows, 2 * tables[0].num_rows):
            return rebound(tables, max_partitions, max_per_partition)
    return tables
