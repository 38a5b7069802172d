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
    changes: the neighbours to build (default: every change of the relation), in the exact mode;
    noisy_changes: those run again in the noisy testing mode (default: the same; () for none).
    keys_private:
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
    noisy_changes: Optional[Sequence[Change]] = None
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
                         relation=self.relation,
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
    import dataclasses

    spec = entry.spec(datasets)
    if job is not None:
        spec = dataclasses.replace(spec, job=job)
    exact = audit(dataclasses.replace(spec, modes=("exact",)), datasets, changes=changes, seed=seed)
    noisy_changes = changes if changes is not None else entry.noisy_changes
    if noisy_changes is not None and not noisy_changes:
        return exact   # an exact-only audit (noisy_changes=())
    noisy = audit(dataclasses.replace(spec, modes=("noisy",)), datasets, changes=noisy_changes,
                  seed=seed)
    return AuditResult(violations=exact.violations + noisy.violations,
                       runs=exact.runs + noisy.runs, pairs=exact.pairs + noisy.pairs)


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
        measures={"*/summary.csv": {"noisy_sum": "summary"}},
        changes=(Change.ADD_HEAVY, Change.ADD_MIXED_IDS, Change.REBATCH),
        noisy_changes=(Change.REBATCH,))




def _centralnotice_audit() -> JobAudit:
    import datetime as dt
    import itertools

    from accounting.audit import synthetic_dataset
    from pipelines import centralnotice
    from release_testkit import (CN_BANNERS, CN_CLK_HEADER, CN_DAY1, CN_IMP_HEADER,
                                 CN_PROJECTS, CN_RELEASE1, LOW, cn_config, write_csv, write_json)

    countries = ["DE", "FR"]   # RU (protected) is never released: a key of its own
    keys = [("C1", b, c, p, CN_DAY1) for b, c, p in itertools.product(CN_BANNERS, countries, CN_PROJECTS)]
    units = Units(column="user_id", keys=CN_CLK_HEADER[:5], public_keys=keys,
                  fresh_keys=[("C1", CN_BANNERS[0], "RU", CN_PROJECTS[0], CN_DAY1)],
                  heavy_keys=2, heavy_rows=3)
    day = dt.date.fromisoformat(CN_DAY1)
    released = [k[:4] + (day,) for k in keys]
    clicks = {"noise": "discrete_laplace", "epsilon": 1.0, "neighbouring": "user",
              "max_clicks_per_user": 2, "bound_per": "period", "release_threshold": LOW}

    def write(dataset, folder):
        files = rows_as_csv("clicks", CN_CLK_HEADER)(dataset, folder)
        imp = write_csv(os.path.join(folder, "imp.csv"), CN_IMP_HEADER,
                        [k + (100 + 10 * i,) for i, k in enumerate(keys[:3])])
        config = write_json(os.path.join(folder, "config.json"), cn_config(clicks=clicks))
        return {**files, "impressions": [imp], "config": [config]}

    return JobAudit(
        name="centralnotice",
        job=ReleaseLayerJob(
            module=centralnotice, write=write,
            request=lambda files, options: centralnotice.CentralNoticeRequest(
                config=files["config"][0], impressions=tuple(files["impressions"]),
                clicks=tuple(files["clicks"]), release=CN_RELEASE1, num_shards=2,
                options=options)),
        units=units,
        datasets=lambda: [synthetic_dataset(units, seed=7, n_units=6, batches=2, empty_keys=2)],
        tables={"*/centralnotice.parquet": TableRule(
            keys=CN_CLK_HEADER[:5], noisy=("impressions", "clicks"), public_keys=released)},
        measures={"*/centralnotice.parquet": {"impressions": "impressions", "clicks": "clicks"}},
        changes=(Change.ADD_MIXED_IDS, Change.ADD_ALONE, Change.ADD_SPREAD, Change.REBATCH),
        noisy_changes=(Change.REBATCH,))


register(_centralnotice_audit())


def _reach_frequency_audit() -> JobAudit:
    from accounting.audit import synthetic_dataset
    from pipelines import reach_frequency

    publishers = ["pub_a", "pub_b", "pub_c"]
    units = Units(column="vid", keys=("publisher",), public_keys=publishers,
                  fresh_keys=["pub_undeclared"], heavy_keys=2, heavy_rows=3,
                  row=lambda r: {**r, "campaign": "c1"})

    return JobAudit(
        name="reach_frequency",
        job=ReleaseLayerJob(
            module=reach_frequency, write=rows_as_csv("impressions", ["publisher", "campaign", "vid"]),
            request=lambda files, options: reach_frequency.ReachFrequencyRequest(
                input=tuple(files["impressions"]), campaigns=("c1",), publishers=tuple(publishers),
                epsilon=1.0, num_registers=500, max_frequency=3, options=options)),
        units=units,
        datasets=lambda: [synthetic_dataset(units, seed=11, n_units=8, batches=2)],
        # Released values are estimates (post-processing of the sketches' noisy statistics): the
        # audit checks structure, order, files and marker text, and the exact mode's key set.
        tables={"*/reach_frequency.jsonl": TableRule(
            keys=("scope", "publisher"), noisy=("reach", "frequency", "k_reach", "k_plus_reach"),
            public_keys=[("publisher", p) for p in publishers] + [("union", None)])},
        changes=(Change.ADD_MIXED_IDS, Change.REMOVE_HEAVY, Change.REBATCH),
        noisy_changes=(Change.REBATCH,))


register(_reach_frequency_audit())


register(_summary_reports_audit())


# ---- DPAggregate (the transform, in a Beam pipeline of its own; bounds from its plan) ----------

def exact_aggregate_job_type():
    """aggregate_kit.AggregateJob whose exact mode also uses a noise-free key (so private
    selection is deterministic: ReleaseKey.for_exact_testing) besides DPAggregate's testing mode."""
    from aggregate_kit import AggregateJob

    from accounting.keys import ReleaseKey

    class ExactAggregateJob(AggregateJob):
        def transform(self, key, exact, **kwargs):
            if exact and not key.noise_free:
                key = ReleaseKey(key.secret_bytes(), is_testing=True, noise_free=True)
            return super().transform(key, exact, **kwargs)

    return ExactAggregateJob


def aggregate_audit(name: str, job, units: Units, datasets, **kwargs) -> JobAudit:
    """The JobAudit of one DPAggregate configuration (``job``: an aggregate_kit.AggregateJob)."""
    relation = "substitute" if job.neighbouring.name == "SUBSTITUTE" else "add_remove"
    return JobAudit(name=name, job=job, units=units, datasets=datasets,
                    tables={"release": job.rule()}, reports={"explain": ReportRule()},
                    relation=relation, **kwargs)


def _aggregate_audits() -> list[JobAudit]:
    from accounting.audit import synthetic_dataset
    from accounting.budget import PrivacyBudget
    from accounting.sensitivity import ContributionBounds, Neighbouring
    from transforms.metrics import Count, PrivacyUnitCount, Quantiles, Std, Sum, Variance
    from transforms.selection import PrivateSelection, SelectionStrategy

    Job = exact_aggregate_job_type()
    keys = [f"k{i}" for i in range(6)]
    units = Units(column="user", keys=("k",), public_keys=keys, fresh_keys=["z1", "z2"],
                  values={"v": [0.0, 4.0, 100.0, -3.0]}, heavy_keys=3, heavy_rows=3)
    bounds = ContributionBounds(2, 2, min_value=0, max_value=10)
    keyset = Job(value="v", metrics=[Count(), Sum(), PrivacyUnitCount()], bounds=bounds,
                 budget=PrivacyBudget(epsilon=1.0), public_keys=keys)
    # variance, std and quantiles (issue 16): derived columns, audited for structure and as noisy
    spread = Job(value="v", metrics=[Count(), Variance(), Std(), Quantiles([0.5, 0.9], branching=4, depth=2)],
                 bounds=bounds, budget=PrivacyBudget(epsilon=1.0), public_keys=keys)
    selection = Job(value="v", metrics=[Count(), Sum()], bounds=bounds,
                    budget=PrivacyBudget(epsilon=8.0, delta=1e-2),
                    selection=PrivateSelection(strategy=SelectionStrategy.LAPLACE_THRESHOLDING))

    def data():
        # k2 is a public key without rows in the middle of the keyset (an order that puts keys
        # with rows first shows); k5 holds a lone unit; k0, k1 are busy (selected)
        return [synthetic_dataset(units, seed=2, n_units=12, batches=3,
                                  keys=["k0", "k1", "k3", "k4", "k5", "k2"])]

    exact_changes = (Change.ADD_HEAVY, Change.ADD_EMPTY_KEY, Change.ADD_MIXED_IDS, Change.REBATCH)
    substitute_changes = (Change.SUBSTITUTE_ALONE, Change.SUBSTITUTE_MIXED_IDS,
                          Change.SUBSTITUTE_SPREAD)
    noisy = (Change.REBATCH,)
    noisy_substitute = (Change.SUBSTITUTE_EMPTY_KEY,)
    substitute = dict(neighbouring=Neighbouring.SUBSTITUTE)
    return [
        aggregate_audit("dp_aggregate/keyset", keyset, units, data, changes=exact_changes,
                        noisy_changes=noisy),
        aggregate_audit("dp_aggregate/selection", selection, units, data, changes=exact_changes,
                        noisy_changes=noisy),
        aggregate_audit("dp_aggregate/keyset/spread_metrics", spread, units, data, changes=exact_changes,
                        noisy_changes=noisy),
        # the dict / Row input path: one batch may mix id types
        aggregate_audit("dp_aggregate/keyset/dicts", keyset.with_(input="dicts"), units, data,
                        changes=(Change.ADD_MIXED_IDS, Change.REBATCH), noisy_changes=()),
        aggregate_audit("dp_aggregate/selection/substitute", selection.with_(**substitute), units,
                        data, changes=substitute_changes, noisy_changes=noisy_substitute),
    ]


for _entry in _aggregate_audits():
    register(_entry)
