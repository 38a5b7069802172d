"""The statistical DP tester: its own statistics, reference mechanisms, and the project's noise.

Each check has a false-failure probability of at most 1 - confidence (1e-3 by default) and
uses fixed seeds, so the suite is deterministic. Broken mechanisms must fail: that shows the
tester can fail. Heavier sweeps are marked ``slow``.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from accounting.calibration import NoiseKind, calibrate, discrete_gaussian_sigma
from accounting.verification.dp_tester import (DPTester, DPTestResult, Event, assert_dp,
                                  clopper_pearson_lower, clopper_pearson_upper, run_dp_test)
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise, discrete_gaussian, discrete_laplace

N = 400_000  # samples per dataset and check: ~0.15 s of tester time


def numpy_rng(seed):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------------------------
# Reference mechanisms on numpy randomness (exact privacy known in closed form)
# --------------------------------------------------------------------------------------------

def laplace_sampler(value, scale, seed):
    rng = numpy_rng(seed)
    return lambda n: value + rng.laplace(0.0, scale, n)


def gaussian_sampler(value, sigma, seed):
    rng = numpy_rng(seed)
    return lambda n: value + rng.normal(0.0, sigma, n)


def geometric_sampler(value, scale, seed):
    """Two-sided geometric (discrete Laplace) noise: P[z] ∝ exp(-|z|/scale)."""
    rng = numpy_rng(seed)
    p = math.exp(-1.0 / scale)

    def sample(n):
        return value + (rng.geometric(1 - p, n) - rng.geometric(1 - p, n))
    return sample


def randomized_response_sampler(bit, epsilon, seed):
    """Reports the true bit with probability e^eps / (1 + e^eps): exactly eps-DP."""
    rng = numpy_rng(seed)
    keep = math.exp(epsilon) / (1 + math.exp(epsilon))
    return lambda n: np.where(rng.random(n) < keep, bit, 1 - bit)


def gaussian_delta(sigma, epsilon, sensitivity):
    """Exact delta(eps) of the Gaussian mechanism (Balle & Wang 2018, Theorem 8)."""
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    return stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)


# --------------------------------------------------------------------------------------------
# Clopper-Pearson bounds
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,n", [(1, 10), (7, 20), (500, 1000), (3, 100_000), (99_990, 100_000)])
@pytest.mark.parametrize("alpha", [0.05, 1e-4])
def test_clopper_pearson_matches_exact_binomial_interval(k, n, alpha):
    # A one-sided bound at level alpha is one end of the two-sided exact interval at 1 - 2 alpha.
    interval = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact")
    assert float(clopper_pearson_lower(k, n, alpha)) == pytest.approx(interval.low, rel=1e-9)
    assert float(clopper_pearson_upper(k, n, alpha)) == pytest.approx(interval.high, rel=1e-9)


def test_clopper_pearson_edges_and_vectorisation():
    n, alpha = 1000, 1e-3
    assert clopper_pearson_lower(0, n, alpha) == 0.0
    assert clopper_pearson_upper(n, n, alpha) == 1.0
    # Zero successes: P(0 successes) = (1 - p)^n = alpha at the upper bound.
    assert float(clopper_pearson_upper(0, n, alpha)) == pytest.approx(1 - alpha ** (1 / n))
    assert float(clopper_pearson_lower(n, n, alpha)) == pytest.approx(alpha ** (1 / n))
    ks = np.array([0, 10, 500, 1000])
    lows, highs = clopper_pearson_lower(ks, n, alpha), clopper_pearson_upper(ks, n, alpha)
    assert np.all(lows <= ks / n) and np.all(highs >= ks / n) and np.all(np.diff(lows) > 0)


def test_clopper_pearson_coverage_by_simulation():
    # The one-sided bounds at level alpha must fail at most an alpha fraction of the time.
    rng, n, p, alpha, reps = numpy_rng(11), 200, 0.03, 0.05, 20_000
    k = rng.binomial(n, p, reps)
    assert np.mean(clopper_pearson_upper(k, n, alpha) < p) <= alpha
    assert np.mean(clopper_pearson_lower(k, n, alpha) > p) <= alpha


# --------------------------------------------------------------------------------------------
# The tester on reference mechanisms
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_randomized_response_bound_is_tight_and_valid(epsilon):
    result = run_dp_test(randomized_response_sampler(1, epsilon, 1),
                         randomized_response_sampler(0, epsilon, 2),
                         epsilon=epsilon, n_samples=N)
    assert result.passed, result
    # A valid lower bound on the true epsilon, and close to it (the mechanism is exactly eps-DP).
    assert epsilon - 0.06 < result.epsilon_lower_bound <= epsilon
    # Understating epsilon by 10% is detected.
    understated = run_dp_test(randomized_response_sampler(1, epsilon, 3),
                              randomized_response_sampler(0, epsilon, 4),
                              epsilon=0.9 * epsilon, n_samples=N)
    assert not understated.passed, understated


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("sensitivity", [1.0, 3.0, 2.5])
def test_laplace_reference_passes_and_broken_versions_fail(epsilon, sensitivity):
    scale = sensitivity / epsilon
    correct = run_dp_test(laplace_sampler(0.0, scale, 1), laplace_sampler(sensitivity, scale, 2),
                          epsilon=epsilon, n_samples=N)
    assert correct.passed, correct
    assert correct.epsilon_lower_bound > 0.85 * epsilon  # the tester sees most of the loss

    halved = run_dp_test(laplace_sampler(0.0, scale / 2, 3),
                         laplace_sampler(sensitivity, scale / 2, 4),
                         epsilon=epsilon, n_samples=N)
    assert not halved.passed, halved
    assert halved.epsilon_lower_bound > 1.5 * epsilon

    # Calibrated for sensitivity 1 while the neighbours differ by 3.
    ignored = run_dp_test(laplace_sampler(0.0, 1 / epsilon, 5), laplace_sampler(3.0, 1 / epsilon, 6),
                          epsilon=epsilon, n_samples=N)
    assert not ignored.passed, ignored


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_geometric_reference_passes_and_broken_versions_fail(epsilon):
    for sensitivity in (1, 3):
        scale = sensitivity / epsilon
        assert_dp(geometric_sampler(5, scale, 1), geometric_sampler(5 + sensitivity, scale, 2),
                  epsilon=epsilon, n_samples=N)
        with pytest.raises(AssertionError, match="violates"):
            assert_dp(geometric_sampler(5, scale / 2, 3),
                      geometric_sampler(5 + sensitivity, scale / 2, 4),
                      epsilon=epsilon, n_samples=N)


@pytest.mark.parametrize("epsilon,sensitivity", [(0.5, 1.0), (1.0, 3.0), (2.0, 2.5)])
def test_gaussian_reference_delta(epsilon, sensitivity):
    from scipy.optimize import brentq

    sigma = brentq(lambda s: gaussian_delta(s, epsilon, sensitivity) - 1e-2, 1e-3, 1e3)
    a, b = gaussian_sampler(0.0, sigma, 1), gaussian_sampler(sensitivity, sigma, 2)
    assert_dp(a, b, epsilon=epsilon, delta=1e-2, n_samples=N)
    # A point of the privacy profile where delta is large, so the check is nearly tight there.
    eps_small = epsilon / 3
    delta_small = gaussian_delta(sigma, eps_small, sensitivity)
    assert_dp(gaussian_sampler(0.0, sigma, 3), gaussian_sampler(sensitivity, sigma, 4),
              epsilon=eps_small, delta=delta_small, n_samples=N)
    # Claiming a delta 1000 times smaller than the calibration's is detected.
    result = run_dp_test(gaussian_sampler(0.0, sigma, 5), gaussian_sampler(sensitivity, sigma, 6),
                         epsilon=epsilon, delta=1e-5, n_samples=N)
    assert not result.passed, result


def test_leak_visible_only_in_a_single_value_is_found():
    # Thresholds see a ratio of at most 1.25 here; only the event {x == 4} shows the leak.
    rng = numpy_rng(7)
    a = lambda n: rng.integers(0, 10, n)
    b = lambda n: np.where((v := rng.integers(0, 10, n)) == 4, 5, v)
    result = run_dp_test(a, b, epsilon=1.0, n_samples=100_000)
    assert not result.passed
    assert str(result.worst.event) == "x == 4" and result.worst.direction == "D over D'"


def test_leak_visible_only_in_a_bin_of_real_outputs_is_found():
    rng = numpy_rng(8)
    a = lambda n: rng.random(n)
    b = lambda n: np.where(((v := rng.random(n)) >= 0.4) & (v < 0.5), v + 0.1, v)
    result = run_dp_test(a, b, epsilon=1.0, n_samples=100_000)
    assert not result.passed
    worst = result.worst.event
    assert 0.4 <= worst.lower < worst.upper <= 0.5 and not worst.include_upper


def test_false_failures_are_rare_at_the_exact_epsilon():
    # Exactly eps-DP, claim eps, low confidence: failures must stay within 1 - confidence.
    tester = DPTester(n_samples=4000, confidence=0.8)
    failures = sum(
        not tester.run(randomized_response_sampler(1, 1.0, 2 * i),
                       randomized_response_sampler(0, 1.0, 2 * i + 1), epsilon=1.0).passed
        for i in range(200))
    assert failures <= 0.2 * 200


def test_identical_distributions_pass_a_near_zero_epsilon():
    # Event selection over thousands of bins must not overfit: selection and evaluation use
    # disjoint samples.
    result = run_dp_test(laplace_sampler(0.0, 1.0, 1), laplace_sampler(0.0, 1.0, 2),
                         epsilon=1e-9, n_samples=N)
    assert result.passed, result
    assert result.epsilon_lower_bound < 0.05


def test_vector_outputs_use_coordinates_and_sum():
    rng = numpy_rng(9)

    def sampler(shift, scale):
        return lambda n: rng.laplace(0.0, scale, (n, 3)) + np.array([0.0, shift, 0.0])

    assert_dp(sampler(0.0, 1.0), sampler(1.0, 1.0), epsilon=1.0, n_samples=200_000)
    result = run_dp_test(sampler(0.0, 0.5), sampler(1.0, 0.5), epsilon=1.0, n_samples=200_000)
    assert not result.passed and result.worst.event.projection in ("x[1]", "sum(x)")


def test_custom_projection_exposes_a_leak_in_a_direction():
    # Both coordinates move by 1/sqrt(2) (L2 shift 1): Gaussian noise with sigma for
    # sensitivity 1/sqrt(2) leaks along the diagonal more than along a coordinate.
    rng = numpy_rng(10)
    shift = np.array([1.0, 1.0]) / math.sqrt(2)
    sigma = 0.5

    def sampler(s):
        return lambda n: rng.normal(0.0, sigma, (n, 2)) + s

    diagonal = {"diagonal": lambda x: x @ shift}
    eps = 2.0
    true_delta = gaussian_delta(sigma, eps, 1.0)
    tester = DPTester(n_samples=200_000, projections=diagonal)
    assert tester.run(sampler(0.0), sampler(shift), epsilon=eps, delta=true_delta).passed
    claimed_delta = gaussian_delta(sigma, eps, math.sqrt(0.5))  # what one coordinate suggests
    result = tester.run(sampler(0.0), sampler(shift), epsilon=eps, delta=claimed_delta)
    assert not result.passed and result.worst.event.projection == "diagonal"


# --------------------------------------------------------------------------------------------
# API behaviour
# --------------------------------------------------------------------------------------------

def test_each_sampler_is_called_once_and_split_into_disjoint_parts():
    calls = []

    def sampler(n):
        calls.append(n)
        return np.arange(n) % 7

    tester = DPTester(n_samples=1000, selection_fraction=0.3)
    result = tester.run(sampler, sampler, epsilon=0.1)
    assert calls == [1000, 1000]
    assert (result.n_selection, result.n_evaluation) == (300, 700)
    assert all(e.trials == 700 for e in result.events)
    assert result.passed


def test_result_reports_the_evidence():
    result = run_dp_test(geometric_sampler(0, 0.5, 1), geometric_sampler(1, 0.5, 2),
                         epsilon=1.0, n_samples=100_000)
    assert isinstance(result, DPTestResult) and not result.passed
    assert len(result.events) == 6  # 3 events per direction
    assert {e.direction for e in result.events} == {"D over D'", "D' over D"}
    assert result.worst.violates
    assert result.epsilon_lower_bound == max(e.epsilon_lower_bound for e in result.events) > 1.0
    text = repr(result)
    assert "FAILED" in text and "claimed epsilon=1" in text and str(result.worst.event) in text
    assert f"{result.worst.count_numerator}/{result.n_evaluation}" in text
    assert "VIOLATION" in str(result) and str(result).count("\n") == 7
    with pytest.raises(AssertionError, match=r"violates \(1, 0\)-DP") as info:
        assert_dp(geometric_sampler(0, 0.5, 1), geometric_sampler(1, 0.5, 2),
                  epsilon=1.0, n_samples=100_000)
    assert "P_D(E) >=" in str(info.value) and "P_D'(E) <=" in str(info.value)


def test_event_counting_and_descriptions():
    values = np.sort(np.array([0.0, 1.0, 1.0, 2.0, 3.0]))
    assert Event(projection="x", lower=1.0, upper=math.inf).count(values) == 4
    assert Event(projection="x", lower=-math.inf, upper=1.0).count(values) == 3
    assert Event(projection="x", lower=1.0, upper=1.0).count(values) == 2
    assert Event(projection="x", lower=1.0, upper=3.0, include_upper=False).count(values) == 3
    assert str(Event(projection="x", lower=1.0, upper=math.inf)) == "x >= 1"
    assert str(Event(projection="x", lower=-math.inf, upper=2.5)) == "x <= 2.5"
    assert str(Event(projection="x", lower=4.0, upper=4.0)) == "x == 4"
    assert str(Event(projection="s", lower=1.0, upper=2.0, include_upper=False)) == "1 <= s < 2"


@pytest.mark.parametrize("kwargs,name", [
    ({"n_samples": 5}, "n_samples"), ({"n_samples": 1.5e5}, "n_samples"),
    ({"confidence": 1.0}, "confidence"), ({"confidence": 0.0}, "confidence"),
    ({"events_per_direction": 0}, "events_per_direction"),
    ({"selection_fraction": 1.0}, "selection_fraction"),
    ({"max_thresholds": 1}, "max_thresholds"),
])
def test_bad_tester_options_are_rejected(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DPTester(**kwargs)


@pytest.mark.parametrize("epsilon,delta,name", [
    (-1.0, 0.0, "epsilon"), (math.inf, 0.0, "epsilon"), (math.nan, 0.0, "epsilon"),
    (1.0, 1.0, "delta"), (1.0, -1e-9, "delta"), ("one", 0.0, "epsilon"),
])
def test_bad_claims_are_rejected(epsilon, delta, name):
    ok = lambda n: np.zeros(n)
    with pytest.raises(ValueError, match=name):
        DPTester(n_samples=100).run(ok, ok, epsilon=epsilon, delta=delta)


def test_bad_sampler_outputs_are_rejected():
    tester = DPTester(n_samples=100)
    ok = lambda n: np.zeros(n)
    with pytest.raises(ValueError, match="sample_a"):
        tester.run(lambda n: np.zeros(n - 1), ok, epsilon=1.0)
    with pytest.raises(ValueError, match="NaN"):
        tester.run(ok, lambda n: np.full(n, np.nan), epsilon=1.0)
    with pytest.raises(ValueError, match="numbers"):
        tester.run(lambda n: np.array(["a"] * n), ok, epsilon=1.0)
    with pytest.raises(ValueError, match="shapes differ"):
        tester.run(ok, lambda n: np.zeros((n, 2)), epsilon=1.0)
    with pytest.raises(ValueError, match="projections"):
        tester.run(lambda n: np.zeros((n, 2, 2)), lambda n: np.zeros((n, 2, 2)), epsilon=1.0)
    bad_projection = DPTester(n_samples=100, projections={"p": lambda x: x[:10]})
    with pytest.raises(ValueError, match="projection 'p'"):
        bad_projection.run(ok, ok, epsilon=1.0)


def test_boolean_outputs_are_accepted():
    result = run_dp_test(lambda n: np.ones(n, bool), lambda n: np.zeros(n, bool),
                         epsilon=2.0, n_samples=1000)
    assert not result.passed and 3.0 < result.epsilon_lower_bound < math.inf


# --------------------------------------------------------------------------------------------
# The project's mechanisms: transforms.noise with specs from accounting.calibration
# --------------------------------------------------------------------------------------------

NP = 200_000          # samples per dataset for the project's (keyed, exact) samplers
NP_BROKEN = 100_000   # broken mechanisms leak far beyond their claim: fewer samples suffice
GAUSSIAN_DELTA = 1e-5


def lanes(seed, purpose, n):
    """n independent keyed lanes from a (non-secret) testing key."""
    return RandomStreams.for_range(ReleaseKey.for_testing(seed), purpose, n)


def noisy_answer_sampler(spec, answer, seed, purpose):
    """``add_noise(spec, .)`` applied to n copies of one true answer, one lane each."""
    dtype = np.int64 if spec.kind.is_integer else np.float64

    def sample(n):
        return add_noise(spec, np.full(n, answer, dtype=dtype), lanes(seed, purpose, n))
    return sample


def memoised(sampler):
    """Draw once, answer repeated calls with the same draws (to test several claims on them)."""
    cache = {}

    def sample(n):
        if n not in cache:
            cache[n] = sampler(n)
        return cache[n]
    return sample


def calibrated(kind, epsilon, sensitivity, delta=GAUSSIAN_DELTA):
    kind = NoiseKind(kind)
    if kind.is_gaussian:
        return calibrate(kind, epsilon=epsilon, delta=delta, l2_sensitivity=sensitivity)
    return calibrate(kind, epsilon=epsilon, l1_sensitivity=sensitivity)


def neighbouring_samplers(spec, sensitivity, seed, base=None):
    """Samplers on answers that differ by exactly ``sensitivity`` (off-grid for real kinds)."""
    if base is None:
        base = 7 if spec.kind.is_integer else 0.3
    return (memoised(noisy_answer_sampler(spec, base, seed, "D")),
            memoised(noisy_answer_sampler(spec, base + sensitivity, seed, "D'")))


def profile_delta(spec, epsilon):
    """A delta the mechanism meets at ``epsilon`` (its pessimistic privacy loss distribution)."""
    return float(spec.privacy_loss_distribution().get_delta_for_epsilon(epsilon))


def check_project_mechanism(kind, epsilon, sensitivity, seed, n_samples):
    """The calibrated mechanism passes its claim and a point of its privacy profile, and is not
    grossly over-noised: a clearly understated claim fails on the same samples."""
    spec = calibrated(kind, epsilon, sensitivity)
    a, b = neighbouring_samplers(spec, sensitivity, seed)
    tester = DPTester(n_samples=n_samples)
    tester.assert_dp(a, b, epsilon=spec.epsilon, delta=spec.delta)
    # At epsilon / 3 the profile's delta is large, so this claim is close to tight.
    eps_profile = epsilon / 3
    delta_profile = profile_delta(spec, eps_profile)
    tester.assert_dp(a, b, epsilon=eps_profile, delta=delta_profile)
    if spec.kind.is_gaussian:
        understated = tester.run(a, b, epsilon=eps_profile / 2, delta=delta_profile)
    else:
        understated = tester.run(a, b, epsilon=0.75 * epsilon)
    assert not understated.passed, understated


def halved_noise(spec):
    return dataclasses.replace(spec, scale=spec.scale / 2, unit_scale=spec.unit_scale / 2)


ALL_KINDS = [k.value for k in NoiseKind]
# Each kind at epsilons 0.5, 1 and 2 with sensitivities 1 and 3, and the real-valued kinds with
# a real sensitivity (2.5). The full cross product runs in the slow sweep below.
DEFAULT_GRID = [(kind, eps, sens) for kind in ALL_KINDS
                for eps, sens in [(0.5, 1), (1.0, 3), (2.0, 2.5 if kind in ("laplace", "gaussian") else 1)]]


@pytest.mark.parametrize("kind,epsilon,sensitivity", DEFAULT_GRID)
def test_project_mechanism_satisfies_its_claim(kind, epsilon, sensitivity):
    seed = DEFAULT_GRID.index((kind, epsilon, sensitivity))
    check_project_mechanism(kind, epsilon, sensitivity, seed=seed, n_samples=NP)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_project_mechanism_with_halved_noise_fails(kind):
    epsilon, sensitivity = 1.0, 1
    spec = calibrated(kind, epsilon, sensitivity)
    a, b = neighbouring_samplers(halved_noise(spec), sensitivity, seed=21)
    result = run_dp_test(a, b, epsilon=spec.epsilon, delta=spec.delta, n_samples=NP_BROKEN)
    assert not result.passed, result


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_project_mechanism_ignoring_sensitivity_fails(kind):
    # Calibrated for sensitivity 1, while the neighbouring answers differ by 3.
    spec = calibrated(kind, 1.0, 1)
    a, b = neighbouring_samplers(spec, 3, seed=22)
    result = run_dp_test(a, b, epsilon=spec.epsilon, delta=spec.delta, n_samples=NP_BROKEN)
    assert not result.passed, result


@pytest.mark.parametrize("kind", ["gaussian", "discrete_gaussian"])
def test_gaussian_claiming_a_far_smaller_delta_fails(kind):
    spec = calibrated(kind, 1.0, 1, delta=1e-2)
    a, b = neighbouring_samplers(spec, 1, seed=23)
    assert_dp(a, b, epsilon=1.0, delta=1e-2, n_samples=NP)
    result = run_dp_test(a, b, epsilon=1.0, delta=1e-5, n_samples=NP)
    assert not result.passed, result


@pytest.mark.parametrize("epsilon,sensitivity", [(0.5, 1), (1.0, 3), (2.0, 2)])
def test_discrete_laplace_sampler(epsilon, sensitivity):
    scale = sensitivity / epsilon

    def sampler(answer, purpose, noise_scale):
        return lambda n: answer + discrete_laplace(lanes(31, purpose, n), noise_scale)

    assert_dp(sampler(0, "D", scale), sampler(sensitivity, "D'", scale),
              epsilon=epsilon, n_samples=NP)
    with pytest.raises(AssertionError, match="violates"):
        assert_dp(sampler(0, "D", scale / 2), sampler(sensitivity, "D'", scale / 2),
                  epsilon=epsilon, n_samples=NP_BROKEN)


@pytest.mark.parametrize("epsilon,sensitivity", [(0.5, 1), (1.0, 3), (2.0, 2)])
def test_discrete_gaussian_sampler(epsilon, sensitivity):
    delta = 1e-3
    sigma = discrete_gaussian_sigma(epsilon, delta, sensitivity)

    def sampler(answer, purpose, noise_sigma):
        return lambda n: answer + discrete_gaussian(lanes(32, purpose, n), noise_sigma)

    assert_dp(sampler(0, "D", sigma), sampler(sensitivity, "D'", sigma),
              epsilon=epsilon, delta=delta, n_samples=NP)
    with pytest.raises(AssertionError, match="violates"):
        assert_dp(sampler(0, "D", sigma / 2), sampler(sensitivity, "D'", sigma / 2),
                  epsilon=epsilon, delta=delta, n_samples=NP_BROKEN)


# --------------------------------------------------------------------------------------------
# Slow sweep: every kind x epsilon x sensitivity, more samples, tighter broken cases
# --------------------------------------------------------------------------------------------

FULL_GRID = [(kind, eps, sens) for kind in ALL_KINDS for eps in (0.5, 1.0, 2.0)
             for sens in ((1, 3, 2.5) if kind in ("laplace", "gaussian") else (1, 3))]


@pytest.mark.slow
@pytest.mark.parametrize("kind,epsilon,sensitivity", FULL_GRID)
def test_slow_project_mechanism_sweep(kind, epsilon, sensitivity):
    check_project_mechanism(kind, epsilon, sensitivity, seed=100 + FULL_GRID.index(
        (kind, epsilon, sensitivity)), n_samples=1_000_000)
    spec = calibrated(kind, epsilon, sensitivity)
    # 1M samples: halved Gaussian noise at epsilon 0.5 is a mild violation (empirical epsilon
    # about 0.68 at 1M samples); at 400k the tester's event selection missed it in 1 of 12 draws.
    for broken, shift, seed in [(halved_noise(spec), sensitivity, 200),
                                (calibrated(kind, epsilon, 1), 3 * sensitivity, 300)]:
        a, b = neighbouring_samplers(broken, shift, seed=seed)
        result = run_dp_test(a, b, epsilon=spec.epsilon, delta=spec.delta, n_samples=1_000_000)
        assert not result.passed, result


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian", "discrete_gaussian"])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_slow_gaussian_delta_understatement(kind, epsilon):
    # The violation is below 1e-3 in probability: it takes millions of samples, and more of
    # them for the evaluation than for the event selection.
    spec = calibrated(kind, epsilon, 1, delta=1e-3)
    a, b = neighbouring_samplers(spec, 1, seed=400)
    tester = DPTester(n_samples=4_000_000, selection_fraction=0.3)
    tester.assert_dp(a, b, epsilon=epsilon, delta=1e-3)
    result = tester.run(a, b, epsilon=epsilon, delta=1e-8)
    assert not result.passed, result


# --------------------------------------------------------------------------------------------
# L0 > 1 (issue 40.7): one unit moves several coordinates at once
# --------------------------------------------------------------------------------------------
#
# The project's mechanisms calibrated from a count's sensitivities (accounting.sensitivity) with
# L0 = 9 keys of Linf = 2 rows each: the neighbour moves every coordinate by Linf, the worst
# case of both norms. The tester's sum projection sees the L1 (and, for Gaussian kinds, the L2)
# shift: a calibration for one coordinate's change passes at L0 = 1 and fails here (L0 = 9: the
# L2 norm is then 3 Linf, a factor the tester resolves at delta = 1e-5).

L0_BOUNDS = dict(max_partitions=9, max_contributions_per_partition=2)


def vector_sampler(spec, answer, coordinates, seed, purpose):
    dtype = np.int64 if spec.kind.is_integer else np.float64

    def sample(n):
        values = np.full(n * coordinates, answer, dtype=dtype)
        return add_noise(spec, values, lanes(seed, purpose, n * coordinates)).reshape(
            n, coordinates)
    return memoised(sample)


@pytest.mark.parametrize("kind", ["laplace", "discrete_laplace", "gaussian", "discrete_gaussian"])
def test_project_mechanism_at_l0_above_one_meets_its_claim(kind):
    from accounting.sensitivity import ContributionBounds, count_sensitivity

    s = count_sensitivity(ContributionBounds(**L0_BOUNDS))
    kind_ = NoiseKind(kind)
    spec = (calibrate(kind_, epsilon=1.0, delta=GAUSSIAN_DELTA, l2_sensitivity=s.l2, l0=s.l0)
            if kind_.is_gaussian else calibrate(kind_, epsilon=1.0, l1_sensitivity=s.l1, l0=s.l0))
    base = 7 if spec.kind.is_integer else 0.3
    a = vector_sampler(spec, base, s.l0, seed=31, purpose="D")
    b = vector_sampler(spec, base + s.linf, s.l0, seed=31, purpose="D'")
    DPTester(n_samples=NP).assert_dp(a, b, epsilon=spec.epsilon, delta=spec.delta)
