"""Attribution Reporting event-level reports: simulated from conversion logs, debiased per group.

The browser's event-level mechanism (seed 000, "event-level statistics"; the Attribution
Reporting API's event-level explainer): every registered source (impression) reports at most R
attributed triggers, each as (reporting window, trigger data); the source's output -- one of
k = C(T w + R, R) states -- goes through k-ary randomized response with flip probability
k / (k + e^epsilon - 1) (``transforms.ara.event_level``), keyed per source under the release
key. The ad tech then debiases aggregate conversion counts from the noisy reports
(``transforms.ara.event_debias``: unbiased, with an unbiased variance estimate).

Inputs: ``--sources`` (the registered sources: ``source_id`` plus the public columns named by
``--group_by``) and ``--conversions`` (``source_id``, optional ``order``, and either
``trigger_data`` and ``window`` columns or -- with ``--value_edges`` and ``--window_ends`` --
``value`` and ``delay`` columns mapped to them). The registered sources are public: the ad tech
registered them.

Output: release ``event_level_reports/<batch_id>`` with

* ``reports.csv``: ``source_id,window,trigger_data``, one row per noisy report (what the browser
  sends), sorted;
* ``estimates.csv``: per group of registered sources and trigger-data value (empty
  ``trigger_data``: all values), ``sources`` (public), the debiased ``estimate`` of attributed
  conversions, its ``variance`` estimate, ``estimate_ci95_low``, ``estimate_ci95_high`` and
  ``estimate_std`` (the variance's square root, clamped at the least variance a group of its
  size can have, and the approximate 95% interval
  estimate -/+ 1.96 estimate_std clipped to [0, R sources]: the error columns' naming,
  :func:`transforms.error_columns.plug_in_interval`); one row per group and value whatever the
  reports. The interval is approximate (plug-in variance, normal approximation): the estimate's
  variance depends on the group's true conversions (``RELEASE.json`` says so,
  :data:`APPROXIMATE_INTERVAL`).

Privacy: epsilon-DP per source for the neighbouring relation "one source's conversions added,
removed or replaced" (k-ary randomized response; no additive noise). The estimates are
post-processing; given the sources' random draws, one source moves its group's rows only, by at
most ``R / (1 - p)`` per estimate (the sensitivity stated in the release metadata). Rows dropped
(null ids, trigger data outside its cardinality, windows outside the report windows, sources not
registered, triggers beyond R) are counted for the operator, never released. A batch's content is
released once (the ledger refuses the same sources and conversions under another label).

Run ``python -m pipelines.ara.event_level_reports --help``; ``--testing_seed`` makes a run that is
not a release (public key, output under ``testing-not-a-release/``).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from accounting.budget import PrivacyBudget
from accounting.ledger import Scope
from accounting.measures import Measure
from accounting.sensitivity import Sensitivities
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, Prepared,
                               ReleaseOptions, ReleaseRefused, cli)
from pipelines.release import run as run_release
from pipelines.release.consumption import SKIP_HELP, Consumes, remove_consumed, scan_ids
from pipelines.release.names import check_segment
from transforms import error_columns
from transforms.ara.event_beam import (EVENT_PURPOSE, NAMESPACE, DebiasConversionCounts,
                                       SimulateEventReports, TriggerMapping)
from transforms.ara.event_level import MAX_EVENT_LEVEL_EPSILON, EventLevelConfig

NAME = "event_level_reports"
#: Consumed-id namespace: the registered sources (each randomized once, ever).
SOURCES = "ara-event/source"
REPORTS = "reports.csv"
ESTIMATES = "estimates.csv"
#: Column names of the estimates table that a group column may not take.
_RESERVED = ("source_id", "trigger_data", "window", "sources", "estimate", "variance",
             *error_columns.names("estimate"))
#: The debiased estimate's errors statement (the estimates table's ``errors``): randomized
#: response adds no noise of a fixed distribution, so its interval is the approximate plug-in one.
APPROXIMATE_INTERVAL = error_columns.approximate_statement(
    "estimate",
    std="the square root of variance, the unbiased estimate of the debiased count's variance "
        "from the released reports, clamped at the least variance any group of as many sources "
        "can have (public: from the sources and the configuration) (the plug-in variance: the true variance "
        "depends on the group's true conversions)",
    assumptions="groups of many sources (the estimate is a sum of independent sources' bounded "
                "terms, close to normal by the central limit theorem) and a variance estimate "
                "close to the true variance (a group of few sources may estimate it low)",
    clipped_to="[0, R sources] (R: the attributed triggers a source reports at most)")


@dataclass(frozen=True, kw_only=True)
class EventLevelReportsRequest:
    """One batch of event-level reports (the CLI flags are these fields)."""

    sources: tuple = field(metadata={"help": "registered sources (source_id and the --group_by "
                                             "columns): paths, globs or folders, comma-separated"})
    conversions: tuple = field(metadata={"help": "conversion logs (source_id, optional order, "
                                                 "trigger_data and window -- or value and delay "
                                                 "with --value_edges/--window_ends)"})
    epsilon: float = field(metadata={"help": "randomized response epsilon per source "
                                             f"(0 < epsilon <= {MAX_EVENT_LEVEL_EPSILON:g})"})
    batch_id: str = field(metadata={"help": "a label for this batch (release id "
                                            "event_level_reports/BATCH_ID)"})
    trigger_data_cardinality: int = field(default=8, metadata={
        "help": "T: values of trigger data (the API's click default)"})
    report_windows: int = field(default=3, metadata={"help": "w: reporting windows"})
    max_reports: int = field(default=3, metadata={"help": "R: attributed triggers per source"})
    value_edges: tuple = field(default=(), metadata={
        "help": "ascending conversion-value class edges (T - 1 numbers): map a value column to "
                "trigger data"})
    window_ends: tuple = field(default=(), metadata={
        "help": "ascending ends of the w reporting windows, in the delay column's unit: map a "
                "delay column to windows (a later conversion is not attributed)"})
    group_by: tuple = field(default=(), metadata={
        "help": "public columns of --sources to group the estimates by"})
    skip_consumed: bool = field(default=False, metadata={"help": SKIP_HELP})
    options: ReleaseOptions = field(metadata={"cli": False})


def _numbers(values, flag: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ReleaseRefused(f"{flag} must be numbers")
    if not all(math.isfinite(v) for v in out):
        raise ReleaseRefused(f"{flag} must be finite numbers")
    return out


def event_config(request) -> EventLevelConfig:
    try:
        return EventLevelConfig(trigger_data_cardinality=request.trigger_data_cardinality,
                                report_windows=request.report_windows,
                                max_reports=request.max_reports, epsilon=request.epsilon)
    except ValueError as err:
        raise ReleaseRefused(f"event-level configuration: {err}")


def trigger_mapping(request, config: EventLevelConfig) -> Optional[TriggerMapping]:
    if not request.value_edges and not request.window_ends:
        return None
    if not request.window_ends:
        raise ReleaseRefused("--value_edges needs --window_ends (value and delay columns)")
    try:
        mapping = TriggerMapping(value_edges=_numbers(request.value_edges, "--value_edges"),
                                 window_ends=_numbers(request.window_ends, "--window_ends"))
        mapping.check(config)
    except ValueError as err:
        raise ReleaseRefused(f"--value_edges/--window_ends: {err}")
    return mapping


def estimate_sensitivities(config: EventLevelConfig) -> Sensitivities:
    """How far one source's conversions move the released estimates, its random draws fixed.

    Its released reports in any cell set change by at most R, so each estimate by at most
    R / (1 - p); it moves its own group's T + 1 rows only; over those, the per-value changes and
    the all-values change sum to at most 2R / (1 - p) (a reports -> b reports moves the values by
    at most a + b in total and the total by |a - b|), squares to at most 2 R^2 / (1 - p)^2.
    """
    scale = config.max_reports / (1.0 - config.flip_probability)
    return Sensitivities(l0=config.trigger_data_cardinality + 1, linf=scale, l1=2 * scale,
                         l2=math.sqrt(2) * scale)


def _estimates_schema(group_by: Sequence[str]) -> pa.Schema:
    return pa.schema([(g, pa.string()) for g in group_by]
                     + [("trigger_data", pa.int64()), ("sources", pa.int64()),
                        ("estimate", pa.float64()), ("variance", pa.float64()),
                        *[(c, pa.float64()) for c in error_columns.names("estimate")]])


def with_intervals(table: pa.Table, max_reports: int) -> pa.Table:
    """The debiased estimates with their approximate 95% interval before ``estimate_std``
    (:data:`APPROXIMATE_INTERVAL`): estimate -/+ 1.96 estimate_std, clipped to [0, R sources],
    the range of a group's reported conversions."""
    import numpy as np

    low_name, high_name, std_name = error_columns.names("estimate")
    estimate = table.column("estimate").to_numpy(zero_copy_only=False)
    bound = table.column("sources").to_numpy(zero_copy_only=False).astype(np.float64) * max_reports
    low, high = error_columns.plug_in_interval(
        estimate, table.column(std_name).to_numpy(zero_copy_only=False), low=0.0, high=bound)
    at = table.column_names.index(std_name)
    table = table.add_column(at, low_name, pa.array(low, pa.float64()))
    return table.add_column(at + 1, high_name, pa.array(high, pa.float64()))


def _reports_schema() -> pa.Schema:
    return pa.schema([("source_id", pa.string()), ("window", pa.int64()),
                      ("trigger_data", pa.int64())])


class _Columns(beam.DoFn):
    """Input tables as the event-level transforms read them: ``numeric`` columns as float64 (CSV
    text that does not parse becomes null, and the row is dropped and counted downstream), the
    release layer's null-typed absent optional columns removed, ``text`` columns (public group
    values) as strings."""

    def __init__(self, numeric: Sequence[str] = (), text: Sequence[str] = ()):
        self._numeric, self._text = tuple(numeric), tuple(text)

    def process(self, table: pa.Table):
        for name in self._numeric + self._text:
            if name not in table.column_names:
                continue
            column = table.column(name)
            index = table.column_names.index(name)
            if name in self._numeric and pa.types.is_null(column.type):
                table = table.drop_columns([name])
            elif name in self._text:
                table = table.set_column(index, name, pc.cast(column, pa.string()))
            elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                table = table.set_column(index, name, _parse_numbers(column))
        yield table


def _parse_numbers(column) -> pa.Array:
    try:
        return pc.cast(column, pa.float64())
    except pa.ArrowInvalid:
        out = []
        for value in column.to_pylist():
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = None
            out.append(number if number is not None and math.isfinite(number) else None)
        return pa.array(out, pa.float64())


@dataclass(frozen=True, kw_only=True)
class EventLevelPrepared(Prepared):
    """The browser's event-level configuration and the optional value/delay mapping."""

    config: EventLevelConfig
    mapping: Optional[TriggerMapping]


class EventLevelReportsJob(Job):
    name = NAME
    request_type = EventLevelReportsRequest
    description = __doc__.split("\n\n")[0]
    counter_namespaces = (NAMESPACE,)

    def prepare(self, request) -> EventLevelPrepared:
        try:
            check_segment(request.batch_id, "--batch_id")
        except ValueError as err:
            raise ReleaseRefused(str(err))
        config = event_config(request)
        mapping = trigger_mapping(request, config)
        if len(set(request.group_by)) != len(request.group_by):
            raise ReleaseRefused("--group_by names a column twice")
        for column in request.group_by:
            if column in _RESERVED:
                raise ReleaseRefused(f"--group_by: {column!r} is a column of the released "
                                     "estimates; rename it in --sources")
        return EventLevelPrepared(request=request, config=config, mapping=mapping)

    def inputs(self, prepared: EventLevelPrepared):
        request = prepared.request
        cells = ({"value": "number", "delay": "number"} if prepared.mapping is not None
                 else {"trigger_data": "number", "window": "number"})
        return [InputSpec(name="sources", paths=request.sources, flag="--sources",
                          columns={"source_id": "id", **{g: "any" for g in request.group_by}}),
                InputSpec(name="conversions", paths=request.conversions, flag="--conversions",
                          columns={"source_id": "id", **cells}, optional={"order": "number"})]

    def dropped_rows(self, prepared, counters):
        """Eligible: rows read. Dropped: rows the event-level transforms drop for a fault of
        their own (null ids, trigger data or windows outside the configuration, conversions of
        unregistered sources); triggers beyond R are the mechanism, not a fault."""
        from pipelines.release.counters import dropped_share

        prefix = f"{NAMESPACE}."
        faults = {"sources": {}, "conversions": {}}
        for name, value in counters.items():
            if not value or not name.startswith(prefix) or "_dropped_" not in name:
                continue
            short = name[len(prefix):]
            target = "conversions" if short.startswith("conversion_rows") else \
                "sources" if short.startswith("source_rows") else None
            if target:
                faults[target][name] = value
        out = {}
        for name, share in dropped_share(counters).items():
            extra = faults.get(name, {})
            dropped = share["dropped"] + sum(extra.values())
            out[name] = {"eligible": share["eligible"], "dropped": dropped,
                         "share": dropped / share["eligible"] if share["eligible"] > 0 else 0.0,
                         "reasons": {**share["reasons"], **extra}}
        return out

    def plan(self, prepared: EventLevelPrepared):
        request, config, mapping = prepared.request, prepared.config, prepared.mapping
        sensitivities = estimate_sensitivities(config)
        measure = Measure(
            name="event_level_reports", mechanism="k_ary_randomized_response",
            epsilon=request.epsilon,
            neighbouring="one source's conversions added, removed or replaced (the registered "
                         "sources are public; epsilon per source)",
            sensitivities=sensitivities,
            description=f"the browser's randomized response over k = {config.states} output "
                        f"states, flip probability {config.flip_probability:.6g}; estimates are "
                        "post-processing (sensitivities: of the estimates, draws fixed)")
        return [PlannedRelease(
            release_id=f"{NAME}/{request.batch_id}", measures=[measure],
            scopes=[Scope(name=f"ara-event:{request.batch_id}",
                          budget=PrivacyBudget(epsilon=MAX_EVENT_LEVEL_EPSILON),
                          description="one batch of sources (randomized once; epsilon <= 14)")],
            outputs=[OutputSpec(name=REPORTS, sort_by=["source_id", "window", "trigger_data"],
                                schema=_reports_schema(), noisy=["window", "trigger_data"],
                                description="one row per noisy event-level report"),
                     OutputSpec(name=ESTIMATES, sort_by=[*request.group_by, "trigger_data"],
                                schema=_estimates_schema(request.group_by),
                                noisy=["estimate", "variance", *error_columns.names("estimate")],
                                errors={"estimate": APPROXIMATE_INTERVAL},
                                description="debiased attributed conversions per group of "
                                            "registered sources and trigger-data value")],
            config={"epsilon": request.epsilon, "trigger_data_cardinality":
                    config.trigger_data_cardinality, "report_windows": config.report_windows,
                    "max_reports": config.max_reports, "group_by": list(request.group_by),
                    "value_edges": None if mapping is None else list(mapping.value_edges),
                    "window_ends": None if mapping is None else list(mapping.window_ends),
                    **({"skip_consumed": True} if request.skip_consumed else {})},
            parameters={"epsilon": request.epsilon, "states": config.states,
                        "flip_probability": config.flip_probability,
                        "trigger_data_cardinality": config.trigger_data_cardinality,
                        "report_windows": config.report_windows,
                        "max_reports": config.max_reports,
                        "estimate_sensitivity": sensitivities.to_dict()},
            guarantee_covers="every registered source's event-level reports (epsilon per "
                             "source) and the estimates derived from them")]

    def content_key(self, prepared, planned, inputs):
        from pipelines.ara.summary_reports import content_digest

        return "event-level:" + content_digest([inputs[name] for name in sorted(inputs)])

    def consumes(self, prepared: EventLevelPrepared, planned, inputs):
        """The registered sources: each randomized once, ever (see the module docstring)."""
        scanned = scan_ids(inputs["sources"], "source_id")
        return [Consumes(namespace=SOURCES, ids=scanned.ids, content=scanned.content,
                         noun="sources", label="--sources", skip=prepared.request.skip_consumed,
                         faults=scanned.faults)]

    def build(self, pipeline, prepared: EventLevelPrepared, inputs, release):
        request, config, mapping = prepared.request, prepared.config, prepared.mapping
        registered = remove_consumed(
            inputs["sources"], pipeline, release, SOURCES, "source_id", label="sources",
            counter=(NAMESPACE, "source_rows"))
        logs = remove_consumed(
            inputs["conversions"], pipeline, release, SOURCES, "source_id", label="conversions",
            counter=(NAMESPACE, "conversion_rows"), copies=False)
        sources = registered | release.label("SourceColumns") >> beam.ParDo(
            _Columns(text=request.group_by))
        conversions = logs | release.label("ConversionColumns") >> beam.ParDo(
            _Columns(numeric=("order", "trigger_data", "window", "value", "delay")))
        reports = ({"sources": sources, "conversions": conversions}
                   | release.label("SimulateEventReports") >> SimulateEventReports(
                       config, release.key, EVENT_PURPOSE, mapping=mapping))
        estimates = ({"sources": sources, "reports": reports}
                     | release.label("Debias") >> DebiasConversionCounts(config, request.group_by)
                     | release.label("Intervals") >> beam.Map(
                         with_intervals, config.max_reports).with_output_types(pa.Table))
        return {REPORTS: reports, ESTIMATES: estimates}


JOB = EventLevelReportsJob()


def run(request: EventLevelReportsRequest):
    """Simulate and debias one batch (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
