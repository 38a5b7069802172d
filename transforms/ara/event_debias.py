"""Debiased aggregate conversion counts from noisy event-level reports, with their variance.

Post-processing of released reports (``transforms.ara.event_level``): it costs no privacy.

Let A be a set of cells (e.g. all windows of one trigger-data value: "conversions of value class
t"), a group of n registered sources (e.g. one slice of impressions; the registered sources are
public to the ad tech), ``a_i`` the true number of source i's reports in A and ``M_i`` the number
of its *released* (noisy) reports in A. With flip probability p and ``U`` the number of reports in
A of a state drawn uniformly from the k states,

    E[M_i] = (1 - p) a_i + p mu,        mu = E[U] = R |A| / (N + 1)

(by symmetry each of the N + 1 symbols -- N cells and "no report" -- has expected multiplicity
R / (N + 1) in a uniform multiset of R symbols), so

    X = (sum_i M_i - n p mu) / (1 - p)

is unbiased for ``sum_i a_i``, the attributed conversions in A (a source's triggers beyond R are
never reported: the estimator targets the reported ones). Sources are independent, so

    Var X = sum_i [(1 - p) p a_i^2 - 2 (1 - p) p mu a_i + p E[U^2] - p^2 mu^2] / (1 - p)^2

with ``P(U = j) = C(|A| + j - 1, j) C(N - |A| + R - j, R - j) / k`` (multisets of j symbols of A
times multisets of the other R - j over the remaining N + 1 - |A| symbols). Replacing
``sum a_i`` by X and ``sum a_i^2`` by ``(sum M_i^2 - n p E[U^2]) / (1 - p)`` gives an unbiased
estimate of the variance from the released reports alone (``debias``). Being unbiased it can be
negative, or below what any group of its size can have, for a small group. Each source's term is a
convex quadratic in ``a_i`` whatever the data, so ``Var X >= n min_a f(a) / (1 - p)^2`` over the
integers ``a`` in [0, R] (``variance_floor``: public, from n and the configuration only; about
``n p Var U / (1 - p)^2``, positive whenever p > 0); ``CountEstimate.standard_error`` and the
released ``estimate_std`` clamp the estimate there, so a group with sources never gets a
zero-width interval.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from transforms.ara.event_level import EventLevelConfig


def _multisets(symbols: int, size: int) -> int:
    """Multisets of ``size`` elements over ``symbols`` symbols."""
    if size == 0:
        return 1
    return math.comb(symbols + size - 1, size) if symbols > 0 else 0


def uniform_moments(config: EventLevelConfig, cells_in_set: int) -> tuple[float, float]:
    """(E[U], E[U^2]) of the reports in a set of ``cells_in_set`` cells, uniform state."""
    n_cells, r, k = config.cells, config.max_reports, config.states
    if not 1 <= cells_in_set <= n_cells:
        raise ValueError(f"cells_in_set must be in [1, {n_cells}]")
    probs = np.array([_multisets(cells_in_set, j) * _multisets(n_cells + 1 - cells_in_set, r - j)
                      for j in range(r + 1)], dtype=np.float64) / k
    j = np.arange(r + 1)
    return float(probs @ j), float(probs @ (j * j))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CountEstimate:
    """Debiased count of attributed conversions in a cell set for a group of sources."""

    estimate: float
    variance: float

    #: the smallest variance a group of its size can have (``variance_floor``; 0 if not given)
    floor: float = 0.0

    @property
    def standard_error(self) -> float:
        return math.sqrt(max(self.variance, self.floor, 0.0))


def debias(reported: float, reported_squares: float, sources: int, config: EventLevelConfig,
           cells_in_set: int) -> CountEstimate:
    """Unbiased count and unbiased variance estimate from released reports.

    reported: sum over the group's sources of their released reports in the set (sum M_i);
    reported_squares: sum of M_i^2; sources: n, the group's registered sources (public).
    """
    if sources < 0 or reported < 0 or reported_squares < reported:
        raise ValueError("reported counts must be non-negative with sum of squares >= sum")
    estimate, variance = debias_groups(np.array([sources]), np.array([reported]),
                                       np.array([reported_squares]), config, cells_in_set)
    return CountEstimate(estimate=float(estimate[0]), variance=float(variance[0]),
                         floor=float(variance_floor(np.array([sources]), config, cells_in_set)[0]))


def _per_source_variance(a, p: float, mu: float, u2: float):
    """f(a) of one source with ``a`` true reports in the set (times (1 - p)^2: module docstring)."""
    return (1 - p) * p * a * a - 2 * (1 - p) * p * mu * a + p * u2 - p * p * mu * mu


def variance_floor(sources: np.ndarray, config: EventLevelConfig, cells_in_set: int) -> np.ndarray:
    """The smallest Var X any group of ``sources`` sources can have: ``n min_a f(a) / (1 - p)^2``
    over the integer counts ``a`` in [0, R] (f is convex with its vertex at mu, so the minimum is
    at floor(mu) or ceil(mu)). A function of public quantities only: clamping a variance
    estimate at it is post-processing."""
    p = config.flip_probability
    mu, u2 = uniform_moments(config, cells_in_set)
    candidates = np.clip(np.array([math.floor(mu), math.ceil(mu)], dtype=np.float64), 0,
                         config.max_reports)
    least = max(float(_per_source_variance(candidates, p, mu, u2).min()), 0.0)
    return np.asarray(sources, dtype=np.float64) * least / (1.0 - p) ** 2


def exact_variance(true_counts: np.ndarray, config: EventLevelConfig, cells_in_set: int) -> float:
    """Var X given each source's true reports in the set (``true_counts``, one per source)."""
    a = np.asarray(true_counts, dtype=np.float64)
    if a.size and (a.min() < 0 or a.max() > config.max_reports):
        raise ValueError(f"true counts must be in [0, max_reports = {config.max_reports}]")
    p = config.flip_probability
    mu, u2 = uniform_moments(config, cells_in_set)
    per_source = _per_source_variance(a, p, mu, u2)
    return float(per_source.sum() / (1 - p) ** 2)


def group_moments(group: np.ndarray, released: np.ndarray, groups: int) -> tuple[np.ndarray,
                                                                                    np.ndarray,
                                                                                    np.ndarray]:
    """(sources, sum M, sum M^2) per group from one released count per source."""
    group = np.asarray(group, dtype=np.int64)
    m = np.asarray(released, dtype=np.float64)
    return (np.bincount(group, minlength=groups).astype(np.float64),
            np.bincount(group, weights=m, minlength=groups),
            np.bincount(group, weights=m * m, minlength=groups))


def debias_groups(sources: np.ndarray, reported: np.ndarray, reported_squares: np.ndarray,
                  config: EventLevelConfig, cells_in_set: int) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised ``debias`` over groups: (estimates, variance estimates)."""
    p = config.flip_probability
    mu, u2 = uniform_moments(config, cells_in_set)
    n = np.asarray(sources, dtype=np.float64)
    estimate = (np.asarray(reported, dtype=np.float64) - n * p * mu) / (1.0 - p)
    squares = (np.asarray(reported_squares, dtype=np.float64) - n * p * u2) / (1.0 - p)
    variance = ((1 - p) * p * squares - 2 * (1 - p) * p * mu * estimate
                + n * (p * u2 - p * p * mu * mu)) / (1.0 - p) ** 2
    return estimate, variance
