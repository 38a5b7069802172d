"""Beam PTransforms of ARA event-level reports (thin wiring over ``event_level``/``event_debias``).

    {"sources": tables, "conversions": tables} --SimulateEventReports--> report tables
    {"sources": tables, "reports": tables} --DebiasConversionCounts--> estimate tables

Inputs and outputs are PCollections of ``pyarrow.Table`` (the release layer's shape). Raw-data
faults (rows dropped and why) are counters in namespace ``ara_event_level`` (pipeline output,
:mod:`transforms.counting`), never columns.

Tables:

* sources: ``source_id`` (the registered sources: public to the ad tech that registered them;
  every one of them is randomized, with or without conversions) plus any public source columns
  used to group estimates (e.g. ``dim_0``).
* conversions: ``source_id``, optional ``order`` (trigger order within the source; ties by the
  cell) and either ``trigger_data`` and ``window`` columns or, with a ``TriggerMapping``, a
  ``value`` and a ``delay`` column from which they are derived.
* reports (released): ``source_id``, ``window``, ``trigger_data``: one row per noisy report.
* estimates (released): the group columns, ``trigger_data`` (null: all trigger data), ``sources``,
  ``estimate``, ``variance``, ``estimate_std``: one row per group of registered sources and
  trigger-data value, whatever the reports.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Sequence

import apache_beam as beam
import numpy as np

from transforms.ara.event_debias import debias_groups, variance_floor
from transforms.ara.event_level import EventLevelConfig, randomize_states
from transforms.batching import ShardedBatches
from transforms.counting import Counted, Counters, CountingDoFn

NAMESPACE = "ara_event_level"
EVENT_PURPOSE = "ara-event-level-randomized-response"



def report_schema():
    import pyarrow as pa
    return pa.schema([("source_id", pa.string()), ("window", pa.int64()),
                      ("trigger_data", pa.int64())])


@dataclasses.dataclass(frozen=True, kw_only=True)
class TriggerMapping:
    """How conversion logs become trigger data and windows (public parameters).

    value_edges: ascending value-class boundaries; class t holds values in [edge_{t-1}, edge_t)
      (T = len + 1 classes). window_ends: ascending ends of the reporting windows, in the unit of
      the ``delay`` column (e.g. days [2, 7, 30]); a conversion after the last end is not
      attributed (dropped and counted), one at delay <= end_j falls in the first such window.
    """

    value_edges: tuple[float, ...]
    window_ends: tuple[float, ...]

    def __post_init__(self):
        for name in ("value_edges", "window_ends"):
            v = np.asarray(getattr(self, name), dtype=np.float64)
            if not np.isfinite(v).all() or (np.diff(v) <= 0).any():
                raise ValueError(f"{name} must be finite and strictly ascending")
            object.__setattr__(self, name, tuple(float(x) for x in v))
        if not self.window_ends:
            raise ValueError("window_ends needs at least one window")

    def check(self, config: EventLevelConfig) -> None:
        if len(self.value_edges) + 1 != config.trigger_data_cardinality:
            raise ValueError("value_edges must give trigger_data_cardinality classes "
                             "(one edge fewer than classes)")
        if len(self.window_ends) != config.report_windows:
            raise ValueError("window_ends must give one end per report window")

    def trigger_data(self, values: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.value_edges), values, side="right")

    def window(self, delays: np.ndarray) -> np.ndarray:
        """Window index per delay; ``len(window_ends)`` for a delay after the last window."""
        return np.searchsorted(np.asarray(self.window_ends), delays, side="left")


# --------------------------------------------------------------------------------------------
# SimulateEventReports
# --------------------------------------------------------------------------------------------

class _SourceIdsFn(CountingDoFn):
    def __init__(self):
        self._counts = Counters(NAMESPACE)
        self.rows = self._counts.counter("source_rows")
        self.null = self._counts.counter("source_rows_dropped_null_id")

    def process(self, table):
        from transforms.privacy_units import canonical_unit_ids
        if "source_id" not in table.column_names:
            raise ValueError("sources input lacks column 'source_id'")
        ids = canonical_unit_ids(table.column("source_id"), "source_id")
        self.rows.inc(table.num_rows)
        self.null.inc(ids.null_count)
        for sid in ids.to_pylist():
            if sid is not None:
                yield sid, 1


def _column(table, name: str, required: bool = True):
    if name not in table.column_names:
        if required:
            raise ValueError(f"conversions input lacks column {name!r}")
        return None
    return table.column(name)


def _integral(column, n: int, fill: float = np.nan) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc
    if column is None or pa.types.is_null(column.type):
        return np.full(n, fill)  # absent (the release layer's null-typed optional column)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise ValueError("conversions columns trigger_data, window, order, value and delay must "
                         "be numeric")
    return np.asarray(pc.fill_null(column.cast(pa.float64()), np.nan))


class _TriggersFn(CountingDoFn):
    """Conversion rows -> (source id, (order, cell)); faulty rows dropped and counted."""

    def __init__(self, config: EventLevelConfig, mapping: TriggerMapping | None):
        self._counts = Counters(NAMESPACE)
        self.config, self.mapping = config, mapping
        self.rows = self._counts.counter("conversion_rows")
        self.null = self._counts.counter("conversion_rows_dropped_null_or_nonfinite")
        self.trigger_out = self._counts.counter("conversion_rows_dropped_trigger_data_outside_cardinality")
        self.window_out = self._counts.counter("conversion_rows_dropped_window_outside_report_windows")
        self.bad_id = self._counts.counter("conversion_rows_dropped_id_without_canonical_form")

    def process(self, table):
        from transforms.privacy_units import unit_ids_and_faults
        cfg, n = self.config, table.num_rows
        if n == 0:
            return
        self.rows.inc(n)
        # a source id without a canonical form is no id: the row is dropped, counted
        ids, bad = unit_ids_and_faults(_column(table, "source_id"), "source_id")
        self.bad_id.inc(int(bad.sum()))
        order = _integral(_column(table, "order", required=False), n, fill=0.0)
        if self.mapping is None:
            trigger = _integral(_column(table, "trigger_data"), n)
            window = _integral(_column(table, "window"), n)
        else:
            value = _integral(_column(table, "value"), n)
            delay = _integral(_column(table, "delay"), n)
            finite = np.isfinite(value) & np.isfinite(delay)
            trigger = np.where(finite, self.mapping.trigger_data(np.nan_to_num(value)), np.nan)
            window = np.where(finite, self.mapping.window(np.nan_to_num(delay)), np.nan)
        valid = np.asarray(ids.is_valid()) & np.isfinite(trigger) & np.isfinite(window) \
            & np.isfinite(order)
        self.null.inc(int((~valid & ~bad).sum()))
        integral = (trigger == np.floor(trigger)) & (window == np.floor(window))
        t_ok = integral & (trigger >= 0) & (trigger < cfg.trigger_data_cardinality)
        w_ok = integral & (window >= 0) & (window < cfg.report_windows)
        self.trigger_out.inc(int((valid & ~t_ok).sum()))
        self.window_out.inc(int((valid & t_ok & ~w_ok).sum()))
        rows = np.flatnonzero(valid & t_ok & w_ok)
        cells = cfg.cell(trigger[rows].astype(np.int64), window[rows].astype(np.int64))
        id_list = ids.to_pylist()
        for i, cell in zip(rows.tolist(), cells.tolist()):
            yield id_list[i], (float(order[i]), int(cell))


class FirstTriggers(beam.CombineFn):
    """A source's first ``limit`` triggers by (order, cell), and how many it had: the browser
    reports at most R per source. Memory per source is bounded by 2 x limit."""

    def __init__(self, limit: int):
        self.limit = limit

    def create_accumulator(self):
        return [], 0

    def _trim(self, items):
        items.sort()
        del items[self.limit:]

    def add_input(self, acc, item):
        items, seen = acc
        items.append(item)
        if len(items) > 2 * self.limit:
            self._trim(items)
        return items, seen + 1

    def merge_accumulators(self, accs):
        merged, seen = [], 0
        for items, n in accs:
            merged.extend(items)
            seen += n
            if len(merged) > 2 * self.limit:
                self._trim(merged)
        return merged, seen

    def extract_output(self, acc):
        items, seen = list(acc[0]), acc[1]
        self._trim(items)
        return [cell for _, cell in items], seen


class _JoinSourcesFn(CountingDoFn):
    def __init__(self):
        self._counts = Counters(NAMESPACE)
        self.duplicates = self._counts.counter("source_rows_duplicate_id")
        self.unregistered = self._counts.counter("conversion_rows_dropped_source_not_registered")
        self.over_limit = self._counts.counter("conversion_rows_not_reported_over_max_reports")

    def process(self, element):
        source_id, grouped = element
        registered = list(grouped["sources"])
        triggers = list(grouped["triggers"])
        if not registered:
            self.unregistered.inc(sum(seen for _, seen in triggers))
            return
        self.duplicates.inc(sum(registered) - 1)
        cells, seen = triggers[0] if triggers else ([], 0)
        self.over_limit.inc(seen - len(cells))
        yield source_id, cells


#: Shards of the shuffles that batch sources for randomization and groups for estimation.
RANDOMIZE_SHARDS = 256
ESTIMATE_SHARDS = 16


class _RandomizeFn(CountingDoFn):
    """A batch of (source id, true cells) -> a table of noisy reports (vectorised; each
    source's randomness comes from its own keyed lane, so batching does not matter)."""

    def __init__(self, config: EventLevelConfig, release_key, purpose: str):
        self._counts = Counters(NAMESPACE)
        self.config, self.release_key, self.purpose = config, release_key, purpose
        self.sources = self._counts.counter("sources_randomized")
        self.reports = self._counts.counter("reports_released")

    def process(self, batch):
        import pyarrow as pa
        from transforms.noise import RandomStreams
        cfg = self.config
        r = cfg.max_reports
        ids = [sid for sid, _ in batch]
        cells = np.full((len(batch), r), -1, dtype=np.int64)
        for i, (_, source_cells) in enumerate(batch):
            cells[i, :len(source_cells)] = source_cells
        true_states = cfg.encode(cells)
        streams = RandomStreams.for_keys(self.release_key, self.purpose,
                                         pa.table({"source_id": pa.array(ids, pa.string())}))
        noisy = cfg.decode(randomize_states(true_states, cfg, streams))
        rows, cols = np.nonzero(noisy >= 0)
        out_cells = noisy[rows, cols]
        self.sources.inc(len(batch))
        self.reports.inc(int(rows.size))
        yield pa.table({"source_id": pa.array([ids[i] for i in rows.tolist()], pa.string()),
                        "window": pa.array(out_cells // cfg.trigger_data_cardinality, pa.int64()),
                        "trigger_data": pa.array(out_cells % cfg.trigger_data_cardinality,
                                                 pa.int64())},
                       schema=report_schema())


class SimulateEventReports(beam.PTransform):
    """The browser's event-level reports, simulated from conversion logs.

    Every registered source (``sources`` table) gets its true output -- its first R triggers'
    (window, trigger data) cells, by trigger order -- randomized by k-ary randomized response
    (``event_level``; epsilon-DP per source) with its own keyed stream under ``release_key`` and
    ``purpose``: seeded only through a testing key. Applying the transform twice with one key
    and purpose is refused (``ReleaseKey.claim``).

    Row rules (counted, never released): conversions with a null or uncanonicalisable source id
    fail the job naming ``source_id`` if the column's type has no ids, else null ids are dropped;
    trigger data outside [0, T) or a window outside [0, w) (or a delay after the last window)
    drop the conversion; conversions of a source not in ``sources`` are dropped; a source's
    triggers beyond R are not reported (as in the browser).
    """

    def __init__(self, config: EventLevelConfig, release_key, purpose: str = EVENT_PURPOSE,
                 mapping: TriggerMapping | None = None, batch_size: int = 4096):
        super().__init__()
        if mapping is not None:
            mapping.check(config)
        self.config, self.release_key, self.purpose = config, release_key, purpose
        self.mapping, self.batch_size = mapping, batch_size

    def expand(self, inputs):
        self.release_key.claim(self.purpose, owner=type(self).__name__)
        sources = (inputs["sources"]
                   | "SourceIds" >> Counted(_SourceIdsFn())
                   | "Registered" >> beam.CombinePerKey(sum))
        triggers = (inputs["conversions"]
                    | "Triggers" >> Counted(_TriggersFn(self.config, self.mapping))
                    | "FirstTriggers" >> beam.CombinePerKey(FirstTriggers(self.config.max_reports)))
        return ({"sources": sources, "triggers": triggers}
                | "BySource" >> beam.CoGroupByKey()
                | "Join" >> Counted(_JoinSourcesFn())
                # Not BatchElements (its finish_bundle batch is lost on some runners:
                # transforms.batching): each source's
                # randomness is its own keyed lane, so batching never changes a report.
                | "Batch" >> ShardedBatches(operator.itemgetter(0), shards=RANDOMIZE_SHARDS,
                                            batch_size=self.batch_size)
                | "Randomize" >> Counted(_RandomizeFn(self.config, self.release_key,
                                                      self.purpose)))


# --------------------------------------------------------------------------------------------
# DebiasConversionCounts
# --------------------------------------------------------------------------------------------

class _SourceGroupsFn(CountingDoFn):
    def __init__(self, group_by: Sequence[str]):
        self._counts = Counters(NAMESPACE)
        self.group_by = tuple(group_by)
        self.null = self._counts.counter("estimate_source_rows_dropped_null_id_or_group")

    def process(self, table):
        from transforms.privacy_units import canonical_unit_ids
        for col in ("source_id",) + self.group_by:
            if col not in table.column_names:
                raise ValueError(f"sources input lacks column {col!r}")
        ids = canonical_unit_ids(table.column("source_id"), "source_id").to_pylist()
        groups = list(zip(*[table.column(c).to_pylist() for c in self.group_by])) \
            if self.group_by else [()] * table.num_rows
        for sid, group in zip(ids, groups):
            if sid is None or any(g is None for g in group):
                self.null.inc()
                continue
            yield sid, group


class _ReportCellsFn(beam.DoFn):
    def __init__(self, config: EventLevelConfig):
        self.config = config

    def process(self, table):
        from transforms.privacy_units import canonical_unit_ids
        ids = canonical_unit_ids(table.column("source_id"), "source_id").to_pylist()
        trigger = table.column("trigger_data").to_pylist()
        for sid, t in zip(ids, trigger):
            yield sid, int(t)


class _PerSourceCountsFn(CountingDoFn):
    """(group, vector [1, M_0..M_{T-1}, M_all, M_0^2..M_{T-1}^2, M_all^2]) per source."""

    def __init__(self, config: EventLevelConfig):
        self._counts = Counters(NAMESPACE)
        self.config = config
        self.orphans = self._counts.counter("reports_dropped_source_not_registered")
        self.bad = self._counts.counter("reports_dropped_trigger_data_outside_cardinality")
        self.duplicates = self._counts.counter("estimate_source_rows_duplicate_id")

    def process(self, element):
        _, grouped = element
        groups = sorted(set(grouped["group"]))
        reports = list(grouped["reports"])
        if not groups:
            self.orphans.inc(len(reports))
            return
        self.duplicates.inc(len(list(grouped["group"])) - 1)
        t_card = self.config.trigger_data_cardinality
        m = np.zeros(t_card + 1)
        for t in reports:
            if 0 <= t < t_card:
                m[t] += 1
                m[t_card] += 1
            else:
                self.bad.inc()
        yield groups[0], np.concatenate([[1.0], m, m * m])


class _VectorSum(beam.CombineFn):
    def create_accumulator(self):
        return None

    def add_input(self, acc, vec):
        return vec.copy() if acc is None else acc + vec

    def merge_accumulators(self, accs):
        out = None
        for a in accs:
            if a is not None:
                out = a.copy() if out is None else out + a
        return out

    def extract_output(self, acc):
        return acc


class _EstimatesFn(beam.DoFn):
    def __init__(self, config: EventLevelConfig, group_by: Sequence[str]):
        self.config, self.group_by = config, tuple(group_by)

    def process(self, batch):
        import pyarrow as pa
        cfg = self.config
        t_card, windows = cfg.trigger_data_cardinality, cfg.report_windows
        columns = {c: [] for c in self.group_by}
        trigger, sources, estimate, variance = [], [], [], []
        for group, vec in batch:
            n, m, m2 = vec[0], vec[1:t_card + 2], vec[t_card + 2:]
            for t in range(t_card + 1):
                cells = windows if t < t_card else cfg.cells
                est, var = debias_groups(np.array([n]), m[t:t + 1], m2[t:t + 1], cfg, cells)
                for c, g in zip(self.group_by, group):
                    columns[c].append(g)
                trigger.append(t if t < t_card else None)
                sources.append(int(n))
                estimate.append(float(est[0]))
                variance.append(float(var[0]))
        # the least variance a group of its size can have (public: event_debias.variance_floor),
        # once per batch for each cell set (one trigger-data value's windows, or all cells)
        n = np.array(sources, dtype=np.float64)
        every = np.array([t is None for t in trigger], dtype=bool)
        floor = np.where(every, variance_floor(n, cfg, cfg.cells), variance_floor(n, cfg, windows))
        columns.update({"trigger_data": pa.array(trigger, pa.int64()),
                        "sources": pa.array(sources, pa.int64()),
                        "estimate": pa.array(estimate, pa.float64()),
                        "variance": pa.array(variance, pa.float64()),
                        # the unbiased estimate clamped at that floor
                        "estimate_std": pa.array(np.sqrt(np.maximum(variance, floor)),
                                                 pa.float64())})
        yield pa.table(columns)


class DebiasConversionCounts(beam.PTransform):
    """Debiased conversion counts per group of registered sources and trigger-data value.

    Post-processing of released reports (``event_debias``): no key, no privacy cost. The groups
    are those of the ``sources`` table (public), so every group and trigger-data value gets a row
    whether or not it has reports. Reports of sources not in ``sources`` are dropped and counted.
    """

    def __init__(self, config: EventLevelConfig, group_by: Sequence[str] = (),
                 batch_size: int = 1024):
        super().__init__()
        self.config, self.group_by, self.batch_size = config, tuple(group_by), batch_size

    def expand(self, inputs):
        groups = inputs["sources"] | "SourceGroups" >> Counted(_SourceGroupsFn(self.group_by))
        reports = inputs["reports"] | "ReportCells" >> beam.ParDo(_ReportCellsFn(self.config))
        return ({"group": groups, "reports": reports}
                | "BySource" >> beam.CoGroupByKey()
                | "PerSource" >> Counted(_PerSourceCountsFn(self.config))
                | "PerGroup" >> beam.CombinePerKey(_VectorSum())
                | "Batch" >> ShardedBatches(operator.itemgetter(0), shards=ESTIMATE_SHARDS,
                                            batch_size=self.batch_size)
                | "Estimates" >> beam.ParDo(_EstimatesFn(self.config, self.group_by)))
