"""Statistical tester for (epsilon, delta)-differential privacy of a sampled mechanism.

Given samplers for a mechanism's output on two neighbouring datasets D and D', the tester
looks for an output event E that witnesses a violation of

    P_D(E) <= e^epsilon * P_D'(E) + delta      (and the same with D and D' swapped),

in the spirit of Google's stochastic DP tester and DP-Auditorium:

1. Each sampler is called once for ``n_samples`` outputs; the outputs are split into a
   *selection* part and an independent *evaluation* part.
2. On the selection part, a large family of candidate events is scored: threshold events
   {x >= t} and {x <= t} and histogram bins (single values for discrete outputs), for every
   projection of the output to a real number. Thresholds sit at order statistics of the pooled
   selection samples, dense in both tails (where privacy loss concentrates).
3. The few events per direction with the largest *predicted* lower bound on epsilon are kept.
   Because they were chosen on data the evaluation never sees, only the kept events pay for
   multiple testing.
4. On the evaluation part, each kept event gets one-sided Clopper-Pearson bounds: a lower bound
   on the numerator probability and an upper bound on the denominator probability, each at level
   ``alpha / (number of bounds)`` (union bound). The check fails when, for some kept event,
   ``lower P_num(E) - delta > e^epsilon * upper P_den(E)``.

If the mechanism is (epsilon, delta)-DP, every bound holds simultaneously with probability at
least ``confidence`` and then no event can fail, so a false failure has probability at most
``1 - confidence`` (whatever the samplers' mutual dependence, as long as each sampler's lanes
are independent draws). The reported ``epsilon_lower_bound`` -- the largest
``ln((lower P_num(E) - delta) / upper P_den(E))`` over kept events -- is a lower bound on the
mechanism's true epsilon at the claimed delta with the same confidence; the check fails exactly
when it exceeds the claimed epsilon.

The test statistic and the multiple-testing correction, precisely. For a kept event E and a
direction (numerator dataset N, denominator dataset M), with c_N, c_M its counts among the m
evaluation outputs of each dataset and ``alpha = (1 - confidence) / (4 * events_per_direction)``,

    eps_hat(E) = ln((CP_lower(c_N, m, alpha) - delta) / CP_upper(c_M, m, alpha)),

and the statistic is the maximum of eps_hat over the ``2 * events_per_direction`` kept
(event, direction) pairs; the check fails when it exceeds the claimed epsilon. The correction is a
Bonferroni (union) bound over the ``4 * events_per_direction`` one-sided Clopper-Pearson bounds
that the evaluation computes -- and over nothing else: the number of projections and candidate
events (thousands) does not enter it, because events are chosen on the selection half, which is
independent of the evaluation half. So adding projections never raises the false-failure rate
above ``1 - confidence``; it only spreads the selection's attention over more candidates (a
real violation still has to stand out on half the samples), which is why the multi-key families
below are pairwise and targeted rather than exhaustive.

Multi-key releases (:class:`ReleaseLayout`) are vectors per sample, and the leaks that matter
there are invisible to per-coordinate events:

* joint events: "key i released and key j not" (x_i (1 - x_j) on release indicators) and
  x_i - x_j on values. A substitution moves two keys in opposite directions, so a mechanism
  calibrated for one changed key passes every per-key event at the claimed epsilon while the
  joint event carries about twice the loss (issue 10, point 3); :func:`joint_indicator_projection`
  (:meth:`ReleaseLayout.joint_projection`) covers changes spanning more than two keys, where
  pairs see only a share of the loss;
* low-order bits: x mod 2^b of integer outputs (:func:`integer_low_bits_projection`), the residue
  modulo a real grid (:func:`grid_residue_projection`) and the last mantissa bits of float64
  outputs (:func:`low_bits_projection`). Noise drawn on a coarser grid than the answer (2 Z added
  to an integer count) leaves the answer's parity in the output: epsilon is infinite, yet
  threshold events on the value see only the calibrated noise;
* order: "key i emitted before key j" when the layout records emission ranks (a release whose
  row order depends on which keys had data, issue 10 point 1);
* released/suppressed indicators: per key "released", and per key and value "value released"
  (not null): a release threshold compares a noisy value, so whether a key or a value comes out
  is itself an output event bound by (epsilon, delta). A threshold compared against the *exact*
  value makes the indicator a deterministic function of the data: released on every sample of D,
  on none of D' (issue 30).

Fixed indicator events (:func:`indicator_test`): when the events are few and known in advance --
each 0/1 indicator equal to 1 and equal to 0, in both directions -- no selection half is needed:
all samples evaluate every event, under a union bound over the ``4 * m`` Clopper-Pearson bounds
of m indicators. :func:`indicator_runs_needed` is the number of samples per dataset with which an
indicator that is 1 on every sample of one dataset and 0 on every sample of the other fails the
claim for certain (its counts are then deterministic): about ``e^epsilon * ln(4 m / (1 -
confidence))``, which is what makes the check affordable for whole jobs at small epsilon.

A passed check is evidence, not proof: it finds violations that some threshold/bin event of a
projection exposes with the given number of samples. Pure numpy/scipy; no Beam.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
from scipy import stats

from accounting.validation import (check_delta, check_finite, check_positive_int,
                                   check_probability)

Sampler = Callable[[int], np.ndarray]
Projection = Callable[[np.ndarray], np.ndarray]

_DIRECTIONS = ("D over D'", "D' over D")


# --------------------------------------------------------------------------------------------
# Clopper-Pearson bounds
# --------------------------------------------------------------------------------------------

def clopper_pearson_lower(successes, trials, alpha):
    """One-sided (1 - alpha) Clopper-Pearson lower bound on a binomial proportion.

    Vectorised over ``successes``/``trials``; ``successes`` may be non-integer (used to predict
    bounds at another sample size). Zero successes give the bound 0.
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = stats.beta.ppf(alpha, k, n - k + 1.0)
    return np.where(k <= 0, 0.0, bound)


def clopper_pearson_upper(successes, trials, alpha):
    """One-sided (1 - alpha) Clopper-Pearson upper bound on a binomial proportion.

    Vectorised like :func:`clopper_pearson_lower`; ``successes == trials`` gives the bound 1.
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = stats.beta.ppf(1.0 - alpha, k + 1.0, n - k)
    return np.where(k >= n, 1.0, bound)


def _epsilon_bound(num_lower, den_upper, delta):
    """ln((num_lower - delta) / den_upper), -inf where the numerator is not positive."""
    num = np.asarray(num_lower, dtype=np.float64) - delta
    den = np.asarray(den_upper, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log(num) - np.log(den)
    return np.where(num > 0, eps, -np.inf)


# --------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Event:
    """An interval event on one projection of the output: lower <= p(x) <= upper.

    ``lower`` may be -inf and ``upper`` +inf (threshold events); ``include_upper=False`` makes the
    interval half-open, lower <= p(x) < upper (histogram bins).
    """

    projection: str
    lower: float
    upper: float
    include_upper: bool = True

    def count(self, sorted_values: np.ndarray) -> int:
        """Number of values in the event, given the projected outputs sorted ascending."""
        side = "right" if self.include_upper else "left"
        hi = np.searchsorted(sorted_values, self.upper, side=side)
        lo = np.searchsorted(sorted_values, self.lower, side="left")
        return int(max(hi - lo, 0))

    def __str__(self) -> str:
        p = self.projection
        if math.isinf(self.lower) and math.isinf(self.upper):
            return f"any {p}"
        if math.isinf(self.upper):
            return f"{p} >= {self.lower:.6g}"
        if math.isinf(self.lower):
            return f"{p} {'<=' if self.include_upper else '<'} {self.upper:.6g}"
        if self.lower == self.upper and self.include_upper:
            return f"{p} == {self.lower:.6g}"
        return f"{self.lower:.6g} <= {p} {'<=' if self.include_upper else '<'} {self.upper:.6g}"


def _candidate_intervals(pooled_sorted: np.ndarray, max_thresholds: int):
    """Candidate events (lower, upper, include_upper arrays) from pooled selection outputs.

    Outputs with at most ``max_thresholds`` distinct values are treated as discrete: every value
    is a threshold and every single value an event. Otherwise thresholds are order statistics
    at ranks spaced geometrically from both ends (dense in the tails), and bins are the
    half-open intervals between consecutive thresholds.
    """
    uniq = np.unique(pooled_sorted)
    discrete = uniq.size <= max_thresholds
    if discrete:
        thresholds = uniq
    else:
        n = pooled_sorted.size
        per_side = max(max_thresholds // 2, 1)
        ranks = np.unique(np.round(np.geomspace(1, n / 2.0, per_side)).astype(np.int64)) - 1
        thresholds = np.unique(np.concatenate([pooled_sorted[ranks],
                                               pooled_sorted[n - 1 - ranks]]))
    inf = np.full(thresholds.size, np.inf)
    lowers = [thresholds, -inf]                       # {x >= t}, {x <= t}
    uppers = [inf, thresholds]
    closed = [np.ones(thresholds.size, bool), np.ones(thresholds.size, bool)]
    if discrete:                                      # {x == v}
        lowers.append(thresholds)
        uppers.append(thresholds)
        closed.append(np.ones(thresholds.size, bool))
    elif thresholds.size > 1:                         # {t_i <= x < t_{i+1}}
        lowers.append(thresholds[:-1])
        uppers.append(thresholds[1:])
        closed.append(np.zeros(thresholds.size - 1, bool))
    return np.concatenate(lowers), np.concatenate(uppers), np.concatenate(closed)


def _interval_counts(sorted_values, lowers, uppers, include_upper):
    hi_right = np.searchsorted(sorted_values, uppers, side="right")
    hi_left = np.searchsorted(sorted_values, uppers, side="left")
    lo = np.searchsorted(sorted_values, lowers, side="left")
    return np.maximum(np.where(include_upper, hi_right, hi_left) - lo, 0)


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class EventEstimate:
    """Evaluation of one kept event in one direction (numerator vs denominator dataset)."""

    event: Event
    direction: str                # "D over D'" (numerator D) or "D' over D"
    count_numerator: int
    count_denominator: int
    trials: int
    numerator_lower: float        # lower confidence bound on P_num(E)
    denominator_upper: float      # upper confidence bound on P_den(E)
    epsilon_lower_bound: float    # ln((numerator_lower - delta) / denominator_upper), or -inf
    violates: bool

    def __str__(self) -> str:
        num, den = ("D", "D'") if self.direction == _DIRECTIONS[0] else ("D'", "D")
        return (f"{self.event} [{self.direction}]: "
                f"P_{num}(E) >= {self.numerator_lower:.6g} "
                f"({self.count_numerator}/{self.trials}), "
                f"P_{den}(E) <= {self.denominator_upper:.6g} "
                f"({self.count_denominator}/{self.trials}), "
                f"epsilon >= {self.epsilon_lower_bound:.4g}"
                f"{'  VIOLATION' if self.violates else ''}")


@dataclass(frozen=True, kw_only=True)
class DPTestResult:
    """Outcome of one DP check.

    ``passed`` is False when some kept event violates the claimed (epsilon, delta) with all
    confidence bounds applied; ``epsilon_lower_bound`` is then above ``epsilon``.
    """

    passed: bool
    epsilon: float
    delta: float
    epsilon_lower_bound: float
    worst: EventEstimate
    events: tuple[EventEstimate, ...]
    n_samples: int
    n_selection: int
    n_evaluation: int
    confidence: float

    def __repr__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        return (f"DPTestResult({verdict}: claimed epsilon={self.epsilon:g}, delta={self.delta:g}; "
                f"empirical epsilon >= {self.epsilon_lower_bound:.4g} at confidence "
                f"{self.confidence:g} ({self.n_evaluation} evaluation samples per dataset); "
                f"worst event {self.worst})")

    def __str__(self) -> str:
        lines = [repr(self), "kept events:"]
        lines.extend(f"  {estimate}" for estimate in self.events)
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Tester
# --------------------------------------------------------------------------------------------

def default_projections(sample: np.ndarray) -> dict[str, Projection]:
    """Identity for scalar outputs; each coordinate and the coordinate sum for vectors."""
    if sample.ndim == 1:
        return {"x": lambda x: x}
    if sample.ndim == 2:
        projections: dict[str, Projection] = {
            f"x[{i}]": (lambda x, i=i: x[:, i]) for i in range(sample.shape[1])}
        projections["sum(x)"] = lambda x: x.sum(axis=1)
        return projections
    raise ValueError(f"sampler outputs must have shape (n,) or (n, d); got {sample.shape}; "
                     "pass projections mapping outputs to one number each")


class DPTester:
    """Configured statistical DP check; see the module docstring for the method.

    Args:
        n_samples: outputs drawn from each sampler (split into selection and evaluation).
        confidence: probability that a mechanism satisfying the claim passes (family-wise
            over all confidence bounds of the check, via a union bound).
        events_per_direction: events kept from the selection part for each direction; the
            union bound is over ``2 * 2 * events_per_direction`` Clopper-Pearson bounds.
        selection_fraction: share of the samples used to choose events.
        max_thresholds: candidate thresholds per projection (outputs with at most this many
            distinct values are treated as discrete and every value is a threshold).
        projections: name -> function mapping the (n, ...) output array to n real numbers;
            defaults to :func:`default_projections`.
    """

    def __init__(self, *, n_samples: int = 400_000, confidence: float = 0.999,
                 events_per_direction: int = 3, selection_fraction: float = 0.5,
                 max_thresholds: int = 1024,
                 projections: Mapping[str, Projection] | None = None):
        n_samples = check_positive_int(n_samples, "n_samples")
        if n_samples < 20:
            raise ValueError(f"n_samples must be at least 20, got {n_samples!r}")
        events_per_direction = check_positive_int(events_per_direction, "events_per_direction")
        max_thresholds = check_positive_int(max_thresholds, "max_thresholds")
        if max_thresholds < 2:
            raise ValueError(f"max_thresholds must be at least 2, got {max_thresholds!r}")
        self.n_samples = n_samples
        self.confidence = check_probability(confidence, "confidence", allow_one=False)
        self.events_per_direction = events_per_direction
        self.selection_fraction = check_probability(selection_fraction, "selection_fraction",
                                                    allow_one=False)
        self.max_thresholds = max_thresholds
        self.projections = dict(projections) if projections is not None else None
        self.n_selection = min(max(int(round(self.n_samples * self.selection_fraction)), 10),
                               self.n_samples - 10)
        self.n_evaluation = self.n_samples - self.n_selection

    def __repr__(self) -> str:
        return (f"DPTester(n_samples={self.n_samples}, confidence={self.confidence:g}, "
                f"events_per_direction={self.events_per_direction}, "
                f"selection_fraction={self.selection_fraction:g}, "
                f"max_thresholds={self.max_thresholds})")

    # -- public API ---------------------------------------------------------------------------

    def run(self, sample_a: Sampler, sample_b: Sampler, *, epsilon: float,
            delta: float = 0.0) -> DPTestResult:
        """Test the claim that the mechanism behind the samplers is (epsilon, delta)-DP.

        ``sample_a(n)`` / ``sample_b(n)`` return n independent outputs of the mechanism on the
        neighbouring datasets D / D'; each is called exactly once.
        """
        epsilon, delta = _check_claim(epsilon, delta)
        outputs_a = self._draw(sample_a, "sample_a")
        outputs_b = self._draw(sample_b, "sample_b")
        if outputs_a.shape[1:] != outputs_b.shape[1:]:
            raise ValueError(f"sample_a and sample_b output shapes differ: "
                             f"{outputs_a.shape[1:]} vs {outputs_b.shape[1:]}")
        projections = self.projections or default_projections(outputs_a)
        alpha_each = (1.0 - self.confidence) / (4 * self.events_per_direction)

        # Project and sort both halves of both samples once.
        halves: dict[str, tuple[np.ndarray, ...]] = {}
        for name, project in projections.items():
            halves[name] = tuple(
                np.sort(self._project(project, name, outputs[part]))
                for outputs in (outputs_a, outputs_b)
                for part in (slice(0, self.n_selection), slice(self.n_selection, None)))

        kept = self._select(halves, epsilon, delta, alpha_each)
        estimates = [self._evaluate(event, direction, halves[event.projection],
                                    epsilon, delta, alpha_each)
                     for event, direction in kept]
        worst = max(estimates, key=lambda e: (e.epsilon_lower_bound, e.numerator_lower))
        return DPTestResult(
            passed=not any(e.violates for e in estimates), epsilon=epsilon, delta=delta,
            epsilon_lower_bound=worst.epsilon_lower_bound, worst=worst,
            events=tuple(estimates), n_samples=self.n_samples, n_selection=self.n_selection,
            n_evaluation=self.n_evaluation, confidence=self.confidence)

    def assert_dp(self, sample_a: Sampler, sample_b: Sampler, *, epsilon: float,
                  delta: float = 0.0) -> DPTestResult:
        """Like :meth:`run`, but raise AssertionError with the evidence when the check fails."""
        result = self.run(sample_a, sample_b, epsilon=epsilon, delta=delta)
        if not result.passed:
            raise AssertionError(f"mechanism violates ({epsilon:g}, {delta:g})-DP:\n{result}")
        return result

    # -- steps --------------------------------------------------------------------------------

    def _draw(self, sampler: Sampler, name: str) -> np.ndarray:
        outputs = np.asarray(sampler(self.n_samples))
        if outputs.ndim == 0 or outputs.shape[0] != self.n_samples:
            raise ValueError(f"{name}({self.n_samples}) returned shape {outputs.shape}; "
                             f"expected {self.n_samples} outputs along the first axis")
        if outputs.dtype == bool:
            outputs = outputs.astype(np.int64)
        if not np.issubdtype(outputs.dtype, np.number):
            raise ValueError(f"{name} must return numbers; got dtype {outputs.dtype}")
        if np.issubdtype(outputs.dtype, np.floating) and np.isnan(outputs).any():
            raise ValueError(f"{name} returned NaN outputs")
        return outputs

    def _project(self, project: Projection, name: str, outputs: np.ndarray) -> np.ndarray:
        values = np.asarray(project(outputs), dtype=np.float64)
        if values.shape != (outputs.shape[0],):
            raise ValueError(f"projection {name!r} must return one number per output; "
                             f"got shape {values.shape}")
        if np.isnan(values).any():
            raise ValueError(f"projection {name!r} produced NaN")
        return values

    def _select(self, halves, epsilon, delta, alpha_each) -> list[tuple[Event, str]]:
        """Keep the events with the largest predicted epsilon bound on the selection part.

        The prediction applies the evaluation's Clopper-Pearson bounds to the selection
        frequencies scaled to the evaluation sample size, so it ranks events by how likely they
        are to show a violation in the evaluation, penalising rare events for their wide bounds.
        """
        scale = self.n_evaluation / self.n_selection
        scored: list[tuple[np.ndarray, np.ndarray, str, np.ndarray, np.ndarray, np.ndarray]] = []
        for name, (sel_a, _, sel_b, _) in halves.items():
            pooled = np.sort(np.concatenate([sel_a, sel_b]))
            lowers, uppers, closed = _candidate_intervals(pooled, self.max_thresholds)
            counts_a = _interval_counts(sel_a, lowers, uppers, closed) * scale
            counts_b = _interval_counts(sel_b, lowers, uppers, closed) * scale
            lower_a = clopper_pearson_lower(counts_a, self.n_evaluation, alpha_each)
            lower_b = clopper_pearson_lower(counts_b, self.n_evaluation, alpha_each)
            upper_a = clopper_pearson_upper(counts_a, self.n_evaluation, alpha_each)
            upper_b = clopper_pearson_upper(counts_b, self.n_evaluation, alpha_each)
            scored.append((_epsilon_bound(lower_a, upper_b, delta),
                           _epsilon_bound(lower_b, upper_a, delta),
                           name, lowers, uppers, closed))

        kept: list[tuple[Event, str]] = []
        for d, direction in enumerate(_DIRECTIONS):
            scores = np.concatenate([s[d] for s in scored])
            owner = np.concatenate([np.full(s[3].size, i) for i, s in enumerate(scored)])
            index = np.concatenate([np.arange(s[3].size) for s in scored])
            # Stable sort keeps ties in candidate order, so results do not depend on hashing.
            for j in np.argsort(-scores, kind="stable")[:self.events_per_direction]:
                _, _, name, lowers, uppers, closed = scored[owner[j]]
                i = index[j]
                kept.append((Event(projection=name, lower=float(lowers[i]), upper=float(uppers[i]),
                                   include_upper=bool(closed[i])),
                             direction))
        return kept

    def _evaluate(self, event, direction, halves, epsilon, delta, alpha_each) -> EventEstimate:
        _, eval_a, _, eval_b = halves
        count_a, count_b = event.count(eval_a), event.count(eval_b)
        if direction == _DIRECTIONS[0]:
            count_num, count_den = count_a, count_b
        else:
            count_num, count_den = count_b, count_a
        m = self.n_evaluation
        num_lower = float(clopper_pearson_lower(count_num, m, alpha_each))
        den_upper = float(clopper_pearson_upper(count_den, m, alpha_each))
        # lower P_num(E) - delta > e^epsilon * upper P_den(E), compared in log space.
        epsilon_bound = float(_epsilon_bound(num_lower, den_upper, delta))
        return EventEstimate(
            event=event, direction=direction, count_numerator=count_num,
            count_denominator=count_den, trials=m, numerator_lower=num_lower,
            denominator_upper=den_upper, epsilon_lower_bound=epsilon_bound,
            violates=epsilon_bound > epsilon)


# --------------------------------------------------------------------------------------------
# Fixed indicator events: released / suppressed
# --------------------------------------------------------------------------------------------

def _indicator_matrix(values, name: str) -> np.ndarray:
    x = np.asarray(values)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"{name} must have shape (n, m) with n >= 1; got {x.shape}")
    if not np.isin(x, (0, 1)).all():
        raise ValueError(f"{name} must hold 0/1 indicators")
    return x.astype(np.int64)


def indicator_test(indicators_a, indicators_b, *, epsilon: float, delta: float = 0.0,
                   names: Sequence[str] = None, confidence: float = 0.999,
                   report: int = 6) -> DPTestResult:
    """Check (epsilon, delta) on every event of m 0/1 indicators (released or not), fixed in
    advance: for each indicator, {= 1} and {= 0}, each in both directions.

    ``indicators_a`` / ``indicators_b``: (n, m) 0/1 arrays, one row per independent sample of the
    mechanism on D / D' (the same n). All samples evaluate every event (no selection half: the
    events are not chosen from the data). Per indicator, the lower and upper Clopper-Pearson
    bounds on P_D(= 1) and P_D'(= 1), each at level ``(1 - confidence) / (4 m)``, give all four
    (event, direction) bounds (those of {= 0} are their complements), so a mechanism satisfying
    the claim fails with probability at most ``1 - confidence`` (union bound over the 4 m
    bounds). The result keeps the ``report`` worst (event, direction) estimates.
    """
    epsilon, delta = _check_claim(epsilon, delta)
    confidence = check_probability(confidence, "confidence", allow_one=False)
    a = _indicator_matrix(indicators_a, "indicators_a")
    b = _indicator_matrix(indicators_b, "indicators_b")
    if a.shape != b.shape:
        raise ValueError(f"indicators_a and indicators_b shapes differ: {a.shape} vs {b.shape}")
    n, m = a.shape
    names = list(names) if names is not None else [f"x[{j}]" for j in range(m)]
    if len(names) != m:
        raise ValueError(f"{len(names)} names for {m} indicators")
    alpha = (1.0 - confidence) / (4 * m)
    count_a, count_b = a.sum(axis=0), b.sum(axis=0)
    lower_a, upper_a = clopper_pearson_lower(count_a, n, alpha), clopper_pearson_upper(count_a, n, alpha)
    lower_b, upper_b = clopper_pearson_lower(count_b, n, alpha), clopper_pearson_upper(count_b, n, alpha)
    estimates = []
    for j, name in enumerate(names):
        for value, (ca, cb, la, ua, lb, ub) in (
                (1.0, (count_a[j], count_b[j], lower_a[j], upper_a[j], lower_b[j], upper_b[j])),
                (0.0, (n - count_a[j], n - count_b[j], 1 - upper_a[j], 1 - lower_a[j],
                       1 - upper_b[j], 1 - lower_b[j]))):
            event = Event(projection=name, lower=value, upper=value)
            for direction, c_num, c_den, num_lower, den_upper in (
                    (_DIRECTIONS[0], ca, cb, la, ub), (_DIRECTIONS[1], cb, ca, lb, ua)):
                bound = float(_epsilon_bound(num_lower, den_upper, delta))
                estimates.append(EventEstimate(
                    event=event, direction=direction, count_numerator=int(c_num),
                    count_denominator=int(c_den), trials=n, numerator_lower=float(num_lower),
                    denominator_upper=float(den_upper), epsilon_lower_bound=bound,
                    violates=bound > epsilon))
    estimates.sort(key=lambda e: (-e.epsilon_lower_bound, -e.numerator_lower))
    return DPTestResult(passed=not any(e.violates for e in estimates), epsilon=epsilon, delta=delta,
                        epsilon_lower_bound=estimates[0].epsilon_lower_bound, worst=estimates[0],
                        events=tuple(estimates[:max(report, 1)]), n_samples=n, n_selection=0,
                        n_evaluation=n, confidence=confidence)


def indicator_runs_needed(*, epsilon: float, delta: float = 0.0, indicators: int,
                          confidence: float = 0.999) -> int:
    """The least number of samples per dataset with which :func:`indicator_test` fails an
    indicator that is 1 on every sample of one dataset and 0 on every sample of the other (a
    threshold compared against the exact value): with counts n/n and 0/n the bounds are
    ``alpha^(1/n)`` and ``1 - alpha^(1/n)``, so the least n with ``alpha^(1/n) - delta >
    e^epsilon (1 - alpha^(1/n))``, alpha = (1 - confidence) / (4 m). Such an indicator is caught
    for certain with this many samples; a mechanism meeting the claim still fails with
    probability at most 1 - confidence."""
    epsilon, delta = _check_claim(epsilon, delta)
    m = check_positive_int(indicators, "indicators")
    confidence = check_probability(confidence, "confidence", allow_one=False)
    alpha = (1.0 - confidence) / (4 * m)
    target = (math.exp(epsilon) + delta) / (math.exp(epsilon) + 1.0)
    if target >= 1.0:
        raise ValueError(f"no sample size separates a deterministic indicator at delta={delta}")
    n = max(1, math.ceil(math.log(alpha) / math.log(target)))
    while not alpha ** (1.0 / n) - delta > math.exp(epsilon) * (1.0 - alpha ** (1.0 / n)):
        n += 1
    return n


# --------------------------------------------------------------------------------------------
# Projections for multi-key releases
# --------------------------------------------------------------------------------------------
#
# A release of many keys is a vector per sample. Per-coordinate events miss leaks that live in
# the *joint* behaviour of keys: a substitution moves two keys in opposite directions (the event
# "key i released and key j not" has twice the per-key privacy loss), and key reuse makes two
# noisy values differ by an exact amount (x_i - x_j is noise-free). Floating-point and
# fractional-part leaks sit in the low-order bits of real outputs, where threshold events on the
# value itself see nothing. These projections turn each into one real number per sample.

def exclusion_projection(i: int, j: int) -> Projection:
    """x_i * (1 - x_j): for 0/1 release indicators, "key i released and key j not"."""
    return lambda x: x[:, i] * (1.0 - x[:, j])


def difference_projection(i: int, j: int) -> Projection:
    """x_i - x_j (noise-free when both coordinates carry the same noise)."""
    return lambda x: x[:, i] - x[:, j]


def joint_indicator_projection(released: Sequence[int], dropped: Sequence[int] = ()) -> Projection:
    """1 when every coordinate in ``released`` is 1 and every one in ``dropped`` is 0 (0/1
    indicators): "keys A released and keys B not" for a change that moves several keys."""
    released, dropped = list(released), list(dropped)

    def project(x):
        hit = np.ones(x.shape[0], dtype=bool)
        for i in released:
            hit &= x[:, i] == 1
        for j in dropped:
            hit &= x[:, j] == 0
        return hit.astype(np.float64)
    return project


def low_bits_projection(i: int, bits: int = 8) -> Projection:
    """The ``bits`` lowest bits of coordinate i's float64 representation (its mantissa's last
    bits), as an integer: values on a power-of-two grid have them all zero, a textbook
    floating-point mechanism or an unsnapped exact value leaves a data-dependent pattern
    (Mironov 2012, "On significance of the least significant bits for differential privacy")."""
    bits = check_positive_int(bits, "bits")
    if bits > 52:
        raise ValueError(f"bits must be at most 52 (the float64 mantissa), got {bits}")
    mask = np.uint64((1 << bits) - 1)

    def project(x):
        column = np.ascontiguousarray(x[:, i], dtype=np.float64) + 0.0   # -0.0 -> 0.0
        return (column.view(np.uint64) & mask).astype(np.float64)
    return project


def integer_low_bits_projection(i: int, bits: int = 1) -> Projection:
    """x_i mod 2^bits (floor modulo, so negative outputs map to 0 .. 2^bits - 1) for integer
    outputs: ``bits=1`` is the parity. Integer noise on the answer's grid makes these bits
    (nearly) uniform whatever the answer; noise on a coarser grid (a multiple of 2^b) passes the
    answer's own low bits through untouched."""
    bits = check_positive_int(bits, "bits")
    if bits > 52:
        raise ValueError(f"bits must be at most 52 (exact in float64), got {bits}")
    modulus = float(2 ** bits)

    def project(x):
        column = np.asarray(x[:, i], dtype=np.float64)
        if not np.all(column == np.rint(column)):
            raise ValueError(f"integer_low_bits_projection({i}) needs integer outputs")
        return np.mod(column, modulus)
    return project


def grid_residue_projection(i: int, grid: float) -> Projection:
    """(x_i / grid) mod 1: zero for outputs on the grid; the fractional part of an exact value
    that integer (or grid) noise did not cover otherwise (grid = 1 for integer noise)."""
    grid = check_finite(grid, "grid")
    if grid <= 0:
        raise ValueError(f"grid must be positive, got {grid!r}")
    return lambda x: np.mod(np.asarray(x[:, i], dtype=np.float64) / grid, 1.0)


def pairwise_projections(names: Sequence[str], *, indicators: Sequence[int] = (),
                         values: Sequence[int] = ()) -> dict[str, Projection]:
    """Joint events over pairs of coordinates (``names`` labels every coordinate):
    "i and not j" for each ordered pair of ``indicators`` and x_i - x_j for each pair of
    ``values``."""
    projections: dict[str, Projection] = {}
    for i in indicators:
        for j in indicators:
            if i != j:
                projections[f"{names[i]} and not {names[j]}"] = exclusion_projection(i, j)
    values = list(values)
    for a, i in enumerate(values):
        for j in values[a + 1:]:
            projections[f"{names[i]} - {names[j]}"] = difference_projection(i, j)
    return projections


@dataclass(frozen=True, kw_only=True)
class ReleaseLayout:
    """A multi-key release as one vector per sample, and the projections to test it with.

    ``keys``: the candidate keys (tuples) in a fixed public order; ``values``: the noisy
    columns. The vector holds, per key, its release indicator, then per key and value column
    the released value (``missing`` when the key is not released or the value is masked), then
    (``order=True``) per key its position among the keys released in the same sample.
    """

    keys: tuple
    values: tuple = ()
    order: bool = False
    missing: float = -(2.0 ** 50)

    def __post_init__(self):
        object.__setattr__(self, "keys", tuple(k if isinstance(k, tuple) else (k,) for k in self.keys))
        object.__setattr__(self, "values", tuple(self.values))
        if not self.keys:
            raise ValueError("a release layout needs at least one key")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError("release layout keys must be distinct")

    @property
    def width(self) -> int:
        k = len(self.keys)
        return k + k * len(self.values) + (k if self.order else 0)

    def indicator(self, key) -> int:
        return self.keys.index(key if isinstance(key, tuple) else (key,))

    def value(self, key, column: str) -> int:
        return len(self.keys) + self.indicator(key) * len(self.values) + self.values.index(column)

    def rank(self, key) -> int:
        if not self.order:
            raise ValueError("this layout has no order features (order=False)")
        return len(self.keys) * (1 + len(self.values)) + self.indicator(key)

    def names(self) -> list[str]:
        label = [",".join(map(str, k)) for k in self.keys]
        names = [f"released[{k}]" for k in label]
        names += [f"{c}[{k}]" for k in label for c in self.values]
        if self.order:
            names += [f"rank[{k}]" for k in label]
        return names

    def vectorize(self, columns: Mapping[str, np.ndarray], n: int, *,
                  replica_column: str = None, key_columns: Sequence[str] = None) -> np.ndarray:
        """(n, width) array from released rows given as columns (rows in released order).

        ``replica_column`` gives each row's sample index (0 .. n-1; all 0 without it);
        ``key_columns`` default to every column that is neither a value nor the replica.
        A released key outside ``keys`` or released twice in one sample is an error.
        """
        key_columns = list(key_columns) if key_columns is not None else [
            c for c in columns if c != replica_column and c not in self.values]
        rows = len(next(iter(columns.values()))) if columns else 0
        sample = np.asarray(columns[replica_column], dtype=np.int64) if replica_column else np.zeros(rows, np.int64)
        index = {k: i for i, k in enumerate(self.keys)}
        keys = list(zip(*(np.asarray(columns[c]).tolist() for c in key_columns))) if rows else []
        try:
            position = np.fromiter((index[k] for k in keys), dtype=np.int64, count=rows)
        except KeyError as error:
            raise ValueError(f"released key {error.args[0]} is not in the layout's keys") from None
        if rows and (sample.min() < 0 or sample.max() >= n):
            raise ValueError(f"sample index outside 0 .. {n - 1}")
        flat = sample * len(self.keys) + position
        if np.unique(flat).size != rows:
            raise ValueError("a key is released twice in one sample")
        k = len(self.keys)
        out = np.zeros((n, self.width), dtype=np.float64)
        out[:, k:k * (1 + len(self.values))] = self.missing
        out[sample, position] = 1.0
        for v, column in enumerate(self.values):
            data = np.asarray(columns[column], dtype=np.float64)
            data = np.where(np.isnan(data), self.missing, data)
            out[sample, k + position * len(self.values) + v] = data
        if self.order:
            out[:, k * (1 + len(self.values)):] = -1.0
            by_sample = np.argsort(sample, kind="stable")      # stable: keeps released order
            grouped = sample[by_sample]
            starts = np.searchsorted(grouped, grouped, side="left")
            rank = np.empty(rows, dtype=np.float64)
            rank[by_sample] = np.arange(rows) - starts
            out[sample, k * (1 + len(self.values)) + position] = rank
        return out

    def indicators(self, x: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """The released/suppressed indicators of vectorized outputs ``x``: per key "released",
        then per key and value column "value released" (present and not null), as an (n, k *
        (1 + v)) 0/1 array and their names (for :func:`indicator_test`)."""
        k = len(self.keys)
        names = self.names()
        present = (x[:, k:k * (1 + len(self.values))] != self.missing).astype(np.int64)
        return (np.hstack([x[:, :k].astype(np.int64), present]),
                names[:k] + [f"{name} released" for name in names[k:k * (1 + len(self.values))]])

    def projections(self, *, pairs: bool = True, values: bool = True, indicators: bool = True,
                    integer_bits: int = 0, mantissa_bits: int = 0,
                    grid: float = None) -> dict[str, Projection]:
        """Projections for :class:`DPTester`, by family:

        * per key: its release indicator, and (``values``) each released value and
          (``indicators``) whether it is released (present and not null: a value threshold);
        * ``pairs``: "i released and j not" for every ordered pair of keys (and of one value
          column's indicators), x_i - x_j for every pair of keys and value column (``values``),
          and "i emitted before j" (with order features);
        * low-order bits of every value (``values``): x mod 2^``integer_bits`` for integer
          outputs, the last ``mantissa_bits`` bits of the float64 representation, the residue
          modulo ``grid``; a key that is not released projects to -1 there.

        k keys give O(k^2) pair projections: keep layouts small (the keys a neighbouring change
        touches and a few others).
        """
        names = self.names()
        k = len(self.keys)
        key_indicators = list(range(k))
        value_index = {c: [k + i * len(self.values) + v for i in range(k)]
                       for v, c in enumerate(self.values)}
        projections: dict[str, Projection] = {names[i]: (lambda x, i=i: x[:, i]) for i in key_indicators}
        if values:
            for column in self.values:
                for i in value_index[column]:
                    projections[names[i]] = lambda x, i=i: x[:, i]
                    if indicators:
                        projections[f"{names[i]} released"] = self._present(i)
                    if integer_bits:
                        projections[f"{names[i]} mod 2^{integer_bits}"] = self._released_only(
                            integer_low_bits_projection(i, integer_bits), i)
                    if mantissa_bits:
                        projections[f"low{mantissa_bits}bits({names[i]})"] = self._released_only(
                            low_bits_projection(i, mantissa_bits), i)
                    if grid:
                        projections[f"residue({names[i]}, {grid:g})"] = self._released_only(
                            grid_residue_projection(i, grid), i)
        if pairs:
            projections.update(pairwise_projections(names, indicators=key_indicators))
            if values:
                for column in self.values:
                    projections.update(pairwise_projections(names, values=value_index[column]))
                    if indicators:
                        for i in value_index[column]:
                            for j in value_index[column]:
                                if i != j:
                                    projections[f"{names[i]} released and not {names[j]}"] = (
                                        self._present(i, absent=j))
            if self.order:
                base = k * (1 + len(self.values))
                for i in range(k):
                    for j in range(i + 1, k):
                        projections[f"{names[base + i]} < {names[base + j]}"] = (
                            lambda x, a=base + i, b=base + j:
                            ((x[:, a] >= 0) & (x[:, b] >= 0) & (x[:, a] < x[:, b])).astype(np.float64))
        return projections

    def joint_projection(self, released: Sequence, dropped: Sequence = ()) -> dict[str, Projection]:
        """"Keys ``released`` all released and keys ``dropped`` all not", named after them: the
        event of a change that moves several keys (a substituted unit leaves its min(L0, L1)
        keys and joins as many others; pairs of keys see only a share of its loss)."""
        label = lambda keys: ",".join(",".join(map(str, self.keys[self.indicator(k)])) for k in keys)
        name = f"released[{label(released)}] and not [{label(dropped)}]"
        return {name: joint_indicator_projection([self.indicator(k) for k in released],
                                                 [self.indicator(k) for k in dropped])}

    def _present(self, column: int, absent: Optional[int] = None) -> Projection:
        """1 where value ``column`` is released (and value ``absent`` is not), else 0."""
        missing = self.missing

        def project(x):
            hit = x[:, column] != missing
            if absent is not None:
                hit &= x[:, absent] == missing
            return hit.astype(np.float64)
        return project

    def _released_only(self, project: Projection, column: int) -> Projection:
        """``project`` on released values, -1 where the value is missing."""
        missing = self.missing

        def wrapped(x):
            present = x[:, column] != missing
            out = np.full(x.shape[0], -1.0)
            if present.any():
                out[present] = np.asarray(project(x[present]), dtype=np.float64)
            return out
        return wrapped


def _check_claim(epsilon, delta) -> tuple[float, float]:
    # epsilon = 0 is a legitimate claim to test (outputs independent of the input).
    epsilon = check_finite(epsilon, "epsilon")
    if epsilon < 0:
        raise ValueError(f"epsilon must not be negative, got {epsilon!r}")
    return epsilon, check_delta(delta)


def run_dp_test(sample_a: Sampler, sample_b: Sampler, *, epsilon: float, delta: float = 0.0,
                **tester_options) -> DPTestResult:
    """One-off :meth:`DPTester.run`; ``tester_options`` are :class:`DPTester` arguments."""
    return DPTester(**tester_options).run(sample_a, sample_b, epsilon=epsilon, delta=delta)


def assert_dp(sample_a: Sampler, sample_b: Sampler, *, epsilon: float, delta: float = 0.0,
              **tester_options) -> DPTestResult:
    """One-off :meth:`DPTester.assert_dp`: AssertionError with the evidence on failure."""
    return DPTester(**tester_options).assert_dp(sample_a, sample_b, epsilon=epsilon, delta=delta)
