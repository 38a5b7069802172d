"""Contribution bounding on Arrow tables: invariants, mergeability, uniformity (no Beam)."""
import collections
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from transforms import bounding
from transforms.partials import key_partials, sum_partials
from accounting.keys import ReleaseKey

KEY = ReleaseKey.for_testing(11)


def _table(rows):
    units, keys, values = zip(*rows) if rows else ((), (), ())
    return pa.table({"unit": pa.array(units, pa.string()), "k": pa.array(keys, pa.int64()),
                     "__value": pa.array(values, pa.float64())})


def _prepared(rows, key=KEY):
    return bounding.prioritize(_table(rows), "unit", ["k"], key, "__value")


rows_strategy = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 6),
                                   st.integers(0, 3).map(float)), max_size=120)


def _multiset(table):
    return collections.Counter(zip(table.column(bounding.UNIT).to_pylist(),
                                   table.column("k").to_pylist(),
                                   table.column(bounding.ROW).to_pylist()))


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, l0=st.integers(1, 4), linf=st.integers(1, 4))
def test_bound_invariants(rows, l0, linf):
    bounded = bounding.bound(_prepared(rows), l0, linf)
    name_of = {_unit_hash(u): u for u in {r[0] for r in rows}}
    kept = collections.Counter(zip((name_of[h] for h in bounded.column(bounding.UNIT).to_pylist()),
                                   bounded.column("k").to_pylist()))
    original = collections.Counter((r[0], r[1]) for r in rows)
    assert all(c <= linf for c in kept.values())
    assert all(c <= l0 for c in collections.Counter(u for u, _ in kept).values())
    for (unit, key), count in kept.items():
        assert count == min(original[(unit, key)], linf)  # a kept key keeps as many rows as allowed
    for unit in {r[0] for r in rows}:
        keys_of_unit = {k for (u, k) in original if u == unit}
        assert len({k for (u, k) in kept if u == unit}) == min(len(keys_of_unit), l0)


def _unit_hash(unit):
    return _prepared([(unit, 0, 0.0)]).column(bounding.UNIT)[0].as_py()


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, split=st.integers(0, 120), l0=st.integers(1, 3), linf=st.integers(1, 3))
def test_bound_is_mergeable(rows, split, l0, linf):
    table = _prepared(rows)
    whole = bounding.bound(table, l0, linf)
    a, b = table.slice(0, split), table.slice(split)
    merged = bounding.bound(pa.concat_tables([bounding.bound(a, l0, linf), bounding.bound(b, l0, linf)]),
                            l0, linf)
    assert _multiset(merged) == _multiset(whole)


def test_total_bound():
    rows = [("a", k, 1.0) for k in range(5) for _ in range(3)] + [("b", 1, 1.0)]
    bounded = bounding.bound_total(bounding.bound(_prepared(rows), 5, 3), 4)
    counts = collections.Counter(bounded.column(bounding.UNIT).to_pylist())
    assert sorted(counts.values()) == [1, 4]


def test_kept_subset_is_uniform():
    # One unit with 10 keys x 4 rows; L0 = 3, Linf = 1. Over many release keys each key is kept
    # with probability 3/10 and each row of a key with probability 1/4 (no bias to first rows).
    rows = [("u", k, float(r)) for k in range(10) for r in range(4)]
    key_hits = np.zeros(10)
    row_hits = np.zeros(4)
    trials = 600
    for seed in range(trials):
        bounded = bounding.bound(_prepared(rows, ReleaseKey.for_testing(1000 + seed)), 3, 1)
        for k, v in zip(bounded.column("k").to_pylist(), bounded.column("__value").to_pylist()):
            key_hits[k] += 1
            row_hits[int(v)] += 1
    assert stats.chisquare(key_hits).pvalue > 1e-3
    assert key_hits.sum() == 3 * trials
    assert stats.chisquare(row_hits).pvalue > 1e-3


def test_priorities_are_secret_and_reproducible():
    rows = [("a", 1, 1.0), ("b", 2, 2.0)]
    first = _prepared(rows)
    again = _prepared(rows)
    other = _prepared(rows, ReleaseKey.for_testing(12))
    assert first.column(bounding.ROW).equals(again.column(bounding.ROW))
    assert not first.column(bounding.ROW).equals(other.column(bounding.ROW))


def test_pair_priorities_are_per_unit_and_key():
    # A pair priority depends on both the unit and the key: the same key ranks differently in
    # different units (so no key is favoured across units) and a unit's keys rank independently;
    # a unit's pair priority is the same in any batch; without key columns each unit has one.
    units, keys = [f"u{i}" for i in range(200)], list(range(20))
    table = _prepared([(u, k, 0.0) for u in units for k in keys])
    pair = np.array(table.column(bounding.PAIR).to_pylist(), dtype=np.uint64).reshape(len(units), len(keys))
    assert np.unique(pair).size == pair.size
    # Which key is a unit's first: spread over the keys (chi-square), not one key for all units.
    firsts = np.bincount(np.argmin(pair, axis=1), minlength=len(keys))
    assert stats.chisquare(firsts).pvalue > 1e-3
    alone = _prepared([("u7", 3, 0.0), ("zz", 9, 1.0)])
    assert alone.column(bounding.PAIR)[0].as_py() == int(pair[7, 3])
    keyless = bounding.prioritize(_table([("a", 1, 0.0), ("b", 1, 0.0), ("a", 2, 1.0)]), "unit", [], KEY,
                                  "__value")
    assert keyless.column(bounding.PAIR).to_pylist()[0] == keyless.column(bounding.PAIR).to_pylist()[2]
    assert keyless.column(bounding.PAIR).to_pylist()[0] != keyless.column(bounding.PAIR).to_pylist()[1]


def test_key_partials_and_sum():
    rows = [("a", 1, 2.0), ("a", 1, 3.0), ("b", 1, 1.0), ("b", 2, 4.0)]
    bounded = bounding.bound(_prepared(rows), 5, 5)
    partials = key_partials(bounded, ["k"], has_value=True, midpoint=1.0)
    got = {r["k"]: r for r in partials.to_pylist()}
    assert got[1]["count"] == 3 and got[1]["units"] == 2 and got[1]["sum"] == 6.0 and got[1]["nsum"] == 3.0
    assert got[2]["count"] == 1 and got[2]["units"] == 1
    total = sum_partials([partials, partials], ["k"])
    assert {r["k"]: r["count"] for r in total.to_pylist()} == {1: 6, 2: 2}


def _kept(batches, l0, linf, l1, key=KEY):
    """Prioritize each batch on its own, bound it, re-bound the union, then the total bound."""
    bounded = [bounding.bound(_prepared(b, key), l0, linf) for b in batches]
    union = bounding.bound(pa.concat_tables(bounded), l0, linf)
    union = bounding.bound_total(union, l1)
    return collections.Counter(zip(union.column("k").to_pylist(), union.column("__value").to_pylist()))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10 ** 6), cut=st.integers(1, 59))
def test_kept_rows_do_not_depend_on_batching_or_order(seed, cut):
    """Issue 10 point 5: priorities from row content only. The same rows cut into other batches,
    in another order, keep the same rows when Linf and L1 bind (duplicates included)."""
    rng = np.random.default_rng(seed)
    rows = [("u", int(rng.integers(0, 4)), float(rng.integers(0, 6))) for _ in range(60)]
    whole = _kept([rows], 3, 2, 4)
    shuffled = [rows[i] for i in rng.permutation(len(rows))]
    assert _kept([shuffled[cut:], shuffled[:cut]], 3, 2, 4) == whole
    assert _kept([[r] for r in reversed(rows)], 3, 2, 4) == whole
    assert sum(whole.values()) == 4


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, split=st.integers(0, 120), l0=st.integers(1, 3), linf=st.integers(1, 3))
def test_rows_of_unit_and_key_only_bound_alike_without_their_row_priority(rows, split, l0, linf):
    """Count rows (no value): every row of a (unit, key) has one row priority, so dropping the
    column (8 bytes per shuffled row) keeps the same multiset, batch by batch and merged."""
    table = bounding.prioritize(_table([(u, k, 0.0) for u, k, _ in rows]).drop_columns(["__value"]),
                                "unit", ["k"], KEY)

    def pairs(bounded):
        return collections.Counter(zip(bounded.column(bounding.UNIT).to_pylist(),
                                       bounded.column("k").to_pylist()))

    whole = bounding.bound(table, l0, linf)
    slim = bounding.without_row_priority(table)
    assert bounding.ROW not in slim.column_names
    assert bounding.without_row_priority(slim) is slim
    a, b = (bounding.without_row_priority(bounding.bound(part, l0, linf))
            for part in (slim.slice(0, split), table.slice(split)))
    merged = bounding.bound(pa.concat_tables([a, b]), l0, linf)
    assert pairs(bounding.bound(slim, l0, linf)) == pairs(merged) == pairs(whole)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10 ** 6), units=st.integers(1, 40), keys=st.integers(1, 30),
       l0=st.integers(1, bounding.PRESELECT_MAX_PARTITIONS + 1), linf=st.integers(1, 3),
       with_row=st.booleans())
def test_preselecting_rows_changes_no_kept_row_nor_their_order(seed, units, keys, l0, linf, with_row):
    # Tables of a few thousand rows over few units (where bound() pre-selects each unit's
    # smallest pairs before sorting), with repeated rows, repeated priorities and the largest
    # pair priority 2^64 - 1: the bounded table is identical, row for row, to sorting them all.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1024, 4000))
    unit_ids = rng.integers(0, 2 ** 64, units, dtype=np.uint64)
    pair_ids = rng.integers(0, 2 ** 64, (units, keys), dtype=np.uint64)
    pair_ids[:, -1] = np.iinfo(np.uint64).max
    u, k = rng.integers(0, units, n), rng.integers(0, keys, n)
    columns = {bounding.UNIT: unit_ids[u], bounding.PAIR: pair_ids[u, k], "k": k}
    if with_row:
        columns[bounding.ROW] = rng.integers(0, 3, n).astype(np.uint64)
    table = pa.table(columns)
    preselected = bounding.bound(table, l0, linf)
    with mock.patch.object(bounding, "PRESELECT_MAX_PARTITIONS", 0):  # sort every row
        assert bounding.bound(table, l0, linf).equals(preselected)


def test_preselection_applies_only_where_it_pays():
    rng = np.random.default_rng(0)
    n = 4096
    few_units = pa.table({bounding.UNIT: rng.integers(0, 8, n).astype(np.uint64),
                          bounding.PAIR: rng.integers(0, 2 ** 64, n, dtype=np.uint64)})
    selected = bounding._rows_of_smallest_pairs(few_units, 2)
    assert selected is not None and 2 * 8 <= selected.sum() < n / 10
    many_units = few_units.set_column(0, bounding.UNIT, pa.array(np.arange(n, dtype=np.uint64)))
    assert bounding._rows_of_smallest_pairs(many_units, 2) is None
    assert bounding._rows_of_smallest_pairs(few_units, bounding.PRESELECT_MAX_PARTITIONS + 1) is None


def test_keyed_hash_is_each_rows_mac_on_every_path():
    """Fixed-width keys MAC'd row by row, a dictionary column through its dictionary (smaller or
    larger than the batch, chunked, with duplicate entries), text keys once per distinct value:
    each row's words are the MAC of its own values (mac_keys of that one row)."""
    from transforms.noise.prf import mac_keys, mac_words

    rng = np.random.default_rng(3)
    units = [f"u{i}" for i in rng.integers(0, 30, 200)]
    keys = rng.integers(-5, 5, 200)
    tables = {
        "int": pa.table({"c": keys}),
        "int, float": pa.table({"c": keys, "f": keys * 0.5}),
        "text": pa.table({"c": units}),
        "text, int": pa.table({"c": units, "f": keys}),
        "dictionary": pa.table({"c": pa.array(units).dictionary_encode()}),
        "dictionary larger than the batch": pa.table({"c": pa.array(units).dictionary_encode()}).slice(5, 7),
        "dictionary with repeated entries": pa.table({"c": pa.DictionaryArray.from_arrays(
            pa.array(np.arange(200) % 4, pa.int32()), pa.array(["x", "y", "x", "z"]))}),
        "chunked dictionaries": pa.Table.from_batches(
            [pa.record_batch({"c": pa.array(units[:100]).dictionary_encode()}),
             pa.record_batch({"c": pa.array(units[100:][::-1]).dictionary_encode()})]),
    }
    secret = KEY.derive("p").secret_bytes()
    for name, table in tables.items():
        columns = table.column_names
        got = bounding._keyed_hash(KEY, "p", table, columns)
        plain = pa.table({c: table.column(c).cast(table.column(c).type.value_type)
                          if pa.types.is_dictionary(table.column(c).type) else table.column(c)
                          for c in columns})
        want = np.concatenate([mac_words(mac_keys(secret, plain.slice(i, 1)))
                               for i in range(plain.num_rows)] or [np.zeros((0, 2), np.uint64)])
        assert np.array_equal(got, want), name
