"""Neighbouring-pair audits of transforms and jobs: the one entry point (issue 10).

:func:`audit_job` runs a registered audit: the job on small datasets and on their adversarial
neighbours (:mod:`accounting.audit`: one unit added / removed / replaced, in an empty key, alone
in a key, with ids 7 / 7.0 / "7", spread across batches; REBATCH = the same rows in other
batches), in the noisy testing mode and in the exact (noise-free) testing mode, and checks what
must not differ (released keys, their order and schema, file names and counts, report text apart
from noisy values) and that exact outputs move by at most the sensitivities the release itself
states. ``tests/test_audits.py`` runs every registered audit in ``make test``.

Adding the audit of a new job (local DP, Masked LARk, ARA event-level, ...) takes a few lines::

    from audit_kit import JobAudit, ReleaseLayerJob, register, rows_as_csv
    from accounting.audit import Units, TableRule, Order

    register(JobAudit(
        name="my_job",
        job=ReleaseLayerJob(
            module=my_job_module,                      # has run(Request) and JOB
            write=rows_as_csv("events", ["user", "key", "value"]),   # dataset -> input files
            request=lambda files, options: MyRequest(input=tuple(files["events"]), ...,
                                                     options=options)),
        units=Units(column="user", keys=("key",), public_keys=[...], values={"value": [...]}),
        tables={"my_output.csv": TableRule(keys=("key",), noisy=("count",),
                                           public_keys=[...])},
        measures={"my_output.csv": {"count": "count"}},   # column -> the plan's Measure name
        datasets=lambda: [synthetic_dataset(...)],
    ))

and add its name to ``AUDITED`` in tests/test_audits.py (a test fails when a registered job is
not audited). The job runs through the release layer exactly as a user runs it
(``run(Request)``), with ``ReleaseOptions(testing_seed=..., exact_testing=...)``:
``exact_testing`` gives the job a noise-free testing key
(:meth:`accounting.keys.ReleaseKey.for_exact_testing`), refused by every real release. The
sensitivity bounds are read from the job's own plan (``Job.plan(request)``: each released
column's :class:`~accounting.measures.Measure`), never re-typed here; the published marker
(RELEASE.json) is compared as a report with its noisy fields masked.

DPAggregate (a transform, not a job) is audited through :class:`aggregate_kit.AggregateJob`.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from accounting.audit import (AuditResult, AuditSpec, Bound, Change, Dataset, Release,
                              ReportRule, Table, TableRule, Units, audit)

TESTING_FOLDER = "testing-not-a-release"

#: Marker fields that depend on noisy values (hashes of released bytes, data-dependent summaries).
MARKER_NOISY = ("outputs.*.sha256",)
#: ... and those that also depend on which keys were released, when the key set is private.
MARKER_NOISY_KEYS = ("outputs.*.rows", "summary.*")


# --------------------------------------------------------------------------------------------
# Writing a dataset as a job's input files (one file per batch: the batches a job reads)
# --------------------------------------------------------------------------------------------

def rows_as_csv(input_name: str, columns: Sequence[str]) -> Callable:
    """Each batch as one CSV file of ``columns`` (a missing value is an empty field)."""
    def write(dataset: Dataset, folder: str) -> dict:
        paths = []
        for i, batch in enumerate(dataset.batches):
            path = os.path.join(folder, f"{input_name}-{i:03d}.csv")
            with open(path, "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(columns)
                for row in batch:
                    writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
            paths.append(path)
        return {input_name: paths}
    return write


def rows_as_jsonl(input_name: str, line: Callable[[dict], dict]) -> Callable:
    """Each batch as one JSON-lines file, ``line(row)`` per row (ids keep their JSON types)."""
    def write(dataset: Dataset, folder: str) -> dict:
        paths = []
        for i, batch in enumerate(dataset.batches):
            path = os.path.join(folder, f"{input_name}-{i:03d}.jsonl")
            with open(path, "w") as handle:
                handle.writelines(json.dumps(line(row)) + "\n" for row in batch)
            paths.append(path)
        return {input_name: paths}
    return write


# --------------------------------------------------------------------------------------------
# A release-layer job as an audited job
# --------------------------------------------------------------------------------------------

def read_released(folder: str) -> Release:
    """What a testing run released under ``folder`` (OUTPUT/testing-not-a-release): every file's
    relative name, each table (csv / parquet / jsonl) in its row order, each marker as a report."""
    tables, files, reports = {}, [], {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))   # .reports: the operator's
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            files.append(rel)
            if name == "RELEASE.json":
                with open(path) as handle:
                    reports[rel] = json.load(handle)
            elif name.endswith(".csv"):
                with open(path, newline="") as handle:
                    reader = csv.reader(handle)
                    header = next(reader, [])
                    tables[rel] = Table(columns=header, rows=[tuple(r) for r in reader])
            elif name.endswith(".parquet"):
                import pyarrow.parquet as pq
                tables[rel] = Table.from_arrow(pq.read_table(path))
            elif name.endswith(".jsonl"):
                with open(path) as handle:
                    records = [json.loads(line) for line in handle if line.strip()]
                tables[rel] = Table.from_records(records, columns=list(records[0]) if records else None)
    return Release(tables=tables, files=files, reports=reports)


@dataclass(frozen=True, kw_only=True)
class ReleaseLayerJob:
    """A job of ``pipelines`` run the way users run it: ``module.run(request)`` in testing mode.

    module: the job's module (``run`` and ``JOB``). write(dataset, folder) -> {input name:
    [paths]}: the dataset as input files. request(files, options) -> the job's request.
    """

    module: Any
    write: Callable[[Dataset, str], Mapping[str, Sequence[str]]]
    request: Callable[[Mapping[str, Sequence[str]], Any], Any]

    def __call__(self, dataset: Dataset, seed: int, exact: bool) -> Release:
        from pipelines.release import ReleaseOptions

        folder = tempfile.mkdtemp(prefix="audit-")
        try:
            files = self.write(dataset, folder)
            output = os.path.join(folder, "out")
            self.module.run(self.request(files, ReleaseOptions(
                output=output, testing_seed=seed, exact_testing=exact)))
            return read_released(os.path.join(output, TESTING_FOLDER))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def planned(self, dataset: Dataset) -> list:
        """The job's own plan (its PlannedReleases and their Measures) for ``dataset``."""
        from pipelines.release import ReleaseOptions

        folder = tempfile.mkdtemp(prefix="audit-plan-")
        try:
            files = self.write(dataset, folder)
            request = self.request(files, ReleaseOptions(output=os.path.join(folder, "out"),
                                                         testing_seed=0))
            self.module.JOB.check(request)
            return list(self.module.JOB.plan(request))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def bounds_from_measures(planned: Sequence, columns: Mapping[str, str]) -> dict[str, Bound]:
    """{column: Bound} from the stated sensitivities of the plan's measures (``columns``: released
    column -> measure name; every planned release must state the same sensitivities)."""
    bounds = {}
    for column, measure_name in columns.items():
        found = {(m.sensitivities.l0, m.sensitivities.linf, m.sensitivities.l1)
                 for p in planned for m in p.measures if m.name == measure_name}
        if len(found) != 1:
            raise AssertionError(f"the plan states {len(found)} sensitivities for measure "
                                 f"{measure_name!r} (column {column!r}); expected one")
        l0, linf, l1 = found.pop()
        bounds[column] = Bound(l0=int(l0), linf=float(linf), l1=float(l1))
    return bounds


# --------------------------------------------------------------------------------------------
# The registry and the entry point
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class JobAudit:
    """One registered audit.

    job: ``(dataset, seed, exact) -> accounting.audit.Release`` (a :class:`ReleaseLayerJob`, an
    ``aggregate_kit.AggregateJob``, ...). units: the row model neighbours are built from.
    tables: {released file or table name (fnmatch pattern): TableRule}; measures: {file: {column:
    measure name}}: the rule's bounds are taken from the job's plan (ReleaseLayerJob) --
    a rule's own ``bounds`` are for transforms without a plan. reports: rules of non-marker
    reports. datasets: the small datasets to audit. relation: "add_remove" or "substitute".
    changes: the neighbours to build (default: every change of the relation). keys_private:
    the marker's row counts are noisy (private key selection, thresholds).
    """

    name: str
    job: Callable[[Dataset, int, bool], Release]
    units: Units
    tables: Mapping[str, TableRule]
    datasets: Callable[[], Sequence[Dataset]]
    measures: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    reports: Mapping[str, ReportRule] = field(default_factory=dict)
    relation: str = "add_remove"
    changes: Optional[Sequence[Change]] = None
    modes: tuple = ("exact", "noisy")
    keys_private: bool = False
    marker_noisy: tuple = ()

    def spec(self, datasets: Sequence[Dataset]) -> AuditSpec:
        tables = dict(self.tables)
        if self.measures:
            planned = self.job.planned(datasets[0])
            for name, columns in self.measures.items():
                rule = tables[name]
                tables[name] = _replace(rule, bounds={**rule.bounds,
                                                      **bounds_from_measures(planned, columns)})
        reports = dict(self.reports)
        if isinstance(self.job, ReleaseLayerJob):
            noisy = MARKER_NOISY + (MARKER_NOISY_KEYS if self.keys_private else ()) + self.marker_noisy
            reports.setdefault("*RELEASE.json", ReportRule(noisy_fields=noisy))
        return AuditSpec(job=self.job, units=self.units, tables=tables, reports=reports,
                         relation=self.relation, modes=self.modes,
                         changes=tuple(self.changes) if self.changes is not None else None)


def _replace(rule: TableRule, **changes) -> TableRule:
    import dataclasses
    return dataclasses.replace(rule, **changes)


REGISTRY: dict[str, JobAudit] = {}


def register(entry: JobAudit) -> JobAudit:
    if entry.name in REGISTRY:
        raise ValueError(f"an audit named {entry.name!r} is already registered")
    REGISTRY[entry.name] = entry
    return entry


def audit_job(entry, *, job=None, datasets: Sequence[Dataset] = None,
              changes: Sequence[Change] = None, seed: int = 1) -> AuditResult:
    """Run the audit ``entry`` (a JobAudit or a registered name) and return its result (call
    ``.assert_ok()``). ``job`` replaces the audited job (a deliberately broken variant) while
    keeping the declarations of the real one."""
    if isinstance(entry, str):
        entry = REGISTRY[entry]
    datasets = list(datasets if datasets is not None else entry.datasets())
    spec = entry.spec(datasets)
    if job is not None:
        import dataclasses
        spec = dataclasses.replace(spec, job=job)
    return audit(spec, datasets, changes=changes, seed=seed)


__all__ = ["JobAudit", "REGISTRY", "ReleaseLayerJob", "audit_job", "bounds_from_measures",
           "read_released", "register", "rows_as_csv", "rows_as_jsonl"]


# --------------------------------------------------------------------------------------------
# Registered audits (one block per job; tests/test_audits.py runs each in make test)
# --------------------------------------------------------------------------------------------

def _summary_reports_write(dataset: Dataset, folder: str) -> dict:
    buckets = dataset.extra["buckets"]
    domain = os.path.join(folder, "domain.txt")
    with open(domain, "w") as handle:
        handle.writelines(f"{b:#x}\n" for b in buckets)
    files = rows_as_jsonl("reports", lambda r: {
        "source_id": r["source_id"],
        "contributions": [{"bucket": f"{r['bucket']:#x}", "value": r["value"]}]})(dataset, folder)
    return {**files, "domain": [domain]}


def _summary_reports_audit() -> JobAudit:
    from accounting.audit import synthetic_dataset
    from pipelines import summary_reports

    buckets = [0x10, 0x11, 0x12, 0x13, 0x14]
    units = Units(column="source_id", keys=("bucket",), public_keys=buckets, fresh_keys=[0x99],
                  values={"value": [40000, 30000, 7, 65536]}, heavy_keys=2, heavy_rows=2)
    released = [f"{b:#034x}" for b in buckets]

    def datasets():
        d = synthetic_dataset(units, seed=5, n_units=5, batches=2)
        return [Dataset(batches=d.batches, name=d.name, extra={"buckets": buckets})]

    return JobAudit(
        name="summary_reports",
        job=ReleaseLayerJob(
            module=summary_reports, write=_summary_reports_write,
            request=lambda files, options: summary_reports.SummaryReportsRequest(
                input=tuple(files["reports"]), input_format="reports",
                output_domain=files["domain"][0], epsilon=4.0, batch_id="audit",
                options=options)),
        units=units, datasets=datasets,
        tables={"*/summary.csv": TableRule(keys=("bucket",), noisy=("noisy_sum",),
                                           public_keys=released)},
        measures={"*/summary.csv": {"noisy_sum": "summary"}})


register(_summary_reports_audit())
