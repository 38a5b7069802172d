"""Count, sum, mean, variance and standard deviation from the fewest noisy measures.

The moment metrics of one aggregation share their noisy measures (post-processing of the same
noisy answers costs nothing): a noisy count ``N``, a noisy normalised sum ``S`` (the sum of
``value - midpoint``: the centred values' magnitude is the half-range ``h``, not the largest
|value|) and, for a variance or standard deviation, a noisy normalised sum of squares ``Q`` (the
sum of ``(value - midpoint)^2 - h^2/2``). A mean is ``midpoint + S/N``; a sum asked with a mean
or variance is ``S + midpoint N``; a variance is ``Q/N + h^2/2 - (S/N)^2``. PipelineDP derives
count, sum and mean the same way (its mean's count and normalised sum). A sum asked without a
mean or variance is measured directly (``Σ``, the sum of clamped values) when that has the
smaller stated error: alone, one measure is always better (Hölder's inequality); beside a
count it depends on where the range lies and on the weights (beside a count of equal weight,
held at or above its equal-split accuracy below, the derived sum wins: at the equal split its
variance ``h^2 + midpoint^2 = (a^2 + b^2) / 2`` per unit of the count's is never above the direct
sum's ``max(a^2, b^2)``, for a range ``[a, b]``).

The budget share of these measures (the moment metrics' weights together) is split among them
to minimise the *worst* requested metric's stated variance (:func:`best_split`), each
metric's variance taken per row and in its own natural unit, so that the metrics are comparable
without any data:

* a count: ``Var(N)`` (rows^2);
* a sum: ``(Var(S) + midpoint^2 Var(N)) / h^2`` (derived) or ``Var(Σ) / h^2`` (direct) -- the
  sum's error per row in half-ranges;
* a mean: ``(Var(S) + (h^2/3) Var(N)) / h^2`` -- the delta method's ``Var(S) + m^2 Var(N)``
  (``m`` the mean's offset from the midpoint), with ``m^2`` at its average ``h^2/3`` over the
  range (the mean is not known in advance), in half-ranges;
* a variance: ``(Var(Q) + (4 h^2/3) Var(S) + (25 h^4/36) Var(N)) / h^4`` -- the delta method at
  ``m^2 = h^2/3`` and the normalised second moment of values spread evenly over the range
  (``q = -h^2/6``), in half-ranges squared; a standard deviation: 3/4 of that (the delta
  method's ``Var(V) / (4 V)`` at the same values' variance ``h^2/3``, in half-ranges);

each divided by the metric's weight relative to the others (``Metric.weight``: a metric of twice
the weight is held to half the variance). The variances are the calibrated noises' own
(discrete Laplace, Laplace, the analytic Gaussian or zCDP's Gaussian at each share), found by a
search over the shares on a grid of 1/40 of the budget refined to 1/400, plus the equal split
itself: a deterministic function of the public configuration. The minimax objective puts the
budget where the worst-off metric needs it.

**No metric below the equal split** (metrics of equal weight, the default): the search keeps
only splits at which *every* requested metric's variance is at most its variance at the equal
split of the same measures (:func:`equal_split_floor`) -- the split a user composing the
measures by hand gets, and PipelineDP's (its mean's count and normalised sum at half the budget
each). Without it the minimax serves the worst metric only: where one metric's normalised
variance always exceeds another's (the derived sum's ``Var(S)/h^2 + Var(N)`` over a range
starting at 0 is never below the count's ``Var(N)``), the other never binds and pays for a small
gain of the worst. A discrete count at large epsilon is the case: its variance falls faster than
the normalised sum's as its share grows, and the unconstrained minimax for a count, a sum and a
mean at epsilon 8 gave the count 0.4675 of the budget -- its variance 1.31x that at the equal
split, for 1.8% off the sum's. With the floor the split there is the equal one, where neither
can gain without the other losing; a request whose metrics all gain together (one metric, or a
variance's three measures) still gets the minimax optimum. Weighted metrics state their own
trade-off, and the floor does not apply. For a count, a sum and a mean over a range starting at
0 the result is the equal split at every epsilon (the sum's variance is symmetric in the two
shares under continuous noise, and the floor holds the count at half with a discrete one).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from accounting.calibration import NoiseKind, calibrate, calibrate_zcdp

#: The search grid: shares in steps of 1/COARSE of the moments' budget, then steps of 1/FINE
#: within one coarse step of the best.
COARSE, FINE = 40, 400


@dataclass(frozen=True, kw_only=True)
class Moments:
    """The shared moment measures of one aggregation and how the metrics derive from them.

    count, nsum, nsq, direct_sum: the names of the measures ``N``, ``S``, ``Q`` and ``Σ`` (None
    where not measured); a sum is derived as ``S + midpoint N`` when ``direct_sum`` is None.
    fractions: each measure's share of the moments' budget (they add up to 1); worst: the
    minimised objective (the worst requested metric's normalised variance); floored: whether
    the split was held to no metric above its variance at the equal split (metrics of equal
    weight, module docstring).
    """

    count: Optional[str] = None
    nsum: Optional[str] = None
    nsq: Optional[str] = None
    direct_sum: Optional[str] = None
    midpoint: float = 0.0
    half_range: float = 0.0
    fractions: Mapping[str, float] = field(default_factory=dict)
    worst: float = 0.0
    floored: bool = False

    @property
    def names(self) -> tuple:
        return tuple(n for n in (self.count, self.nsum, self.nsq, self.direct_sum) if n is not None)


def metric_variances(kinds: Sequence[str], variances: Mapping[str, np.ndarray], *, count, nsum,
                     nsq, direct_sum, midpoint: float, half_range: float) -> list:
    """Each metric kind's normalised variance (module docstring) from its measures' noise
    variances (arrays over candidate splits), in the order of ``kinds``."""
    h2 = half_range * half_range if half_range > 0 else 1.0
    out = []
    for kind in kinds:
        if kind == "count":
            out.append(variances[count])
        elif kind == "sum":
            out.append(variances[direct_sum] / h2 if direct_sum is not None else
                       (variances[nsum] + midpoint * midpoint * variances[count]) / h2)
        elif kind == "mean":
            out.append((variances[nsum] + h2 / 3 * variances[count]) / h2)
        else:
            var = (variances[nsq] + 4 * h2 / 3 * variances[nsum]
                   + 25 * h2 * h2 / 36 * variances[count]) / (h2 * h2)
            out.append(0.75 * var if kind == "std" else var)
    return out


def equal_split_floor(terms: Sequence[np.ndarray], floor: Sequence[float]) -> np.ndarray:
    """Where each metric's variance (``terms``, arrays over candidate splits, as
    :func:`metric_variances` returns them) is at most its ``floor`` (its variance at the equal
    split; a relative slack of 1e-9 for rounding): the splits the module docstring's "no metric
    below the equal split" keeps."""
    terms = np.stack([np.asarray(t, dtype=float) for t in terms])
    return np.all(terms <= np.asarray(floor, dtype=float)[:, None] * (1 + 1e-9), axis=0)


def best_split(names: Sequence[str], objective: Callable[[Mapping[str, np.ndarray]], np.ndarray]):
    """The shares of ``names`` (adding up to 1) minimising ``objective`` (fractions by name,
    arrays over candidates -> array of objective values, ``inf`` where a split is not allowed),
    searched on a grid of 1/COARSE and refined in steps of 1/FINE around the best, the equal
    split evaluated beside each grid (1/3 is on neither). Returns ``(fractions, objective
    value)``."""
    k = len(names)
    if k == 1:
        return {names[0]: 1.0}, float(objective({names[0]: np.ones(1)})[0])
    best = None
    for step, centre, radius in ((COARSE, None, None), (FINE, None, FINE // COARSE)):
        if best is not None:
            centre = np.rint(np.asarray(best) * step).astype(int)
        free = []
        for j in range(k - 1):
            if centre is None:
                free.append(np.arange(1, step))
            else:
                free.append(np.arange(max(1, centre[j] - radius), min(step - 1, centre[j] + radius) + 1))
        grid = np.stack(np.meshgrid(*free, indexing="ij"), -1).reshape(-1, k - 1)
        last = step - grid.sum(axis=1)
        grid = grid[last >= 1]
        points = np.concatenate([grid, (step - grid.sum(axis=1))[:, None]], axis=1) / step
        points = np.concatenate([np.full((1, k), 1.0 / k), points])
        values = objective({n: points[:, j] for j, n in enumerate(names)})
        i = int(np.argmin(values))
        best = points[i]
        best_value = float(values[i])
    return {n: float(best[j]) for j, n in enumerate(names)}, best_value


def noise_variance(kind: NoiseKind, sensitivities, share, fraction: float) -> float:
    """The variance of ``kind`` noise calibrated to ``fraction`` of ``share`` (a BudgetShare:
    its epsilon and delta, or its rho) for ``sensitivities``, as
    :meth:`accounting.measures.Measure.calibrated` calibrates it. (Where Gaussian and Laplace
    measures mix, the final split gives the Gaussian ones all the moments' delta: the search's
    Gaussian variances are then slightly pessimistic; the calibration itself is exact. A
    multi-key discrete Gaussian's variance here is the zCDP route's, an upper bound on the
    final PLD calibration's, which would cost seconds per point of the search.)"""
    return _variance(NoiseKind.parse(kind), float(sensitivities.l1), float(sensitivities.l2),
                     int(sensitivities.l0), share.epsilon, share.delta, share.rho, round(fraction, 9))


@functools.lru_cache(maxsize=65536)
def _variance(kind, l1, l2, l0, epsilon, delta, rho, fraction) -> float:
    if rho is not None and kind.is_gaussian:
        noise = calibrate_zcdp(kind, rho=rho * fraction, l2_sensitivity=l2, l0=l0,
                               multi_key_pld=False)
    elif rho is not None:
        noise = calibrate(kind, epsilon=math.sqrt(2 * rho * fraction), l1_sensitivity=l1, l0=l0)
    elif kind.is_gaussian:
        noise = calibrate(kind, epsilon=epsilon * fraction, delta=delta * fraction,
                          l2_sensitivity=l2, l0=l0, multi_key_pld=False)
    else:
        noise = calibrate(kind, epsilon=epsilon * fraction, l1_sensitivity=l1, l0=l0)
    return noise.std ** 2
