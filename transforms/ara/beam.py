"""Beam PTransforms of the ARA summary-report pipeline (thin wiring over the pure modules).

Bucket keys travel through Beam as 16-byte big-endian ``bytes`` (deterministic BytesCoder;
Python ints wider than 64 bits do not fit Beam's integer coder).

    conversions (pyarrow RecordBatches) --EncodeConversions (A)--> AggregatableReport
    JSON lines --ParseReports--> AggregatableReport
    AggregatableReport --BoundSourceContributions (C)--> (bucket, value)
    {"contributions", "domain"} --SummaryReport (S)--> (bucket, noisy sum)
    (bucket, noisy sum) --Reconstruct (R)--> (bucket, noisy sum, estimate)
"""
from __future__ import annotations

import dataclasses
import operator

import numpy as np
import apache_beam as beam

from transforms.ara.contribution import (CONTRIBUTION_BUDGET, ContributionConfig,
                                         bound_contributions)
from transforms.ara.reports import FAULTS, AggregatableReport, ReportFault, parse_report
from transforms.batching import ShardedBatches
from transforms.counting import MAIN, Counted, Counters, CountingDoFn
from transforms.ara.summary import (add_summary_noise, bucket_streams, check_summary_epsilon,
                                    key_bytes)

NAMESPACE = "ara"
ROUNDING_PURPOSE = "ara-randomized-rounding"
SUMMARY_PURPOSE = "ara-summary-report"


def batch_purpose(purpose: str, batch_id: str | None) -> str:
    """Random-stream purpose of one batch: a release key reused for another batch id still
    gives independent rounding and noise (never the same noise on different data)."""
    return purpose if batch_id is None else f"{purpose}/batch={batch_id}"



# --------------------------------------------------------------------------------------------
# Input: conversions
# --------------------------------------------------------------------------------------------

def conversion_columns(config: ContributionConfig, has_count_column: bool = True) -> list[str]:
    """Columns a conversions file must have: source_id, dim_0.., and the measures (a missing
    ``count`` column means one conversion per row); ``order`` is optional."""
    cols = ["source_id"] + [f"dim_{d}" for d in range(len(config.slice_dimensions))]
    cols += [m for m in config.measures if m != "count" or has_count_column]
    return cols


def check_conversion_schema(schema, config: ContributionConfig) -> None:
    """Raise ValueError naming the first required column the input lacks or whose type is not
    numeric (``order`` must be an integer column). ``schema``: a pyarrow Schema."""
    import pyarrow.types as pat
    names = set(schema.names)
    for col in conversion_columns(config, has_count_column="count" in names):
        if col not in names:
            raise ValueError(f"conversions input lacks column {col!r} (has {sorted(names)})")
    from transforms.privacy_units import check_unit_type
    check_unit_type(schema.field("source_id").type, "source_id")
    numeric = [c for c in conversion_columns(config, "count" in names) if c != "source_id"]
    for col in numeric:
        t = schema.field(col).type
        if not (pat.is_integer(t) or pat.is_floating(t) or pat.is_null(t)):
            raise ValueError(f"conversions column {col!r} must be numeric, got {t}")
    if "order" in names and not (pat.is_integer(schema.field("order").type)
                                 or pat.is_null(schema.field("order").type)):
        raise ValueError(f"conversions column 'order' must be integer, got "
                         f"{schema.field('order').type}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConversionRows:
    """A batch of conversion rows after algorithm A's row rules (``conversion_rows``): the
    valid rows and what the rules dropped. Shared by the pipeline and the release layer's
    preflight (which reads what a batch consumes before the charge)."""

    n: int
    null_rows: int
    range_rows: int
    missing_report_id: int
    bad_id_rows: int
    rows: np.ndarray                  # indices of the valid rows
    sources: list                     # canonical source ids of the valid rows
    report_ids: list | None           # canonical report ids (None: the batch has no column)
    order: np.ndarray
    values: np.ndarray                # (rows, measures), before clipping
    features: np.ndarray              # (rows, dimensions)
    padding_counts_not_one: int


def conversion_rows(batch, cfg: ContributionConfig,
                    require_report_id: bool = False) -> ConversionRows:
    """Algorithm A's row rules on a pyarrow RecordBatch/Table of conversions (numeric columns):
    canonical source (and report) ids, null/non-finite and out-of-range rows dropped; with
    ``require_report_id`` a row without a report id is dropped too. A source or report id
    without a canonical form (``"1e999"``) drops its row, counted (``bad_id_rows``): one row
    never refuses or fails a batch."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from transforms.privacy_units import unit_ids_and_faults
    n = batch.num_rows
    check_conversion_schema(batch.schema, cfg)
    names = batch.schema.names

    def column(name):
        return batch.column(names.index(name))

    # One canonical form before any grouping or hashing: 7, 7.0 and "7" are one source.
    source_ids, bad_id = unit_ids_and_faults(column("source_id"), "source_id")
    valid = np.asarray(pc.is_valid(source_ids), dtype=bool)
    report_ids = None
    if "report_id" in names and not pa.types.is_null(column("report_id").type):
        report_ids, bad_report = unit_ids_and_faults(column("report_id"), "report_id")
        bad_id = bad_id | bad_report
    valid &= ~bad_id
    missing = np.zeros(n, dtype=bool)
    if require_report_id:
        missing = ~np.asarray(pc.is_valid(report_ids), dtype=bool) if report_ids is not None \
            else np.ones(n, dtype=bool)
    dims = []
    for d in range(len(cfg.slice_dimensions)):
        col = column(f"dim_{d}")
        valid &= np.asarray(pc.is_valid(col), dtype=bool)
        dims.append(np.asarray(pc.fill_null(col.cast(pa.float64()), -1.0)))
    values = []
    for m in cfg.measures:
        if m == "count" and "count" not in names:
            values.append(np.ones(n))
            continue
        v = np.asarray(pc.fill_null(column(m).cast(pa.float64()), np.nan))
        valid &= np.isfinite(v)
        values.append(v)
    bad_id_rows = int(bad_id.sum())
    null_rows = int((~valid & ~bad_id).sum())
    features = np.stack(dims, axis=1) if dims else np.zeros((n, 0))
    integral = (features == np.floor(features)).all(axis=1)
    in_range = valid & integral & cfg.valid_feature_rows(features)
    range_rows = int((valid & ~in_range).sum())
    missing_rows = int((in_range & missing).sum())
    rows = np.flatnonzero(in_range & ~missing)
    values = np.stack(values, axis=1)[rows] if values else np.zeros((rows.size, 0))
    if "order" in names:
        order = np.asarray(pc.fill_null(column("order").cast(pa.int64()), 0))[rows]
    else:
        order = np.zeros(rows.size, dtype=np.int64)
    take = pa.array(rows, pa.int64())
    pad = cfg.padding_measure
    not_one = int((values[:, pad] != 1).sum()) if pad is not None and "count" in names else 0
    return ConversionRows(
        n=n, null_rows=null_rows, range_rows=range_rows, missing_report_id=missing_rows,
        bad_id_rows=bad_id_rows,
        rows=rows, sources=source_ids.take(take).to_pylist(),
        report_ids=None if report_ids is None else report_ids.take(take).to_pylist(),
        order=order, values=values, features=features[rows], padding_counts_not_one=not_one)


def max_report_totals(cfg: ContributionConfig, values: np.ndarray) -> np.ndarray:
    """Per conversion row, the largest L1 total algorithm A's randomized rounding can give it
    (every rounding up; exact with the ``padding`` encoding): what a source may spend on it."""
    n = values.shape[0]
    top = np.full((n, len(cfg.prefixes), len(cfg.columns)), np.nextafter(1.0, 0.0))
    return cfg.contributions(values, top).sum(axis=(1, 2)).astype(np.int64)


class _EncodeConversionsFn(CountingDoFn):
    def __init__(self, config: ContributionConfig, release_key, purpose: str,
                 require_report_id: bool = False):
        self._counts = Counters(NAMESPACE)
        self.config = config
        self.release_key = release_key
        self.purpose = purpose
        self.require_report_id = require_report_id
        self.rows = self._counts.counter("conversion_rows")
        self.null_rows = self._counts.counter("conversion_rows_dropped_null_or_nonfinite")
        self.range_rows = self._counts.counter("conversion_rows_dropped_feature_out_of_range")
        self.missing_ids = self._counts.counter("conversion_rows_dropped_missing_report_id")
        self.bad_ids = self._counts.counter("conversion_rows_dropped_id_without_canonical_form")
        self.negative = self._counts.counter("conversion_values_negative_clipped_to_zero")
        self.reports = self._counts.counter("reports_encoded")
        self.count_not_one = self._counts.counter("conversion_rows_count_not_one_counted_once_by_padding")

    def process(self, batch):
        from transforms.noise import RandomStreams
        cfg = self.config
        if batch.num_rows == 0:
            return
        self.rows.inc(batch.num_rows)
        prepared = conversion_rows(batch, cfg, self.require_report_id)
        self.null_rows.inc(prepared.null_rows)
        self.range_rows.inc(prepared.range_rows)
        self.missing_ids.inc(prepared.missing_report_id)
        self.bad_ids.inc(prepared.bad_id_rows)
        n_rows = prepared.rows.size
        if n_rows == 0:
            return
        values, sources, order = prepared.values, prepared.sources, prepared.order
        report_ids = prepared.report_ids or [None] * n_rows
        self.negative.inc(int((values < 0).sum()))
        codes = cfg.slice_codes(prepared.features.astype(np.int64))
        q = cfg.n_queries
        # One keyed uniform per (report, level, bucket column): rounding does not depend on
        # batching.
        lanes = [(s, int(o), j) for s, o in zip(sources, order.tolist()) for j in range(q)]
        uniforms = RandomStreams.for_keys(self.release_key, self.purpose, lanes).uniform_float()
        self.count_not_one.inc(prepared.padding_counts_not_one)
        columns = cfg.columns
        contrib = cfg.contributions(values, uniforms.reshape(
            (n_rows, len(cfg.prefixes), len(columns))))
        column_bits = [c << 96 for c in columns]
        for i in range(n_rows):
            items = []
            for l, p in enumerate(cfg.prefixes):
                base = (p << 64) | int(codes[i, l])
                for j, bits in enumerate(column_bits):
                    v = int(contrib[i, l, j])
                    if v:
                        items.append((bits | base, v))
            self.reports.inc()
            yield AggregatableReport(source_id=sources[i], order=int(order[i]),
                                     contributions=tuple(items), report_id=report_ids[i])


class EncodeConversions(beam.PTransform):
    """Algorithm A over RecordBatches of conversions: one AggregatableReport per valid row.

    Randomized rounding uses the keyed stream of lane (source_id, order, query index) under the
    release key and ``purpose``, so re-runs with the same key reproduce and batching does not
    matter.
    Source ids are canonicalised first (``transforms.privacy_units``: ``7``, ``7.0`` and ``"7"``
    are one source); a source_id column that cannot be canonicalised fails the job naming it.
    Row faults (documented rule): rows with a null source/feature/measure, a NaN or infinite
    measure, or a fractional feature or one outside its declared dimension, are dropped and
    counted; negative measures are clipped to 0 by algorithm A and counted. A ``report_id``
    column, if any, is carried into the reports (canonicalised); with ``require_report_id`` a
    row without one is dropped and counted.
    """

    def __init__(self, config: ContributionConfig, release_key, purpose: str = ROUNDING_PURPOSE,
                 require_report_id: bool = False):
        super().__init__()
        self.config, self.release_key, self.purpose = config, release_key, purpose
        self.require_report_id = require_report_id

    def expand(self, batches):
        # One application per key and purpose: applied again (other input) the same lanes would
        # round the same way, and the difference of two outputs would carry no rounding noise.
        self.release_key.claim(self.purpose, owner=type(self).__name__)
        return batches | "Encode" >> Counted(
            _EncodeConversionsFn(self.config, self.release_key, self.purpose,
                                 self.require_report_id))


# --------------------------------------------------------------------------------------------
# Input: JSON aggregatable reports
# --------------------------------------------------------------------------------------------

class _ParseReportsFn(CountingDoFn):
    def __init__(self, require_report_id: bool = False):
        self._counts = Counters(NAMESPACE)
        self.require_report_id = require_report_id
        self.faults = {reason: self._counts.counter(f"reports_dropped_{reason}") for reason in FAULTS}
        self.parsed = self._counts.counter("reports_parsed")

    def process(self, line):
        if not line.strip():
            return
        try:
            report = parse_report(line, require_report_id=self.require_report_id)
        except ReportFault as fault:
            self.faults[fault.reason].inc()
            return
        self.parsed.inc()
        yield report


class ParseReports(beam.PTransform):
    """JSON lines -> AggregatableReport; faulty reports are dropped whole and counted by reason
    (see ``transforms.ara.reports``; ``require_report_id``: a report without one is a fault)."""

    def __init__(self, require_report_id: bool = False):
        super().__init__()
        self.require_report_id = require_report_id

    def expand(self, lines):
        return lines | "Parse" >> Counted(_ParseReportsFn(self.require_report_id))


class _RemoveReportsFn(CountingDoFn):
    def __init__(self):
        self._counts = Counters(NAMESPACE)
        self.removed = self._counts.counter("reports_removed_already_consumed")
        self.repeated = self._counts.counter("reports_removed_conflicting_copies_in_batch")

    def process(self, report, removed):
        held, repeated, identical = removed
        if report.report_id is not None and report.report_id in repeated:
            self.repeated.inc()
            return
        if report.report_id is not None and report.report_id in held:
            self.removed.inc()
            return
        if report.report_id is not None and report.report_id in identical:
            yield beam.pvalue.TaggedOutput(_COPIES, (report.report_id, report))
            return
        yield report


_COPIES = "copies"


class _OneReport(beam.CombineFn):
    """The copies of one report id whose copies are identical (their digests, before the
    charge): one report held (bounded memory) -- the first in time and content order, so the
    choice never depends on arrival -- and how many there were."""

    def create_accumulator(self):
        return (None, 0)

    def add_input(self, acc, report):
        return self.merge_accumulators([acc, (report, 1)])

    def merge_accumulators(self, accs):
        kept, copies = None, 0
        for report, n in accs:
            copies += n
            if report is not None and (kept is None or report.sort_key() < kept.sort_key()):
                kept = report
        return (kept, copies)

    def extract_output(self, acc):
        return acc


class _KeptReportFn(CountingDoFn):
    def __init__(self):
        self._counts = Counters(NAMESPACE)
        self.identical = self._counts.counter("reports_dropped_identical_copies_in_batch")

    def process(self, item):
        _, (report, copies) = item
        self.identical.inc(copies - 1)
        yield report


class RemoveReports(beam.PTransform):
    """Drop the reports whose report id is in ``removed`` or ``repeated`` and keep one of each
    id in ``identical`` (PCollections of canonical ids): ids an earlier batch consumed, when the
    operator chose to remove them (``--skip_consumed``), counted as
    ``reports_removed_already_consumed``; ids whose copies within this batch conflict (every
    copy), counted as ``reports_removed_conflicting_copies_in_batch``; ids whose copies are
    identical (one kept: a combine per id that holds one report), the others counted as
    ``reports_dropped_identical_copies_in_batch`` (rule 1 of
    :mod:`pipelines.release.consumption`: stable under add/remove). Operator only; not row
    faults: the reports are valid, only already (or ambiguously) aggregated."""

    def __init__(self, removed, repeated, identical=None):
        super().__init__()
        self.removed, self.repeated, self.identical = removed, repeated, identical

    def expand(self, reports):
        held = self.removed | "AsSet" >> beam.combiners.ToSet()
        repeated = self.repeated | "RepeatedAsSet" >> beam.combiners.ToSet()
        sets = (held | "Both" >> beam.Map(lambda h, r: (h, r), beam.pvalue.AsSingleton(repeated)))
        if self.identical is None:
            sets = sets | "NoIdentical" >> beam.Map(lambda hr: (*hr, frozenset()))
            return reports | "Remove" >> Counted(_RemoveReportsFn(), beam.pvalue.AsSingleton(sets))
        identical = self.identical | "IdenticalAsSet" >> beam.combiners.ToSet()
        sets = sets | "All" >> beam.Map(lambda hr, i: (*hr, i), beam.pvalue.AsSingleton(identical))
        out = reports | "Remove" >> Counted(_RemoveReportsFn(), beam.pvalue.AsSingleton(sets),
                                            tagged=(_COPIES,))
        kept = (out[_COPIES]
                | "OneCopy" >> beam.CombinePerKey(_OneReport())
                | "KeptCopies" >> Counted(_KeptReportFn()))
        return (out[MAIN], kept) | "WithKeptCopies" >> beam.Flatten()


# --------------------------------------------------------------------------------------------
# Algorithm C
# --------------------------------------------------------------------------------------------

class FirstReportsPerSource(beam.CombineFn):
    """Keeps a source's first ``limit`` reports (by time order, then content) and a count of all.

    Memory per source is bounded by 2 x limit reports whatever the input size.
    """

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("max_reports_per_source must be positive")
        self.limit = limit

    def _trim(self, reports):
        reports.sort(key=AggregatableReport.sort_key)
        del reports[self.limit:]

    def create_accumulator(self):
        return [], 0

    def add_input(self, acc, report):
        reports, seen = acc
        reports.append(report)
        if len(reports) > 2 * self.limit:
            self._trim(reports)
        return reports, seen + 1

    def merge_accumulators(self, accs):
        merged, seen = [], 0
        for reports, n in accs:
            merged.extend(reports)
            seen += n
            if len(merged) > 2 * self.limit:
                self._trim(merged)
        return merged, seen

    def extract_output(self, acc):
        reports, seen = acc
        reports = list(reports)
        self._trim(reports)
        return reports, seen


class _ApplyBudgetFn(CountingDoFn):
    def __init__(self, budget: int):
        self._counts = Counters(NAMESPACE)
        self.budget = budget
        self.kept = self._counts.counter("reports_kept")
        self.over_budget = self._counts.counter("reports_dropped_source_budget_exhausted")
        self.over_limit = self._counts.counter("reports_dropped_over_max_reports_per_source")

    def process(self, element, grants=None):
        source, (reports, seen) = element
        self.over_limit.inc(seen - len(reports))
        totals = np.array([r.total for r in reports], dtype=np.int64)
        budget = self.budget if not grants else min(self.budget, grants.get(source, self.budget))
        keep = bound_contributions(np.zeros(len(reports), dtype=np.int64), totals,
                                   budget=budget)
        self.kept.inc(int(keep.sum()))
        self.over_budget.inc(int((~keep).sum()))
        for report, k in zip(reports, keep):
            if k:
                for key, value in report.contributions:
                    yield key_bytes(key), value


class BoundSourceContributions(beam.PTransform):
    """Algorithm C: per source, keep reports in order while they fit in the 65,536 L1 budget.

    Reports beyond ``max_reports_per_source`` (by order) are dropped before bounding (counted),
    which can only lower a source's contribution. ``grants``: optional PCollection of
    (source id, budget left): a source that spent part of its budget in earlier batches is
    bounded by what is left (the browser's budget holds across all of a source's reports).
    Output: (16-byte bucket key, value).
    """

    def __init__(self, max_reports_per_source: int = 1024, budget: int = CONTRIBUTION_BUDGET,
                 grants=None):
        super().__init__()
        self.limit, self.budget, self.grants = max_reports_per_source, budget, grants

    def expand(self, reports):
        grouped = (reports
                   | "BySource" >> beam.Map(lambda r: (r.source_id, r))
                   | "FirstReports" >> beam.CombinePerKey(FirstReportsPerSource(self.limit)))
        if self.grants is None:
            return grouped | "Budget" >> Counted(_ApplyBudgetFn(self.budget))
        return grouped | "Budget" >> Counted(_ApplyBudgetFn(self.budget),
                                             beam.pvalue.AsDict(self.grants))


# --------------------------------------------------------------------------------------------
# Algorithm S and R
# --------------------------------------------------------------------------------------------

class _SumAndCount(beam.CombineFn):
    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, value):
        return acc[0] + value, acc[1] + 1

    def merge_accumulators(self, accs):
        total = count = 0
        for s, c in accs:
            total += s
            count += c
        return total, count

    def extract_output(self, acc):
        return acc


class _RestrictToDomainFn(CountingDoFn):
    def __init__(self):
        self._counts = Counters(NAMESPACE)
        self.unknown_keys = self._counts.counter("unknown_bucket_keys_dropped")
        self.unknown_contributions = self._counts.counter("unknown_bucket_contributions_dropped")
        self.empty = self._counts.counter("declared_buckets_without_contributions")

    def process(self, element):
        key, grouped = element
        declared = list(grouped["domain"])
        sums = list(grouped["sums"])
        if not declared:
            self.unknown_keys.inc()
            self.unknown_contributions.inc(sum(c for _, c in sums))
            return
        if not sums:
            self.empty.inc()
        yield key, sum(s for s, _ in sums)


NOISE_SHARDS = 1024  # buckets are noised in batches of at most NOISE_BATCH from a shard
NOISE_BATCH = 4096


class _AddNoiseFn(beam.DoFn):
    def __init__(self, epsilon: float, release_key, purpose: str):
        self.epsilon, self.release_key, self.purpose = epsilon, release_key, purpose

    def process(self, batch):
        keys = [int.from_bytes(k, "big") for k, _ in batch]
        sums = np.array([s for _, s in batch], dtype=np.int64)
        noisy = add_summary_noise(sums, self.epsilon,
                                  bucket_streams(self.release_key, keys, self.purpose))
        for (k, _), v in zip(batch, noisy.tolist()):
            yield k, v


class SummaryReport(beam.PTransform):
    """Algorithm S on ``{"contributions": (key bytes, int), "domain": key bytes}``.

    Sums per key (combined before the shuffle), keeps exactly the declared keys (a declared key
    without contributions gets sum 0; undeclared keys are dropped and counted) and adds discrete
    Laplace noise of scale 65,536 / epsilon from the bucket's keyed stream. Output:
    (16-byte key, noisy sum). Sensitivity 65,536 holds because the input went through
    ``BoundSourceContributions``.
    """

    def __init__(self, epsilon: float, release_key, purpose: str = SUMMARY_PURPOSE):
        super().__init__()
        self.epsilon = check_summary_epsilon(epsilon)
        self.release_key, self.purpose = release_key, purpose

    def expand(self, inputs):
        # Same key and purpose on other input would repeat every bucket's noise: refused.
        self.release_key.claim(self.purpose, owner=type(self).__name__)
        sums = inputs["contributions"] | "SumPerBucket" >> beam.CombinePerKey(_SumAndCount())
        domain = inputs["domain"] | "Declared" >> beam.Map(lambda k: (k, True))
        return ({"sums": sums, "domain": domain}
                | "JoinDomain" >> beam.CoGroupByKey()
                | "Restrict" >> Counted(_RestrictToDomainFn())
                # Batches for vectorised noise from a shuffle on a key-derived shard, not from
                # BatchElements (its last batch comes from finish_bundle, which some runners
                # drop: transforms.batching). Noise is keyed per bucket, so batching never
                # changes it.
                | "Batch" >> ShardedBatches(operator.itemgetter(0), shards=NOISE_SHARDS,
                                            batch_size=NOISE_BATCH)
                | "Noise" >> beam.ParDo(_AddNoiseFn(self.epsilon, self.release_key, self.purpose)))


def _reconstruct_slice(element, config: ContributionConfig):
    _, rows = element
    rows = sorted(rows)
    estimates = config.reconstruct_estimates([int.from_bytes(k, "big") for k, _ in rows],
                                             [v for _, v in rows])
    for (key, noisy), estimate in zip(rows, estimates.tolist()):
        yield key, noisy, None if estimate != estimate else estimate  # NaN -> null


class Reconstruct(beam.PTransform):
    """Algorithm R: (key, noisy sum) -> (key, noisy sum, estimate of the key's query).

    ``separate`` and value buckets: noisy sum x C / b. With ``padding`` the padding bucket's
    estimate is its slice's count, C x (sum of the slice's main buckets) / B_l, and a split
    measure's main bucket carries the value estimate of both its parts (the overflow bucket's
    estimate is null) -- ``ContributionConfig.reconstruct_estimates`` -- so the buckets of a
    slice (one per column) are grouped first; an estimate needing an undeclared bucket is null.
    Every estimate is then multiplied by its measure's estimate scale (``estimate_scales``,
    default 1; post-processing).
    """

    def __init__(self, config: ContributionConfig):
        super().__init__()
        self.config = config

    def expand(self, noisy):
        config = self.config
        if config.padding_measure is None:
            return noisy | "Rescale" >> beam.Map(
                lambda kv: (kv[0], kv[1],
                            kv[1] * config.scale_of_key(int.from_bytes(kv[0], "big"))))

        def slice_of(kv):
            level, _, code = config.query_of_key(int.from_bytes(kv[0], "big"))
            return (level, code), kv

        return (noisy
                | "BySlice" >> beam.Map(slice_of)
                | "GroupSlice" >> beam.GroupByKey()
                | "Rescale" >> beam.FlatMap(_reconstruct_slice, config))

