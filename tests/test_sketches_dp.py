"""DP of sketch reach/frequency: sensitivities, budget, calibrated noise (DP tester), Polya shares."""
import math

import numpy as np
import pytest
from scipy import stats

from accounting.calibration import NoiseKind
from accounting.dp_tester import DPTester
from accounting.sensitivity import Neighbouring
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise
from transforms.sketches.dp import (NOISE_PURPOSE, ReachFrequencyBudget, SketchStatistics,
                                    add_global_noise, add_helper_share, helper_shares,
                                    output_keys, polya_share)
from transforms.sketches.fingerprint import FingerprintSalt
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

KEY = ReleaseKey.for_testing(5)
SALT = FingerprintSalt.for_campaign("dp-campaign")
UNION = ("union", "")


# ----------------------------------------------------------------------------- budget

def test_budget_splits_the_campaign_epsilon_over_scopes_and_measures():
    budget = ReachFrequencyBudget(epsilon=math.log(3), num_publishers=3, reach_fraction=0.25)
    reach, hist = budget.reach_spec(), budget.histogram_spec()
    assert reach.epsilon == pytest.approx(math.log(3) * 0.25 / 4)
    assert hist.epsilon == pytest.approx(math.log(3) * 0.75 / 4)
    assert reach.kind is NoiseKind.DISCRETE_LAPLACE and reach.l1_sensitivity == 1
    assert reach.scale == pytest.approx(1 / reach.epsilon, rel=1e-5)
    assert budget.total().epsilon == pytest.approx(math.log(3))
    assert budget.total().delta == 0
    substitute = ReachFrequencyBudget(epsilon=math.log(3), num_publishers=3, reach_fraction=0.25,
                                      neighbouring=Neighbouring.SUBSTITUTE)
    assert substitute.reach_spec().scale == pytest.approx(2 * reach.scale, rel=1e-5)
    gauss = ReachFrequencyBudget(epsilon=1.0, delta=1e-6, num_publishers=1,
                                 kind=NoiseKind.DISCRETE_GAUSSIAN)
    assert gauss.total().delta == pytest.approx(1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0.0, num_publishers=2), "epsilon"),
    (dict(epsilon=1.0, num_publishers=0), "num_publishers"),
    (dict(epsilon=1.0, num_publishers=2, reach_fraction=1.0), "reach_fraction"),
    (dict(epsilon=1.0, num_publishers=2, kind="laplace"), "discrete"),
    (dict(epsilon=1.0, num_publishers=2, kind="discrete_gaussian"), "delta"),
])
def test_budget_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReachFrequencyBudget(**kwargs)


# ----------------------------------------------------------------------------- sensitivity

def test_one_person_changes_at_most_one_register_and_one_histogram_bin():
    """The stated sensitivities, checked on sketches crowded enough to hit every transition
    (empty -> singleton, singleton -> collided, collided -> collided)."""
    cfg = SketchConfig(200, 10.0)
    rng = np.random.default_rng(0)
    base_ids = rng.integers(0, 2 ** 62, 300)
    base_imp = rng.integers(1, 6, 300)
    base = LiquidLegionsSketch.from_ids(cfg, SALT, base_ids, base_imp)
    k = 4
    before = SketchStatistics.of(base, k)
    transitions = set()
    for pid in range(2000):
        person = LiquidLegionsSketch.from_ids(cfg, SALT, np.array([2 ** 62 + pid]),
                                              np.array([rng.integers(1, 8)]))
        after = SketchStatistics.of(base.merge(person), k)
        r = int(np.flatnonzero(person.counts)[0])
        transitions.add((int(base.counts[r] > 0) + int(base.collided[r]),))
        assert abs(after.active_registers - before.active_registers) <= 1
        assert np.abs(after.histogram - before.histogram).sum() <= 1
    assert transitions == {(0,), (1,), (2,)}
    # Removing a person is the same pair of sketches read the other way; one extra impression
    # of a present person moves one bin to another: L1 = 2, covered by SUBSTITUTE's factor 2.
    extra = LiquidLegionsSketch.from_ids(cfg, SALT, base_ids[:1])
    moved = SketchStatistics.of(base.merge(extra), k)
    assert np.abs(moved.histogram - before.histogram).sum() <= 2
    assert moved.active_registers == before.active_registers


# ----------------------------------------------------------------------------- global noise

def _neighbouring_sketches(kind: str):
    """D and D' = D + one person: either into an empty register (reach +1) or onto a
    singleton register (histogram bin -1)."""
    cfg = SketchConfig(500, 10.0)
    ids = np.arange(300, dtype=np.int64)
    d = LiquidLegionsSketch.from_ids(cfg, SALT, ids, np.arange(300) % 3 + 1)
    for pid in range(10_000, 20_000):
        person = LiquidLegionsSketch.from_ids(cfg, SALT, np.array([pid]))
        r = int(np.flatnonzero(person.counts)[0])
        if kind == "empty" and d.counts[r] == 0:
            return d, d.merge(person)
        if kind == "singleton" and d.counts[r] > 0 and not d.collided[r]:
            return d, d.merge(person)
    raise AssertionError("no suitable person found")


def test_global_noise_is_the_budget_spec_on_keyed_lanes():
    budget = ReachFrequencyBudget(epsilon=1.0, num_publishers=2)
    stats_ = SketchStatistics(1234, np.array([5, 0, 7], np.int64))
    noisy = add_global_noise(stats_, budget, KEY, "c1", UNION)
    reach_streams = RandomStreams.for_keys(KEY, NOISE_PURPOSE, output_keys("c1", UNION, "reach", 1))
    hist_streams = RandomStreams.for_keys(KEY, NOISE_PURPOSE,
                                          output_keys("c1", UNION, "frequency", 3))
    assert noisy.active_registers == add_noise(budget.reach_spec(), np.array([1234]),
                                               reach_streams)[0]
    assert np.array_equal(noisy.histogram, add_noise(budget.histogram_spec(), stats_.histogram,
                                                     hist_streams))
    # Reproducible per output key, independent across keys and release keys.
    again = add_global_noise(stats_, budget, KEY, "c1", UNION)
    assert again.active_registers == noisy.active_registers
    assert np.array_equal(again.histogram, noisy.histogram)
    others = [add_global_noise(stats_, budget, KEY, "c1", ("publisher", p)).active_registers
              for p in "abcdefgh"]
    others += [add_global_noise(stats_, budget, ReleaseKey.for_testing(s), "c1",
                                UNION).active_registers for s in range(8)]
    assert len(set(others)) > 5


def _lane_sampler(spec, values, tag):
    """n independent outputs of the mechanism on one statistic vector (one lane per number)."""
    values = np.asarray(values, np.int64)

    def sample(n):
        streams = RandomStreams.for_range(KEY.derive(tag), "dp-test", n * values.size)
        out = add_noise(spec, np.tile(values, n), streams).reshape(n, values.size)
        return out[:, 0] if values.size == 1 else out
    return sample


def test_reach_noise_passes_the_dp_tester_on_neighbouring_sketches():
    budget = ReachFrequencyBudget(epsilon=4.0, num_publishers=1)  # 1.0 per statistic
    d, d_prime = _neighbouring_sketches("empty")
    a, b = d.active_registers(), d_prime.active_registers()
    assert b == a + 1
    spec = budget.reach_spec()
    tester = DPTester(n_samples=200_000)
    result = tester.run(_lane_sampler(spec, [a], "D"), _lane_sampler(spec, [b], "D'"),
                        epsilon=spec.epsilon)
    assert result.passed, result
    # The check can fail: the same noise does not give a 30% smaller epsilon.
    weaker = tester.run(_lane_sampler(spec, [a], "D"), _lane_sampler(spec, [b], "D'"),
                        epsilon=0.7 * spec.epsilon)
    assert not weaker.passed


def test_histogram_noise_passes_the_dp_tester_on_neighbouring_sketches():
    budget = ReachFrequencyBudget(epsilon=4.0, num_publishers=1)
    d, d_prime = _neighbouring_sketches("singleton")
    ha, hb = d.frequency_histogram(3), d_prime.frequency_histogram(3)
    assert np.abs(ha - hb).sum() == 1
    spec = budget.histogram_spec()
    tester = DPTester(n_samples=100_000)
    result = tester.run(_lane_sampler(spec, ha, "D"), _lane_sampler(spec, hb, "D'"),
                        epsilon=spec.epsilon)
    assert result.passed, result
    assert not tester.run(_lane_sampler(spec, ha, "D"), _lane_sampler(spec, hb, "D'"),
                          epsilon=0.6 * spec.epsilon).passed


# ----------------------------------------------------------------------------- Polya shares

def _discrete_laplace_pmf(k, scale):
    p = math.exp(-1 / scale)
    return (1 - p) / (1 + p) * p ** np.abs(k)


@pytest.mark.parametrize("helpers", [1, 3, 10])
def test_sum_of_polya_shares_is_two_sided_geometric(helpers):
    scale, n = 2.5, 200_000
    rng = np.random.default_rng(helpers)
    total = sum(polya_share(rng, helpers, scale, n) for _ in range(helpers))
    support = np.arange(-12, 13)
    observed = np.array([np.sum(total == k) for k in support] +
                        [np.sum(total < -12) + np.sum(total > 12)])
    pmf = _discrete_laplace_pmf(support, scale)
    expected = n * np.r_[pmf, 1 - pmf.sum()]
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    # No helper knows the total: one share carries only 1/n of the variance.
    p = math.exp(-1 / scale)
    one = polya_share(rng, helpers, scale, n)
    assert one.var() == pytest.approx(2 * p / (1 - p) ** 2 / helpers, rel=0.05)


def test_a_wrong_share_shape_is_detected():
    """Control for the test above: shares of Polya(1, p) from 3 helpers are not DLap(b)."""
    scale, n, rng = 2.5, 200_000, np.random.default_rng(9)
    total = sum(polya_share(rng, 1, scale, n) for _ in range(3))
    support = np.arange(-12, 13)
    observed = np.array([np.sum(total == k) for k in support] +
                        [np.sum(total < -12) + np.sum(total > 12)])
    pmf = _discrete_laplace_pmf(support, scale)
    assert stats.chisquare(observed, n * np.r_[pmf, 1 - pmf.sum()]).pvalue < 1e-6


def test_helper_shares_are_keyed_and_sum_to_the_calibrated_noise():
    budget = ReachFrequencyBudget(epsilon=1.0, num_publishers=1)  # scale 4 per statistic
    zero = SketchStatistics(0, np.zeros(2, np.int64))
    totals = []
    for campaign in range(600):
        s = zero
        for h in range(3):
            s = add_helper_share(s, KEY, h, 3, budget, f"c{campaign}", UNION)
        totals.append(s.active_registers)
    scale = budget.reach_spec().scale
    p = math.exp(-1 / scale)
    totals = np.array(totals)
    # Variance of DLap(4) is ~31.5; the sample variance of 600 draws is within +-25%.
    assert totals.var() == pytest.approx(2 * p / (1 - p) ** 2, rel=0.25)
    a = helper_shares(KEY, 0, 3, budget, "c1", UNION, 2)
    assert helper_shares(KEY, 0, 3, budget, "c1", UNION, 2).active_registers == a.active_registers
    shares = {helper_shares(KEY, h, 3, budget, "c1", UNION, 50).histogram.tobytes()
              for h in range(3)}
    assert len(shares) == 3


def test_distributed_noise_needs_discrete_laplace():
    budget = ReachFrequencyBudget(epsilon=1.0, delta=1e-6, num_publishers=1,
                                  kind=NoiseKind.DISCRETE_GAUSSIAN)
    with pytest.raises(ValueError, match="discrete_laplace"):
        helper_shares(KEY, 0, 2, budget, "c", UNION, 3)
    with pytest.raises(ValueError, match="helper"):
        helper_shares(KEY, 2, 2, ReachFrequencyBudget(epsilon=1.0, num_publishers=1), "c",
                      UNION, 3)
