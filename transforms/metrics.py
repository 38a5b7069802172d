"""What a DP aggregation releases per key, and the noisy measures each metric needs.

A :class:`Metric` is one released metric (count, sum, mean, privacy-unit count, variance,
standard deviation, quantiles, vector sum) with its noise kind, release threshold and budget
weight. Each metric plans the noisy *measures* it is computed from (:meth:`Metric.plan`, one
planner per kind: a mean is post-processing of a noisy count and a noisy normalized sum, and
reuses a requested count); :func:`plan_measures` splits the budget among them and returns a
:class:`~accounting.budget.ReleasePlan` that states every measure's mechanism, sensitivity and
budget share.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from accounting.budget import PrivacyBudget, ReleasePlan
from accounting.measures import Measure
from accounting.calibration import NoiseKind
from accounting.composition import sequential
from accounting.sensitivity import (ContributionBounds, Neighbouring, count_sensitivity,
                                    mean_sensitivity, privacy_unit_count_sensitivity,
                                    sum_sensitivity, variance_sensitivity)
from accounting.validation import check_epsilon, check_finite
from transforms.release import SELECTION_PURPOSE, NoisedPartial


class MetricKind(str, enum.Enum):
    COUNT = "count"
    SUM = "sum"
    MEAN = "mean"
    PRIVACY_UNIT_COUNT = "privacy_unit_count"
    VARIANCE = "variance"
    STD = "std"
    QUANTILES = "quantiles"
    VECTOR_SUM = "vector_sum"


_DEFAULT_NOISE = {
    MetricKind.COUNT: NoiseKind.DISCRETE_LAPLACE,
    MetricKind.PRIVACY_UNIT_COUNT: NoiseKind.DISCRETE_LAPLACE,
    MetricKind.SUM: NoiseKind.LAPLACE,
    MetricKind.MEAN: NoiseKind.LAPLACE,
    MetricKind.VARIANCE: NoiseKind.LAPLACE,
    MetricKind.STD: NoiseKind.LAPLACE,
    MetricKind.QUANTILES: NoiseKind.DISCRETE_LAPLACE,
    MetricKind.VECTOR_SUM: NoiseKind.LAPLACE,
}
#: Metric kinds computed from the value column.
_VALUE_KINDS = (MetricKind.SUM, MetricKind.MEAN, MetricKind.VARIANCE, MetricKind.STD,
                MetricKind.QUANTILES)
#: Metric kinds whose value column holds vectors (list columns).
_VECTOR_KINDS = (MetricKind.VECTOR_SUM,)


#: How a quantiles metric may be released (:class:`Metric`, ``mechanism``).
QUANTILE_MECHANISMS = ("auto", "tree", "selection")


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One released metric (one output column; a quantiles metric has one per quantile).

    noise: the mechanism (default: discrete Laplace for counts and quantile trees, Laplace for
      sums, means, variances and standard deviations).
    threshold: release threshold; a key whose noisy value is not above it is suppressed
      (post-processing). weight: this metric's share of the budget, relative to the others.
    name: the output column (default: the kind); ``key_selection`` and names containing ``.``
      are reserved for internal measures (:func:`check_metric_name`).
    quantiles, branching, depth: for ``QUANTILES``: the quantiles in [0, 1] and the tree's shape
      (its leaves are the answers' resolution). mechanism: ``"auto"`` (default) releases them
      by whichever states the smaller rank error at the metric's budget share: one noisy tree
      read for every quantile (:mod:`transforms.quantiles`), or permute-and-flip over the
      tree's leaf edges per quantile (:mod:`transforms.private_quantile`, under an (epsilon, delta)
      budget); ``"tree"`` or ``"selection"`` asks for one.
    dimension, max_norm, norm: for ``VECTOR_SUM``: the vectors' length, and each row's clipping
      bound in the ``"l1"`` or ``"l2"`` norm (:mod:`transforms.vectors`).
    """

    kind: MetricKind
    noise: Optional[NoiseKind] = None
    threshold: Optional[float] = None
    weight: float = 1.0
    name: Optional[str] = None
    quantiles: tuple = ()
    branching: int = 16
    depth: int = 2
    mechanism: str = "auto"
    dimension: Optional[int] = None
    max_norm: Optional[float] = None
    norm: str = "l2"

    def __post_init__(self):
        try:
            kind = MetricKind(self.kind)
        except ValueError:
            raise ValueError(f"unknown metric kind {self.kind!r}; known: "
                             f"{[k.value for k in MetricKind]}") from None
        object.__setattr__(self, "kind", kind)
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"metric name must be a string, got {type(self.name).__name__}")
        try:
            noise = _DEFAULT_NOISE[self.kind] if self.noise is None else NoiseKind.parse(self.noise)
        except (ValueError, TypeError, AttributeError):
            raise ValueError(f"{self.column}: unknown noise {self.noise!r}; known: "
                             f"{[k.value for k in NoiseKind]}") from None
        object.__setattr__(self, "noise", noise)
        for field_name in ("threshold", "weight"):
            value = getattr(self, field_name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise TypeError(f"{self.column}: {field_name} must be a number, got {value!r}")
        if self.threshold is not None:
            check_finite(self.threshold, f"{self.column} threshold")
        check_epsilon(self.weight, f"{self.column} weight")
        if self.kind is MetricKind.QUANTILES:
            qs = (self.quantiles,) if isinstance(self.quantiles, (int, float)) else tuple(self.quantiles)
            if not qs:
                raise ValueError(f"{self.column}: give at least one quantile in [0, 1]")
            for q in qs:
                if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
                    raise ValueError(f"{self.column}: quantiles must be numbers in [0, 1], got {q!r}")
            if len(set(qs)) != len(qs):
                raise ValueError(f"{self.column}: quantiles must be distinct, got {qs}")
            object.__setattr__(self, "quantiles", tuple(float(q) for q in qs))
            if not self.noise.is_integer:
                raise ValueError(f"{self.column}: a quantile tree releases integer counts: use "
                                 "discrete_laplace or discrete_gaussian noise")
            if self.threshold is not None:
                raise ValueError(f"{self.column}: quantiles take no threshold (threshold a count)")
            if self.mechanism not in QUANTILE_MECHANISMS:
                raise ValueError(f"{self.column}: mechanism must be one of {QUANTILE_MECHANISMS}, "
                                 f"got {self.mechanism!r}")
        elif self.quantiles:
            raise ValueError(f"{self.column}: quantiles= is only for the quantiles metric")
        if self.kind is MetricKind.VECTOR_SUM:
            self.vector_spec()  # validates dimension, max_norm and norm
            if self.noise.is_integer:
                raise ValueError(f"{self.column}: a vector sum needs real-valued noise (laplace or gaussian)")
            if self.threshold is not None:
                raise ValueError(f"{self.column}: a vector sum takes no threshold (threshold a count)")
        elif self.dimension is not None or self.max_norm is not None:
            raise ValueError(f"{self.column}: dimension= and max_norm= are only for the vector_sum metric")

    @property
    def column(self) -> str:
        return self.name or self.kind.value

    @property
    def output_columns(self) -> tuple:
        """The released columns: the metric's name, or one per quantile (``<name>_p<100 q>``;
        a single quantile with an explicit name, e.g. ``median``, keeps the name)."""
        if self.kind is not MetricKind.QUANTILES:
            return (self.column,)
        if len(self.quantiles) == 1 and self.name is not None:
            return (self.name,)
        return tuple(f"{self.column}_p{100 * q:g}" for q in self.quantiles)

    @property
    def needs_value(self) -> bool:
        return self.kind in _VALUE_KINDS or self.kind in _VECTOR_KINDS

    @property
    def needs_range(self) -> bool:
        """Whether the metric needs the clamping range (scalar values)."""
        return self.kind in _VALUE_KINDS

    @property
    def is_vector(self) -> bool:
        return self.kind in _VECTOR_KINDS

    def vector_spec(self):
        """The clipping and shape of a ``VECTOR_SUM`` metric."""
        from transforms.vectors import VectorSpec

        if self.dimension is None or self.max_norm is None:
            raise ValueError(f"{self.column}: a vector sum needs dimension= and max_norm=")
        return VectorSpec(dimension=self.dimension, max_norm=self.max_norm, norm=self.norm,
                          prefix=f"{self.column}.c")

    def tree(self, bounds: ContributionBounds):
        """The quantile tree of a ``QUANTILES`` metric over the clamping range."""
        from transforms.quantiles import QuantileTree

        low, high = bounds.value_range()
        return QuantileTree(low=low, high=high, branching=self.branching, depth=self.depth,
                            prefix=f"{self.column}.node")

    def plan(self, planned: "_Planned") -> None:
        """Ask ``planned`` for the noisy measures this metric is computed from (its kind's
        planner: a count or a sum is one measure; a mean, a variance or a standard deviation
        derive from a normalized sum, a count and, for the latter two, a normalized sum of
        squares; quantiles from one noisy tree)."""
        _PLANNERS[self.kind](self, planned)


def as_metric(metric) -> Metric:
    """A Metric, or a metric kind given as a string (``"count"``, ``"mean"``...)."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str):
        if metric == "median":
            return Median()
        try:
            kind = MetricKind(metric)
        except ValueError:
            raise ValueError(f"unknown metric {metric!r}; known: "
                             f"{[k.value for k in MetricKind] + ['median']}") from None
        if kind is MetricKind.QUANTILES:
            raise ValueError("the quantiles metric needs its quantiles: Quantiles([0.5, 0.9])")
        if kind is MetricKind.VECTOR_SUM:
            raise ValueError("the vector_sum metric needs its shape: VectorSum(dimension=..., max_norm=...)")
        return Metric(kind=kind)
    raise TypeError(f"a metric must be a Metric (Count(), Sum(), ...) or a kind name, got "
                    f"{type(metric).__name__} {metric!r}")


def Count(**kwargs) -> Metric:
    return Metric(kind=MetricKind.COUNT, **kwargs)


def Sum(**kwargs) -> Metric:
    return Metric(kind=MetricKind.SUM, **kwargs)


def Mean(**kwargs) -> Metric:
    return Metric(kind=MetricKind.MEAN, **kwargs)


def PrivacyUnitCount(**kwargs) -> Metric:
    return Metric(kind=MetricKind.PRIVACY_UNIT_COUNT, **kwargs)


def Variance(**kwargs) -> Metric:
    return Metric(kind=MetricKind.VARIANCE, **kwargs)


def Std(**kwargs) -> Metric:
    """Standard deviation: the square root of the noisy variance (post-processing)."""
    return Metric(kind=MetricKind.STD, **kwargs)


def Quantiles(quantiles, **kwargs) -> Metric:
    """Several quantiles from one noisy quantile tree (:mod:`transforms.quantiles`)."""
    return Metric(kind=MetricKind.QUANTILES, quantiles=quantiles, **kwargs)


def Percentiles(percentiles, **kwargs) -> Metric:
    """Percentiles in [0, 100] (PipelineDP's naming); columns ``percentile_p<p>``."""
    ps = (percentiles,) if isinstance(percentiles, (int, float)) else tuple(percentiles)
    kwargs.setdefault("name", "percentile")
    return Metric(kind=MetricKind.QUANTILES, quantiles=tuple(p / 100 for p in ps), **kwargs)


def VectorSum(*, dimension: int, max_norm: float, norm: str = "l2", **kwargs) -> Metric:
    """Per-key sum of vectors (a list column), each row clipped to ``max_norm`` in ``norm``."""
    return Metric(kind=MetricKind.VECTOR_SUM, dimension=dimension, max_norm=max_norm, norm=norm, **kwargs)


def Median(**kwargs) -> Metric:
    kwargs.setdefault("name", "median")
    return Metric(kind=MetricKind.QUANTILES, quantiles=(0.5,), **kwargs)


class _Planned:
    """The measures one aggregation's metrics ask for, collected as each metric plans its own
    (:meth:`Metric.plan`): per measure name its budget weight, noise kind, sensitivities,
    partial column(s) and description, in the order asked."""

    def __init__(self, bounds: ContributionBounds, neighbouring, *, integer_values: bool,
                 has_count: bool):
        self.bounds, self.neighbouring = bounds, neighbouring
        self.integer_values, self.has_count = integer_values, has_count
        self.weights, self.kinds, self.sensitivities, self.partials, self.descriptions = {}, {}, {}, {}, {}

    def measure(self, name: str, weight: float, kind: NoiseKind, sensitivities, partial: str,
                integer: bool, description: str, columns: tuple = ()) -> None:
        self.weights[name], self.kinds[name], self.sensitivities[name] = weight, kind, sensitivities
        self.partials[name] = (partial, integer, columns)
        self.descriptions[name] = description

    def count_for(self, m: "Metric", share: float, count_sensitivities, what: str) -> None:
        """A derived metric's own noisy count, unless a released count is reused."""
        if not self.has_count:
            kind = NoiseKind.DISCRETE_GAUSSIAN if m.noise.is_gaussian else NoiseKind.DISCRETE_LAPLACE
            self.measure(f"{m.column}.count", share, kind, count_sensitivities, "count", True,
                         f"rows per key, for the {what}")


def _real_noise(m: "Metric", what: str) -> None:
    if m.noise.is_integer:
        raise ValueError(f"{m.column}: a {what} needs real-valued noise (laplace or gaussian)")


def _plan_count(m: "Metric", p: _Planned) -> None:
    p.measure(m.column, m.weight, m.noise, count_sensitivity(p.bounds, p.neighbouring), "count",
              m.noise.is_integer, "rows per key")


def _plan_privacy_unit_count(m: "Metric", p: _Planned) -> None:
    p.measure(m.column, m.weight, m.noise, privacy_unit_count_sensitivity(p.bounds, p.neighbouring),
              "units", m.noise.is_integer, "distinct privacy units per key")


def _plan_sum(m: "Metric", p: _Planned) -> None:
    if m.noise.is_integer and not p.integer_values:
        raise ValueError(f"{m.column}: {m.noise.value} noise needs integer values and integer "
                         "clamping bounds")
    p.measure(m.column, m.weight, m.noise, sum_sensitivity(p.bounds, p.neighbouring), "sum",
              m.noise.is_integer, "sum of clamped values per key")


def _plan_mean(m: "Metric", p: _Planned) -> None:
    """A noisy normalized sum plus a noisy count (a released count is reused)."""
    _real_noise(m, "mean")
    mean = mean_sensitivity(p.bounds, p.neighbouring)
    share = m.weight if p.has_count else m.weight / 2
    p.measure(f"{m.column}.normalized_sum", share, m.noise, mean.normalized_sum, "nsum", False,
              "sum of (value - midpoint) per key, for the mean")
    p.count_for(m, share, mean.count, "mean")


def _plan_variance(m: "Metric", p: _Planned) -> None:
    """A noisy normalized sum, a noisy normalized sum of squares and a noisy count (a released
    count is reused); the standard deviation is the variance's square root."""
    _real_noise(m, m.kind.value)
    var = variance_sensitivity(p.bounds, p.neighbouring)
    share = m.weight / 2 if p.has_count else m.weight / 3
    p.measure(f"{m.column}.normalized_sum", share, m.noise, var.normalized_sum, "nsum", False,
              f"sum of (value - midpoint) per key, for the {m.kind.value}")
    p.measure(f"{m.column}.normalized_squares", share, m.noise, var.normalized_squares, "nsq",
              False, f"sum of ((value - midpoint)^2 - h^2/2) per key, h = {var.half_range:g}, "
              f"for the {m.kind.value}")
    p.count_for(m, share, var.count, m.kind.value)


def _plan_quantiles(m: "Metric", p: _Planned) -> None:
    """One noisy tree of node counts; one row moves one node per level."""
    from transforms.quantiles import tree_sensitivity

    tree = m.tree(p.bounds)
    p.measure(m.column, m.weight, m.noise,
              tree_sensitivity(count_sensitivity(p.bounds, p.neighbouring), tree.depth),
              tree.prefix, True,
              f"quantile tree: {tree.num_nodes} node counts per key (branching {tree.branching}, "
              f"depth {tree.depth}, leaf width {tree.leaf_width:.4g}) for quantiles "
              f"{list(m.quantiles)}; one row moves one node per level", columns=tree.columns)


def _plan_vector_sum(m: "Metric", p: _Planned) -> None:
    from transforms.vectors import vector_sum_sensitivity

    spec = m.vector_spec()
    p.measure(m.column, m.weight, m.noise,
              vector_sum_sensitivity(count_sensitivity(p.bounds, p.neighbouring), spec),
              spec.prefix, False,
              f"sum of {spec.dimension}-dimensional vectors per key, each row clipped to "
              f"{spec.norm.upper()} norm {spec.max_norm:g}", columns=spec.columns)


#: How each metric kind plans its measures (:meth:`Metric.plan`).
_PLANNERS = {
    MetricKind.COUNT: _plan_count,
    MetricKind.PRIVACY_UNIT_COUNT: _plan_privacy_unit_count,
    MetricKind.SUM: _plan_sum,
    MetricKind.MEAN: _plan_mean,
    MetricKind.VARIANCE: _plan_variance,
    MetricKind.STD: _plan_variance,
    MetricKind.QUANTILES: _plan_quantiles,
    MetricKind.VECTOR_SUM: _plan_vector_sum,
}


def plan_measures(metrics: Sequence[Metric], bounds: ContributionBounds, budget: PrivacyBudget,
                  *, neighbouring=Neighbouring.ADD_REMOVE, selection_weight: float = 0.0,
                  selection_needs_delta: bool = False, integer_values: bool = False):
    """Split ``budget`` among the measures the metrics need (each metric plans its own:
    :meth:`Metric.plan`) and calibrate each.

    Returns ``(plan, measures, selection_share)``: the ReleasePlan, a mapping measure name ->
    calibrated :class:`~transforms.release.NoisedPartial` (partial columns: count, units, sum,
    nsum...), and the budget share for private key selection (or None).
    """
    if isinstance(metrics, (str, Metric)):
        metrics = [metrics]
    metrics = [as_metric(m) for m in metrics]
    if not metrics:
        raise ValueError("metrics must name at least one metric")
    columns = [m.column for m in metrics]
    if len(set(columns)) != len(columns):
        raise ValueError(f"metric columns must be unique, got {columns}")
    for column in columns:
        check_metric_name(column)
    planned = _Planned(bounds, neighbouring, integer_values=integer_values,
                       has_count=any(m.kind is MetricKind.COUNT for m in metrics))
    for m in metrics:
        m.plan(planned)
    weights, kinds = dict(planned.weights), planned.kinds
    if selection_weight:
        weights[SELECTION_PURPOSE] = selection_weight
    needs_delta = [n for n, k in kinds.items() if k.is_gaussian]
    if selection_weight and selection_needs_delta:
        needs_delta.append(SELECTION_PURPOSE)
    shares = budget.split(weights, needs_delta=needs_delta)
    plan = ReleasePlan(budget=budget)
    calibrated = [plan.calibrated(name, kinds[name], shares[name], planned.sensitivities[name],
                                  neighbouring=neighbouring, description=planned.descriptions[name])
                  for name in kinds]
    selections = _selections(metrics, calibrated, shares, bounds, neighbouring, budget)
    plan = plan.with_measures(*(selections[m.name][0] if m.name in selections else m
                                for m in calibrated))
    specs = {m.name: m.noise for m in plan.measures}
    measures = {name: selections[name][1] if name in selections else
                NoisedPartial(name=name, partial=partial, spec=specs[name], integer=integer,
                              columns=columns)
                for name, (partial, integer, columns) in planned.partials.items()}
    selection_share = shares.get(SELECTION_PURPOSE)
    if selection_share is not None:
        check_within_budget(plan, (selection_share.epsilon, selection_share.delta))
    return plan, measures, selection_share


def _selections(metrics, calibrated, shares, bounds, neighbouring, budget) -> dict:
    """Per quantiles metric whose selection (:mod:`transforms.private_quantile`) states a smaller
    rank error than its tree at the same budget share: ``name -> (Measure, CellSelection)``.
    Pure-epsilon selection under an (epsilon, delta) budget only (a zCDP budget keeps the tree)."""
    from transforms.private_quantile import selection_if_better
    from transforms.quantiles import rank_error_std

    by_name = {m.name: m for m in calibrated}
    out = {}
    for metric in metrics:
        if metric.kind is not MetricKind.QUANTILES or metric.mechanism == "tree":
            continue
        if budget.is_zcdp:
            if metric.mechanism == "selection":
                raise ValueError(f"{metric.column}: selection is pure epsilon-DP: give an "
                                 "(epsilon, delta) budget, or mechanism='tree'")
            continue
        tree = metric.tree(bounds)
        share = shares[metric.column]
        beat = math.inf if metric.mechanism == "selection" else \
            rank_error_std(tree, by_name[metric.column].noise.std)
        selection = selection_if_better(metric.column, tree, metric.quantiles, share.epsilon,
                                        beat, bounds, neighbouring)
        if selection is None and metric.mechanism == "selection":
            raise ValueError(f"{metric.column}: selection needs quantiles strictly inside (0, 1) "
                             "and a share of epsilon >= 2^-20 per quantile")
        if selection is not None:
            out[metric.column] = (Measure(
                name=metric.column, mechanism="permute_and_flip", epsilon=share.epsilon,
                neighbouring=neighbouring, share=share,
                sensitivities=count_sensitivity(bounds, neighbouring),
                description=f"quantiles {list(metric.quantiles)}: per key and quantile, one of "
                            f"the {tree.leaves + 1} leaf edges (width {tree.leaf_width:.4g}), by "
                            f"permute-and-flip over the rank distance (epsilon "
                            f"{selection.epsilon:g} each, {selection.steps} value(s) per "
                            "change, monotone bound); "
                            + ("asked for" if metric.mechanism == "selection" else
                               "chosen over the tree by its smaller stated rank error")), selection)
    return out


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


def variance_from_noisy(nsum, nsq, count, low: float, high: float, std: bool = False):
    """Post-processing: E[(v - m)^2] - E[v - m]^2 from the three noisy sums, clamped to
    [0, h^2] (h = (high - low) / 2); its square root for the standard deviation."""
    import numpy as np

    half = (high - low) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.maximum(np.asarray(count, dtype=float), 1.0)
        mean = np.clip(np.asarray(nsum, dtype=float) / n, -half, half)
        squares = np.asarray(nsq, dtype=float) / n + half * half / 2
        variance = np.clip(squares - mean * mean, 0.0, half * half)
    return np.sqrt(variance) if std else variance


def mean_from_noisy(nsum, count, low: float, high: float):
    """Post-processing: midpoint + noisy normalized sum / noisy count, clamped to the range."""
    import numpy as np

    midpoint = (low + high) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = midpoint + np.asarray(nsum, dtype=float) / np.maximum(np.asarray(count, dtype=float), 1.0)
    return np.clip(mean, low, high)


def _ratio_range(numerator_low, numerator_high, count_low, count_high):
    """The range of ``x / n`` over ``x`` in [numerator_low, numerator_high] and ``n`` in
    [count_low, count_high] (count_low >= 1)."""
    import numpy as np

    low = np.where(numerator_low >= 0, numerator_low / count_high, numerator_low / count_low)
    high = np.where(numerator_high >= 0, numerator_high / count_low, numerator_high / count_high)
    return low, high


def mean_error(nsum, count, low: float, high: float, *, sum_std: float, count_std: float,
               sum_half: float, count_half: float):
    """The error of the released mean (:func:`mean_from_noisy`) from the noise of the normalized
    sum ``S`` and the count ``N`` it divides (post-processing of released values and public
    noise parameters only). Returns ``(std, ci_low, ci_high)`` per key:

    * std, by the delta method at the released values: ``sqrt(sum_std^2 + m^2 count_std^2) /
      max(N, 1)`` with ``m`` the released mean minus the midpoint, at most half the range (no
      value in the range is further off);
    * the interval: every mean ``mid + s / n`` with ``|s - S| <= sum_half`` and ``|n - N| <=
      count_half``, within the range (and the midpoint, a key without rows, when ``n`` may be
      0). With ``sum_half`` and ``count_half`` each the noise's symmetric interval of level
      ``1 - alpha / 2``, both hold with probability at least ``1 - alpha`` (a union bound), and
      then the interval holds the noise-free (bounded) mean, whatever the count.
    """
    import numpy as np

    half, midpoint = (high - low) / 2, (low + high) / 2
    nsum, count = np.asarray(nsum, dtype=float), np.asarray(count, dtype=float)
    n = np.maximum(count, 1.0)
    m = np.clip(nsum / n, -half, half)
    std = np.minimum(np.sqrt(sum_std ** 2 + m * m * count_std ** 2) / n, half)
    lower, upper = _ratio_range(nsum - sum_half, nsum + sum_half,
                                np.maximum(count - count_half, 1.0), np.maximum(count + count_half, 1.0))
    empty = count - count_half < 1  # the count may be 0: the noise-free mean is the midpoint
    lower, upper = np.where(empty, np.minimum(lower, 0.0), lower), np.where(empty, np.maximum(upper, 0.0), upper)
    return std, midpoint + np.clip(lower, -half, half), midpoint + np.clip(upper, -half, half)


def variance_error(nsum, nsq, count, low: float, high: float, *, sum_std: float,
                   squares_std: float, count_std: float, sum_half: float, squares_half: float,
                   count_half: float, std: bool = False):
    """The error of the released variance, or standard deviation (``std``), of
    :func:`variance_from_noisy`, from the noise of the normalized sum ``S``, the normalized sum
    of squares ``Q`` and the count ``N``. Returns ``(std, ci_low, ci_high)`` per key:

    * std, by the delta method at the released values: the variance ``Q/N + h^2/2 - (S/N)^2``
      has ``sqrt(squares_std^2 + 4 m^2 sum_std^2 + (2 m^2 - q)^2 count_std^2) / max(N, 1)``
      (``m = S/N``, ``q = Q/N``), at most ``h^2 / 2``; the standard deviation ``sd`` has that
      over ``2 sd``, at most its square root (``|sqrt(a) - sqrt(b)| <= sqrt(|a - b|)``) and at
      most ``h / 2``;
    * the interval: every variance ``E - m^2`` with ``E = q + h^2/2`` and ``q``, ``m`` from sums
      and counts within ``squares_half``, ``sum_half`` and ``count_half`` of the released ones,
      within ``[0, h^2]`` (and ``h^2 / 2``, a key without rows, when the count may be 0, and
      the released value); its square roots for the standard deviation. With each half-width the noise's symmetric
      interval of level ``1 - alpha / 3``, all three hold with probability at least
      ``1 - alpha`` (a union bound), and then the interval holds the noise-free value.
    """
    import numpy as np

    half = (high - low) / 2
    nsum, nsq = np.asarray(nsum, dtype=float), np.asarray(nsq, dtype=float)
    count = np.asarray(count, dtype=float)
    n = np.maximum(count, 1.0)
    m = np.clip(nsum / n, -half, half)
    q = nsq / n
    variance_std = np.minimum(np.sqrt(squares_std ** 2 + 4 * m * m * sum_std ** 2
                                      + (2 * m * m - q) ** 2 * count_std ** 2) / n, half * half / 2)
    count_low, count_high = np.maximum(count - count_half, 1.0), np.maximum(count + count_half, 1.0)
    q_low, q_high = _ratio_range(nsq - squares_half, nsq + squares_half, count_low, count_high)
    e_low = np.clip(q_low + half * half / 2, 0.0, half * half)
    e_high = np.clip(q_high + half * half / 2, 0.0, half * half)
    m_low, m_high = _ratio_range(nsum - sum_half, nsum + sum_half, count_low, count_high)
    m_low, m_high = np.clip(m_low, -half, half), np.clip(m_high, -half, half)
    m2_min = np.where((m_low <= 0) & (m_high >= 0), 0.0, np.minimum(m_low * m_low, m_high * m_high))
    m2_max = np.maximum(m_low * m_low, m_high * m_high)
    lower = np.clip(e_low - m2_max, 0.0, half * half)
    upper = np.maximum(np.clip(e_high - m2_min, 0.0, half * half), lower)
    empty = count - count_half < 1  # the count may be 0: the noise-free variance is h^2 / 2
    released = variance_from_noisy(nsum, nsq, count, low, high)
    # The released value (its noisy sum of squares may exceed what any data gives) is inside too.
    lower = np.minimum(np.where(empty, np.minimum(lower, half * half / 2), lower), released)
    upper = np.maximum(np.where(empty, np.maximum(upper, half * half / 2), upper), released)
    if not std:
        return variance_std, lower, upper
    released = np.sqrt(released)
    with np.errstate(divide="ignore", invalid="ignore"):
        by_delta = np.where(released > 0, variance_std / (2 * released), np.inf)
    sd_std = np.minimum(np.minimum(by_delta, np.sqrt(variance_std)), half / 2)
    return sd_std, np.sqrt(lower), np.sqrt(upper)


def is_integer_range(bounds: ContributionBounds) -> bool:
    low, high = bounds.min_value, bounds.max_value
    return low is not None and float(low).is_integer() and float(high).is_integer() \
        and math.isfinite(low) and math.isfinite(high)
