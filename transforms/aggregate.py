"""``DPAggregate``: differentially private per-key aggregates as a Beam PTransform.

    released = rows | DPAggregate(
        compute=Compute(metrics=[Count(), Sum(), Mean(), PrivacyUnitCount()], value="seconds"),
        keys=Keys(privacy_unit="user_id", columns=["country", "project"],
                  keyset=PublicKeyset.cross_product({...}).exclude("country", protected)),
        bounds=ContributionBounds(max_partitions=3, max_contributions_per_partition=2,
                                  min_value=0, max_value=10),
        budget=PrivacyBudget(epsilon=1.0), release_key=ReleaseKey.generate())

Configuration: :class:`Compute` (what: the metrics and the value column), :class:`Keys` (whose
rows and which keys: the privacy-unit and key columns, a public keyset or a private selection),
the :class:`~accounting.sensitivity.ContributionBounds`, the budget (a ``PrivacyBudget`` or a
``SharedBudget`` part) and :class:`Output` (format, threshold mode, error columns, shards).

Input: a PCollection of pyarrow RecordBatches / Tables (the fast path, e.g. from
``ReadFromParquetBatched``), pandas or Polars DataFrames, or dicts / ``beam.Row``s. When the
input's contents are known at construction (``beam.Create``, schema'd Rows), a missing or
mistyped column fails when the transform is applied, naming the columns present
(:func:`check_schema`; ``transform.check_schema(schema)`` checks any other source up front).
Output: Arrow tables, one row per released key with its noisy metrics (``Output(format="arrow")``),
or dicts (``Output(format="dicts")``).

Output schema (``transform.output_schema()`` states it for a given configuration): the key
columns (their input types), then per metric, in the order given:

* ``count``, ``privacy_unit_count``: int64 (discrete noise); ``sum``: float64 (int64 with
  integer noise and integer values); ``mean``, ``variance``, ``std``: float64;
* quantiles: one float64 column per quantile, ``<name>_p<100 q>`` (``median``,
  ``percentile_p50``...), from the metric's quantile tree or, when it states the smaller rank
  error at the metric's budget share (one or two quantiles, usually), by permute-and-flip over
  the tree's leaf edges (:mod:`transforms.private_quantile`); ``vector_sum``:
  fixed_size_list<float64>[dimension];
* error columns, on by default (``Output(error_columns=False)`` leaves them out): after each
  count / sum / privacy-unit count / mean / variance / std ``<name>``: ``<name>_ci95_low``,
  ``<name>_ci95_high`` and ``<name>_std``, all float64 -- functions of released values and
  public noise parameters only, so they cost no budget. For a count or a sum measured directly
  they are the noise's symmetric 95% interval around the released value and its standard
  deviation; a sum derived as ``S + midpoint N`` (below) has ``sqrt(std_S^2 + midpoint^2
  std_N^2)`` and a union bound of the two noises' 97.5% intervals. A mean, variance or std
  derives its error from the noise of the sums and count it is computed from
  (:func:`transforms.metrics.mean_error`, :func:`~transforms.metrics.variance_error`): the std
  by the delta method at the released values, the interval as a bound that holds the
  noise-free value with probability at least 95% for every count (a union bound over the noisy
  answers' own intervals); ``explain()`` states how, with the numbers. They describe the noise
  only, not the bias of contribution bounding and clamping; quantiles state their error in
  ``explain()``.

Counts, sums, means, variances and standard deviations share the fewest noisy measures that
determine them -- one noisy count, one normalised sum, one normalised sum of squares
(:mod:`transforms.moments`): a mean is ``midpoint + S / N``, a sum beside a mean or variance is
``S + midpoint N``; the budget split among them minimises the worst requested metric's stated
variance with none (of equal weight) above its variance at the equal split, and ``explain()``
states how each released metric is derived. A mean, variance or
std whose *noisy* count is below its ``min_count`` (default 1: a key that may have no rows) is
null, with its error columns: a public rule on a released value.

A null value (``Output(threshold_mode="value")``) means *suppressed*: the noisy value was not above its
threshold, and its error columns are null too. With ``threshold_mode="key"`` (the default) such a key is not
released at all. Rows are sorted by the key columns (:mod:`transforms.release`).

Data flow (every step works on Arrow batches; only bounded partials are shuffled):

1. and 2. The bounding stage (:class:`~transforms.bounding_stage.BoundedKeyPartials`): per batch,
   the row rules, the keyset filter, secret priorities and bounding (L0 keys per unit, Linf rows
   per unit and key); per unit shard, re-bounding as partial batches meet and exact per-key
   partials. Its module states the row rules (each counted under namespace ``dp_aggregate``,
   for the operator only) and the canonical form of privacy-unit ids (7, 7.0 and "7" are one
   unit; a unit column that cannot hold ids is refused before the pipeline runs).
3. The release stage (:class:`~transforms.release.NoisyRelease`) sums partials per key shard.
4. Keys are chosen: the public keyset (left join: keys without rows get zeros), private key
   selection, or both (the keyset's keys, and the keys outside it selected privately: bounding
   sees every key, so one contribution bound covers both sides; the selected side is noised
   under a child of the release key). Noise is drawn per key from the release key and the
   measure's name, and release thresholds (post-processing) suppress keys.

Keys: every random choice derives from ``release_key``. A key's secret drives each purpose once
per process (:meth:`accounting.keys.ReleaseKey.claim`): one ``DPAggregate`` applied twice, or two
transforms given the same key (any object holding its secret), raise
:class:`~accounting.keys.KeyReuseError` at pipeline construction, because the same noise on other
input would cancel in the difference. Give each release a fresh key (``KeyStore.issue``, or the
ledger), and each aggregation of one release a part of one ``SharedBudget``.

Testing mode (``testing=True``) is for users' own unit tests: bounding as in a release, no noise,
and it refuses a secret release key, so it cannot make a real release.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa

from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.guarantee import compose as compose_measures
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds, Neighbouring
from accounting.shared_budget import BudgetPart, selection_measure
from transforms import error_columns
from transforms.bounding_stage import BoundedKeyPartials, BoundingConfig, check_schema
from transforms.keyset import PublicKeyset
from transforms.metrics import (Metric, MetricKind, as_metric, is_integer_range, is_moment,
                                mean_error, mean_from_noisy, plan_measures, sum_from_noisy,
                                variance_error, variance_from_noisy)
from transforms.partials import PartialsSpec
from transforms.private_quantile import CellSelection
from transforms.release import SELECTION_PURPOSE, NoisyRelease, OutputColumn
from transforms.selection import PrivateSelection, Selector
from transforms.tables import static_schema

#: Metrics that get error columns on request (``error_columns=True``): those released from one
#: noisy measure (their noise std and 95% interval are public constants), and the mean,
#: variance and standard deviation, whose errors derive from the noise of their sums and count.
ERROR_COLUMN_KINDS = (MetricKind.COUNT, MetricKind.SUM, MetricKind.PRIVACY_UNIT_COUNT,
                      MetricKind.MEAN, MetricKind.VARIANCE, MetricKind.STD)
#: Metrics that divide by the noisy count (a ``min_count`` rule nulls them where it is small).
_RATIO_KINDS = (MetricKind.MEAN, MetricKind.VARIANCE, MetricKind.STD)


# --------------------------------------------------------------------------- configuration

@dataclass(frozen=True, kw_only=True)
class Compute:
    """What a DPAggregate computes: ``metrics`` (Metric objects or kind names) over the
    ``value`` column (needed by value metrics). ``integer_values``: the value column holds
    integers (default: when an integer-noise sum asks for it), so integer sums get integer noise."""

    metrics: tuple
    value: Optional[str] = None
    integer_values: Optional[bool] = None

    def __post_init__(self):
        metrics = [self.metrics] if isinstance(self.metrics, (str, Metric)) else list(self.metrics)
        metrics = tuple(as_metric(m) for m in metrics)
        object.__setattr__(self, "metrics", metrics)
        if self.value is not None and not isinstance(self.value, str):
            raise TypeError("privacy_unit, keys and value must be column names (strings)")
        outputs = [c for m in metrics for c in m.output_columns]
        if len(set(outputs)) != len(outputs):
            raise ValueError(f"output columns must be unique, got {outputs}")
        if self.needs_value and not self.value:
            kinds = sorted({m.kind.value for m in metrics if m.needs_value})
            raise ValueError(f"metrics {kinds} need a value column (value=...)")
        vectors = [m for m in metrics if m.is_vector]
        if vectors and (len(vectors) > 1 or self.needs_range):
            raise ValueError("a vector sum reads the value column as vectors: it cannot be combined "
                             "with another vector sum or with scalar value metrics in one DPAggregate "
                             "(use a second DPAggregate, e.g. with a SharedBudget)")
        if self.integer_values is not None and not isinstance(self.integer_values, bool):
            raise TypeError(f"integer_values must be True, False or None, got {self.integer_values!r}")

    @property
    def needs_value(self) -> bool:
        return any(m.needs_value for m in self.metrics)

    @property
    def needs_range(self) -> bool:
        return any(m.needs_range for m in self.metrics)

    @property
    def vector(self) -> Optional[Metric]:
        return next((m for m in self.metrics if m.is_vector), None)

    def integer_sums(self, bounds: ContributionBounds) -> bool:
        """Whether sums are integer (integer noise): as given, else when an integer-noise sum
        asks for it; integer sums need integer clamping bounds."""
        integer = self.integer_values
        if integer is None:
            integer = self.needs_value and any(
                m.kind is MetricKind.SUM and m.noise.is_integer for m in self.metrics)
        if integer and self.needs_value and not is_integer_range(bounds):
            raise ValueError("integer sums need integer clamping bounds (min_value, max_value)")
        return bool(integer)


@dataclass(frozen=True, kw_only=True)
class Keys:
    """Whose rows and which keys: the ``privacy_unit`` column, the key ``columns``, and how the
    released keys are chosen -- a public ``keyset``, a private ``selection``, or both: every
    keyset key released (keys without rows get zeros) and the keys outside it (never an
    excluded one) chosen privately, all under one contribution bound and one budget."""

    privacy_unit: str
    columns: tuple
    keyset: Optional[PublicKeyset] = None
    selection: Optional[PrivateSelection] = None

    def __post_init__(self):
        columns = [self.columns] if isinstance(self.columns, str) else list(self.columns)
        object.__setattr__(self, "columns", tuple(columns))
        if not columns:
            raise ValueError("keys must name at least one key column")
        if not isinstance(self.privacy_unit, str) or not all(isinstance(k, str) for k in columns):
            raise TypeError("privacy_unit, keys and value must be column names (strings)")
        if self.keyset is not None and self.selection is not None and not self.keyset.in_memory:
            raise ValueError("a public keyset with private selection of the keys outside it needs "
                             "an in-memory keyset (a list, table, file or cross product)")
        if self.keyset is None and self.selection is None:
            raise ValueError("no public keyset: pass keyset=PublicKeyset(...) or "
                             "selection=PrivateSelection() for private key selection")
        if self.keyset is not None and list(self.keyset.columns) != columns:
            raise ValueError(f"keyset columns {self.keyset.columns} must equal keys {columns}")


@dataclass(frozen=True, kw_only=True)
class Output:
    """How the release comes out: ``format`` ``"arrow"`` (tables) or ``"dicts"``;
    ``threshold_mode`` ``"key"`` (a key failing a threshold is not released) or ``"value"``
    (the failing value is null); ``error_columns`` (module docstring); ``num_shards``: the
    bounding stage's unit shards (and private selection's key shards)."""

    format: str = "arrow"
    threshold_mode: str = "key"
    error_columns: bool = True
    num_shards: int = 32

    def __post_init__(self):
        if self.format not in ("arrow", "dicts"):
            raise ValueError(f"output must be 'arrow' or 'dicts', got {self.format!r}")
        if self.threshold_mode not in ("key", "value"):
            raise ValueError(f"threshold_mode must be 'key' or 'value', got {self.threshold_mode!r}")
        if isinstance(self.num_shards, bool) or not isinstance(self.num_shards, int) or self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")
        if not isinstance(self.error_columns, bool):
            raise TypeError(f"error_columns must be True or False, got {self.error_columns!r}")


# --------------------------------------------------------------------------- the transform

class DPAggregate(beam.PTransform):
    """Differentially private per-key metrics; see the module docstring.

    compute: what (:class:`Compute`); keys: whose rows and which keys (:class:`Keys`); bounds:
    what one privacy unit may contribute; budget: a PrivacyBudget or a SharedBudget part;
    output: :class:`Output`. release_key: the release's key (default: a fresh secret one);
    testing: exact aggregates for unit tests (refuses a secret key); neighbouring: the relation
    the guarantee is stated for.
    """

    def __init__(self, *, compute: Compute, keys: Keys, bounds: ContributionBounds, budget,
                 output: Output = Output(), release_key: ReleaseKey = None, testing: bool = False,
                 neighbouring=Neighbouring.ADD_REMOVE, label: str = None):
        super().__init__(label)
        for name, value, typ in (("compute", compute, Compute), ("keys", keys, Keys),
                                 ("bounds", bounds, ContributionBounds), ("output", output, Output)):
            if not isinstance(value, typ):
                raise TypeError(f"{name} must be a {typ.__name__}, got {type(value).__name__}")
        # Whether this aggregation's mechanisms use delta (a SharedBudget part gets delta only
        # then): Gaussian noise on a metric or private key selection.
        uses_delta = keys.selection is not None or any(
            as_metric(m).noise.is_gaussian for m in compute.metrics)
        part, budget, release_key = _spendable(budget, release_key, testing, uses_delta)
        _check_together(compute, keys, bounds, budget)
        self.testing, self.release_key = testing, _release_key(release_key, testing)
        self.selection, self.keyset = keys.selection, keys.keyset
        integer_values = compute.integer_sums(bounds)
        planned = plan_measures(
            compute.metrics, bounds, budget, neighbouring=neighbouring,
            selection_weight=keys.selection.weight if keys.selection else 0.0,
            selection_needs_delta=keys.selection is not None, integer_values=integer_values)
        self.plan, self.measures, self.moments = planned.plan, planned.measures, planned.moments
        selection_share = planned.selection_share
        self.selector = None
        if keys.selection is not None:
            self.selector = Selector.for_bounds(keys.selection, selection_share.epsilon,
                                                selection_share.delta, bounds, neighbouring)
        self._config = _bounding_config(compute, keys, bounds, self.release_key, output.num_shards,
                                        integer_values)
        self._metrics, self._output = list(compute.metrics), output
        if part is not None:
            part.register(self)

    def guarantee(self) -> EpsDelta:
        """The whole release's (epsilon, delta): the measures (basic composition, or the zCDP
        budget's conversion) plus private key selection -- a measure of its own, composed with
        them by accounting.guarantee (selection needs an (epsilon, delta) budget: basic)."""
        if self.selector is None:
            return self.plan.guarantee("zcdp" if self.plan.budget.is_zcdp else "basic")
        return compose_measures([*self.plan.measures,
                                 selection_measure(SELECTION_PURPOSE, self.selector)], "basic")

    def explain(self) -> str:
        """The release plan: each measure's mechanism, sensitivity, noise and budget share."""
        text = self.plan.explain()
        text += self._derivations()
        text += self._quantile_errors()
        text += self._error_statements()
        if self.selector is not None:
            s = self.selector
            total = self.guarantee()
            if self.keyset is not None:
                text += ("\nkeys: every key of the public keyset, and the keys outside it (never an "
                         "excluded one) chosen by private selection; one contribution bound across "
                         "both, so each unit's rows count once; the measures' noise covers every "
                         "key (the two sides are disjoint)")
            text += (f"\nkey selection: {s.selection.strategy.value}, epsilon={s.epsilon:g}, "
                     f"delta={s.delta:g}, keys moved by one neighbouring change={s.max_partitions}"
                     f"\nwhole release with key selection: epsilon={total.epsilon:g}, delta={total.delta:g}")
        if self.testing:
            text += "\nTESTING MODE: no noise is added; this is not a release."
        return text

    def _quantile_errors(self) -> str:
        """Each quantile metric's stated error (transforms.quantiles): resolution and rank error."""
        from transforms.quantiles import rank_error_std

        lines = []
        for metric in self._metrics:
            if metric.kind is not MetricKind.QUANTILES:
                continue
            if isinstance(self.measures[metric.column], CellSelection):
                lines.append(self.measures[metric.column].explain())
                continue
            tree = metric.tree(self._config.bounds)
            spec = next(m for m in self.plan.measures if m.name == metric.column).noise
            if spec is None:
                continue
            lines.append(f"{metric.column}: error = leaf width {tree.leaf_width:.4g} (resolution) "
                         f"plus a rank error of std <= {rank_error_std(tree, spec.std):.4g} rows "
                         "(a shift of that / n in q for a key of n rows)")
        return ("\n" + "\n".join(lines)) if lines else ""

    def check_schema(self, schema: pa.Schema) -> None:
        """Fail early (before the pipeline runs) on a missing or mistyped column."""
        c = self._config
        check_schema(schema, c.unit, c.keys, c.value, vector=c.vector is not None)

    def _derivations(self) -> str:
        """How each released moment metric derives from the shared measures, and their split
        (transforms.moments)."""
        mo = self.moments
        if mo is None:
            return ""
        mid, h, n, s, q = mo.midpoint, mo.half_range, mo.count, mo.nsum, mo.nsq
        how = {MetricKind.COUNT: f"the noisy count {n}",
               MetricKind.MEAN: f"{mid:g} + {s} / max({n}, 1), clamped to the range",
               MetricKind.VARIANCE: f"{q} / N + {h * h / 2:g} - ({s} / N)^2 with N = max({n}, 1), "
                                    f"within [0, {h * h:g}]",
               MetricKind.STD: "the square root of the variance "
                               f"{q} / N + {h * h / 2:g} - ({s} / N)^2, N = max({n}, 1)"}
        how[MetricKind.SUM] = f"the noisy sum {mo.direct_sum}" if mo.direct_sum else \
            f"{s} + {mid:g} x {n}"
        lines = [f"{m.column}: {how[m.kind]}" + self._min_count_rule(m)
                 for m in self._metrics if is_moment(m)]
        split = ", ".join(f"{name} {100 * x:.4g}%" for name, x in mo.fractions.items())
        floor = ", none above its variance at the equal split" if mo.floored else ""
        lines.append(f"the moment metrics share {len(mo.names)} noisy measure(s), their budget split "
                     f"{split}: the split minimising the worst requested metric's stated variance "
                     f"per row{floor} (transforms.moments; worst normalised variance {mo.worst:.4g})")
        return "\nderived metrics (post-processing of the measures above):\n" + "\n".join(lines)

    def _min_count_rule(self, metric: Metric) -> str:
        if metric.kind not in _RATIO_KINDS or metric.min_count is None:
            return ""
        return (f"; null (with its error columns) where the noisy count {self.moments.count} is "
                f"below {metric.min_count:g}: a public rule on the noisy count only")

    def _outputs(self):
        """Released columns from the metrics (a mean derives from two noisy measures), each
        followed by its error columns when asked for."""
        outputs = []
        mo = self.moments
        for metric in self._metrics:
            if metric.kind is MetricKind.COUNT or (metric.kind is MetricKind.SUM and mo is not None
                                                  and is_moment(metric) and mo.direct_sum):
                measure = mo.count if metric.kind is MetricKind.COUNT else mo.direct_sum
                outputs.append(OutputColumn(name=metric.column, measure=measure,
                                            threshold=metric.threshold))
            elif metric.kind is MetricKind.SUM and is_moment(metric):
                derive = functools.partial(_sum_output, nsum=mo.nsum, count=mo.count, midpoint=mo.midpoint)
                outputs.append(OutputColumn(name=metric.column, derive=derive, threshold=metric.threshold))
            elif metric.kind is MetricKind.MEAN:
                low, high = self._config.bounds.value_range()
                derive = functools.partial(_mean_output, nsum=mo.nsum, count=mo.count, low=low,
                                           high=high, min_count=metric.min_count)
                outputs.append(OutputColumn(name=metric.column, derive=derive, threshold=metric.threshold))
            elif metric.kind in (MetricKind.VARIANCE, MetricKind.STD):
                low, high = self._config.bounds.value_range()
                derive = functools.partial(
                    _variance_output, nsum=mo.nsum, nsq=mo.nsq, count=mo.count, low=low, high=high,
                    std=metric.kind is MetricKind.STD, min_count=metric.min_count)
                outputs.append(OutputColumn(name=metric.column, derive=derive, threshold=metric.threshold))
            elif metric.kind is MetricKind.QUANTILES:
                tree = metric.tree(self._config.bounds)
                selection = self.measures[metric.column]
                for j, column in enumerate(metric.output_columns):
                    if isinstance(selection, CellSelection):
                        derive = functools.partial(_selected_output, measure=metric.column,
                                                   selection=selection, j=j)
                    else:
                        derive = functools.partial(_quantile_output, measure=metric.column,
                                                   tree=tree, q=metric.quantiles[j])
                    outputs.append(OutputColumn(name=column, derive=derive))
            else:
                outputs.append(OutputColumn(name=metric.column, measure=metric.column,
                                            threshold=metric.threshold))
            if self._output.error_columns and metric.kind in ERROR_COLUMN_KINDS:
                outputs += self._error_outputs(metric, outputs[-1])
        return outputs

    def _single_noise(self, metric: Metric):
        """(std, 95% half-width) of a count or sum released as one noisy measure plus public
        constants: its own noise's; a derived sum ``S + m N``: ``sqrt(std_S^2 + m^2 std_N^2)``
        and a union bound, each measure's interval at level 97.5%."""
        mo = self.moments
        if metric.kind is MetricKind.SUM and is_moment(metric) and not mo.direct_sum:
            s, n = self.measures[mo.nsum].spec, self.measures[mo.count].spec
            level = 1 - (1 - 0.95) / 2
            return (math.hypot(s.std, mo.midpoint * n.std),
                    s.ci_halfwidth(level) + abs(mo.midpoint) * n.ci_halfwidth(level))
        if metric.kind is MetricKind.COUNT:
            spec = self.measures[mo.count].spec
        elif metric.kind is MetricKind.SUM and is_moment(metric):
            spec = self.measures[mo.direct_sum].spec
        else:
            spec = self.measures[metric.column].spec
        return spec.std, spec.ci_halfwidth(0.95)

    def _error_outputs(self, metric: Metric, released: OutputColumn) -> list:
        """``<name>_ci95_low``, ``<name>_ci95_high`` and ``<name>_std`` of ``metric`` (each null
        where its value is suppressed; ``released``: its value's column); :meth:`_error_statements`
        says how they are computed."""
        if metric.kind in (MetricKind.COUNT, MetricKind.SUM, MetricKind.PRIVACY_UNIT_COUNT):
            std, half = self._single_noise(metric)
            return error_columns.output_columns(released, error_columns.NoiseError(std=std, halfwidth=half))
        errors = self._derived_errors(metric)
        return [OutputColumn(name=name, follows=metric.column,
                             derive=functools.partial(_error_output, errors=errors, part=part))
                for name, part in zip(error_columns.names(metric.column), (1, 2, 0))]

    def _derived_errors(self, metric: Metric):
        """``noisy answers -> (std, ci low, ci high)`` of a mean, variance or standard deviation
        (transforms.metrics.mean_error / variance_error), from its measures' public noise."""
        low, high = self._config.bounds.value_range()
        mo = self.moments
        nsum, count = mo.nsum, mo.count
        sum_spec, count_spec = self.measures[nsum].spec, self.measures[count].spec
        if metric.kind is MetricKind.MEAN:
            level = 1 - (1 - 0.95) / 2  # two noisy answers: a union bound
            return functools.partial(_mean_errors, nsum=nsum, count=count, low=low, high=high,
                                     min_count=metric.min_count,
                                     sum_std=sum_spec.std, count_std=count_spec.std,
                                     sum_half=sum_spec.ci_halfwidth(level),
                                     count_half=count_spec.ci_halfwidth(level))
        nsq = mo.nsq
        squares_spec = self.measures[nsq].spec
        level = 1 - (1 - 0.95) / 3  # three noisy answers: a union bound
        return functools.partial(_variance_errors, nsum=nsum, nsq=nsq, count=count, low=low,
                                 high=high, min_count=metric.min_count, sum_std=sum_spec.std,
                                 squares_std=squares_spec.std,
                                 count_std=count_spec.std, sum_half=sum_spec.ci_halfwidth(level),
                                 squares_half=squares_spec.ci_halfwidth(level),
                                 count_half=count_spec.ci_halfwidth(level),
                                 std=metric.kind is MetricKind.STD)

    def _error_statements(self) -> str:
        """How each metric's error columns are computed (explain(), with error_columns=True)."""
        if not self._output.error_columns:
            return ""
        lines = []
        for metric in self._metrics:
            name = metric.column
            if metric.kind in (MetricKind.COUNT, MetricKind.SUM, MetricKind.PRIVACY_UNIT_COUNT):
                std, half = self._single_noise(metric)
                derived = metric.kind is MetricKind.SUM and is_moment(metric) and not self.moments.direct_sum
                lines.append(f"{name}: error columns {name}_std = {std:.4g} and {name}_ci95 = "
                             f"value -/+ {half:.4g}: " + (
                                 "the noise of the normalised sum and the count it is derived from "
                                 "(a union bound of their 97.5% intervals)" if derived else
                                 "the noise's own standard deviation and symmetric 95% interval"))
            elif metric.kind in (MetricKind.MEAN, MetricKind.VARIANCE, MetricKind.STD):
                errors = self._derived_errors(metric).keywords
                answers = [errors["nsum"]] + ([errors["nsq"]] if "nsq" in errors else []) + [errors["count"]]
                halves = [errors["sum_half"]] + ([errors["squares_half"]] if "nsq" in errors else []) + \
                    [errors["count_half"]]
                how = {MetricKind.MEAN: "sqrt(std(S)^2 + m^2 std(N)^2) / N, m the released mean minus "
                                        "the midpoint",
                       MetricKind.VARIANCE: "of Q/N + h^2/2 - (S/N)^2",
                       MetricKind.STD: "of the variance Q/N + h^2/2 - (S/N)^2, over twice the "
                                       "released std, at most the square root of the variance's"}[metric.kind]
                within = ", ".join(f"{a} -/+ {h:.4g}" for a, h in zip(answers, halves))
                lines.append(
                    f"{name}: error columns derived from the noise of {', '.join(answers)}: "
                    f"{name}_std by the delta method ({how}) at the released values, at most what "
                    f"the clamping range allows; {name}_ci95_low/high a bound: every "
                    f"{metric.kind.value} the noise-free answers may give within {within} (each its "
                    f"noise's {100 - 5 / len(answers):.4g}% interval, so all hold with probability "
                    f">= 95%: a union bound), clamped to the range; it holds the noise-free (bounded) "
                    f"{metric.kind.value} with probability at least 95% whatever the count "
                    "(conservative: its coverage is often above 95%)")
        lines.append("error columns describe the noise only, not the bias of contribution "
                     "bounding and clamping")
        return "\n" + "\n".join(lines)

    def output_schema(self) -> pa.Schema:
        """The released table's schema (module docstring, "Output schema"); key columns typed
        from an in-memory keyset, else as null (their type is the input's). Fields are nullable
        as Arrow builds them; only metric values (threshold_mode="value") are ever null."""
        fields = []
        for k in self._config.keys:
            typ = pa.null()
            if self.keyset is not None and self.keyset.in_memory:
                typ = _keyset_type(self.keyset, k)
            fields.append(pa.field(k, typ))
        for metric in self._metrics:
            for column in metric.output_columns:
                if metric.kind is MetricKind.COUNT:
                    typ = pa.int64() if self.measures[self.moments.count].integer else pa.float64()
                elif metric.kind is MetricKind.PRIVACY_UNIT_COUNT or \
                        (metric.kind is MetricKind.SUM and not is_moment(metric)):
                    typ = pa.int64() if self.measures[column].integer else pa.float64()
                elif metric.kind is MetricKind.VECTOR_SUM:
                    typ = pa.list_(pa.float64(), metric.dimension)
                else:
                    typ = pa.float64()
                fields.append(pa.field(column, typ))
            if self._output.error_columns and metric.kind in ERROR_COLUMN_KINDS:
                fields += [pa.field(name, pa.float64()) for name in error_columns.names(metric.column)]
        return pa.schema(fields)

    def expand(self, pcoll):
        c = self._config
        schema = static_schema(pcoll)
        if schema is not None:  # contents known at construction: fail now, not in a worker
            typed = pa.schema([f for f in schema if not pa.types.is_null(f.type)])
            missing = [col for col in [c.unit, *c.keys] + ([c.value] if c.value else [])
                       if col not in schema.names]
            if missing:
                role = "privacy unit" if missing[0] == c.unit else ("value" if missing[0] == c.value else "key")
                raise ValueError(f"input has no {role} column {missing[0]!r} "
                                 f"(columns: {sorted(schema.names)})")
            if len(typed) == len(schema):
                check_schema(schema, c.unit, c.keys, c.value, vector=c.vector is not None)
        both = self.keyset is not None and self.selector is not None
        pcollection_keyset = None if self.keyset is None or self.keyset.in_memory else self.keyset
        # An in-memory keyset: bounded rows and partials carry the key's position in it, not the
        # key columns (8 bytes per row through the shuffles; NoisyRelease joins on it). With
        # private selection beside it, bounding sees every key (one bound across both) and the
        # partials keep their key columns.
        by_position = self.keyset is not None and self.keyset.in_memory and not both
        partials = pcoll | "BoundContributions" >> BoundedKeyPartials(c, pcollection_keyset,
                                                                      by_position=by_position)
        release = functools.partial(
            NoisyRelease, keys=c.keys, measures=list(self.measures.values()),
            outputs=self._outputs(), testing=self.testing, num_shards=c.num_shards,
            partial_types=c.partials.partial_types(has_value=c.value is not None,
                                                   integer_sum=c.integer_values),
            threshold_mode=self._output.threshold_mode)
        if not both:
            released = partials | "Release" >> release(release_key=self.release_key, keyset=self.keyset,
                                                       selector=self.selector)
        else:
            # The keyset's keys (left join: the others are dropped there) under the release key;
            # the keys outside it (and not excluded) selected privately, noised under a child of
            # the key (each key is on one side only: the same measures on disjoint keys).
            public = partials | "ReleaseKeyset" >> release(release_key=self.release_key,
                                                           keyset=self.keyset, selector=None)
            outside = (partials | "OutsideKeyset" >> beam.Map(_outside_keyset, keyset=self.keyset)
                       | "ReleaseSelected" >> release(release_key=self.release_key.derive(_OUTSIDE),
                                                      keyset=None, selector=self.selector))
            released = (public, outside) | "Released" >> beam.Flatten()
        if self._output.format == "dicts":
            return released | "ToDicts" >> beam.FlatMap(lambda t: t.to_pylist())
        return released


def _spendable(budget, release_key, testing, uses_delta: bool):
    """(the SharedBudget part or None, the PrivacyBudget to spend, the release key): a part
    lends its budget (with delta only if ``uses_delta``: BudgetPart.spendable_budget) and,
    unless one is given, its release key."""
    part = None
    if isinstance(budget, BudgetPart):
        part, budget = budget, budget.spendable_budget(uses_delta=uses_delta)
        if release_key is None and part.release_key is not None and \
                (not testing or part.release_key.is_testing):
            release_key = part.release_key
    if not isinstance(budget, PrivacyBudget):
        raise TypeError("budget must be a PrivacyBudget or a SharedBudget part "
                        f"(shared.part(name)), got {type(budget).__name__}")
    return part, budget, release_key


def _check_together(compute: Compute, keys: Keys, bounds: ContributionBounds, budget) -> None:
    """What no single configuration object can check alone."""
    if keys.selection is not None and budget.is_zcdp:
        raise ValueError("private key selection is (epsilon, delta)-DP: give an (epsilon, delta) "
                         "budget, or a public keyset with a zCDP budget")
    outputs = [c for m in compute.metrics for c in m.output_columns]
    clash = sorted(set(outputs) & set(keys.columns))
    if clash:
        raise ValueError(f"metric names {clash} are key columns: give the metrics other names")
    if compute.needs_range and bounds.min_value is None:
        raise ValueError("metrics of values need a clamping range: "
                         "ContributionBounds(..., min_value=..., max_value=...)")


def _release_key(release_key, testing: bool) -> ReleaseKey:
    """The given key, a fresh secret one, or in testing mode a testing key (never a secret)."""
    if testing:
        if release_key is not None and not release_key.is_testing:
            raise ValueError("testing mode refuses a secret release key: it makes no release")
        release_key = release_key or ReleaseKey.for_testing(0)
    elif release_key is None:
        release_key = ReleaseKey.generate()
    if not isinstance(release_key, ReleaseKey):
        raise TypeError("release_key must be a ReleaseKey")
    return release_key


def _bounding_config(compute: Compute, keys: Keys, bounds: ContributionBounds, release_key,
                     num_shards: int, integer_values: bool) -> BoundingConfig:
    """The bounding stage's configuration: the columns, bounds and the partials to compute."""
    metrics = compute.metrics
    low, high = bounds.value_range() if compute.needs_range else (0.0, 0.0)
    squares = any(m.kind in (MetricKind.VARIANCE, MetricKind.STD) for m in metrics)
    vector = compute.vector
    partials = PartialsSpec(
        half_range=(high - low) / 2 if squares else None,
        trees=tuple(m.tree(bounds) for m in metrics if m.kind is MetricKind.QUANTILES),
        vector=vector.vector_spec() if vector is not None else None)
    return BoundingConfig(unit=keys.privacy_unit, keys=list(keys.columns),
                          value=compute.value if compute.needs_value else None, bounds=bounds,
                          release_key=release_key,
                          keyset=None if keys.selection is not None else keys.keyset,
                          num_shards=num_shards,
                          integer_values=integer_values, midpoint=(low + high) / 2, partials=partials)


#: The derivation label of the key that noises and selects the keys outside a public keyset.
_OUTSIDE = "outside_keyset"


def _outside_keyset(table: pa.Table, *, keyset: PublicKeyset) -> pa.Table:
    """The partials of keys outside an in-memory ``keyset`` and not excluded by it (those the
    private selection beside the keyset may release)."""
    if not table.num_rows:
        return table
    keep = (keyset.positions(table) < 0) & ~keyset.excluded_mask(table)
    return table.filter(pa.array(keep))


def _keyset_type(keyset, column):
    batch = keyset.batch_at(0, max_rows=1)
    return batch.schema.field(column).type


def _sum_output(noisy, *, nsum, count, midpoint):
    return sum_from_noisy(noisy[nsum], noisy[count], midpoint)


def _quantile_output(noisy, *, measure, tree, q):
    return tree.quantiles(noisy[measure], [q])[:, 0]


def _selected_output(noisy, *, measure, selection, j):
    return selection.values(noisy[measure], j)


def _below(noisy, count, min_count):
    """Keys whose noisy count is below ``min_count`` (None: none): their ratio metrics are null."""
    if min_count is None:
        return None
    return np.asarray(noisy[count], dtype=float) < min_count


def _masked(values, below):
    return values if below is None else np.ma.masked_array(values, mask=below)


def _mean_output(noisy, *, nsum, count, low, high, min_count):
    return _masked(mean_from_noisy(noisy[nsum], noisy[count], low, high), _below(noisy, count, min_count))


def _variance_output(noisy, *, nsum, nsq, count, low, high, std, min_count):
    return _masked(variance_from_noisy(noisy[nsum], noisy[nsq], noisy[count], low, high, std=std),
                   _below(noisy, count, min_count))


def _mean_errors(noisy, *, nsum, count, min_count, **noise):
    below = _below(noisy, count, min_count)
    return tuple(_masked(a, below) for a in mean_error(noisy[nsum], noisy[count], **noise))


def _variance_errors(noisy, *, nsum, nsq, count, min_count, **noise):
    below = _below(noisy, count, min_count)
    return tuple(_masked(a, below) for a in variance_error(noisy[nsum], noisy[nsq], noisy[count], **noise))


def _error_output(noisy, *, errors, part):
    values = errors(noisy)[part]
    return values.astype(np.float64) if np.ma.isMaskedArray(values) else np.asarray(values, dtype=np.float64)
