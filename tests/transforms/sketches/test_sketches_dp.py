"""DP of sketch reach/frequency: sensitivities, budget, calibrated noise (DP tester), Polya shares."""
import math

import numpy as np
import pytest
from scipy import stats

from accounting.calibration import NoiseKind
from accounting.verification.dp_tester import DPTester
from accounting.sensitivity import Neighbouring
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise
from accounting.budget import PrivacyBudget
from transforms.sketches.dp import (NOISE_PURPOSE, SHARE_PURPOSE, ReachFrequencyNoise,
                                    SketchStatistics, add_global_noise, add_helper_share,
                                    distributed_noise_delta, helper_shares, output_keys,
                                    polya_difference, polya_table, helper_keys_for_testing)
from transforms.sketches.fingerprint import FingerprintSalt
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

KEY = ReleaseKey.for_testing(5)
SALT = FingerprintSalt.for_campaign("dp-campaign")
UNION = ("union", "")


# ----------------------------------------------------------------------------- budget

def test_budget_splits_the_campaign_epsilon_over_scopes_and_measures():
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=math.log(3)), num_publishers=3, reach_fraction=0.25)
    reach, hist = budget.reach_spec(), budget.histogram_spec()
    assert reach.epsilon == pytest.approx(math.log(3) * 0.25 / 4)
    assert hist.epsilon == pytest.approx(math.log(3) * 0.75 / 4)
    assert reach.kind is NoiseKind.DISCRETE_LAPLACE and reach.l1_sensitivity == 1
    assert reach.scale == pytest.approx(1 / reach.epsilon, rel=1e-5)
    assert budget.total().epsilon == pytest.approx(math.log(3))
    assert budget.total().delta == 0
    substitute = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=math.log(3)), num_publishers=3, reach_fraction=0.25, neighbouring=Neighbouring.SUBSTITUTE)
    # A replaced person moves the reach by at most 1 (ONE_PERSON, checked below and by exact
    # enumeration), the histogram by 2: only the histogram's noise doubles.
    assert substitute.reach_spec().scale == pytest.approx(reach.scale, rel=1e-5)
    assert substitute.histogram_spec().scale == pytest.approx(2 * hist.scale, rel=1e-5)
    gauss = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=1.0, delta=1e-6), num_publishers=1, kind=NoiseKind.DISCRETE_GAUSSIAN)
    assert gauss.total().delta == pytest.approx(1e-6)


#: What one person moves, from the register argument (checked by the sensitivity test below):
#: (L1, L2) of the reach and of the histogram. Adding or removing a person changes one register
#: (reach by 1, one bin by 1); replacing one removes a person from a register and adds one to
#: another: reach by at most 1, the histogram by 2 in L1 and L2 (one bin by 2 at worst).
ONE_PERSON = {Neighbouring.ADD_REMOVE: {"reach": (1, 1), "frequency": (1, 1)},
              Neighbouring.SUBSTITUTE: {"reach": (1, 1), "frequency": (2, 2)}}


@pytest.mark.parametrize("neighbouring", list(ONE_PERSON), ids=lambda n: n.value)
@pytest.mark.parametrize("kind", ["discrete_laplace", "discrete_gaussian"])
def test_a_campaigns_statistics_compose_within_its_budget_by_an_independent_computation(kind, neighbouring):
    """A person may appear at every publisher: all 2 (P + 1) statistics move at once. Their
    true privacy losses -- discrete Laplace: the person's L1 shift over the scale; discrete
    Gaussian: delta at the stated epsilon from dp_accounting's PLD of the person's L2 shift --
    must compose (basic composition) within the campaign's (epsilon, delta)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    publishers = 3
    budget = PrivacyBudget(epsilon=2.0, delta=1e-6 if kind == "discrete_gaussian" else 0.0)
    noise = ReachFrequencyNoise(budget=budget, num_publishers=publishers, reach_fraction=0.3,
                                kind=kind, neighbouring=neighbouring)
    specs = {"reach": noise.reach_spec(), "frequency": noise.histogram_spec()}
    epsilon = delta = 0.0
    for name, spec in specs.items():
        l1, l2 = ONE_PERSON[neighbouring][name]
        if kind == "discrete_laplace":
            epsilon += l1 / spec.unit_scale
        else:
            epsilon += spec.epsilon
            delta += pld.from_discrete_gaussian_mechanism(
                spec.unit_scale, sensitivity=l2, value_discretization_interval=1e-4) \
                .get_delta_for_epsilon(spec.epsilon)
    scopes = publishers + 1
    assert scopes * epsilon <= budget.epsilon * (1 + 1e-9)
    assert scopes * delta <= budget.delta * (1 + 1e-2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_publishers=0), "num_publishers"),
    (dict(num_publishers=2, reach_fraction=1.0), "reach_fraction"),
    (dict(num_publishers=2, kind="laplace"), "discrete"),
    (dict(num_publishers=2, kind="discrete_gaussian"), "delta"),
    (dict(num_publishers=2, budget=PrivacyBudget.zcdp(0.5)), "sequentially"),
])
def test_noise_split_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReachFrequencyNoise(**{"budget": PrivacyBudget(epsilon=1.0), **kwargs})


# ----------------------------------------------------------------------------- sensitivity

def test_one_person_changes_at_most_one_register_and_one_histogram_bin():
    """The stated sensitivities, checked on sketches crowded enough to hit every transition
    (empty -> singleton, singleton -> collided, collided -> collided)."""
    cfg = SketchConfig(num_registers=200, decay_rate=10.0)
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
    cfg = SketchConfig(num_registers=500, decay_rate=10.0)
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
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=1.0), num_publishers=2)
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
        streams = RandomStreams.for_range(KEY.subkey(tag), "dp-test", n * values.size)
        out = add_noise(spec, np.tile(values, n), streams).reshape(n, values.size)
        return out[:, 0] if values.size == 1 else out
    return sample


def test_reach_noise_passes_the_dp_tester_on_neighbouring_sketches():
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=4.0), num_publishers=1)  # 1.0 per statistic
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
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=4.0), num_publishers=1)
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


def _dlap_chisquare(total, scale):
    support = np.arange(-12, 13)
    observed = np.array([np.sum(total == k) for k in support] +
                        [np.sum(total < -12) + np.sum(total > 12)])
    pmf = _discrete_laplace_pmf(support, scale)
    return stats.chisquare(observed, total.size * np.r_[pmf, 1 - pmf.sum()]).pvalue


def _shares(helper_keys, table, lanes):
    """Each helper's Polya-difference share for ``lanes`` output keys, from its own key."""
    return [polya_difference(RandomStreams.for_range(key, SHARE_PURPOSE, lanes), table)
            for key in helper_keys]


@pytest.mark.parametrize("helpers", [1, 3, 10])
def test_sum_of_helper_shares_is_discrete_laplace(helpers):
    """Exact integers from keyed streams: the sum of n helpers' shares, each from its own key,
    matches discrete Laplace (chi-square, seeded by testing keys)."""
    scale, lanes = 2.5, 100_000
    table = polya_table(helpers, scale)
    shares = _shares([ReleaseKey.for_testing(100 + h) for h in range(helpers)], table, lanes)
    assert all(s.dtype == np.int64 for s in shares)
    assert _dlap_chisquare(sum(shares), scale) > 1e-4
    # No helper knows the total: one share carries only 1/n of the variance.
    p = math.exp(-1 / scale)
    assert shares[0].var() == pytest.approx(2 * p / (1 - p) ** 2 / helpers, rel=0.05)


def test_a_wrong_share_shape_is_detected():
    """Control for the test above: shares of Polya(1, p) from 3 helpers are not DLap(b)."""
    scale = 2.5
    shares = _shares([ReleaseKey.for_testing(200 + h) for h in range(3)], polya_table(1, scale),
                     100_000)
    assert _dlap_chisquare(sum(shares), scale) < 1e-6


def test_polya_table_is_the_exact_cdf_in_integers_with_a_stated_tv_bound():
    n, scale = 3, 7.5
    table = polya_table(n, scale)
    p = math.exp(-1 / scale)
    cdf = stats.nbinom.cdf(np.arange(table.size), 1 / n, 1 - p)
    np.testing.assert_allclose(table.thresholds.astype(float) / 2 ** 64, cdf, rtol=0, atol=1e-13)
    assert table.thresholds.dtype == np.uint64 and np.all(np.diff(table.thresholds.astype(float)) >= 0)
    assert stats.nbinom.sf(table.size - 1, 1 / n, 1 - p) < 2 ** -59     # truncated past 2^-60
    assert table.tv_per_draw == pytest.approx((table.size + 2) * 2.0 ** -64 + 2.0 ** -60)
    assert table.tv_per_value == 2 * n * table.tv_per_draw
    assert table.tv_per_value < 1e-15


def test_distributed_noise_delta_is_charged():
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=1.0), num_publishers=2)
    assert budget.total().delta == 0.0
    charged = budget.charged_specs(num_helpers=3, max_frequency=5)
    extra = charged["frequency"].delta
    assert extra == pytest.approx(distributed_noise_delta(budget.histogram_spec(), 3, 5))
    assert 0 < charged["reach"].delta < extra < 1e-12
    total = budget.total(num_helpers=3, max_frequency=5)
    assert total.epsilon == pytest.approx(budget.total().epsilon)
    assert total.delta == pytest.approx(3 * (charged["reach"].delta + extra))


def test_helper_shares_come_from_each_helpers_own_key():
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=1.0), num_publishers=1)  # scale 4 per statistic
    keys = helper_keys_for_testing(KEY, 3)
    zero = SketchStatistics(0, np.zeros(2, np.int64))
    totals = []
    for campaign in range(600):
        s = zero
        for key in keys.values():
            s = add_helper_share(s, key, 3, budget, f"c{campaign}", UNION)
        totals.append(s.active_registers)
    p = math.exp(-1 / budget.reach_spec().unit_scale)
    # Variance of DLap(4) is ~31.5; the sample variance of 600 draws is within +-25%.
    assert np.var(totals) == pytest.approx(2 * p / (1 - p) ** 2, rel=0.25)
    first = helper_shares(keys["helper0"], 3, budget, "c1", UNION, 50)
    again = helper_shares(keys["helper0"], 3, budget, "c1", UNION, 50)               # reproducible
    assert again.active_registers == first.active_registers
    assert again.histogram.tobytes() == first.histogram.tobytes()
    other = helper_shares(ReleaseKey.for_testing(77), 3, budget, "c1", UNION, 50)
    assert other.histogram.tobytes() != first.histogram.tobytes()                  # keyed
    with pytest.raises(ValueError, match="own ReleaseKey"):
        helper_keys_for_testing(ReleaseKey.generate(), 3)


def test_distributed_release_needs_one_key_per_helper():
    from transforms.sketches.beam import ReleaseReachFrequency

    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=1.0), num_publishers=1)
    config = SketchConfig(num_registers=100, decay_rate=10.0)
    with pytest.raises(ValueError, match="own ReleaseKey"):
        ReleaseReachFrequency(config, budget, ReleaseKey.generate(), max_frequency=3, num_helpers=2)
    shared = ReleaseKey.generate()
    with pytest.raises(ValueError, match="key of its own"):
        ReleaseReachFrequency(config, budget, ReleaseKey.generate(), max_frequency=3,
                              helper_keys={"a": shared, "b": shared})
    release = ReleaseReachFrequency(config, budget, ReleaseKey.generate(), max_frequency=3,
                                    helper_keys={"a": ReleaseKey.generate(), "b": ReleaseKey.generate()})
    assert release.guarantee().delta > 0


def test_distributed_noise_needs_discrete_laplace():
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=1.0, delta=1e-6), num_publishers=1, kind=NoiseKind.DISCRETE_GAUSSIAN)
    with pytest.raises(ValueError, match="discrete_laplace"):
        helper_shares(KEY, 2, budget, "c", UNION, 3)
    with pytest.raises(ValueError, match="discrete Laplace"):
        distributed_noise_delta(budget.histogram_spec(), 2, 3)
