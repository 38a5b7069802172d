"""CentralNotice impressions: Algorithm 1's split of pre-aggregated rows into blocks of k, without
materialising blocks, and the job's rule for bad impression rows (pure: no Beam; the job's DoFns in
:mod:`pipelines.centralnotice` call it per batch). Key columns are the job's
(:data:`pipelines.centralnotice.config.KEY_COLUMNS`).

The CentralNotice impressions table is pre-aggregated: a row says "n impressions of this banner
in this (country, project, date)", with no user attached. Algorithm 1 of the Wikimedia
feasibility report ("Differential privacy/Active/CentralNotice/Feasibility report" on
Meta-Wiki; seed 001_4177a0bca025ff82.txt) states the guarantee by splitting every row into
``floor(n / k)`` blocks of exactly ``k`` impressions plus one remainder block of ``n mod k``, and
treating each block as a privacy unit: the noisy per-key sum with clamping bounds ``[0, k]`` then
protects any ``k`` impressions per (geo, project) and period with sensitivity ``k``.

Compact form: a row is ``(block_size=k, full_blocks=n // k, remainder=n % k)``; its blocks are
``full_blocks`` copies of ``k`` and, if ``remainder > 0``, one block of ``remainder``. A row of
10^12 impressions with k = 1 stays three integers.

Clamping to ``[0, k]`` clamps nothing: a full block is exactly ``k`` and a remainder is in
``[0, k)``. So the clamped per-key sum equals the sum of the blocks, which equals the sum of the
row's impressions -- :func:`clamped_block_sum` computes it through the blocks anyway, so the code
matches the stated mechanism (sensitivity ``k`` per block, noise ``Laplace(k / epsilon)``).

Bad input rule (:func:`clean_impressions`, vectorised over a pyarrow Table, for the pipeline's
DoFn, which adds the returned counts to Beam metrics): a row is **dropped and counted** under the
first reason that applies, in this order --

* ``missing_key``: a null in campaign_id, banner_id, country, project or date;
* ``missing``: impressions null or NaN;
* ``unparseable``: impressions given as text that is not a number;
* ``negative``: impressions < 0;
* ``fractional``: impressions not a whole number (a count cannot be 2.5);
* ``too_large``: impressions above :data:`MAX_IMPRESSIONS` (2^53, beyond which a float input
  is no longer exact). Per-key sums of accepted rows can still leave int64 (1024 rows of 2^53):
  they are checked and the run fails with a clear message instead of wrapping
  (:func:`transforms.partials.check_int64_sums`).

Dropping a row depends only on that row, so it is a stable (1-to-at-most-1) transformation and
changes no privacy guarantee; the counts are for the operator and never enter a release.
Rows whose key is outside the public keyset are the keyset join's business, not this module's.

Duplicate rows for one key (same campaign_id, banner_id, country, project, date) are **summed**
by :func:`sum_duplicates`: they are impressions of the same key (e.g. two partial aggregates).
Splitting before or after summing gives the same per-key sum and the same sensitivity k per
block, so the choice only affects the block count, which is never released.
"""
from __future__ import annotations

import collections
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.validation import check_positive_int
from pipelines.centralnotice.config import KEY_COLUMNS
from transforms.partials import check_int64_sums

IMPRESSIONS = "impressions"
#: Largest accepted impressions count of one row (exact in float64; per-key sums are checked).
MAX_IMPRESSIONS = 2 ** 53
DROP_REASONS = ("missing_key", "missing", "unparseable", "negative", "fractional", "too_large")
_NUMBER = r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$"


# --------------------------------------------------------------------------- the split

def _as_counts(impressions) -> np.ndarray:
    arr = np.asarray(impressions)
    if arr.ndim != 1:
        raise ValueError(f"impressions must be one-dimensional, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"impressions must be integers (run clean_impressions first), got {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise ValueError("impressions must not be negative (run clean_impressions first)")
    return arr.astype(np.int64, copy=False)


def split_compact(impressions, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: ``(full_blocks, remainder) = (n // k, n % k)``; the blocks are ``full_blocks`` x k
    plus one block of ``remainder`` when it is positive."""
    k = check_positive_int(k, "k")
    n = _as_counts(impressions)
    return np.floor_divide(n, k), np.remainder(n, k)


def split_literal(n: int, k: int) -> list[int]:
    """The literal split of one row, one element per block (for tests and small examples)."""
    k = check_positive_int(k, "k")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    n = int(n)
    return [k] * (n // k) + ([n % k] if n % k else [])


def block_multiset(full_blocks: int, remainder: int, k: int) -> collections.Counter:
    """The blocks of one compact row as a multiset {block size: count} (no materialisation)."""
    counter = collections.Counter()
    if full_blocks:
        counter[k] += int(full_blocks)
    if remainder:
        counter[int(remainder)] += 1
    return counter


def clamped_block_sum(full_blocks, remainder, k: int) -> np.ndarray:
    """Per row: the sum of its blocks each clamped to ``[0, k]`` (equal to n: nothing is clamped)."""
    k = check_positive_int(k, "k")
    full_blocks = np.asarray(full_blocks, dtype=np.int64)
    remainder = np.asarray(remainder, dtype=np.int64)
    # A full block is exactly k, so clamping it to [0, k] leaves k; remainders are clipped as such.
    return full_blocks * k + np.clip(remainder, 0, k)


def split_table(table: pa.Table, k: int) -> pa.Table:
    """``table`` with the compact split appended: ``block_size``, ``full_blocks``, ``remainder``."""
    full, rem = split_compact(table.column(IMPRESSIONS).to_numpy(), k)
    return (table.append_column("block_size", pa.array(np.full(len(full), k, dtype=np.int64)))
            .append_column("full_blocks", pa.array(full))
            .append_column("remainder", pa.array(rem)))


def per_key_contribution(keys: pa.Table, impressions, k: int, key_columns: Sequence[str] = KEY_COLUMNS) -> pa.Table:
    """Per key: the clamped sum of all its blocks (the value Algorithm 1 adds noise to)."""
    full, rem = split_compact(impressions, k)
    values = clamped_block_sum(full, rem, k)
    table = keys.select(list(key_columns)).append_column(IMPRESSIONS, pa.array(values))
    check_int64_sums(table, key_columns, [IMPRESSIONS], "impressions per key")
    grouped = table.group_by(list(key_columns), use_threads=False).aggregate([(IMPRESSIONS, "sum")])
    return grouped.rename_columns(list(key_columns) + [IMPRESSIONS])


# --------------------------------------------------------------------------- bad input

def _check_columns(table: pa.Table, key_columns: Sequence[str]) -> None:
    if not isinstance(table, pa.Table):
        raise TypeError(f"expected a pyarrow Table, got {type(table).__name__}")
    missing = [c for c in list(key_columns) + [IMPRESSIONS] if c not in table.column_names]
    if missing:
        raise ValueError(f"impressions table is missing column(s) {missing}; it has {table.column_names}")
    col_type = table.schema.field(IMPRESSIONS).type
    if not (pa.types.is_integer(col_type) or pa.types.is_floating(col_type)
            or pa.types.is_decimal(col_type) or pa.types.is_string(col_type)
            or pa.types.is_large_string(col_type) or pa.types.is_null(col_type)):
        raise ValueError(f"column {IMPRESSIONS!r} must be numeric (or numeric text), got {col_type}")


def clean_impressions(table: pa.Table, key_columns: Sequence[str] = KEY_COLUMNS
                      ) -> tuple[pa.Table, dict[str, int]]:
    """Drop bad rows (see the module docstring); returns the clean table and counts by reason.

    The clean table has the key columns and ``impressions`` as int64. Missing columns or a
    non-numeric impressions type raise ValueError naming the column (a job-level fault).
    """
    _check_columns(table, key_columns)
    n = table.num_rows
    counts = dict.fromkeys(DROP_REASONS, 0)
    column = table.column(IMPRESSIONS).combine_chunks() if n else pa.array([], pa.float64())
    dropped = np.zeros(n, dtype=bool)

    def drop(reason: str, mask: np.ndarray) -> None:
        new = mask & ~dropped
        counts[reason] += int(new.sum())
        dropped[new] = True

    key_null = np.zeros(n, dtype=bool)
    for name in key_columns:
        key_null |= table.column(name).is_null().to_numpy(zero_copy_only=False)
    drop("missing_key", key_null)

    col_type = column.type
    if pa.types.is_string(col_type) or pa.types.is_large_string(col_type):
        is_null = column.is_null().to_numpy(zero_copy_only=False)
        stripped = pc.utf8_trim_whitespace(column)
        empty = pc.fill_null(pc.equal(stripped, ""), False).to_numpy(zero_copy_only=False)
        numeric = pc.fill_null(pc.match_substring_regex(column, _NUMBER), False) \
            .to_numpy(zero_copy_only=False)
        drop("missing", is_null | empty)
        drop("unparseable", ~numeric)
        values = pc.cast(pc.if_else(pa.array(numeric), stripped, pa.scalar(None, pa.string())),
                         pa.float64())
        column = values
    if pa.types.is_null(column.type):
        drop("missing", np.ones(n, dtype=bool))
        values = np.zeros(n, dtype=np.float64)
    elif pa.types.is_integer(column.type):
        drop("missing", column.is_null().to_numpy(zero_copy_only=False))
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
        if values.dtype == np.uint64:
            drop("too_large", values > MAX_IMPRESSIONS)
            values = np.where(dropped, 0, values).astype(np.int64)
    else:  # float or decimal (or text parsed to float above)
        as_float = pc.cast(column, pa.float64()) if not pa.types.is_float64(column.type) else column
        is_null = as_float.is_null().to_numpy(zero_copy_only=False)
        values = pc.fill_null(as_float, 0.0).to_numpy(zero_copy_only=False)
        drop("missing", is_null | np.isnan(values))
        values = np.where(dropped, 0.0, values)
    drop("negative", values < 0)
    if values.dtype.kind == "f":
        drop("fractional", np.isfinite(values) & (np.floor(values) != values))
        drop("too_large", ~np.isfinite(values) | (values > MAX_IMPRESSIONS))
        values = np.where(dropped, 0.0, values)
    else:
        drop("too_large", values > MAX_IMPRESSIONS)
    keep = ~dropped
    clean_values = np.asarray(values)[keep].astype(np.int64)
    clean = table.select(list(key_columns)).filter(pa.array(keep)) \
        .append_column(IMPRESSIONS, pa.array(clean_values, pa.int64()))
    return clean, counts


def sum_duplicates(table: pa.Table, key_columns: Sequence[str] = KEY_COLUMNS) -> pa.Table:
    """One row per key, duplicate rows' impressions summed (run on the output of clean_impressions)."""
    _check_columns(table, key_columns)
    check_int64_sums(table, key_columns, [IMPRESSIONS], "impressions of duplicate rows")
    grouped = table.group_by(list(key_columns), use_threads=False).aggregate([(IMPRESSIONS, "sum")])
    return grouped.rename_columns(list(key_columns) + [IMPRESSIONS])
