"""The distributions of the noise a :class:`~accounting.calibration.NoiseSpec` describes.

Pure numpy/scipy, beside calibration: what the noise engine (:mod:`transforms.noise`) samples,
as probabilities. Used by private key selection (thresholds and keep probabilities) and by the
CentralNotice tuning report (:func:`spurious_rate`, :func:`suppressed_share` and
:func:`threshold_for_rate`, for any spec).

* Discrete Laplace with P[z] ∝ p^|z|, p = exp(-1/b) (b the unit scale): in closed form,
  P(Z <= m) = 1 - p^(m+1)/(1+p) for m >= 0 and p^(-m)/(1+p) for m < 0.
* Discrete Gaussian N_Z(0, σ²) (Canonne, Kamath & Steinke 2020): by exact summation of its mass
  function over |z| <= 40σ + 10 (beyond, the mass underflows double precision), with the upper
  tail summed from the top so tiny tail probabilities keep their relative precision.
* Real-valued kinds are integer noise in units of the spec's grid; for ``GAUSSIAN`` (grid 2^-24
  of σ) and for discrete Gaussians with σ above :data:`EXACT_SIGMA_LIMIT` the *reporting*
  functions :func:`noise_cdf` / :func:`noise_sf` use the continuity-corrected normal CDF, which
  differs far less than a reported share's rounding. Decisions that carry a privacy guarantee
  (:func:`discrete_gaussian_quantile`) always use the exact sums.
* :func:`discrete_gaussian_shift_delta`: the exact privacy curve δ(ε) of independent discrete
  Gaussians on several coordinates shifted by an integer vector (one privacy unit changing
  several keys), the oracle behind the multi-key calibration of ``accounting.calibration``.
"""
from __future__ import annotations

import functools
import math

import numpy as np

#: Beyond this many sigmas the discrete Gaussian's mass is below double precision.
TAIL_SIGMAS = 40
#: Above this sigma the reporting CDF of a discrete Gaussian is the continuity-corrected normal.
EXACT_SIGMA_LIMIT = 2000.0


# --------------------------------------------------------------------------- discrete Gaussian

@functools.lru_cache(maxsize=16)
def _discrete_gaussian_table(sigma: float) -> tuple[int, np.ndarray, np.ndarray]:
    """(h, CDF P(Z <= z), upper tail P(Z >= z)) over the integers z = -h..h."""
    half = int(TAIL_SIGMAS * sigma) + 10
    support = np.arange(-half, half + 1, dtype=np.float64)
    weights = np.exp(-(support ** 2) / (2 * sigma ** 2))
    total = weights.sum()
    return half, np.cumsum(weights) / total, np.cumsum(weights[::-1])[::-1] / total


def discrete_gaussian_cdf(sigma: float, m) -> np.ndarray:
    """P(Z <= m) for integer(s) m, Z ~ N_Z(0, sigma^2), by exact summation."""
    half, cdf, _ = _discrete_gaussian_table(float(sigma))
    index = np.asarray(m, dtype=np.int64) + half
    return np.where(index < 0, 0.0, cdf[np.clip(index, 0, 2 * half)])


def discrete_gaussian_upper_tail(sigma: float, m) -> np.ndarray:
    """P(Z >= m) for integer(s) m, Z ~ N_Z(0, sigma^2), by exact summation (from the top)."""
    half, _, upper = _discrete_gaussian_table(float(sigma))
    index = np.asarray(m, dtype=np.int64) + half
    return np.where(index > 2 * half, 0.0, np.where(index < 0, 1.0, upper[np.clip(index, 0, 2 * half)]))


def discrete_gaussian_quantile(sigma: float, target: float) -> int:
    """Smallest integer m >= 1 with P(Z >= m) <= target (Z ~ N_Z(0, sigma^2)).

    A threshold m released only when ``n + Z >= m + 1`` keeps a key with a single unit
    (n = 1) with probability at most ``target``.
    """
    from scipy import special  # lazily (start-up time); scipy.stats is never imported here

    m = max(1, int(-special.ndtri(target) * sigma) - 2)
    while discrete_gaussian_upper_tail(sigma, m) > target:
        m += 1
    while m > 1 and discrete_gaussian_upper_tail(sigma, m - 1) <= target:
        m -= 1
    return m


def discrete_gaussian_shift_delta(sigma: float, shifts, epsilon: float) -> float:
    """Exact δ(ε) between ⊗N_Z(0, σ²) and ⊗N_Z(c_i, σ²) for integer shifts c (one per key).

    The privacy loss at x is (‖c‖² − 2 Σ c_i x_i) / (2σ²): it depends on x only through the
    integer S = Σ c_i X_i, whose distribution is the convolution of the coordinates' mass
    functions placed on the lattices c_i·Z. So δ(ε) = Σ_s P(S = s)·(1 − e^(ε − L(s)))₊ is a finite
    sum (mass beyond 40σ + 10 per coordinate is below double precision). S is symmetric, so the
    reverse direction has the same curve. Cost grows like (Σ c_i · σ)²: for small cases (tests
    and audits), not for calibrating large σ.
    """
    shifts = [abs(int(c)) for c in np.atleast_1d(shifts) if int(c) != 0]
    if not shifts:
        return 0.0
    half, cdf, _ = _discrete_gaussian_table(float(sigma))
    mass = np.diff(cdf, prepend=0.0)
    dist, offset = np.ones(1), 0
    for c in shifts:
        spread = np.zeros(2 * half * c + 1)
        spread[::c] = mass
        dist, offset = np.convolve(dist, spread), offset + half * c
    s = np.arange(dist.size, dtype=np.float64) - offset
    loss = (sum(c * c for c in shifts) - 2 * s) / (2 * sigma ** 2)
    above = loss > epsilon
    return float(np.sum(dist[above] * -np.expm1(epsilon - loss[above])))


# --------------------------------------------------------------------------- discrete Laplace

def discrete_laplace_cdf(unit_scale: float, m) -> np.ndarray:
    """P(Z <= m) for integer(s) m, P[z] ∝ exp(-|z| / unit_scale), in closed form."""
    m = np.asarray(m, dtype=np.float64)
    log_p = -1.0 / unit_scale
    log1p_p = math.log1p(math.exp(log_p))
    with np.errstate(over="ignore", invalid="ignore"):
        upper = -np.expm1((m + 1) * log_p - log1p_p)
        lower = np.exp(-m * log_p - log1p_p)
    return np.where(m >= 0, upper, lower)


def discrete_laplace_quantile(unit_scale: float, target: float) -> int:
    """Smallest integer m >= 1 with P(Z >= m) = p^m / (1 + p) <= target (p = exp(-1/unit_scale)),
    in closed form: the discrete Laplace counterpart of :func:`discrete_gaussian_quantile`."""
    p = math.exp(-1 / unit_scale)
    return max(1, math.ceil(math.log(target * (1 + p)) / math.log(p)))


# --------------------------------------------------------------------------- any NoiseSpec

def noise_cdf(spec, x) -> np.ndarray:
    """P(noise <= x), elementwise, for the noise ``spec`` describes (in output units)."""
    x = np.asarray(x, dtype=np.float64)
    units = np.floor(x / spec.granularity + 1e-9)  # noise is an integer number of grid units
    if spec.kind.is_gaussian:
        sigma = spec.unit_scale
        if not spec.kind.is_integer or sigma > EXACT_SIGMA_LIMIT:
            # Grid far below sigma (or huge sigma): the continuous CDF at the grid point.
            from scipy import special

            return special.ndtr((units + 0.5) / sigma)
        return discrete_gaussian_cdf(sigma, units)
    return discrete_laplace_cdf(spec.unit_scale, units)


def noise_sf(spec, x) -> np.ndarray:
    """P(noise > x), computed in the tail (so tiny probabilities keep their precision)."""
    x = np.asarray(x, dtype=np.float64)
    units = np.floor(x / spec.granularity + 1e-9)
    if spec.kind.is_gaussian and (not spec.kind.is_integer or spec.unit_scale > EXACT_SIGMA_LIMIT):
        from scipy import special

        return special.ndtr(-(units + 0.5) / spec.unit_scale)
    # Symmetry: P(Z > m) = P(Z < -m) = P(Z <= -m - 1).
    return noise_cdf(spec, (-units - 1) * spec.granularity)


# --------------------------------------------------------------------------- thresholds of any NoiseSpec

def spurious_rate(spec, threshold: float) -> float:
    """P(noise > threshold): an empty key released."""
    return float(noise_sf(spec, threshold))


def suppressed_share(spec, threshold: float, true_values=None) -> float:
    """Mean over keys of P(value + noise <= threshold) (true values 0 when not given)."""
    values = np.zeros(1) if true_values is None else np.asarray(true_values, dtype=np.float64)
    if values.size == 0:
        return float("nan")
    return float(np.mean(noise_cdf(spec, threshold - values)))


def threshold_for_rate(spec, rate: float) -> float:
    """Smallest threshold (a multiple of the grid) with P(noise > threshold) <= rate."""
    if not 0 < rate < 1:
        raise ValueError(f"spurious rate must be in (0, 1), got {rate!r}")
    lo, hi = 0.0, spec.scale
    while spurious_rate(spec, hi) > rate:
        lo, hi = hi, hi * 2
    g = spec.granularity
    lo_u, hi_u = math.floor(lo / g), math.ceil(hi / g)
    while hi_u - lo_u > 1:
        mid = (lo_u + hi_u) // 2
        if spurious_rate(spec, mid * g) > rate:
            lo_u = mid
        else:
            hi_u = mid
    return hi_u * g
