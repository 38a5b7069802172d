"""accounting.distributions: the noise's CDF, tails and quantiles (one implementation)."""
import math

import numpy as np
import pytest

from accounting import distributions as dist
from accounting.calibration import NoiseKind, calibrate, calibrate_zcdp
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise


@pytest.mark.parametrize("sigma", [0.7, 3.0, 25.0])
def test_discrete_gaussian_tail_and_quantile_match_direct_sums(sigma):
    z = np.arange(-int(60 * sigma) - 5, int(60 * sigma) + 6)
    mass = np.exp(-z.astype(float) ** 2 / (2 * sigma ** 2))
    mass /= mass.sum()
    for m in (-3, 0, 1, 4, int(3 * sigma) + 1):
        assert dist.discrete_gaussian_upper_tail(sigma, m) == pytest.approx(mass[z >= m].sum(), rel=1e-9)
        assert dist.discrete_gaussian_cdf(sigma, m) == pytest.approx(mass[z <= m].sum(), rel=1e-9)
    target = 1e-7
    m = dist.discrete_gaussian_quantile(sigma, target)
    assert mass[z >= m].sum() <= target * (1 + 1e-9)
    assert m == 1 or mass[z >= m - 1].sum() > target


def test_noise_cdf_and_sf_are_complementary_for_every_kind():
    for spec in [calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=0.5, l1_sensitivity=3),
                 calibrate(NoiseKind.DISCRETE_GAUSSIAN, epsilon=1.0, delta=1e-6, l2_sensitivity=2),
                 calibrate(NoiseKind.GAUSSIAN, epsilon=1.0, delta=1e-6, l2_sensitivity=2)]:
        xs = np.linspace(-5 * spec.std, 5 * spec.std, 41)
        np.testing.assert_allclose(dist.noise_cdf(spec, xs) + dist.noise_sf(spec, xs), 1.0, atol=1e-12)
    p = math.exp(-1 / 2.0)
    assert dist.discrete_laplace_cdf(2.0, -1) == pytest.approx(p / (1 + p))


# --------------------------------------------------------------------------- any NoiseSpec (from the tuning report)

SPECS = [
    calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=0.5, l1_sensitivity=10),
    calibrate(NoiseKind.LAPLACE, epsilon=1.0, l1_sensitivity=3),
    calibrate(NoiseKind.DISCRETE_GAUSSIAN, epsilon=1.0, delta=1e-6, l2_sensitivity=5),
    calibrate_zcdp(NoiseKind.DISCRETE_GAUSSIAN, rho=0.005, l2_sensitivity=1),
    calibrate_zcdp(NoiseKind.GAUSSIAN, rho=0.01, l2_sensitivity=2),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind.value)
def test_noise_cdf_matches_the_sampler(spec):
    """The CDF used for suppression shares (CentralNotice tuning) is what transforms.noise samples."""
    n = 40_000
    noise = add_noise(spec, np.zeros(n, dtype=np.int64 if spec.kind.is_integer else np.float64),
                      RandomStreams.for_range(ReleaseKey.for_testing(11), "tuning-test", n))
    for x in (-2 * spec.std, -0.3 * spec.std, 0.0, 0.7 * spec.std, 2.5 * spec.std):
        empirical = np.mean(noise <= x)
        assert abs(empirical - float(dist.noise_cdf(spec, x))) < 0.012, x
    xs = np.linspace(-5 * spec.std, 5 * spec.std, 41)
    np.testing.assert_allclose(dist.noise_cdf(spec, xs) + dist.noise_sf(spec, xs), 1.0, atol=1e-12)
    assert np.all(np.diff(dist.noise_cdf(spec, xs)) >= 0)


def test_discrete_laplace_cdf_closed_form_against_summation():
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=1.0, l1_sensitivity=4)
    p = math.exp(-1 / spec.unit_scale)
    z = np.arange(-400, 401)
    mass = (1 - p) / (1 + p) * p ** np.abs(z)
    cdf = np.cumsum(mass)
    for m in (-30, -1, 0, 1, 17):
        assert float(dist.noise_cdf(spec, m)) == pytest.approx(cdf[m + 400], rel=1e-12)
    # Far tail keeps its precision through the survival function.
    assert float(dist.noise_sf(spec, 200)) == pytest.approx(p ** 201 / (1 + p), rel=1e-9)


def test_suppression_share_and_thresholds():
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=1.0, l1_sensitivity=10)
    threshold = dist.threshold_for_rate(spec, 1e-4)
    assert dist.spurious_rate(spec, threshold) <= 1e-4 < dist.spurious_rate(spec, threshold - 1)
    assert dist.suppressed_share(spec, threshold) == pytest.approx(1 - dist.spurious_rate(spec, threshold))
    values = np.array([0, 0, 10 * threshold, 10 * threshold])
    assert dist.suppressed_share(spec, threshold, values) == pytest.approx(
        (1 - dist.spurious_rate(spec, threshold)) / 2, abs=1e-6)
    # Monte Carlo through the real mechanism: the share of keys a release would suppress.
    rng = np.random.default_rng(0)
    true = np.floor(np.exp(rng.normal(4, 1.5, size=20_000))).astype(np.int64)
    noisy = add_noise(spec, true, RandomStreams.for_range(ReleaseKey.for_testing(3), "mc", true.size))
    assert np.mean(noisy <= threshold) == pytest.approx(
        dist.suppressed_share(spec, threshold, true), abs=0.01)


def test_discrete_laplace_quantile_is_the_smallest_integer_meeting_the_target():
    for scale, target in ((1.0, 1e-3), (7.5, 1e-9), (40.0, 0.2)):
        m = dist.discrete_laplace_quantile(scale, target)
        p = math.exp(-1 / scale)
        assert p ** m / (1 + p) <= target and (m == 1 or p ** (m - 1) / (1 + p) > target)
