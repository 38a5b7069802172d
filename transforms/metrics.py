"""What a DP aggregation releases per key, and the noisy measures each metric needs.

A :class:`Metric` is one output column (count, sum, mean or privacy-unit count) with its noise
kind, release threshold and budget weight. :func:`plan_measures` turns metrics, contribution
bounds and a budget into the noisy *measures* actually drawn (a mean is post-processing of a
noisy count and a noisy normalized sum; it reuses a requested count) and a
:class:`~accounting.budget.ReleasePlan` that states every measure's mechanism, sensitivity and
budget share.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from accounting.budget import PrivacyBudget, ReleasePlan
from accounting.calibration import NoiseKind
from accounting.composition import sequential
from accounting.sensitivity import (ContributionBounds, Neighbouring, count_sensitivity,
                                    mean_sensitivity, privacy_unit_count_sensitivity,
                                    sum_sensitivity)
from accounting.validation import check_epsilon, check_finite
from transforms.release import SELECTION_PURPOSE, NoisyMeasure


class MetricKind(str, enum.Enum):
    COUNT = "count"
    SUM = "sum"
    MEAN = "mean"
    PRIVACY_UNIT_COUNT = "privacy_unit_count"


_DEFAULT_NOISE = {
    MetricKind.COUNT: NoiseKind.DISCRETE_LAPLACE,
    MetricKind.PRIVACY_UNIT_COUNT: NoiseKind.DISCRETE_LAPLACE,
    MetricKind.SUM: NoiseKind.LAPLACE,
    MetricKind.MEAN: NoiseKind.LAPLACE,
}


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One released column.

    noise: the mechanism (default: discrete Laplace for counts, Laplace for sums and means).
    threshold: release threshold; a key whose noisy value is not above it is suppressed
      (post-processing). weight: this metric's share of the budget, relative to the others.
    name: the output column (default: the kind); ``key_selection`` and names containing ``.``
      are reserved for internal measures (:func:`check_metric_name`).
    """

    kind: MetricKind
    noise: Optional[NoiseKind] = None
    threshold: Optional[float] = None
    weight: float = 1.0
    name: Optional[str] = None

    def __post_init__(self):
        object.__setattr__(self, "kind", MetricKind(self.kind))
        noise = _DEFAULT_NOISE[self.kind] if self.noise is None else NoiseKind.parse(self.noise)
        object.__setattr__(self, "noise", noise)
        if self.threshold is not None:
            check_finite(self.threshold, f"{self.column} threshold")
        check_epsilon(self.weight, f"{self.column} weight")

    @property
    def column(self) -> str:
        return self.name or self.kind.value

    @property
    def needs_value(self) -> bool:
        return self.kind in (MetricKind.SUM, MetricKind.MEAN)


def Count(**kwargs) -> Metric:
    return Metric(kind=MetricKind.COUNT, **kwargs)


def Sum(**kwargs) -> Metric:
    return Metric(kind=MetricKind.SUM, **kwargs)


def Mean(**kwargs) -> Metric:
    return Metric(kind=MetricKind.MEAN, **kwargs)


def PrivacyUnitCount(**kwargs) -> Metric:
    return Metric(kind=MetricKind.PRIVACY_UNIT_COUNT, **kwargs)


def plan_measures(metrics: Sequence[Metric], bounds: ContributionBounds, budget: PrivacyBudget,
                  *, neighbouring=Neighbouring.ADD_REMOVE, selection_weight: float = 0.0,
                  selection_needs_delta: bool = False, integer_values: bool = False):
    """Split ``budget`` among the measures the metrics need and calibrate each.

    Returns ``(plan, measures, selection_share)``: the ReleasePlan, a mapping measure name ->
    calibrated :class:`~transforms.release.NoisyMeasure` (partial columns: count, units, sum,
    nsum), and the budget share for private key selection (or None).
    """
    if not metrics:
        raise ValueError("metrics must name at least one metric")
    columns = [m.column for m in metrics]
    if len(set(columns)) != len(columns):
        raise ValueError(f"metric columns must be unique, got {columns}")
    for column in columns:
        check_metric_name(column)
    has_count = any(m.kind is MetricKind.COUNT for m in metrics)
    weights, kinds, sens, partials, descriptions = {}, {}, {}, {}, {}

    def measure(name, weight, kind, sensitivities, partial, integer, description):
        weights[name], kinds[name], sens[name] = weight, kind, sensitivities
        partials[name] = (partial, integer)
        descriptions[name] = description

    for m in metrics:
        if m.kind is MetricKind.COUNT:
            measure(m.column, m.weight, m.noise, count_sensitivity(bounds, neighbouring), "count",
                    m.noise.is_integer, "rows per key")
        elif m.kind is MetricKind.PRIVACY_UNIT_COUNT:
            measure(m.column, m.weight, m.noise, privacy_unit_count_sensitivity(bounds, neighbouring),
                    "units", m.noise.is_integer, "distinct privacy units per key")
        elif m.kind is MetricKind.SUM:
            if m.noise.is_integer and not integer_values:
                raise ValueError(f"{m.column}: {m.noise.value} noise needs integer values and "
                                 "integer clamping bounds")
            measure(m.column, m.weight, m.noise, sum_sensitivity(bounds, neighbouring), "sum",
                    m.noise.is_integer, "sum of clamped values per key")
        else:  # MEAN: a noisy normalized sum plus a noisy count (reused if one is released)
            if m.noise.is_integer:
                raise ValueError(f"{m.column}: a mean needs real-valued noise (laplace or gaussian)")
            mean = mean_sensitivity(bounds, neighbouring)
            share = m.weight if has_count else m.weight / 2
            measure(f"{m.column}.normalized_sum", share, m.noise, mean.normalized_sum, "nsum", False,
                    "sum of (value - midpoint) per key, for the mean")
            if not has_count:
                count_kind = NoiseKind.DISCRETE_GAUSSIAN if m.noise.is_gaussian else NoiseKind.DISCRETE_LAPLACE
                measure(f"{m.column}.count", share, count_kind, mean.count, "count", True,
                        "rows per key, for the mean")
    if selection_weight:
        weights[SELECTION_PURPOSE] = selection_weight
    needs_delta = [n for n, k in kinds.items() if k.is_gaussian]
    if selection_weight and selection_needs_delta:
        needs_delta.append(SELECTION_PURPOSE)
    shares = budget.split(weights, needs_delta=needs_delta)
    plan = ReleasePlan(budget)
    for name in kinds:
        plan.add_calibrated(name, kinds[name], shares[name], sens[name],
                            neighbouring=neighbouring, description=descriptions[name])
    specs = {m.name: m.noise for m in plan.measures}
    measures = {name: NoisyMeasure(name=name, partial=partial, spec=specs[name], integer=integer)
                for name, (partial, integer) in partials.items()}
    selection_share = shares.get(SELECTION_PURPOSE)
    if selection_share is not None:
        check_within_budget(plan, (selection_share.epsilon, selection_share.delta))
    return plan, measures, selection_share


def check_metric_name(column: str) -> str:
    """Refuse a metric name that could collide with an internal measure or stream.

    Internal names: private selection's stream and budget share (``key_selection``) and the
    measures a mean derives (``<name>.normalized_sum``, ``<name>.count``); so ``key_selection``
    and any name containing ``.`` are reserved.
    """
    if not isinstance(column, str) or not column.strip():
        raise ValueError(f"a metric name must be a non-empty string, got {column!r}")
    if column == SELECTION_PURPOSE or "." in column:
        raise ValueError(f"metric name {column!r} is reserved: {SELECTION_PURPOSE!r} is private "
                         "key selection's, and names with '.' are derived measures' (a mean's "
                         "'<name>.count' and '<name>.normalized_sum')")
    return column


def check_within_budget(plan: ReleasePlan, selection) -> None:
    """The measures (basic composition, or the zCDP budget's conversion) plus private key
    selection's (epsilon, delta), composed sequentially, must fit the declared budget."""
    budget = plan.budget
    measures = plan.guarantee("zcdp" if budget.is_zcdp else "basic")
    total = sequential([measures, tuple(selection)])
    declared = budget.as_epsilon_delta() if budget.is_zcdp else budget
    tolerance = 1 + 1e-9
    if total.epsilon > declared.epsilon * tolerance or total.delta > declared.delta * tolerance:
        raise ValueError(f"the release with key selection spends epsilon={total.epsilon:g}, "
                         f"delta={total.delta:g}, beyond the declared budget "
                         f"epsilon={declared.epsilon:g}, delta={declared.delta:g}")


def mean_from_noisy(nsum, count, low: float, high: float):
    """Post-processing: midpoint + noisy normalized sum / noisy count, clamped to the range."""
    import numpy as np

    midpoint = (low + high) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = midpoint + np.asarray(nsum, dtype=float) / np.maximum(np.asarray(count, dtype=float), 1.0)
    return np.clip(mean, low, high)


def is_integer_range(bounds: ContributionBounds) -> bool:
    low, high = bounds.min_value, bounds.max_value
    return low is not None and float(low).is_integer() and float(high).is_integer() \
        and math.isfinite(low) and math.isfinite(high)
