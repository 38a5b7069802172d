"""Reach and frequency estimators for LiquidLegions sketches (pure math, post-processing only).

Reach: n ids spread over m registers with density a e^{-a x} / (1 - e^{-a}); with t = n / m,
    E[active] / m = 1 - (1/a) [E1(a t / (e^a - 1)) - E1(a e^a t / (e^a - 1))]
(E1 the exponential integral; for a = 0, 1 - e^{-t}). The expectation increases strictly with n,
so the estimate is the n that makes it equal to the (noisy) active-register count, found by
Brent's method on a doubling bracket.

Frequency: a non-collided register holds exactly one person, and which registers stay
non-collided depends only on the register occupancy, not on anybody's frequency, so the
histogram of their counts (capped at K, the last bin meaning "K or more") estimates the
frequency distribution; k-reach = reach * f_k and k+ reach is the reverse cumulative sum.

Rules for noisy inputs: an active count is clamped to [0, m - 1] (0 gives reach 0); negative
histogram bins count as 0; a histogram with no positive bin gives the all-zero distribution.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import exp1

from transforms.sketches.liquid_legions import SketchConfig

__all__ = ["expected_active_registers", "estimate_reach", "frequency_distribution",
           "k_reach", "k_plus_reach", "shuffle_distance"]


def expected_active_registers(reach, config: SketchConfig):
    """Expected number of active registers after ``reach`` distinct ids (array or scalar)."""
    m, a = config.num_registers, config.decay_rate
    t = np.asarray(reach, dtype=np.float64) / m
    if a == 0.0:
        return m * -np.expm1(-t)
    scale = a / math.expm1(a)  # a / (e^a - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        low, high = exp1(scale * t), exp1(scale * math.exp(a) * t)
        frac = np.where(t > 0, 1.0 - (low - high) / a, 0.0)
    return m * frac


def estimate_reach(active_registers: float, config: SketchConfig) -> float:
    """Number of distinct ids whose expected active-register count is ``active_registers``."""
    m, a = config.num_registers, config.decay_rate
    target = min(max(float(active_registers), 0.0), m - 1.0)
    if target <= 0.0:
        return 0.0
    if a == 0.0:
        return float(-m * math.log1p(-target / m))
    hi = float(m)
    while expected_active_registers(hi, config) < target:
        hi *= 2.0
    return float(brentq(lambda n: float(expected_active_registers(n, config)) - target,
                        0.0, hi, xtol=1e-9, rtol=1e-12, maxiter=500))


def frequency_distribution(histogram) -> np.ndarray:
    """Fractions f_1..f_K (f_K = "K or more") from a (noisy) capped histogram."""
    h = np.clip(np.asarray(histogram, dtype=np.float64), 0.0, None)
    total = h.sum()
    return h / total if total > 0 else np.zeros_like(h)


def k_reach(reach: float, distribution) -> np.ndarray:
    """Number of people reached exactly k times (the last entry: K or more times)."""
    return float(reach) * np.asarray(distribution, dtype=np.float64)


def k_plus_reach(reach: float, distribution) -> np.ndarray:
    """Number of people reached at least k times, k = 1..K."""
    d = np.asarray(distribution, dtype=np.float64)
    return float(reach) * np.cumsum(d[::-1])[::-1]


def shuffle_distance(f1, f2) -> float:
    """WFA frequency error: half the L1 distance between two frequency distributions."""
    return 0.5 * float(np.abs(np.asarray(f1, float) - np.asarray(f2, float)).sum())
