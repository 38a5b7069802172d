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

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from accounting.budget import PrivacyBudget, ReleasePlan
from accounting.measures import Measure
from accounting.calibration import NoiseKind
from accounting.composition import sequential
from accounting.sensitivity import (ContributionBounds, Neighbouring, Sensitivities,
                                    count_sensitivity, privacy_unit_count_sensitivity,
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
    min_count: for ``MEAN``, ``VARIANCE`` and ``STD``, which divide by the noisy count: the
      value (and its error columns) is null where the *noisy* count is below it -- a public rule
      on a released value, so post-processing. Default 1: a key whose noisy count is below 1
      may have no rows, and has no mean; ``float("-inf")`` releases every value (its interval
      then says how little it tells).
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
    min_count: Optional[float] = None

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
        if self.kind in (MetricKind.MEAN, MetricKind.VARIANCE, MetricKind.STD):
            min_count = 1.0 if self.min_count is None else self.min_count
            if isinstance(min_count, bool) or not isinstance(min_count, (int, float)) or math.isnan(min_count):
                raise TypeError(f"{self.column}: min_count must be a number, got {min_count!r}")
            object.__setattr__(self, "min_count", float(min_count))
        elif self.min_count is not None:
            raise ValueError(f"{self.column}: min_count= is only for the mean, variance and std")
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


@dataclass(frozen=True, kw_only=True)
class MeasureNeed:
    """One noisy measure a metric asks for, before the budget is split: its name (labels its
    noise streams), budget ``weight``, noise ``kind``, ``sensitivities``, the ``partial``
    column(s) holding its exact answer (``columns`` for a vector answer), whether the answer
    and its noise are ``integer``, and a description for ``explain()``."""

    name: str
    weight: float
    kind: NoiseKind
    sensitivities: Sensitivities
    partial: str
    integer: bool
    description: str
    columns: tuple = ()


class _Planned:
    """The measures one aggregation's metrics ask for, collected as each metric plans its own
    (:meth:`Metric.plan`): one :class:`MeasureNeed` per measure name, in the order asked."""

    def __init__(self, bounds: ContributionBounds, neighbouring, *, integer_values: bool):
        self.bounds, self.neighbouring = bounds, neighbouring
        self.integer_values = integer_values
        self.needs: dict[str, MeasureNeed] = {}

    def measure(self, need: MeasureNeed) -> None:
        self.needs[need.name] = need


def _real_noise(m: "Metric", what: str) -> None:
    if m.noise.is_integer:
        raise ValueError(f"{m.column}: a {what} needs real-valued noise (laplace or gaussian)")


def _plan_privacy_unit_count(m: "Metric", p: _Planned) -> None:
    p.measure(MeasureNeed(name=m.column, weight=m.weight, kind=m.noise,
                          sensitivities=privacy_unit_count_sensitivity(p.bounds, p.neighbouring),
                          partial="units", integer=m.noise.is_integer,
                          description="distinct privacy units per key"))


def _plan_sum(m: "Metric", p: _Planned) -> None:
    if m.noise.is_integer and not p.integer_values:
        raise ValueError(f"{m.column}: {m.noise.value} noise needs integer values and integer "
                         "clamping bounds")
    p.measure(MeasureNeed(name=m.column, weight=m.weight, kind=m.noise,
                          sensitivities=sum_sensitivity(p.bounds, p.neighbouring), partial="sum",
                          integer=m.noise.is_integer, description="sum of clamped values per key"))


def _plan_quantiles(m: "Metric", p: _Planned) -> None:
    """One noisy tree of node counts; one row moves one node per level."""
    from transforms.quantiles import tree_sensitivity

    tree = m.tree(p.bounds)
    p.measure(MeasureNeed(
        name=m.column, weight=m.weight, kind=m.noise,
        sensitivities=tree_sensitivity(count_sensitivity(p.bounds, p.neighbouring), tree.depth),
        partial=tree.prefix, integer=True, columns=tree.columns,
        description=f"quantile tree: {tree.num_nodes} node counts per key (branching "
                    f"{tree.branching}, depth {tree.depth}, leaf width {tree.leaf_width:.4g}) for "
                    f"quantiles {list(m.quantiles)}; one row moves one node per level"))


def _plan_vector_sum(m: "Metric", p: _Planned) -> None:
    from transforms.vectors import vector_sum_sensitivity

    spec = m.vector_spec()
    p.measure(MeasureNeed(
        name=m.column, weight=m.weight, kind=m.noise,
        sensitivities=vector_sum_sensitivity(count_sensitivity(p.bounds, p.neighbouring), spec),
        partial=spec.prefix, integer=False, columns=spec.columns,
        description=f"sum of {spec.dimension}-dimensional vectors per key, each row clipped to "
                    f"{spec.norm.upper()} norm {spec.max_norm:g}"))


#: How each metric kind outside the moments plans its measures (:meth:`Metric.plan`); the
#: moment metrics (:func:`is_moment`) share the measures :func:`plan_moments` chooses.
_PLANNERS = {
    MetricKind.PRIVACY_UNIT_COUNT: _plan_privacy_unit_count,
    MetricKind.SUM: _plan_sum,
    MetricKind.QUANTILES: _plan_quantiles,
    MetricKind.VECTOR_SUM: _plan_vector_sum,
}

#: The moments' budget share while the split among them is searched (a reserved name: '.').
_MOMENTS_SHARE = "moments.share"


def is_moment(m: Metric) -> bool:
    """Whether ``m`` derives from the shared moment measures (:mod:`transforms.moments`): a
    count, mean, variance, standard deviation, or a sum with real noise (an integer sum is its
    own integer measure)."""
    return m.kind in (MetricKind.COUNT, MetricKind.MEAN, MetricKind.VARIANCE, MetricKind.STD) or \
        (m.kind is MetricKind.SUM and not m.noise.is_integer)


def _moment_kinds(moments: Sequence[Metric]):
    """(the count's noise kind, the other measures' noise kind): one noisy count serves every
    count and derived metric, one noise kind for the normalised sums."""
    counts = {m.noise for m in moments if m.kind is MetricKind.COUNT}
    values = {m.noise for m in moments if m.kind is not MetricKind.COUNT}
    for m in moments:
        if m.kind is not MetricKind.COUNT:
            _real_noise(m, m.kind.value)
    if len(counts) > 1 or len(values) > 1:
        raise ValueError("the counts, sums, means, variances and standard deviations of one "
                         "aggregation derive from shared measures: give the counts one noise and "
                         f"the others one noise (got {sorted(k.value for k in counts | values)})")
    value_kind = next(iter(values), None)
    if counts:
        count_kind = next(iter(counts))
    else:
        count_kind = NoiseKind.DISCRETE_GAUSSIAN if value_kind.is_gaussian else NoiseKind.DISCRETE_LAPLACE
    return count_kind, value_kind


def _moment_candidates(moments: Sequence[Metric], p: _Planned):
    """The candidate measure sets for the moment metrics: (Moments names, MeasureNeeds without
    weights). Derived (N, S[, Q]) always; with sums but no mean or variance also the direct sum
    (Σ[, N])."""
    count_kind, value_kind = _moment_kinds(moments)
    kinds = {m.kind for m in moments}
    first = {k: next((m.column for m in moments if m.kind is k), None) for k in MetricKind}
    var = variance_sensitivity(p.bounds, p.neighbouring) if value_kind is not None else None
    spread = first[MetricKind.VARIANCE] or first[MetricKind.STD]
    value_user = next((m.column for m in moments if m.kind is not MetricKind.COUNT), None)
    count_name = first[MetricKind.COUNT] or f"{moments[0].column}.count"

    def count_need():
        return MeasureNeed(name=count_name, weight=1.0, kind=count_kind,
                           sensitivities=count_sensitivity(p.bounds, p.neighbouring), partial="count",
                           integer=count_kind.is_integer,
                           description="rows per key" if first[MetricKind.COUNT] else
                           f"rows per key, for the {moments[0].kind.value}")

    candidates = []
    needs_centred = kinds & {MetricKind.MEAN, MetricKind.VARIANCE, MetricKind.STD}
    if value_kind is None or needs_centred or MetricKind.SUM in kinds:
        derived = [count_need()]
        nsum = nsq = None
        if value_kind is not None:
            nsum = f"{value_user}.normalized_sum"
            derived.append(MeasureNeed(name=nsum, weight=1.0, kind=value_kind,
                                       sensitivities=var.normalized_sum, partial="nsum", integer=False,
                                       description="sum of (value - midpoint) per key"))
        if spread is not None:
            nsq = f"{spread}.normalized_squares"
            derived.append(MeasureNeed(name=nsq, weight=1.0, kind=value_kind,
                                       sensitivities=var.normalized_squares, partial="nsq",
                                       integer=False, description=f"sum of ((value - midpoint)^2 - "
                                       f"h^2/2) per key, h = {var.half_range:g}"))
        candidates.append((dict(count=count_name, nsum=nsum, nsq=nsq, direct_sum=None), derived))
    if MetricKind.SUM in kinds and not needs_centred:
        direct = [count_need()] if MetricKind.COUNT in kinds else []
        direct.append(MeasureNeed(name=first[MetricKind.SUM], weight=1.0, kind=value_kind,
                                  sensitivities=sum_sensitivity(p.bounds, p.neighbouring),
                                  partial="sum", integer=False,
                                  description="sum of clamped values per key"))
        candidates.append((dict(count=count_name if MetricKind.COUNT in kinds else None, nsum=None,
                                nsq=None, direct_sum=first[MetricKind.SUM]), direct))
    return candidates


def plan_moments(moments: Sequence[Metric], p: _Planned, share) -> tuple:
    """The moment metrics' measures and their split of ``share`` (the moments' BudgetShare):
    the candidate with the smallest minimax objective (:mod:`transforms.moments`), fewer
    measures on a tie. Returns ``(Moments, [MeasureNeed with its share of the moments' weight])``."""
    from transforms.moments import Moments, best_split, equal_split_floor, metric_variances, noise_variance

    low, high = p.bounds.value_range() if p.bounds.min_value is not None else (0.0, 0.0)
    midpoint, half = (low + high) / 2, (high - low) / 2
    kinds = [m.kind.value for m in moments]
    mean_weight = math.fsum(m.weight for m in moments) / len(moments)
    relative = np.array([m.weight / mean_weight for m in moments])[:, None]
    # metrics of equal weight: none above its variance at the equal split (module docstring)
    floored = len(moments) > 1 and len({m.weight for m in moments}) == 1
    best = None
    for names, needs in _moment_candidates(moments, p):
        by_name = {n.name: n for n in needs}

        def terms_at(fractions, names=names, by_name=by_name):
            variances = {name: np.array([noise_variance(need.kind, need.sensitivities, share, x)
                                         for x in fractions[name]])
                         for name, need in by_name.items()}
            return metric_variances(kinds, variances, midpoint=midpoint, half_range=half, **names)

        floor = ([float(t[0]) for t in terms_at({n: np.array([1.0 / len(needs)]) for n in by_name})]
                 if floored else None)

        def objective(fractions, terms_at=terms_at, floor=floor):
            terms = terms_at(fractions)
            worst = np.max(np.stack(terms) / relative, axis=0)
            return worst if floor is None else np.where(equal_split_floor(terms, floor), worst, np.inf)

        fractions, worst = best_split([n.name for n in needs], objective)
        if best is None or worst < best[0].worst * (1 - 1e-12):
            best = (Moments(midpoint=midpoint, half_range=half, fractions=fractions, worst=worst,
                            floored=floored, **names), needs)
    moments_plan, needs = best
    weight = math.fsum(m.weight for m in moments)
    return moments_plan, [dataclasses.replace(n, weight=weight * moments_plan.fractions[n.name])
                          for n in needs]


@dataclass(frozen=True, kw_only=True)
class MeasurePlan:
    """What :func:`plan_measures` returns: the ReleasePlan (every measure's mechanism,
    sensitivity and budget share), ``measures`` (name -> the calibrated
    :class:`~transforms.release.NoisedPartial` the release stage noises), ``selection_share``
    (private key selection's BudgetShare, or None) and ``moments`` (the shared moment measures
    and their split, or None without moment metrics)."""

    plan: ReleasePlan
    measures: Mapping[str, NoisedPartial]
    selection_share: Optional[object] = None
    moments: Optional[object] = None


def plan_measures(metrics: Sequence[Metric], bounds: ContributionBounds, budget: PrivacyBudget,
                  *, neighbouring=Neighbouring.ADD_REMOVE, selection_weight: float = 0.0,
                  selection_needs_delta: bool = False, integer_values: bool = False) -> MeasurePlan:
    """Split ``budget`` among the measures the metrics need and calibrate each: the moment
    metrics (:func:`is_moment`) share the fewest measures that determine them, split among
    them to minimise the worst one's stated variance (:func:`plan_moments`); the others plan
    their own (:meth:`Metric.plan`), each with its weight. The moments' share of the budget is
    their weights together."""
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
    planned = _Planned(bounds, neighbouring, integer_values=integer_values)
    moments = [m for m in metrics if is_moment(m)]
    order = []  # measure names in the order of the metrics (the moments at the first one's place)
    for m in metrics:
        if is_moment(m):
            if _MOMENTS_SHARE not in order:
                order.append(_MOMENTS_SHARE)
        else:
            m.plan(planned)
            order += [n for n in planned.needs if n not in order]
    selection = SELECTION_PURPOSE if selection_weight else None

    def split(needs):
        weights = {name: need.weight for name, need in needs.items()}
        if selection:
            weights[selection] = selection_weight
        needs_delta = [name for name, need in needs.items() if need.kind.is_gaussian]
        if selection and selection_needs_delta:
            needs_delta.append(selection)
        return budget.split(weights, needs_delta=needs_delta)

    needs = dict(planned.needs)
    moments_plan = None
    if moments:
        count_kind, value_kind = _moment_kinds(moments)
        gaussian = value_kind if value_kind is not None and value_kind.is_gaussian else count_kind
        placeholder = MeasureNeed(name=_MOMENTS_SHARE, weight=math.fsum(m.weight for m in moments),
                                  kind=gaussian, sensitivities=None, partial="", integer=True,
                                  description="")
        share = split({**needs, _MOMENTS_SHARE: placeholder})[_MOMENTS_SHARE]
        moments_plan, moment_needs = plan_moments(moments, planned, share)
        ordered = {}
        for name in order:
            for need in (moment_needs if name == _MOMENTS_SHARE else [needs[name]]):
                ordered[need.name] = need
        needs = ordered
    shares = split(needs)
    plan = ReleasePlan(budget=budget)
    calibrated = [plan.calibrated(name, need.kind, shares[name], need.sensitivities,
                                  neighbouring=neighbouring, description=need.description)
                  for name, need in needs.items()]
    selections = _selections(metrics, calibrated, shares, bounds, neighbouring, budget)
    plan = plan.with_measures(*(selections[m.name][0] if m.name in selections else m
                                for m in calibrated))
    specs = {m.name: m.noise for m in plan.measures}
    measures = {name: selections[name][1] if name in selections else
                NoisedPartial(name=name, partial=need.partial, spec=specs[name],
                              integer=need.integer, columns=need.columns)
                for name, need in needs.items()}
    selection_share = shares.get(SELECTION_PURPOSE)
    if selection_share is not None:
        check_within_budget(plan, (selection_share.epsilon, selection_share.delta))
    return MeasurePlan(plan=plan, measures=measures, selection_share=selection_share,
                       moments=moments_plan)


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


def sum_from_noisy(nsum, count, midpoint: float):
    """Post-processing: the sum of clamped values from the noisy normalised sum and count,
    ``S + midpoint N`` (each value is its offset from the midpoint plus the midpoint)."""
    import numpy as np

    return np.asarray(nsum, dtype=float) + midpoint * np.asarray(count, dtype=float)


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
