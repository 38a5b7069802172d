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

A passed check is evidence, not proof: it finds violations that some threshold/bin event of a
projection exposes with the given number of samples. Pure numpy/scipy; no Beam.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

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

@dataclass(frozen=True)
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
                kept.append((Event(name, float(lowers[i]), float(uppers[i]), bool(closed[i])),
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
