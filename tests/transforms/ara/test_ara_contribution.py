"""ARA algorithms A (contribution vectors) and C (contribution bounding): invariants."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.ara.contribution import (CONTRIBUTION_BUDGET, ContributionConfig,
                                         bound_contributions, contribution_vectors,
                                         parse_bucket_key, rank_within_source, split_budget)


def _config(**over):
    base = dict(measures=("count", "value"), clip_thresholds=(1.0, 100.0),
                slice_dimensions=(3, 4), prefixes=(0, 1, 2),
                budgets=((1000, 2000), (3000, 4000), (5000, 6000)), reports_per_source=3)
    base.update(over)
    return ContributionConfig(**base)


# --- algorithm A -----------------------------------------------------------------------------

def test_contribution_vectors_clip_scale_and_bounds():
    values = np.array([[1.0, 250.0], [1.0, 50.0], [1.0, -7.0], [1.0, np.nan]])
    budgets = np.array([[100, 1000]])
    u = np.full((4, 1, 2), 0.999999)
    out = contribution_vectors(values, np.array([1.0, 100.0]), budgets, u)
    # clipped at C=100 -> full budget; 50 -> 500 (+U rounds up only on fractions); negatives/NaN -> 0
    assert out[:, 0, 1].tolist() == [1000, 500, 0, 0]
    assert out[:, 0, 0].tolist() == [100] * 4
    u0 = np.zeros((4, 1, 2))
    assert contribution_vectors(values, np.array([1.0, 100.0]), budgets, u0)[:, 0, 1].tolist() \
        == [1000, 500, 0, 0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e9, allow_nan=False), min_size=1, max_size=40),
       st.floats(0.01, 1e6), st.integers(1, CONTRIBUTION_BUDGET), st.integers(0, 2**32 - 1))
def test_contribution_never_exceeds_budget(values, clip, budget, seed):
    rng = np.random.default_rng(seed)
    v = np.array(values)[:, None]
    out = contribution_vectors(v, np.array([clip]), np.array([[budget]]),
                               rng.random((len(values), 1, 1)))
    assert out.dtype == np.int64
    assert (out >= 0).all() and (out <= budget).all()


@pytest.mark.parametrize("x", [0.25, 3.5, 7.123, 99.99])
def test_randomized_rounding_is_unbiased(x):
    n = 200_000
    rng = np.random.default_rng(7)
    budget, clip = 997, 100.0
    out = contribution_vectors(np.full((n, 1), x), np.array([clip]), np.array([[budget]]),
                               rng.random((n, 1, 1)))[:, 0, 0]
    exact = x * budget / clip
    frac = exact - math.floor(exact)
    assert set(np.unique(out)) <= {math.floor(exact), math.floor(exact) + 1}
    se = math.sqrt(max(frac * (1 - frac), 1e-12) / n)
    assert abs(out.mean() - exact) <= 5 * se + 1e-12


def test_reconstruction_of_rounded_contributions_is_unbiased():
    # R(A(x)) = rounded * C / b has expectation min(x, C) for every x >= 0.
    rng = np.random.default_rng(11)
    x = rng.lognormal(3, 1, 500)
    clip, budget = 40.0, 321
    reps = 400
    total = np.zeros(500)
    for _ in range(reps):
        total += contribution_vectors(x[:, None], np.array([clip]), np.array([[budget]]),
                                      rng.random((500, 1, 1)))[:, 0, 0]
    estimate = total / reps * clip / budget
    target = np.minimum(x, clip)
    # per-value s.e. <= (C / b) * 0.5 / sqrt(reps); check the mean over values tightly
    assert abs((estimate - target).mean()) < 5 * (clip / budget) * 0.5 / math.sqrt(reps * 500)
    assert np.abs(estimate - target).max() < 6 * (clip / budget) * 0.5 / math.sqrt(reps)


# --- algorithm C -----------------------------------------------------------------------------

def test_bound_contributions_greedy_in_order():
    src = np.array([7, 7, 7, 7, 9])
    totals = np.array([40000, 30000, 25536, 1, 65536])
    keep = bound_contributions(src, totals)
    # 40000 fits, 30000 would exceed -> dropped whole, 25536 fits exactly, then nothing left.
    assert keep.tolist() == [True, False, True, False, True]
    # order decides, not position
    keep = bound_contributions(src, totals, order=np.array([3, 2, 1, 0, 0]))
    assert keep.tolist() == [False, True, True, True, True]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 70000)), min_size=1, max_size=60),
       st.integers(0, 2**32 - 1))
def test_l1_budget_never_exceeded_and_matches_sequential_rule(reports, seed):
    src = np.array([s for s, _ in reports])
    totals = np.array([t for _, t in reports])
    order = np.random.default_rng(seed).permutation(len(reports))
    keep = bound_contributions(src, totals, order)
    for s in np.unique(src):
        assert totals[keep & (src == s)].sum() <= CONTRIBUTION_BUDGET
    # reference: plain sequential loop per source in order
    expected = np.zeros(len(reports), dtype=bool)
    spent = {}
    for i in np.argsort(order, kind="stable"):
        if spent.get(src[i], 0) + totals[i] <= CONTRIBUTION_BUDGET:
            spent[src[i]] = spent.get(src[i], 0) + totals[i]
            expected[i] = True
    assert keep.tolist() == expected.tolist()


def test_rank_within_source():
    assert rank_within_source(np.array([5, 3, 5, 5, 3]), np.array([2, 0, 0, 1, 1])).tolist() \
        == [2, 0, 0, 1, 1]


def test_a_then_c_keeps_source_l1_within_budget_for_any_config():
    cfg = _config()
    rng = np.random.default_rng(3)
    n = 3000
    values = np.column_stack([np.ones(n), rng.lognormal(4, 2, n)])
    contrib = contribution_vectors(values, cfg.clip_array, cfg.budget_array,
                                   rng.random((n,) + cfg.budget_array.shape))
    src = rng.integers(0, 100, n)
    keep = bound_contributions(src, contrib.sum(axis=(1, 2)))
    per_source = np.bincount(src[keep], weights=contrib[keep].sum(axis=(1, 2)))
    assert per_source.max() <= CONTRIBUTION_BUDGET
    # each report totals at most the config's per-report budget; K = 3 reports surely fit
    assert contrib.sum(axis=(1, 2)).max() <= cfg.budget_array.sum()
    first3 = rank_within_source(src) < 3
    assert keep[first3].all()


# --- configuration ---------------------------------------------------------------------------

def test_split_budget_respects_l1_and_shares():
    b = split_budget([0.2, 0.3, 0.5], reports_per_source=4)
    assert b.sum() <= CONTRIBUTION_BUDGET // 4 and (b >= 1).all()
    assert np.allclose(b / b.sum(), [0.2, 0.3, 0.5], atol=1e-3)
    with pytest.raises(ValueError):
        split_budget([1, 1, 1], reports_per_source=CONTRIBUTION_BUDGET)


def test_config_rejects_over_budget_and_bad_shapes():
    with pytest.raises(ValueError, match="exceeds the L1"):
        _config(reports_per_source=4)  # 21000 * 4 > 65536
    with pytest.raises(ValueError, match="shape"):
        _config(budgets=((1, 2),))
    with pytest.raises(ValueError, match="clip_thresholds"):
        _config(clip_thresholds=(1.0, 0.0))
    with pytest.raises(ValueError, match="prefix"):
        _config(prefixes=(0, 3), budgets=((1, 1), (1, 1)))


def test_config_keys_codes_and_json_roundtrip():
    cfg = _config()
    feats = np.array([[2, 3], [0, 1]])
    codes = cfg.slice_codes(feats)
    assert codes.tolist() == [[0, 2, 11], [0, 0, 1]]
    key = cfg.bucket_key(2, 1, 11)
    assert key == (1 << 96) | (2 << 64) | 11 and key < 2**128
    hi, lo = cfg.bucket_keys_hi_lo(codes)
    assert (int(hi[0, 2, 1]) << 64 | int(lo[0, 2, 1])) == key
    assert cfg.scale_of_key(key) == 100.0 / 6000
    domain = cfg.output_domain()
    assert len(domain) == 2 * (1 + 3 + 12) and key in domain
    assert ContributionConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(KeyError):
        cfg.scale_of_key((5 << 96) | (2 << 64))
    assert not cfg.valid_feature_rows(np.array([[3, 0]]))[0]


def test_parse_bucket_key_limits():
    assert parse_bucket_key("0x" + "f" * 32) == 2**128 - 1
    assert parse_bucket_key("12") == 12 and parse_bucket_key(7) == 7
    for bad in ("0x1" + "0" * 32, 2**128, -1, "zz", 1.5, True):
        with pytest.raises(ValueError):
            parse_bucket_key(bad)
