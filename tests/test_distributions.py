"""accounting.distributions: the noise's CDF, tails and quantiles (one implementation)."""
import math

import numpy as np
import pytest

from accounting import distributions as dist
from accounting.calibration import NoiseKind, calibrate


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
