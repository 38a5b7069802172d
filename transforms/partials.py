"""Routing and per-key partial sums (pure: no Beam): what happens after contribution bounding.

* :func:`routing_hash` / :func:`shard_of` / :func:`split_by_shard`: a public 64-bit hash of a
  key (no secrecy needed, only a fixed well-spread hash, the same for data and keysets) routes
  rows and keys to shards, one vectorised ``take`` per shard (and feeds a PCollection keyset's
  membership filter, :mod:`transforms.membership`). It shapes no released value: routing decides
  only which worker sums and noises a key, and the filter's mistakes are removed by the exact
  keyset join;
* :func:`key_partials`: bounded rows (see :mod:`transforms.bounding`) -> exact per-key partial
  aggregates (count, distinct units, sum, normalized sum, and what a :class:`PartialsSpec`
  adds for the metrics that need more);
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

import functools
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.bounding import PAIR, VALUE
from transforms.noise.encoding import plain_column
from transforms.noise.mechanisms import IntegerSumOverflowError
from transforms.noise.prf import mac_keys, mac_words

# Routing keys to shards needs no secrecy, only a fixed, well-spread hash.
_PUBLIC_ROUTING_KEY = bytes(range(32))
_U = np.uint64
# Per component type, a constant folded into its word (so that 1, True and 1.0, which are
# different keys, do not start from the same word).
_TAG_INTEGER = _U(0x49C5A1F3D2B4E687)
_TAG_BOOLEAN = _U(0x42A3E5C7196B8D2F)
_TAG_FLOAT = _U(0x46D1B3F5A7C9E20B)
_TAG_OTHER = _U(0x53F7D9B1E3A5C70D)


def _mix(words: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser (Steele, Lea & Flood, "Fast splittable pseudorandom number
    generators", OOPSLA 2014): a bijection of 64-bit words that spreads every input bit over
    the output (multiplication wraps mod 2^64)."""
    words = (words ^ (words >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    words = (words ^ (words >> _U(27))) * _U(0x94D049BB133111EB)
    return words ^ (words >> _U(31))


def _component_words(column) -> np.ndarray:
    """One 64-bit word per value of a key column, a function of the value's canonical encoding
    alone (:mod:`transforms.noise.encoding`), whatever else its batch holds: equal keys get equal
    words in every batch, whatever their Arrow types (int32 and int64, a column with or without
    nulls). Integer, boolean and float values are read as numbers; other values (text, bytes,
    dates) are hashed through their canonical encoding; a null is one fixed word."""
    column = plain_column(column)
    typ = column.type
    if pa.types.is_integer(typ):
        # Two's complement words: a signed value's word is the value; an unsigned value at or
        # above 2^63 shares its word with a negative one (a collision routing tolerates).
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
        words = values.astype(np.int64 if pa.types.is_signed_integer(typ) else _U).view(_U) ^ _TAG_INTEGER
    elif pa.types.is_boolean(typ):
        words = pc.fill_null(column, False).to_numpy(zero_copy_only=False).astype(_U) ^ _TAG_BOOLEAN
    elif pa.types.is_floating(typ):
        values = pc.fill_null(column, 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        if np.isnan(values).any():
            raise ValueError("a key component must not be NaN")
        words = (values + 0.0).view(_U) ^ _TAG_FLOAT  # -0.0 as 0.0, as the encoding does
    else:
        return _encoded_words(column)
    if column.null_count:
        words[column.is_null().to_numpy(zero_copy_only=False)] = _null_word()
    return words


def _encoded_words(column: pa.Array) -> np.ndarray:
    return mac_words(mac_keys(_PUBLIC_ROUTING_KEY, pa.table({"k": column})))[:, 0] ^ _TAG_OTHER


@functools.cache
def _null_word() -> np.uint64:
    """A null's word: what a null in a column of any other type gets (its canonical encoding)."""
    return _encoded_words(pa.nulls(1))[0]


def routing_hash(keys: pa.Table) -> np.ndarray:
    """A public 64-bit hash of each key (for sharding and the keyset filter; the same for data
    and keysets): its columns' words (:func:`_component_words`) folded in order through the
    SplitMix64 finaliser. Not a PRF and not collision resistant: keys chosen to collide only
    share a shard or pass the filter together, which changes no released value."""
    hashes = np.full(keys.num_rows, _U(0x5851F42D4C957F2D) ^ _U(keys.num_columns), dtype=_U)
    for column in keys.columns:
        hashes = _mix(hashes ^ _component_words(column))
    return hashes


def shard_of(hashes: np.ndarray, num_shards: int) -> np.ndarray:
    return (hashes % np.uint64(num_shards)).astype(np.int64)


def split_by_shard(table: pa.Table, shards: np.ndarray):
    """Yield (shard, sub-table) for each shard present, vectorised (one ``take`` per shard)."""
    if table.num_rows == 0:
        return
    small = shards.size and 0 <= shards.min() and shards.max() < 1 << 16
    # Stable either way; numpy sorts 16-bit integers by radix, several times faster.
    order = np.argsort(shards.astype(np.uint16) if small else shards, kind="stable")
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


@dataclass(frozen=True, kw_only=True)
class PartialsSpec:
    """The per-key partial columns some metrics need beyond count, units, sum and nsum.

    half_range: half the clamping range, when a variance or standard deviation needs the sum of
    squares ``nsq``; trees: the :class:`~transforms.quantiles.QuantileTree` s whose node counts
    are partials; vector: a vector sum's clipping and shape
    (:class:`~transforms.vectors.VectorSpec`), whose coordinates' sums are partials.
    """

    half_range: Optional[float] = None
    trees: tuple = ()
    vector: Optional[object] = None

    def __post_init__(self):
        object.__setattr__(self, "trees", tuple(self.trees))

    def partial_types(self, *, has_value: bool, integer_sum: bool) -> dict:
        """Every partial column :func:`key_partials` gives with this spec, and its Arrow type."""
        types = {"count": pa.int64(), "units": pa.int64()}
        if self.vector is not None:
            types.update({name: pa.float64() for name in self.vector.columns})
        elif has_value:
            types.update(sum=pa.int64() if integer_sum else pa.float64(), nsum=pa.float64())
            if self.half_range is not None:
                types["nsq"] = pa.float64()
            for tree in self.trees:
                types.update({name: pa.int64() for name in tree.columns})
        return types


def key_partials(bounded: pa.Table, key_columns: Sequence[str], *, has_value: bool,
                 midpoint: float = 0.0, integer_sum: bool = False,
                 spec: PartialsSpec = PartialsSpec()) -> pa.Table:
    """Exact per-key partial aggregates of bounded rows: count, units, and sum / nsum; with
    ``spec.half_range`` also nsq (sum of ``(v - midpoint)^2 - half_range^2 / 2``, for
    variances); for each quantile tree of ``spec.trees`` its node counts; the sums of a vector
    sum's clipped coordinates (``spec.vector``)."""
    half_range, trees = spec.half_range, spec.trees
    vector_columns = spec.vector.columns if spec.vector is not None else ()
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
