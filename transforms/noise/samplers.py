"""Exact integer noise samplers, vectorised over lanes of :class:`RandomStreams`.

These follow Canonne, Kamath & Steinke (2020), "The Discrete Gaussian for Differential Privacy",
Algorithms 1-3, using only uniform integers from the keyed streams (no floating point in the
discrete Laplace path). Each algorithm's loops run over arrays of still-active lanes, so a million
samples cost a few dozen numpy passes rather than a million Python calls.

* Bernoulli(exp(-γ)) for rational γ = num/den in [0, 1]: draw A_k ~ Bernoulli(γ/k) for
  k = 1, 2, ... until the first failure; return whether that k is odd. Bernoulli(γ/k) is drawn as
  [uniform{0..k-1} == 0] and [uniform{0..den-1} < num], exact and free of overflow.
* Discrete Laplace with scale t/s (P[z] ∝ exp(-|z| s/t)): geometric via U + t·V, see
  :func:`discrete_laplace_units`. Scales are represented as t / 2^20 with integer t.
* Discrete Gaussian N_Z(0, σ²): discrete Laplace proposal with scale floor(σ)+1, accepted with
  probability exp(-(|Y| - σ²/t)²/(2σ²)). The exponent is computed in double precision and its
  fractional part rounded up to a multiple of 2^-60 before the exact Bernoulli: this perturbs each
  acceptance probability by a relative factor within 1 ± 2^-50 (documented, far below any
  privacy-relevant level); the output is always an integer.
"""
from __future__ import annotations

import math

import numpy as np

from accounting.calibration import SCALE_FRACTION_BITS
from transforms.noise.streams import RandomStreams

_U64 = np.uint64
_FRACTION_BITS_GAMMA = 60


def _all(streams: RandomStreams, lanes):
    return np.arange(streams.size) if lanes is None else np.asarray(lanes)


def bernoulli_ratio(streams: RandomStreams, num: np.ndarray, den, k: int,
                    lanes: np.ndarray) -> np.ndarray:
    """Bernoulli(num / (k·den)) per lane, exactly. ``den`` is an array (one per lane) or one
    integer for every lane (the samplers' common case: no per-lane arrays to build and scan)."""
    if np.ndim(den) == 0:
        den = int(den)  # a Python int: exact products, and randint takes it as one common bound
    if k == 1 and np.all(num == den):
        return np.ones(lanes.size, dtype=bool)
    if np.all(den <= (1 << 63) // k):
        return streams.randint(den * k, lanes) < num
    # k·den would overflow 64 bits: draw the 1/k and num/den parts separately.
    first = streams.randint(k, lanes) == 0
    return first & (streams.randint(den, lanes) < num)


def bernoulli_exp_fraction(streams: RandomStreams, num, den, lanes: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(-num/den)) per lane, for 0 <= num <= den (exact). ``num`` and ``den`` are
    arrays (one per lane) or integers common to every lane."""
    common_num, common_den = np.ndim(num) == 0, np.ndim(den) == 0
    num = int(num) if common_num else np.asarray(num, dtype=np.uint64)
    den = int(den) if common_den else np.asarray(den, dtype=np.uint64)
    result = np.zeros(lanes.size, dtype=bool)
    active = np.arange(lanes.size)
    k = 1
    while active.size:
        success = bernoulli_ratio(streams, num if common_num else num[active],
                                  den if common_den else den[active], k, lanes[active])
        finished = active[~success]
        result[finished] = (k % 2) == 1
        active = active[success]
        k += 1
    return result


def bernoulli_exp_minus_one(streams: RandomStreams, lanes: np.ndarray) -> np.ndarray:
    return bernoulli_exp_fraction(streams, 1, 1, lanes)


def bernoulli_exp(streams: RandomStreams, gamma: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(-γ)) for real γ >= 0 (doubles): floor(γ) exp(-1) trials, then the fraction."""
    gamma = np.asarray(gamma, dtype=np.float64)
    whole = np.floor(gamma)
    fraction = gamma - whole
    alive = np.ones(lanes.size, dtype=bool)
    remaining = whole.astype(np.int64)
    candidates = np.nonzero(remaining > 0)[0]
    while candidates.size:
        ok = bernoulli_exp_minus_one(streams, lanes[candidates])
        alive[candidates[~ok]] = False
        remaining[candidates] -= 1
        candidates = candidates[ok & (remaining[candidates] > 0)]
    idx = np.nonzero(alive)[0]
    if idx.size:
        den = np.full(idx.size, 1 << _FRACTION_BITS_GAMMA, dtype=np.uint64)
        num = np.ceil(np.ldexp(fraction[idx], _FRACTION_BITS_GAMMA)).astype(np.uint64)
        alive[idx] = bernoulli_exp_fraction(streams, num, den, lanes[idx])
    return alive


def scale_to_units(scale: float) -> int:
    """Integer t with t / 2^20 >= scale (the sampled discrete Laplace scale, rounded up)."""
    t = math.ceil(math.ldexp(scale, SCALE_FRACTION_BITS))
    if t >= 1 << 52:
        raise ValueError(f"discrete Laplace scale {scale} is too large for the exact sampler")
    return max(t, 1)


def discrete_laplace_units(streams: RandomStreams, t: int, s: int, lanes: np.ndarray) -> np.ndarray:
    """Discrete Laplace with P[z] ∝ exp(-|z| s / t) for integers s, t >= 1 (CKS Algorithm 2)."""
    out = np.zeros(lanes.size, dtype=np.int64)
    pending = np.arange(lanes.size)
    while pending.size:
        ln = lanes[pending]
        u = streams.randint(t, ln)
        accept_u = bernoulli_exp_fraction(streams, u, t, ln)
        retry = pending[~accept_u]
        kept = pending[accept_u]
        u = u[accept_u]
        # V ~ Geometric(1 - e^-1): count successes of Bernoulli(e^-1) until the first failure.
        v = np.zeros(kept.size, dtype=np.uint64)
        active = np.arange(kept.size)
        while active.size:
            more = bernoulli_exp_minus_one(streams, lanes[kept[active]])
            v[active[more]] += _U64(1)
            active = active[more]
        x = u + _U64(t) * v
        y = (x // _U64(s)).astype(np.int64)
        sign = (streams.draw(lanes[kept]) & _U64(1)).astype(bool)
        reject = sign & (y == 0)
        good = ~reject
        out[kept[good]] = np.where(sign[good], -y[good], y[good])
        pending = np.concatenate([retry, kept[reject]])
    return out


def discrete_laplace(streams: RandomStreams, scale: float, lanes: np.ndarray = None) -> np.ndarray:
    """One sample of discrete Laplace (P[z] ∝ exp(-|z|/b), b = scale rounded up to 2^-20) per lane."""
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    lanes = _all(streams, lanes)
    return discrete_laplace_units(streams, scale_to_units(scale), 1 << SCALE_FRACTION_BITS, lanes)


def discrete_gaussian(streams: RandomStreams, sigma: float, lanes: np.ndarray = None) -> np.ndarray:
    """One sample of the discrete Gaussian N_Z(0, σ²) per lane (CKS Algorithm 3)."""
    if not sigma > 0:
        raise ValueError(f"sigma must be positive, got {sigma!r}")
    lanes = _all(streams, lanes)
    t = math.floor(sigma) + 1
    sigma2 = sigma * sigma
    out = np.zeros(lanes.size, dtype=np.int64)
    pending = np.arange(lanes.size)
    while pending.size:
        y = discrete_laplace_units(streams, t << SCALE_FRACTION_BITS, 1 << SCALE_FRACTION_BITS,
                                   lanes[pending])
        gamma = (np.abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        accept = bernoulli_exp(streams, gamma, lanes[pending])
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out
