"""ARA summary reports on Beam: contribution vectors (A), bounding (C), summary (S), reconstruction (R).

    python -m pipelines.ara.summary_reports --input conv.parquet --config config.json --epsilon 8 \\
        --batch_id 2026-11-21 --output out/ara --ledger private/ledger.json \\
        --key_store private/keys

Inputs (``--input_format``, default from the file names):
  csv / parquet  attributed conversions: columns report_id, source_id, [order], dim_0..dim_{D-1},
                 and one column per measure of ``--config`` (``count`` may be absent: 1 per
                 row); algorithm A encodes them with the configuration (clip thresholds,
                 budgets). ``report_id`` is the id of the aggregatable report the browser sends
                 for the conversion (its ``shared_info``'s); required in real releases (a row
                 without one is dropped and counted; a batch without any is refused before the
                 charge), optional in testing runs.
  reports        JSON lines of cleartext aggregatable reports with their ``report_id`` (see
                 transforms/ara/reports.py).

Output: release ``summary_reports/<batch_id>`` (``summary.csv``): ``bucket,noisy_sum[,estimate]``
per declared bucket (hex key; ``estimate`` = algorithm R when ``--config`` is given), sorted by
bucket, each value followed by its error columns ``<value>_ci95_low``, ``<value>_ci95_high`` and
``<value>_std`` (:mod:`transforms.error_columns`): the noise's, from the stated discrete Laplace
noise only (an estimate's through its public coefficients; ``RELEASE.json`` states how). The output domain is ``--output_domain`` (one key per line), or for conversions, every
bucket of the configuration.

Privacy: one source (impression) contributes at most 65,536 in L1 (algorithm C, re-applied here),
each declared bucket gets DLap(65,536 / epsilon): the summary is epsilon-DP w.r.t. adding or
removing a source. A batch is aggregated at most once, and "the batch" is its content: a digest of
the set of reports (or conversion rows), independent of file names, order and the ``--batch_id``
label, is recorded in the ledger; the same content under another id is refused.

Across batches (``pipelines/release/consumption.py``; checked in the ledger's transaction before
the charge):

* **Each report id is aggregated at most once**, over all batches and all versions of a batch
  (the Aggregation Service's rule). A batch holding report ids an earlier batch consumed -- an
  overlapping batch, a late report sent with its batch again -- is refused (exit 2, naming how
  many and which batches hold them); with ``--skip_consumed`` those reports are removed in the
  pipeline (counter ``ara.reports_removed_already_consumed``) and the rest aggregated. A report
  sent twice within one batch never refuses it: identical copies keep one report (counter
  ``ara.reports_dropped_identical_copies_in_batch``, as the Aggregation Service drops later
  copies), copies that differ are all removed (``ara.reports_removed_conflicting_copies_in_batch``:
  keeping the first by arrival is not the same on every runner and would let an added copy
  replace a report) -- rule 1 of :mod:`pipelines.release.consumption`, stable under add/remove;
  a report id without a canonical form drops its report like any other faulty report.
* **A source's 65,536 L1 budget holds across all batches**, as in the browser: the ledger keeps
  per source what its batches were granted, and a later batch's algorithm C bounds the source by
  what is left. A batch is granted, per source, the least of what is left and what its reports
  can spend at most (their totals; conversions: every rounding up), and records that grant;
  under ``--skip_consumed`` the removed reports still count in what a source asks (conservative).
  So epsilon holds per source over every batch it appears in (each batch's noise is calibrated
  to the whole budget; a source's contributions over all batches sum to at most 65,536).
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.budget import PrivacyBudget
from accounting.calibration import calibrate
from accounting.ledger import Scope
from accounting.measures import Measure
from accounting.sensitivity import Sensitivities
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, Prepared,
                               ReleaseOptions, ReleaseRefused, cli, textfiles)
from pipelines.release import run as run_release
from pipelines.release.consumption import SKIP_HELP, Consumes
from pipelines.release.names import check_segment
from transforms.ara.beam import (ROUNDING_PURPOSE, SUMMARY_PURPOSE, BoundSourceContributions,
                                 EncodeConversions, ParseReports, Reconstruct, RemoveReports,
                                 SummaryReport, batch_purpose, conversion_rows,
                                 max_report_totals)
from transforms.ara.contribution import CONTRIBUTION_BUDGET, ContributionConfig
from transforms import error_columns
from transforms.ara.summary import (check_summary_epsilon, key_bytes, parse_output_domain,
                                    summary_noise_spec)

NAME = "summary_reports"
OUTPUT = "summary.csv"
#: The aggregation service's largest epsilon per batch: the budget of a batch's ledger scope.
MAX_EPSILON = 64.0
#: Consumed-id namespaces (the ledger's records): report ids (at most once) and the sources' L1
#: contribution budget (65,536 over all batches).
REPORT_IDS = "ara-summary/report-id"
SOURCE_BUDGET = "ara-summary/source-l1"


@dataclass(frozen=True, kw_only=True)
class SummaryReportsRequest:
    """One summary-report batch (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "conversions or reports: paths, globs or folders, "
                                           "comma-separated (local or gs://)"})
    epsilon: float = field(metadata={"help": "privacy budget of this summary report "
                                             "(0 < epsilon <= 64)"})
    batch_id: str = field(metadata={"help": "a label for this batch (its release id is "
                                            "summary_reports/BATCH_ID); the batch itself is "
                                            "identified by its content"})
    input_format: Optional[str] = field(default=None, metadata={
        "choices": ["csv", "parquet", "reports"],
        "help": "conversions (csv/parquet) or JSON-lines aggregatable reports (default: from "
                "the file names; .jsonl means reports)"})
    config: Optional[str] = field(default=None, metadata={
        "help": "contribution configuration JSON (clip thresholds, budgets, slice dimensions; "
                "see python -m pipelines.ara.config); required for conversions, enables "
                "reconstruction for reports"})
    output_domain: Optional[str] = field(default=None, metadata={
        "help": "declared bucket keys, one per line (decimal or 0x hex); required for reports"})
    max_reports_per_source: int = field(default=1024, metadata={
        "help": "reports kept per source before budget bounding (memory bound)"})
    skip_consumed: bool = field(default=False, metadata={"help": SKIP_HELP})
    options: ReleaseOptions = field(metadata={"cli": False})


def _format(request) -> str:
    if request.input_format:
        return request.input_format
    name = request.input[0].lower() if request.input else ""
    if ".jsonl" in name or ".ndjson" in name or name.endswith(".json"):
        return "reports"
    return "parquet" if (".parquet" in name or name.endswith(".pq")) else "csv"


def _schema(with_estimate: bool) -> pa.Schema:
    """bucket, noisy_sum[, estimate], each value followed by its error columns."""
    fields = [("bucket", pa.string())]
    for value, typ in [("noisy_sum", pa.int64())] + ([("estimate", pa.float64())] if with_estimate else []):
        fields += [(value, typ)] + [(name, pa.float64()) for name in error_columns.names(value)]
    return pa.schema(fields)


def _errors(config, spec) -> dict:
    """The released values' error statements (the output's ``errors``)."""
    out = {"noisy_sum": error_columns.NoiseError.of(spec).describe(
        "noisy_sum", "algorithm S's discrete Laplace noise, scale 65,536 / epsilon")}
    if config is not None:
        low, high, std = error_columns.names("estimate")
        out["estimate"] = (
            f"{std}, {low}/{high}: algorithm R's estimate is a linear combination of noisy sums "
            "with public coefficients (the configuration's gamma C / b; a padding bucket's count "
            "sums its slice's main buckets, a split measure's value its two parts): std = the "
            "noise's std times the coefficients' L2 norm; interval = estimate -/+ their L1 norm "
            "times the noise's half-width at level 1 - 5%/k for k terms (a union bound; exact for "
            "one term); null where the estimate is. From the stated noise only (public): they "
            "describe the noise, not the clipping, rounding and dropping bias of algorithms A "
            "and C, which depend on the data")
    return out


def _with_errors(rows, schema, keys, config, spec) -> pa.Table:
    """The released table: ``rows`` (key bytes, noisy sum[, estimate]) with error columns."""
    buckets = [int.from_bytes(r[0], "big") for r in rows]
    columns = {"bucket": pa.array([f"{k:#034x}" for k in buckets], pa.string()),
               "noisy_sum": pa.array([r[1] for r in rows], pa.int64())}
    sums = error_columns.NoiseError.of(spec)
    parts = [("noisy_sum", error_columns.arrays(columns["noisy_sum"].to_numpy(zero_copy_only=False),
                                                sums.std, sums.halfwidth))]
    if config is not None:
        estimate = np.array([np.nan if r[2] is None else r[2] for r in rows], dtype=np.float64)
        columns["estimate"] = pa.array(estimate, pa.float64(), mask=np.isnan(estimate))
        errors = [None if c is None else error_columns.combination(spec, c)
                  for c in config.estimate_coefficients(buckets)]
        std = np.array([np.nan if e is None else e.std for e in errors], dtype=np.float64)
        half = np.array([np.nan if e is None else e.halfwidth for e in errors], dtype=np.float64)
        parts.append(("estimate", error_columns.arrays(estimate, std, half)))
    for value, arrays in parts:
        for name, array in zip(error_columns.names(value), arrays):
            columns[name] = pa.array(array, pa.float64(), mask=np.isnan(array))
    return pa.table({name: columns[name] for name in schema.names}, schema=schema)


def numeric_columns(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """Conversion rows read as text (CSV) -> numeric ``columns``; a value that does not parse is
    null (algorithm A then drops the row, counted by its rule). A ``count`` column the file does
    not have (the release layer's null-typed column) is removed: algorithm A counts 1 per row."""
    if "count" in table.column_names and pa.types.is_null(table.column("count").type):
        table = table.drop_columns(["count"])  # absent from the file: 1 per row
    for name in columns:
        if name not in table.column_names:
            continue
        column = table.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            try:
                parsed = pc.cast(column, pa.float64())
            except pa.ArrowInvalid:
                parsed = pa.array([_to_float(v) for v in column.to_pylist()], pa.float64())
            if name == "order":
                parsed = pc.cast(pc.fill_null(parsed, 0), pa.int64(), safe=False)
            table = table.set_column(table.column_names.index(name), name, parsed)
    return table


class _NumericColumns(beam.DoFn):
    """:func:`numeric_columns` over the pipeline's tables."""

    def __init__(self, columns: Sequence[str]):
        self._columns = list(columns)

    def process(self, table: pa.Table):
        yield numeric_columns(table, self._columns)


def _to_float(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def content_digest(resolved, consumed=None) -> str:
    """An order-independent digest of a batch's content: the sum mod 2^256 of each report's (or
    conversion row's) SHA-256, over its canonical form -- file names, order, compression and
    formatting do not change it, adding or removing a report does. ``resolved``: the
    preflighted inputs (read as the pipeline reads them, one file at a time). Shared with
    ``pipelines.ara.event_level_reports``, whose sources and conversions are tables of the same kind.
    ``consumed``: a :class:`_Consumed` that collects, in the same pass, what the batch consumes."""
    total, kind = 0, "conversions"
    for inp in resolved:
        for path in inp.files:
            kind = "reports" if inp.formats[path] == "jsonl" else kind
            try:
                total += _file_digest(path, inp, consumed)
            except (pa.ArrowException, UnicodeDecodeError, OSError, EOFError) as err:
                # The whole batch is read here, before any charge: a file that cannot be read
                # (invalid UTF-8, a corrupt Parquet page) is refused (never echoing its content).
                compression = inp.compression[path]
                raise ReleaseRefused(
                    f"{inp.spec.label}: {path} could not be read ({type(err).__name__}: not valid "
                    f"{inp.formats[path]}" + (f" in {compression}" if compression else "")
                    + "); nothing was charged")
    return f"multiset-sha256:{kind}:{total % (1 << 256):064x}"


def _file_digest(path: str, inp, consumed=None) -> int:
    total = 0
    if inp.formats[path] == "jsonl":
        for row in _report_lines(path, inp.compression[path]):
            try:
                obj = json.loads(row)
                canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
            except ValueError:
                obj, canonical = None, row
            total += int.from_bytes(hashlib.sha256(canonical.encode()).digest(), "big")
            if consumed is not None and obj is not None:
                consumed.add_report(obj)
        return total
    for table in _conversion_tables(path, inp):
        if consumed is not None:
            consumed.add_conversions(table, inp.spec.label, path)
        names = sorted(table.column_names)
        columns = [table.column(n).to_pylist() for n in names]
        for values in zip(*columns):
            row = json.dumps([[n, _canonical_value(n, v)] for n, v in zip(names, values)],
                             separators=(",", ":"))
            total += int.from_bytes(hashlib.sha256(row.encode()).digest(), "big")
    return total


def _report_lines(path: str, compression):
    from pipelines.release.inputs import open_input

    with open_input(path, compression) as handle:
        for raw in handle:
            text = raw.decode("utf-8", errors="replace").strip()
            if text:
                yield text


def _canonical_value(name: str, value):
    """A conversion field as the same JSON value whatever file format carried it."""
    from transforms.privacy_units import canonical_unit_id

    if name == "source_id":
        return canonical_unit_id(value, "source_id")
    if isinstance(value, str):
        parsed = _to_float(value)
        if parsed is None:
            return value.strip() or None
        value = parsed
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = float(value)
        return int(value) if value.is_integer() else repr(value)
    return value


def _conversion_tables(path: str, inp):
    """A conversions file's rows in batches, every column of the file (CSV as text, only an empty
    field missing, a value whose bytes are not UTF-8 missing too: as the pipeline reads it)."""
    from pipelines.release.inputs import open_input, text_not_utf8_as_missing

    if inp.formats[path] == "parquet":
        from transforms import parquet_files

        with open_input(path) as handle:
            for batch in parquet_files.open_file(handle).iter_batches(batch_size=65536,
                                                                      use_threads=False):
                yield pa.Table.from_batches([batch])
        return
    from pyarrow import csv as pacsv

    header = list(inp.present[path])
    with open_input(path, inp.compression[path]) as handle:
        reader = pacsv.open_csv(handle, read_options=pacsv.ReadOptions(use_threads=False),
                                parse_options=pacsv.ParseOptions(
                                    invalid_row_handler=lambda row: "skip"),
                                convert_options=pacsv.ConvertOptions(
                                    column_types={c: pa.string() for c in header},
                                    null_values=[""], strings_can_be_null=True,
                                    check_utf8=False))
        for batch in reader:
            yield text_not_utf8_as_missing(pa.Table.from_batches([batch]))[0]


def _digest(text: str) -> tuple[int, int]:
    """A report's content digest (two 64-bit words; keyed by this process's secret, see
    :func:`pipelines.release.consumption.content_digests`): identical copies of a report id
    keep one, conflicting ones lose every copy (rule 1 of :mod:`pipelines.release.consumption`)."""
    from pipelines.release.consumption import _digest_secret

    raw = hashlib.blake2b(text.encode("utf-8"), key=_digest_secret(), digest_size=16).digest()
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


class _Consumed:
    """What a batch consumes, collected while its content digest is computed (one pass): the
    report ids of the reports (conversion rows) the pipeline aggregates, and per such report its
    source and the most it can spend of the source's budget -- by the pipeline's own row rules
    (``parse_report`` / ``conversion_rows``), so a report the pipeline drops consumes nothing."""

    def __init__(self, config: Optional[ContributionConfig], require_report_id: bool):
        self.config, self.require = config, require_report_id
        self.report_ids, self.sources, self.totals = [], [], []
        self.content = []   # one digest per report id: what the pipeline's report holds
        self._seen = set()  # (report id, digest): an identical copy asks no budget again
        self.without_id = 0

    def _again(self, report_id, digest) -> bool:
        """Whether this report is an identical copy of one already counted (rule 1 keeps one
        copy: its source's budget is asked once, in whatever order the copies come)."""
        if (report_id, digest) in self._seen:
            return True
        self._seen.add((report_id, digest))
        return False

    def add_report(self, obj) -> None:
        from transforms.ara.reports import ReportFault, report_from_json

        try:
            report = report_from_json(obj, require_report_id=self.require)
        except ReportFault as fault:
            self.without_id += fault.reason == "missing_report_id"
            return
        if report.report_id is not None:
            digest = _digest(repr(report))
            self.report_ids.append(report.report_id)
            self.content.append(digest)
            if self._again(report.report_id, digest):
                return
        self.sources.append(report.source_id)
        self.totals.append(report.total)

    def add_conversions(self, table: pa.Table, label: str, path: str) -> None:
        cfg = self.config
        numeric = numeric_columns(table, ["order", "count", *cfg.measures, *[
            f"dim_{d}" for d in range(len(cfg.slice_dimensions))]])
        try:
            rows = conversion_rows(numeric, cfg, self.require)
        except ValueError as err:
            raise ReleaseRefused(f"{label}: {path}: {err}; nothing was charged")
        self.without_id += rows.missing_report_id
        totals = max_report_totals(cfg, rows.values).tolist()
        if rows.report_ids is None:
            self.sources.extend(rows.sources)
            self.totals.extend(totals)
            return
        order = rows.order.tolist()
        for k, i in enumerate(rows.report_ids):
            if i is not None:
                digest = _digest(repr((rows.sources[k], order[k], rows.values[k].tolist(),
                                       rows.features[k].tolist())))
                self.report_ids.append(i)
                self.content.append(digest)
                if self._again(i, digest):
                    continue
            self.sources.append(rows.sources[k])
            self.totals.append(totals[k])


#: Counters of the ARA transforms (namespace ``ara``) that drop a row or report for a fault of
#: its own; the others are bounding rules (a source's budget, --max_reports_per_source).
_FAULT_COUNTERS = ("ara.conversion_rows_dropped_", "ara.reports_dropped_")
_BOUNDING_COUNTERS = ("ara.reports_dropped_source_budget_exhausted",
                      "ara.reports_dropped_over_max_reports_per_source")


@dataclass(frozen=True, kw_only=True)
class SummaryReportsPrepared(Prepared):
    """The input format, the contribution configuration (``--config``, read once) and the
    declared buckets (``--output_domain``, or the configuration's domain)."""

    format: str
    config: Optional[ContributionConfig]
    buckets: tuple


def _contribution_config(request) -> Optional[ContributionConfig]:
    """--config through the one configuration reader (it names file, line and column, never the
    content, and refuses a key file), then ContributionConfig.from_dict."""
    if not request.config:
        return None
    data = textfiles.read(request.config, "--config").json()
    try:
        return ContributionConfig.from_dict(data)
    except (ValueError, KeyError, TypeError) as err:
        raise ReleaseRefused(f"--config {request.config}: {err}")


#: The most buckets one release declares (each is a row of the released file and a noise draw;
#: the domain is built in memory before the charge).
MAX_DECLARED_BUCKETS = 1 << 22


def _buckets(request, config) -> list[int]:
    if config is not None and not request.output_domain and \
            config.domain_size() > MAX_DECLARED_BUCKETS:
        raise ReleaseRefused(
            f"--config {request.config}: its slice_dimensions and prefixes declare "
            f"{config.domain_size():.4g} buckets, more than the {MAX_DECLARED_BUCKETS} one "
            "release can declare: slice coarser, or declare the buckets with --output_domain. "
            "Nothing was charged")
    if request.output_domain:
        text = textfiles.read(request.output_domain, "--output_domain").text
        try:
            keys = parse_output_domain(text).keys
        except ValueError as err:
            raise ReleaseRefused(f"--output_domain {request.output_domain}: {err}")
        if len(keys) > MAX_DECLARED_BUCKETS:
            raise ReleaseRefused(f"--output_domain {request.output_domain}: {len(keys)} buckets, "
                                 f"more than the {MAX_DECLARED_BUCKETS} one release can declare")
        return keys
    return config.output_domain()


class SummaryReportsJob(Job):
    name = NAME
    request_type = SummaryReportsRequest
    description = __doc__.split("\n\n")[0]
    counter_namespaces = ("ara",)

    def dropped_rows(self, prepared, counters):
        """Rows read (and malformed CSV lines) are eligible; conversion rows and reports the ARA
        transforms drop for a fault are dropped (bounding a source's contributions is not)."""
        from pipelines.release.counters import dropped_share

        faults = {k: v for k, v in counters.items()
                  if v and k.startswith(_FAULT_COUNTERS) and k not in _BOUNDING_COUNTERS}
        out = {}
        for name, share in dropped_share(counters).items():
            dropped = share["dropped"] + sum(faults.values())
            out[name] = {"eligible": share["eligible"], "dropped": dropped,
                         "share": dropped / share["eligible"] if share["eligible"] > 0 else 0.0,
                         "reasons": {**share["reasons"], **faults}}
        return out

    def prepare(self, request) -> SummaryReportsPrepared:
        try:
            check_segment(request.batch_id, "--batch_id")
            check_summary_epsilon(request.epsilon)
        except ValueError as err:
            raise ReleaseRefused(str(err))
        if request.max_reports_per_source < 1:
            raise ReleaseRefused("--max_reports_per_source must be positive")
        fmt = _format(request)
        config = _contribution_config(request)
        if fmt != "reports" and config is None:
            raise ReleaseRefused("--config is required for conversions input")
        if fmt == "reports" and not request.output_domain:
            raise ReleaseRefused("--output_domain is required for reports input")
        buckets = _buckets(request, config)
        if config is not None:
            for key in buckets:
                try:
                    config.scale_of_key(key)
                except (ValueError, KeyError):
                    raise ReleaseRefused("--output_domain declares a bucket that belongs to no "
                                         "query of --config")
        return SummaryReportsPrepared(request=request, format=fmt, config=config,
                                      buckets=tuple(buckets))

    def inputs(self, prepared: SummaryReportsPrepared):
        request, config = prepared.request, prepared.config
        if prepared.format == "reports":
            return [InputSpec(name="reports", paths=request.input, format="jsonl", columns={},
                              flag="--input")]
        ids = {"report_id": "id"}
        columns = {**({} if request.options.testing else ids), "source_id": "id",
                   **{f"dim_{d}": "number" for d in range(len(config.slice_dimensions))},
                   **{m: "number" for m in config.measures if m != "count"}}
        optional = {**(ids if request.options.testing else {}),
                    "order": "integer" if prepared.format == "parquet" else "any"}
        if "count" in config.measures:
            optional["count"] = "number"
        return [InputSpec(name="conversions", paths=request.input, format=prepared.format,
                          columns=columns, optional=optional, flag="--input")]

    def plan(self, prepared: SummaryReportsPrepared):
        request, config, keys = prepared.request, prepared.config, prepared.buckets
        spec = calibrate("discrete_laplace", epsilon=request.epsilon,
                         l1_sensitivity=CONTRIBUTION_BUDGET)
        measure = Measure.of_noise(
            "summary", spec, Sensitivities(l0=CONTRIBUTION_BUDGET, linf=CONTRIBUTION_BUDGET,
                                           l1=CONTRIBUTION_BUDGET, l2=CONTRIBUTION_BUDGET),
            neighbouring="add/remove one source: its reports, at most 65,536 in L1 contributions",
            description="algorithm S: discrete Laplace per declared bucket")
        return [PlannedRelease(
            release_id=f"{NAME}/{request.batch_id}", measures=[measure],
            scopes=[Scope(name=f"ara-batch:{request.batch_id}",
                          budget=PrivacyBudget(epsilon=MAX_EPSILON),
                          description="one batch (aggregated once; epsilon <= 64)")],
            outputs=[OutputSpec(name=OUTPUT, sort_by=["bucket"], schema=_schema(config is not None),
                                noisy=["noisy_sum"] + (["estimate"] if config else []),
                                errors=_errors(config, spec),
                                description="one row per declared bucket (hex key)")],
            config={"format": prepared.format, "epsilon": request.epsilon,
                    "contribution_config": None if config is None else json.loads(config.to_json()),
                    "buckets": [f"{k:#034x}" for k in keys],
                    "max_reports_per_source": request.max_reports_per_source,
                    **({"skip_consumed": True} if request.skip_consumed else {})},
            parameters={"epsilon": request.epsilon, "declared_buckets": len(keys),
                        "contribution_budget": CONTRIBUTION_BUDGET},
            guarantee_covers="one batch of reports: every declared bucket's noisy sum")]

    def _scan(self, prepared: SummaryReportsPrepared, inputs) -> tuple[str, _Consumed]:
        """The batch's content digest and what it consumes, in one pass over its files (the
        release layer asks for both before the charge)."""
        resolved = [inputs[name] for name in sorted(inputs)]
        last = self._last_scan
        # The same prepared request and preflighted inputs (the very objects): the same pass.
        if last is None or last[0] is not prepared or len(last[1]) != len(resolved) or \
                any(a is not b for a, b in zip(last[1], resolved)):
            consumed = _Consumed(prepared.config, not prepared.request.options.testing)
            last = (prepared, resolved, content_digest(resolved, consumed), consumed)
            self._last_scan = last
        return last[2], last[3]

    _last_scan = None

    def content_key(self, prepared, planned, inputs):
        return self._scan(prepared, inputs)[0]

    def consumes(self, prepared: SummaryReportsPrepared, planned, inputs):
        """Report ids (at most once) and the sources' budgets (see the module docstring)."""
        consumed = self._scan(prepared, inputs)[1]
        if consumed.without_id and not consumed.report_ids:
            # not one report could be checked against earlier batches: refuse before the charge
            # (a few reports without an id are dropped and counted instead)
            raise ReleaseRefused(f"--input: none of its reports has a report_id "
                                 f"({consumed.without_id} without); a release aggregates each "
                                 "report id at most once across batches, so it needs them. "
                                 "Nothing was charged")
        skip = prepared.request.skip_consumed
        content = np.array(consumed.content, dtype=np.uint64).reshape(-1, 2)
        return [Consumes(namespace=REPORT_IDS, ids=consumed.report_ids, noun="report ids",
                         label="--input", skip=skip, content=content),
                Consumes(namespace=SOURCE_BUDGET, ids=consumed.sources, noun="sources",
                         label="--input", limit=CONTRIBUTION_BUDGET,
                         amounts=np.asarray(consumed.totals, dtype=np.int64))]

    def build(self, pipeline, prepared: SummaryReportsPrepared, inputs, release):
        request, config, keys = prepared.request, prepared.config, prepared.buckets
        key, batch = release.key, request.batch_id
        required = not release.testing
        if prepared.format == "reports":
            reports = (inputs["reports"]
                       | release.label("Lines") >> beam.FlatMap(lambda t: t.column("line").to_pylist())
                       | release.label("ParseReports") >> ParseReports(required))
        else:
            numeric = [c for c in ["order", "count", *config.measures,
                                   *[f"dim_{d}" for d in range(len(config.slice_dimensions))]]]
            reports = (inputs["conversions"]
                       | release.label("Numeric") >> beam.ParDo(_NumericColumns(numeric))
                       | release.label("ContributionVectors") >> EncodeConversions(
                           config, key, batch_purpose(ROUNDING_PURPOSE, batch), required))
        removed = release.consumed.get(REPORT_IDS)
        if removed is not None and removed.removes:
            repeated = set(removed.repeated_ids.to_pylist())
            held = [i for i in removed.removed.to_pylist() if i not in repeated]
            ids = pipeline | release.label("ConsumedReportIds") >> beam.Create(held)
            copies = pipeline | release.label("RepeatedReportIds") >> beam.Create(
                sorted(repeated))
            # identical copies keep one report, unless an earlier batch holds the id
            same = pipeline | release.label("IdenticalReportIds") >> beam.Create(
                sorted(set(removed.identical_ids.to_pylist()) - set(held)))
            reports = reports | release.label("RemoveConsumed") >> RemoveReports(
                ids, copies, same)
        budget = release.consumed.get(SOURCE_BUDGET)
        grants = None
        if budget is not None and budget.grants:
            grants = pipeline | release.label("SourceBudgetsLeft") >> beam.Create(
                sorted(budget.grants.items()))
        contributions = reports | release.label("ContributionBounding") >> BoundSourceContributions(
            request.max_reports_per_source, grants=grants)
        domain = pipeline | release.label("Domain") >> beam.Create([key_bytes(k) for k in keys])
        noisy = ({"contributions": contributions, "domain": domain}
                 | release.label("SummaryReport") >> SummaryReport(
                     request.epsilon, key, batch_purpose(SUMMARY_PURPOSE, batch)))
        if config is not None:
            rows = noisy | release.label("Reconstruct") >> Reconstruct(config)
        else:
            rows = noisy | release.label("AsRows") >> beam.Map(lambda kv: (kv[0], kv[1]))
        schema, spec = _schema(config is not None), summary_noise_spec(request.epsilon)
        table = (rows
                 | release.label("All") >> beam.combiners.ToList()
                 | release.label("Arrow") >> beam.Map(_with_errors, schema, keys, config, spec))
        return {OUTPUT: table}


JOB = SummaryReportsJob()


def run(request: SummaryReportsRequest):
    """Aggregate one batch (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
