"""``DPAggregate``: differentially private per-key aggregates as a Beam PTransform.

    released = rows | DPAggregate(
        privacy_unit="user_id", keys=["country", "project"], value="seconds",
        metrics=[Count(), Sum(), Mean(), PrivacyUnitCount()],
        bounds=ContributionBounds(max_partitions=3, max_contributions_per_partition=2,
                                  min_value=0, max_value=10),
        keyset=PublicKeyset.cross_product({...}).exclude("country", protected),
        budget=PrivacyBudget(epsilon=1.0), release_key=ReleaseKey.generate())

Input: a PCollection of pyarrow RecordBatches / Tables (the fast path, e.g. from
``ReadFromParquetBatched``), pandas or Polars DataFrames, or dicts / ``beam.Row``s. When the
input's contents are known at construction (``beam.Create``, schema'd Rows), a missing or
mistyped column fails when the transform is applied, naming the columns present
(:func:`check_schema`; ``transform.check_schema(schema)`` checks any other source up front).
Output: Arrow tables, one row per released key with its noisy metrics (``output="arrow"``), or
dicts (``output="dicts"``).

Output schema (``transform.output_schema()`` states it for a given configuration): the key
columns (their input types), then per metric, in the order given:

* ``count``, ``privacy_unit_count``: int64 (discrete noise); ``sum``: float64 (int64 with
  integer noise and integer values); ``mean``, ``variance``, ``std``: float64;
* quantiles: one float64 column per quantile, ``<name>_p<100 q>`` (``median``,
  ``percentile_p50``...), from the metric's quantile tree or, when it states the smaller rank
  error at the metric's budget share (one or two quantiles, usually), by permute-and-flip over
  the tree's leaf edges (:mod:`transforms.private_quantile`); ``vector_sum``:
  fixed_size_list<float64>[dimension];
* with ``error_columns=True``, after each count / sum / privacy-unit count / mean / variance /
  std ``<name>``: ``<name>_ci95_low``, ``<name>_ci95_high`` and ``<name>_std``, all float64.
  For a count or a sum they are the noise's symmetric 95% interval around the released value
  and its standard deviation. A mean, variance or std derives its error from the noise of the
  sums and count it is computed from (:func:`transforms.metrics.mean_error`,
  :func:`~transforms.metrics.variance_error`): the std by the delta method at the released
  values, the interval as a bound that holds the noise-free value with probability at least 95%
  for every count (a union bound over the noisy answers' own intervals); ``explain()`` states
  how, with the numbers. They describe the noise only, not the bias of contribution bounding and
  clamping; quantiles state their error in ``explain()``.

A null value (``threshold_mode="value"``) means *suppressed*: the noisy value was not above its
threshold, and its error columns are null too. With ``threshold_mode="key"`` such a key is not
released at all. Rows are sorted by the key columns (:mod:`transforms.release`).

Data flow (every step works on Arrow batches; only bounded partials are shuffled):

1. and 2. The bounding stage (:class:`~transforms.bounding_stage.BoundedKeyPartials`): per batch,
   the row rules, the keyset filter, secret priorities and bounding (L0 keys per unit, Linf rows
   per unit and key); per unit shard, re-bounding as partial batches meet and exact per-key
   partials. Its module states the row rules (each counted under namespace ``dp_aggregate``,
   for the operator only) and the canonical form of privacy-unit ids (7, 7.0 and "7" are one
   unit; a unit column that cannot hold ids is refused before the pipeline runs).
3. The release stage (:class:`~transforms.release.NoisyRelease`) sums partials per key shard.
4. Keys are chosen: the public keyset (left join: keys without rows get zeros) or private key
   selection. Noise is drawn per key from the release key and the measure's name, and release
   thresholds (post-processing) suppress keys.

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
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.guarantee import compose as compose_measures
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds, Neighbouring
from accounting.shared_budget import BudgetPart, selection_measure
from transforms.bounding_stage import BoundedKeyPartials, BoundingConfig, check_schema
from transforms.keyset import PublicKeyset
from transforms.metrics import (Metric, MetricKind, as_metric, is_integer_range, mean_error,
                                mean_from_noisy, plan_measures, variance_error, variance_from_noisy)
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


# --------------------------------------------------------------------------- the transform

class DPAggregate(beam.PTransform):
    """Differentially private per-key metrics; see the module docstring."""

    def __init__(self, *, privacy_unit: str, keys: Sequence[str], metrics: Sequence[Metric],
                 bounds: ContributionBounds, budget: PrivacyBudget, value: str = None,
                 keyset: PublicKeyset = None, selection: PrivateSelection = None,
                 neighbouring=Neighbouring.ADD_REMOVE, release_key: ReleaseKey = None,
                 testing: bool = False, num_shards: int = 32, output: str = "arrow",
                 threshold_mode: str = "key", integer_values: bool = None,
                 error_columns: bool = False, label: str = None):
        super().__init__(label)
        part = None
        if isinstance(budget, BudgetPart):
            part, budget = budget, budget.spendable_budget()
            if release_key is None and part.release_key is not None and \
                    (not testing or part.release_key.is_testing):
                release_key = part.release_key
        if not isinstance(budget, PrivacyBudget):
            raise TypeError("budget must be a PrivacyBudget or a SharedBudget part "
                            f"(shared.part(name)), got {type(budget).__name__}")
        if isinstance(keys, str):
            keys = [keys]
        if not keys:
            raise ValueError("keys must name at least one key column")
        if selection is not None and budget.is_zcdp:
            raise ValueError("private key selection is (epsilon, delta)-DP: give an (epsilon, delta) "
                             "budget, or a public keyset with a zCDP budget")
        if keyset is not None and selection is not None:
            raise ValueError("give either a public keyset or a private selection, not both")
        if keyset is None and selection is None:
            raise ValueError("no public keyset: pass keyset=PublicKeyset(...) or "
                             "selection=PrivateSelection() for private key selection")
        if keyset is not None and list(keyset.columns) != list(keys):
            raise ValueError(f"keyset columns {keyset.columns} must equal keys {list(keys)}")
        if output not in ("arrow", "dicts"):
            raise ValueError(f"output must be 'arrow' or 'dicts', got {output!r}")
        if threshold_mode not in ("key", "value"):
            raise ValueError(f"threshold_mode must be 'key' or 'value', got {threshold_mode!r}")
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if isinstance(metrics, (str, Metric)):
            metrics = [metrics]
        metrics = [as_metric(m) for m in metrics]
        if not isinstance(bounds, ContributionBounds):
            raise TypeError(f"bounds must be a ContributionBounds, got {type(bounds).__name__}")
        if not isinstance(privacy_unit, str) or (value is not None and not isinstance(value, str)) \
                or not all(isinstance(k, str) for k in keys):
            raise TypeError("privacy_unit, keys and value must be column names (strings)")
        outputs = [c for m in metrics for c in m.output_columns]
        clash = sorted(set(outputs) & set(keys))
        if clash:
            raise ValueError(f"metric names {clash} are key columns: give the metrics other names")
        if len(set(outputs)) != len(outputs):
            raise ValueError(f"output columns must be unique, got {outputs}")
        needs_value = any(m.needs_value for m in metrics)
        if needs_value and not value:
            kinds = sorted({m.kind.value for m in metrics if m.needs_value})
            raise ValueError(f"metrics {kinds} need a value column (value=...)")
        vectors = [m for m in metrics if m.is_vector]
        if vectors and (len(vectors) > 1 or any(m.needs_range for m in metrics)):
            raise ValueError("a vector sum reads the value column as vectors: it cannot be combined "
                             "with another vector sum or with scalar value metrics in one DPAggregate "
                             "(use a second DPAggregate, e.g. with a SharedBudget)")
        if any(m.needs_range for m in metrics) and bounds.min_value is None:
            raise ValueError("metrics of values need a clamping range: "
                             "ContributionBounds(..., min_value=..., max_value=...)")
        if testing:
            if release_key is not None and not release_key.is_testing:
                raise ValueError("testing mode refuses a secret release key: it makes no release")
            release_key = release_key or ReleaseKey.for_testing(0)
        elif release_key is None:
            release_key = ReleaseKey.generate()
        if not isinstance(release_key, ReleaseKey):
            raise TypeError("release_key must be a ReleaseKey")
        if integer_values is None:
            integer_values = needs_value and any(
                m.kind is MetricKind.SUM and m.noise.is_integer for m in metrics)
        if integer_values and needs_value and not is_integer_range(bounds):
            raise ValueError("integer sums need integer clamping bounds (min_value, max_value)")
        self.testing = testing
        self.release_key = release_key
        self.selection = selection
        self.plan, self.measures, selection_share = plan_measures(
            metrics, bounds, budget, neighbouring=neighbouring,
            selection_weight=selection.weight if selection else 0.0,
            selection_needs_delta=selection is not None, integer_values=integer_values)
        self.selector = None
        if selection is not None:
            self.selector = Selector.for_bounds(selection, selection_share.epsilon,
                                                selection_share.delta, bounds, neighbouring)
        low_high = bounds.value_range() if any(m.needs_range for m in metrics) else (0.0, 0.0)
        self.keyset = keyset
        squares = any(m.kind in (MetricKind.VARIANCE, MetricKind.STD) for m in metrics)
        partials = PartialsSpec(
            half_range=(low_high[1] - low_high[0]) / 2 if squares else None,
            trees=tuple(m.tree(bounds) for m in metrics if m.kind is MetricKind.QUANTILES),
            vector=vectors[0].vector_spec() if vectors else None)
        self._config = BoundingConfig(unit=privacy_unit, keys=keys, value=value if needs_value else None,
                                      bounds=bounds, release_key=release_key, keyset=keyset,
                                      num_shards=num_shards, integer_values=integer_values,
                                      midpoint=(low_high[0] + low_high[1]) / 2, partials=partials)
        self._metrics = metrics
        self._output = output
        self._threshold_mode = threshold_mode
        if not isinstance(error_columns, bool):
            raise TypeError(f"error_columns must be True or False, got {error_columns!r}")
        self._error_columns = error_columns
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
        text += self._quantile_errors()
        text += self._error_statements()
        if self.selector is not None:
            s = self.selector
            total = self.guarantee()
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

    def _count_name(self) -> Optional[str]:
        """The released count a mean, variance or standard deviation reuses, if any."""
        return next((m.column for m in self._metrics if m.kind is MetricKind.COUNT), None)

    def _outputs(self):
        """Released columns from the metrics (a mean derives from two noisy measures), each
        followed by its error columns when asked for."""
        outputs = []
        count_name = self._count_name()
        for metric in self._metrics:
            if metric.kind is MetricKind.MEAN:
                low, high = self._config.bounds.value_range()
                nsum, count = f"{metric.column}.normalized_sum", count_name or f"{metric.column}.count"
                derive = functools.partial(_mean_output, nsum=nsum, count=count, low=low, high=high)
                outputs.append(OutputColumn(name=metric.column, derive=derive, threshold=metric.threshold))
            elif metric.kind in (MetricKind.VARIANCE, MetricKind.STD):
                low, high = self._config.bounds.value_range()
                derive = functools.partial(
                    _variance_output, nsum=f"{metric.column}.normalized_sum",
                    nsq=f"{metric.column}.normalized_squares",
                    count=count_name or f"{metric.column}.count", low=low, high=high,
                    std=metric.kind is MetricKind.STD)
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
            if self._error_columns and metric.kind in ERROR_COLUMN_KINDS:
                outputs += self._error_outputs(metric)
        return outputs

    def _error_outputs(self, metric: Metric) -> list:
        """``<name>_ci95_low``, ``<name>_ci95_high`` and ``<name>_std`` of ``metric`` (each null
        where its value is suppressed); :meth:`_error_statements` says how they are computed."""
        if metric.kind in (MetricKind.COUNT, MetricKind.SUM, MetricKind.PRIVACY_UNIT_COUNT):
            spec = self.measures[metric.column].spec
            std, half = spec.std, spec.ci_halfwidth(0.95)
            return [OutputColumn(name=metric.column + "_ci95_low", follows=metric.column,
                                 derive=functools.partial(_offset_output, measure=metric.column, offset=-half)),
                    OutputColumn(name=metric.column + "_ci95_high", follows=metric.column,
                                 derive=functools.partial(_offset_output, measure=metric.column, offset=half)),
                    OutputColumn(name=metric.column + "_std", follows=metric.column,
                                 derive=functools.partial(_constant_output, measure=metric.column, value=std))]
        errors = self._derived_errors(metric)
        return [OutputColumn(name=metric.column + suffix, follows=metric.column,
                             derive=functools.partial(_error_output, errors=errors, part=part))
                for suffix, part in (("_ci95_low", 1), ("_ci95_high", 2), ("_std", 0))]

    def _derived_errors(self, metric: Metric):
        """``noisy answers -> (std, ci low, ci high)`` of a mean, variance or standard deviation
        (transforms.metrics.mean_error / variance_error), from its measures' public noise."""
        low, high = self._config.bounds.value_range()
        nsum, count = f"{metric.column}.normalized_sum", self._count_name() or f"{metric.column}.count"
        sum_spec, count_spec = self.measures[nsum].spec, self.measures[count].spec
        if metric.kind is MetricKind.MEAN:
            level = 1 - (1 - 0.95) / 2  # two noisy answers: a union bound
            return functools.partial(_mean_errors, nsum=nsum, count=count, low=low, high=high,
                                     sum_std=sum_spec.std, count_std=count_spec.std,
                                     sum_half=sum_spec.ci_halfwidth(level),
                                     count_half=count_spec.ci_halfwidth(level))
        nsq = f"{metric.column}.normalized_squares"
        squares_spec = self.measures[nsq].spec
        level = 1 - (1 - 0.95) / 3  # three noisy answers: a union bound
        return functools.partial(_variance_errors, nsum=nsum, nsq=nsq, count=count, low=low,
                                 high=high, sum_std=sum_spec.std, squares_std=squares_spec.std,
                                 count_std=count_spec.std, sum_half=sum_spec.ci_halfwidth(level),
                                 squares_half=squares_spec.ci_halfwidth(level),
                                 count_half=count_spec.ci_halfwidth(level),
                                 std=metric.kind is MetricKind.STD)

    def _error_statements(self) -> str:
        """How each metric's error columns are computed (explain(), with error_columns=True)."""
        if not self._error_columns:
            return ""
        lines = []
        for metric in self._metrics:
            name = metric.column
            if metric.kind in (MetricKind.COUNT, MetricKind.SUM, MetricKind.PRIVACY_UNIT_COUNT):
                spec = self.measures[name].spec
                lines.append(f"{name}: error columns {name}_std = {spec.std:.4g} and {name}_ci95 = "
                             f"value -/+ {spec.ci_halfwidth(0.95):.4g}: the noise's own standard "
                             "deviation and symmetric 95% interval")
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
                if metric.kind in (MetricKind.COUNT, MetricKind.PRIVACY_UNIT_COUNT) or \
                        (metric.kind is MetricKind.SUM and self.measures[column].integer):
                    typ = pa.int64() if self.measures[column].integer else pa.float64()
                elif metric.kind is MetricKind.VECTOR_SUM:
                    typ = pa.list_(pa.float64(), metric.dimension)
                else:
                    typ = pa.float64()
                fields.append(pa.field(column, typ))
            if self._error_columns and metric.kind in ERROR_COLUMN_KINDS:
                for suffix in ("_ci95_low", "_ci95_high", "_std"):
                    fields.append(pa.field(metric.column + suffix, pa.float64()))
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
        pcollection_keyset = None if self.keyset is None or self.keyset.in_memory else self.keyset
        # An in-memory keyset: bounded rows and partials carry the key's position in it, not the
        # key columns (8 bytes per row through the shuffles; NoisyRelease joins on it).
        by_position = self.keyset is not None and self.keyset.in_memory
        partials = pcoll | "BoundContributions" >> BoundedKeyPartials(c, pcollection_keyset,
                                                                      by_position=by_position)
        measures = list(self.measures.values())
        partial_types = c.partials.partial_types(has_value=c.value is not None,
                                                 integer_sum=c.integer_values)
        released = partials | "Release" >> NoisyRelease(
            keys=c.keys, measures=measures, outputs=self._outputs(), partial_types=partial_types,
            release_key=self.release_key, keyset=self.keyset, selector=self.selector,
            testing=self.testing, num_shards=c.num_shards, threshold_mode=self._threshold_mode)
        if self._output == "dicts":
            return released | "ToDicts" >> beam.FlatMap(lambda t: t.to_pylist())
        return released


def _keyset_type(keyset, column):
    batch = keyset.batch_at(0, max_rows=1)
    return batch.schema.field(column).type


def _offset_output(noisy, *, measure, offset):
    return np.asarray(noisy[measure], dtype=np.float64) + offset


def _constant_output(noisy, *, measure, value):
    return np.full(len(noisy[measure]), value, dtype=np.float64)


def _variance_output(noisy, *, nsum, nsq, count, low, high, std):
    return variance_from_noisy(noisy[nsum], noisy[nsq], noisy[count], low, high, std=std)


def _quantile_output(noisy, *, measure, tree, q):
    return tree.quantiles(noisy[measure], [q])[:, 0]


def _selected_output(noisy, *, measure, selection, j):
    return selection.values(noisy[measure], j)


def _mean_output(noisy, *, nsum, count, low, high):
    return mean_from_noisy(noisy[nsum], noisy[count], low, high)


def _mean_errors(noisy, *, nsum, count, **noise):
    return mean_error(noisy[nsum], noisy[count], **noise)


def _variance_errors(noisy, *, nsum, nsq, count, **noise):
    return variance_error(noisy[nsum], noisy[nsq], noisy[count], **noise)


def _error_output(noisy, *, errors, part):
    return np.asarray(errors(noisy)[part], dtype=np.float64)
