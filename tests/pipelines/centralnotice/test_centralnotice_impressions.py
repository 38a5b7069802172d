"""Algorithm 1's compact split equals the literal split; the bad-input rule of impressions rows."""
from __future__ import annotations

import collections
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from pipelines.centralnotice.impressions import (DROP_REASONS, MAX_IMPRESSIONS, block_multiset,
                                          clamped_block_sum, clean_impressions, per_key_contribution,
                                          split_compact, split_literal, split_table, sum_duplicates)

small_n = st.integers(min_value=0, max_value=5_000)
any_k = st.integers(min_value=1, max_value=6_000)


@settings(max_examples=300, deadline=None)
@given(n=small_n, k=any_k)
def test_compact_split_equals_literal_split(n, k):
    literal = split_literal(n, k)
    full, rem = split_compact(np.array([n]), k)
    assert block_multiset(int(full[0]), int(rem[0]), k) == collections.Counter(literal)
    assert all(0 < block <= k for block in literal)  # nothing to clamp in [0, k]
    assert int(clamped_block_sum(full, rem, k)[0]) == sum(literal) == n


@settings(max_examples=100, deadline=None)
@given(ns=st.lists(small_n, min_size=1, max_size=30), k=st.integers(1, 50))
def test_vectorised_split_matches_row_by_row(ns, k):
    full, rem = split_compact(np.array(ns, dtype=np.int64), k)
    for n, f, r in zip(ns, full, rem):
        assert block_multiset(int(f), int(r), k) == collections.Counter(split_literal(n, k))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=0, max_value=10 ** 15), k=st.integers(min_value=1, max_value=10 ** 7))
def test_huge_rows_are_not_materialised(n, k):
    full, rem = split_compact(np.array([n], dtype=np.int64), k)
    assert int(full[0]) == n // k and int(rem[0]) == n % k
    blocks = block_multiset(int(full[0]), int(rem[0]), k)
    assert sum(size * count for size, count in blocks.items()) == n
    assert max(blocks, default=0) <= k
    assert int(clamped_block_sum(full, rem, k)[0]) == n


def test_edge_cases():
    assert split_literal(0, 1) == [] and split_literal(0, 7) == []
    assert split_literal(5, 1) == [1] * 5 and split_literal(7, 3) == [3, 3, 1]
    full, rem = split_compact(np.array([10 ** 12, 0, 99], dtype=np.int64), 1)
    assert full.tolist() == [10 ** 12, 0, 99] and rem.tolist() == [0, 0, 0]
    for bad_k in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="k"):
            split_compact(np.array([1]), bad_k)
    with pytest.raises(TypeError):
        split_compact(np.array([1.5]), 3)
    with pytest.raises(ValueError, match="negative"):
        split_compact(np.array([-1]), 3)


def _table(impressions, **overrides):
    n = len(impressions)
    columns = {"campaign_id": ["c1"] * n, "banner_id": ["b1"] * n, "country": ["DE"] * n,
               "project": ["de.wikipedia"] * n, "date": ["2026-11-20"] * n}
    columns.update(overrides)
    return pa.table({**columns, "impressions": impressions})


def test_clean_impressions_drops_and_counts_bad_rows():
    table = _table(pa.array([10.0, None, float("nan"), -3.0, 2.5, 7.0, float(2 ** 60), 0.0]),
                   country=["DE", "FR", "FR", "FR", "FR", None, "FR", "US"])
    clean, counts = clean_impressions(table)
    assert counts == {"missing_key": 1, "missing": 2, "unparseable": 0, "negative": 1,
                      "fractional": 1, "too_large": 1}
    assert clean.column("impressions").type == pa.int64()
    assert clean.column("impressions").to_pylist() == [10, 0]
    assert clean.column("country").to_pylist() == ["DE", "US"]
    assert sum(counts.values()) + clean.num_rows == table.num_rows


def test_clean_impressions_integer_and_text_columns():
    clean, counts = clean_impressions(_table(pa.array([5, None, -1, 2 ** 62], pa.int64())))
    assert clean.column("impressions").to_pylist() == [5]
    assert counts["missing"] == 1 and counts["negative"] == 1 and counts["too_large"] == 1
    clean, counts = clean_impressions(_table(pa.array(["12", " 3 ", "abc", "", None, "-4", "1.5", "1e3"])))
    assert clean.column("impressions").to_pylist() == [12, 3, 1000]
    assert counts == {"missing_key": 0, "missing": 2, "unparseable": 1, "negative": 1,
                      "fractional": 1, "too_large": 0}
    empty, counts = clean_impressions(_table(pa.array([], pa.int64())))
    assert empty.num_rows == 0 and set(counts) == set(DROP_REASONS)


def test_clean_impressions_job_level_errors_name_the_column():
    with pytest.raises(ValueError, match="country"):
        clean_impressions(_table(pa.array([1])).drop(["country"]))
    with pytest.raises(ValueError, match="impressions"):
        clean_impressions(_table(pa.array([[1]])))


def test_duplicates_are_summed_and_contribution_per_key():
    table = _table(pa.array([7, 5, 3], pa.int64()), country=["DE", "DE", "FR"])
    summed = sum_duplicates(table).sort_by("country")
    assert summed.column("impressions").to_pylist() == [12, 3]
    contribution = per_key_contribution(table, table.column("impressions").to_numpy(), k=5)
    assert contribution.sort_by("country").column("impressions").to_pylist() == [12, 3]
    split = split_table(table, 5)
    assert split.column("full_blocks").to_pylist() == [1, 1, 0]
    assert split.column("remainder").to_pylist() == [2, 0, 3]
    assert split.column("block_size").to_pylist() == [5, 5, 5]
    assert MAX_IMPRESSIONS < 2 ** 63 and math.log2(MAX_IMPRESSIONS) == 53
