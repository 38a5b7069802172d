"""Routing and per-key partial sums (pure: no Beam): what happens after contribution bounding.

* :func:`routing_hash` / :func:`shard_of` / :func:`split_by_shard`: a public 64-bit hash of a
  key (no secrecy needed, only a fixed well-spread hash, the same for data and keysets) routes
  rows and keys to shards, one vectorised ``take`` per shard (and feeds a PCollection keyset's
  membership filter, :mod:`transforms.membership`);
* :func:`key_partials`: bounded rows (see :mod:`transforms.bounding`) -> exact per-key partial
  aggregates (count, distinct units, sum, normalized sum);
* :func:`sum_partials`: merge partial tables of the same keys (associative and commutative, so a
  CombineFn may apply it in any order).
* :func:`check_int64_sums`: integer sums never wrap. Arrow's (and numpy's) int64 sums wrap
  around silently; every integer per-key sum here (and CentralNotice's impressions) is checked
  first and a total outside int64 fails with :class:`IntegerSumOverflowError`, naming the column
  and the number of keys, never a value. The check is vectorised: when max|v| · rows < 2^63 no
  group can overflow (the usual case, one min/max pass); otherwise each value is split into
  v = hi·2^32 + lo (hi = v >> 32, 0 <= lo < 2^32), both halves are summed per key without
  overflow (fewer than 2^31 rows), and the exact total hi_sum·2^32 + lo_sum is range-checked.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.bounding import PAIR, VALUE
from transforms.noise.mechanisms import IntegerSumOverflowError
from transforms.noise.prf import mac_keys, mac_words

# Routing keys to shards needs no secrecy, only a fixed, well-spread hash.
_PUBLIC_ROUTING_KEY = bytes(range(32))


def routing_hash(keys: pa.Table) -> np.ndarray:
    """A public 64-bit hash of each key (for sharding; the same for data and keysets)."""
    return mac_words(mac_keys(_PUBLIC_ROUTING_KEY, keys))[:, 0]


def shard_of(hashes: np.ndarray, num_shards: int) -> np.ndarray:
    return (hashes % np.uint64(num_shards)).astype(np.int64)


def split_by_shard(table: pa.Table, shards: np.ndarray):
    """Yield (shard, sub-table) for each shard present, vectorised (one ``take`` per shard)."""
    if table.num_rows == 0:
        return
    order = np.argsort(shards, kind="stable")
    sorted_shards = shards[order]
    boundaries = np.flatnonzero(np.diff(sorted_shards)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(order)]])
    for start, end in zip(starts, ends):
        yield int(sorted_shards[start]), table.take(pa.array(order[start:end]))


_INT64_MAX = 2 ** 63 - 1


def check_int64_sums(table: pa.Table, key_columns: Sequence[str], columns: Sequence[str],
                     what: str = "integer sum", display: Optional[Mapping[str, str]] = None) -> None:
    """Raise :class:`IntegerSumOverflowError` if a per-key sum of an int64 column leaves int64.

    Group sums are by ``key_columns`` (all rows together when empty). Columns of other types
    are ignored (real sums do not wrap). ``display`` renames internal columns in the message.
    """
    n = table.num_rows
    columns = [c for c in columns if pa.types.is_integer(table.schema.field(c).type)]
    if n == 0 or not columns:
        return
    risky = []
    for name in columns:
        bounds = pc.min_max(table.column(name))
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is not None and max(abs(low), abs(high)) * n > _INT64_MAX:
            risky.append(name)
    if not risky:
        return
    if n >= 2 ** 31:
        raise ValueError(f"{n} rows in one partial-sum batch: split the input (at most 2^31 - 1 rows)")
    parts = {}
    for name in risky:
        values = table.column(name).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        parts[f"{name}.hi"] = values >> 32
        parts[f"{name}.lo"] = values & np.int64(0xFFFFFFFF)
    split = pa.table({**{k: table.column(k) for k in key_columns}, **parts})
    if key_columns:
        grouped = split.group_by(list(key_columns), use_threads=False).aggregate(
            [(c, "sum") for c in parts])
        sums = {c: grouped.column(f"{c}_sum").to_numpy() for c in parts}
    else:
        sums = {c: np.array([int(v.sum())], dtype=np.int64) for c, v in parts.items()}
    for name in risky:
        lo = sums[f"{name}.lo"]
        hi = sums[f"{name}.hi"] + (lo >> 32)  # exact: |hi| < 2^62, lo >= 0
        over = (hi < -2 ** 31) | (hi >= 2 ** 31)
        if over.any():
            raise IntegerSumOverflowError(
                f"{what}: the per-key total of column {(display or {}).get(name, name)!r} is outside the int64 range "
                f"[-2^63, 2^63) for {int(over.sum())} key(s); refusing to release a wrapped "
                f"value (check the input values, the clamping or the contribution bounds)")


def key_partials(bounded: pa.Table, key_columns: Sequence[str], *, has_value: bool,
                 midpoint: float = 0.0, integer_sum: bool = False, half_range: float = None,
                 trees: Sequence = (), vector_columns: Sequence[str] = ()) -> pa.Table:
    """Exact per-key partial aggregates of bounded rows: count, units, and sum / nsum; with
    ``half_range`` also nsq (sum of ``(v - midpoint)^2 - half_range^2 / 2``, for variances);
    for each :class:`~transforms.quantiles.QuantileTree` in ``trees`` its node counts; the sums
    of ``vector_columns`` (clipped vector coordinates)."""
    aggregations = [([], "count_all"), (PAIR, "count_distinct")]
    aggregations += [(c, "sum") for c in vector_columns]
    table = bounded
    if has_value and half_range is not None:
        centred = pc.subtract(table.column(VALUE), pa.scalar(midpoint))
        table = table.append_column("__nsq", pc.subtract(pc.multiply(centred, centred),
                                                         pa.scalar(half_range * half_range / 2)))
        aggregations.append(("__nsq", "sum"))
    if has_value and trees:
        values = table.column(VALUE).to_numpy()
        for i, tree in enumerate(trees):
            table = table.append_column(f"__leaf{i}", pa.array(tree.leaf_of(values)))
            aggregations.append((f"__leaf{i}", "list"))
    if has_value:
        value = table.column(VALUE)
        if integer_sum:
            table = table.append_column("__ivalue", pc.cast(value, pa.int64()))
            check_int64_sums(table, key_columns, ["__ivalue"], "integer Sum", {"__ivalue": "value"})
            aggregations.append(("__ivalue", "sum"))
        else:
            aggregations.append((VALUE, "sum"))
        table = table.append_column("__nvalue", pc.subtract(value, pa.scalar(midpoint)))
        aggregations.append(("__nvalue", "sum"))
    grouped = table.group_by(list(key_columns), use_threads=False).aggregate(aggregations)
    columns = {k: grouped.column(k) for k in key_columns}
    columns["count"] = grouped.column("count_all").cast(pa.int64())
    columns["units"] = grouped.column(f"{PAIR}_count_distinct").cast(pa.int64())
    for c in vector_columns:
        columns[c] = grouped.column(f"{c}_sum")
    if has_value:
        columns["sum"] = grouped.column("__ivalue_sum" if integer_sum else f"{VALUE}_sum")
        columns["nsum"] = grouped.column("__nvalue_sum")
        if half_range is not None:
            columns["nsq"] = grouped.column("__nsq_sum")
        for i, tree in enumerate(trees):
            lists = grouped.column(f"__leaf{i}_list").combine_chunks()
            parents = pc.list_parent_indices(lists).to_numpy()
            leaves = pc.list_flatten(lists).to_numpy()
            histogram = np.bincount(parents * tree.leaves + leaves,
                                    minlength=grouped.num_rows * tree.leaves)
            nodes = tree.node_counts(histogram.reshape(grouped.num_rows, tree.leaves))
            for j, name in enumerate(tree.columns):
                columns[name] = pa.array(nodes[:, j].astype(np.int64))
    return pa.table(columns)


def sum_partials(tables: Sequence[pa.Table], key_columns: Sequence[str]) -> pa.Table:
    """Merge per-key partials (sums of every partial column)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    if len(tables) == 1:
        return tables[0]
    table = pa.concat_tables(tables, promote_options="permissive")
    value_columns = [c for c in table.column_names if c not in key_columns]
    check_int64_sums(table, key_columns, value_columns, "merging per-key partial sums")
    grouped = table.group_by(list(key_columns), use_threads=False).aggregate(
        [(c, "sum") for c in value_columns])
    return pa.table({**{k: grouped.column(k) for k in key_columns},
                     **{c: grouped.column(f"{c}_sum") for c in value_columns}})
