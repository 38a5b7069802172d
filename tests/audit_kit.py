"""Neighbouring-pair audits of transforms and jobs: the one entry point (issue 10).

:func:`audit_job` runs a registered audit: the job on small datasets and on their adversarial
neighbours (:mod:`accounting.verification.audit`: one unit added / removed / replaced, in an empty key, alone
in a key, with ids 7 / 7.0 / "7", spread across batches; REBATCH = the same rows in other
batches), in the noisy testing mode and in the exact (noise-free) testing mode, and checks what
must not differ (released keys, their order and schema, file names and counts, report text apart
from noisy values) and that exact outputs move by at most the sensitivities the release itself
states. ``tests/accounting/verification/test_audits.py`` runs every registered audit in ``make test``.

Adding the audit of a new job (local DP, Masked LARk, ARA event-level, ...) takes a few lines::

    from audit_kit import JobAudit, ReleaseLayerJob, register, rows_as_csv
    from accounting.verification.audit import Units, TableRule, Order

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

and tests/accounting/verification/test_audits.py runs it (every registered audit; tests/test_layout.py fails while a job
under pipelines/ has none). The job runs through the release layer exactly as a user runs it
(``run(Request)``), with ``ReleaseOptions(testing_seed=..., exact_testing=...)``:
``exact_testing`` gives the job a noise-free testing key
(:meth:`accounting.keys.ReleaseKey.for_exact_testing`), refused by every real release. The
sensitivity bounds are read from the job's own plan (``Job.planned(request)``: each released
column's :class:`~accounting.measures.Measure`), never re-typed here; the published marker
(RELEASE.json) is compared as a report with its noisy fields masked.

DPAggregate (a transform, not a job) is audited through :class:`aggregate_kit.AggregateJob`.
:class:`AdaptedJob` reads released tables through an adapter (CSV key columns parsed as
numbers; an occurrence column where a table may repeat a row); :class:`LarkChain` audits the
Masked LARk jobs as their operators chain them (share -> helpers -> combine). Relations that keep
every unit and change one unit's values (label DP, Masked LARk reports) use the
``Change.REPLACE_VALUES`` neighbour.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from accounting.verification.audit import (AuditResult, AuditSpec, Bound, Change, Dataset, Order, Release,
                              ReportRule, Table, TableRule, Units, audit)
from accounting.composition import EpsDelta

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
            return self.module.JOB.planned(request)
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

    job: ``(dataset, seed, exact) -> accounting.verification.audit.Release`` (a :class:`ReleaseLayerJob`, an
    ``aggregate_kit.AggregateJob``, ...). units: the row model neighbours are built from.
    tables: {released file or table name (fnmatch pattern): TableRule}; measures: {file: {column:
    measure name}}: the rule's bounds are taken from the job's plan (ReleaseLayerJob) --
    a rule's own ``bounds`` are for transforms without a plan. reports: rules of non-marker
    reports. datasets: the small datasets to audit. relation: "add_remove" or "substitute".
    changes: the neighbours to build (default: every change of the relation), in the exact mode;
    noisy_changes: those run again in the noisy testing mode (default: the same; () for none).
    keys_private:
    the marker's row counts are noisy (private key selection, thresholds).
    indicator_changes: neighbours whose released/suppressed indicators are sampled over many
    seeds (:mod:`accounting.verification.audit`): every job that thresholds or selects keys lists one that
    moves a key across its threshold. A ReleaseLayerJob's rules that are ``keys_private`` or
    ``thresholded`` take the plan's guarantee as their claim. indicator_runs: seeds per side
    (default: the least that catch a deterministic indicator for certain). slow: the audit runs
    with the slow tests only (its sampled indicators take many runs of the job).
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
    indicator_changes: Sequence[Change] = ()
    indicator_runs: Optional[int] = None
    slow: bool = False     # many sampled runs: in make test-slow (and the mutation suite) only

    def spec(self, datasets: Sequence[Dataset]) -> AuditSpec:
        tables = dict(self.tables)
        planned = self.job.planned(datasets[0]) if self.measures or (
            self.indicator_changes and isinstance(self.job, ReleaseLayerJob)) else None
        if self.measures:
            for name, columns in self.measures.items():
                rule = tables[name]
                tables[name] = _replace(rule, bounds={**rule.bounds,
                                                      **bounds_from_measures(planned, columns)})
        if self.indicator_changes and isinstance(self.job, ReleaseLayerJob):
            claim = claim_from_plan(planned)
            for name, rule in tables.items():
                if (rule.keys_private or rule.thresholded) and rule.indicator_claim is None:
                    tables[name] = _replace(rule, indicator_claim=claim)
        reports = dict(self.reports)
        if isinstance(self.job, ReleaseLayerJob):
            noisy = MARKER_NOISY + (MARKER_NOISY_KEYS if self.keys_private else ()) + self.marker_noisy
            reports.setdefault("*RELEASE.json", ReportRule(noisy_fields=noisy))
        return AuditSpec(job=self.job, units=self.units, tables=tables, reports=reports,
                         relation=self.relation,
                         changes=tuple(self.changes) if self.changes is not None else None,
                         indicator_changes=tuple(self.indicator_changes),
                         indicator_runs=self.indicator_runs)


def claim_from_plan(planned: Sequence) -> EpsDelta:
    """The (epsilon, delta) of all the plan's releases together (their guarantees summed: basic
    composition) -- a valid claim for any indicator of what they release."""
    guarantees = [p.guarantee() for p in planned]
    return EpsDelta(sum(g.epsilon for g in guarantees), sum(g.delta for g in guarantees))


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
    results = [audit(dataclasses.replace(spec, modes=("exact",)), datasets, changes=changes, seed=seed)]
    noisy_changes = changes if changes is not None else entry.noisy_changes
    if noisy_changes is None or noisy_changes:   # noisy_changes=(): an exact-only audit
        results.append(audit(dataclasses.replace(spec, modes=("noisy",)), datasets,
                             changes=noisy_changes, seed=seed))
    # the sampled indicators: of the registered changes, or of those requested among them
    indicator_changes = tuple(c for c in spec.indicator_changes
                              if changes is None or c in {Change(x) for x in changes})
    if indicator_changes:
        results.append(audit(dataclasses.replace(spec, modes=("indicators",),
                                                 indicator_changes=indicator_changes),
                             datasets, seed=seed))
    return AuditResult(violations=sum((r.violations for r in results), ()),
                       runs=sum(r.runs for r in results), pairs=sum((r.pairs for r in results), ()))


__all__ = ["JobAudit", "REGISTRY", "ReleaseLayerJob", "audit_job", "bounds_from_measures",
           "claim_from_plan", "read_released", "register", "rows_as_csv", "rows_as_jsonl"]


# --------------------------------------------------------------------------------------------
# Registered audits (one block per job; tests/accounting/verification/test_audits.py runs each in make test)
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
    from accounting.verification.audit import synthetic_dataset
    from pipelines.ara import summary_reports

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
        # noisy_sum's interval moves with it; its std is public and must not move
        tables={"*/summary.csv": TableRule(keys=("bucket",), noisy=(
            "noisy_sum", "noisy_sum_ci95_low", "noisy_sum_ci95_high"), public_keys=released)},
        measures={"*/summary.csv": {"noisy_sum": "summary"}},
        changes=(Change.ADD_HEAVY, Change.ADD_MIXED_IDS, Change.REBATCH),
        noisy_changes=(Change.REBATCH,))




def _centralnotice_audit(thresholds: bool = False, spread: bool = False,
                         target: bool = False) -> JobAudit:
    """CentralNotice user-DP clicks. With ``target`` (``centralnotice/target``): discrete
    Gaussian clicks (up to two keys per user) calibrated jointly with the impressions to one
    target (``privacy.target``, pld: each measure gets more than its weight's share of epsilon,
    the release is charged what they compose to). With ``thresholds``
    (``centralnotice/thresholds``): a click release threshold of 0.5 (value mode: a suppressed
    count is null) and epsilon 0.1 per measure, so that the sampled released/suppressed
    indicators of the lone user's key -- one or two clicks in D, none in D' -- need few seeds
    (about 18 per side). With ``spread`` as well
    (``centralnotice/thresholds/l0_2``, slow): the lone user clicks once in each of two keys of
    its own (L0 = max_clicks_per_user = 2), so removing it moves both across the threshold and
    the joint indicators of the two keys are sampled too."""
    import datetime as dt
    import itertools

    from accounting.verification.audit import synthetic_dataset
    from pipelines.centralnotice import job as centralnotice
    from release_testkit import (CN_BANNERS, CN_CLK_HEADER, CN_DAY1, CN_IMP_HEADER,
                                 CN_PROJECTS, CN_RELEASE1, LOW, cn_config, write_csv, write_json)

    countries = ["DE", "FR"]   # RU (protected) is never released: a key of its own
    keys = [("C1", b, c, p, CN_DAY1) for b, c, p in itertools.product(CN_BANNERS, countries, CN_PROJECTS)]
    units = Units(column="user_id", keys=CN_CLK_HEADER[:5], public_keys=keys,
                  fresh_keys=[("C1", CN_BANNERS[0], "RU", CN_PROJECTS[0], CN_DAY1)],
                  heavy_keys=2, heavy_rows=3)
    day = dt.date.fromisoformat(CN_DAY1)
    released = [k[:4] + (day,) for k in keys]
    clicks = {"noise": "discrete_laplace", "epsilon": 0.1 if thresholds else 1.0, "neighbouring": "user",
              "max_clicks_per_user": 2, "bound_per": "period",
              "release_threshold": 0.5 if thresholds else LOW}
    impressions = {"epsilon": 0.1} if thresholds else None
    if target:
        clicks = {"noise": "discrete_gaussian", "epsilon": 0.5, "delta": 1e-7, "neighbouring": "user",
                  "max_clicks_per_user": 2, "bound_per": "period", "release_threshold": LOW}
        impressions = {"epsilon": 0.5}

    def write(dataset, folder):
        files = rows_as_csv("clicks", CN_CLK_HEADER)(dataset, folder)
        imp = write_csv(os.path.join(folder, "imp.csv"), CN_IMP_HEADER,
                        [k + (100 + 10 * i,) for i, k in enumerate(keys[:3])])
        data = cn_config(clicks=clicks, impressions=impressions)
        if target:
            data["accountant"] = "pld"
            data["campaigns"][0]["privacy"].update(
                target={"epsilon": 1.0, "delta": 1e-7},
                budget={"campaign_total": {"epsilon": 8.0, "delta": 1e-6},
                        "per_period": {"epsilon": 4.0, "delta": 1e-6}})
        config = write_json(os.path.join(folder, "config.json"), data)
        return {**files, "impressions": [imp], "config": [config]}

    def datasets():
        if not thresholds:
            return [synthetic_dataset(units, seed=7, n_units=6, batches=2, empty_keys=2)]
        # users 1-5 click twice in each of the first three keys; user 6 once, alone in the
        # sixth: removing it takes that key's clicks from 1 to 0, across the threshold
        rows = [{"user_id": u, **dict(zip(CN_CLK_HEADER[:5], keys[i]))} for u in range(1, 6)
                for i in (0, 1, 2) for _ in range(2)]
        rows.append({"user_id": 6, **dict(zip(CN_CLK_HEADER[:5], keys[5]))})
        if spread:
            rows.append({"user_id": 6, **dict(zip(CN_CLK_HEADER[:5], keys[4]))})
        return [Dataset(batches=[rows[0::2], rows[1::2]],
                        name="lone-clicks-in-two-keys" if spread else "lone-click")]

    if thresholds:   # the other changes are the plain audit's
        changes = (Change.REMOVE_LONE, Change.REBATCH)
        # the marker's summary counts suppressed values: noisy
        extra = dict(indicator_changes=(Change.REMOVE_LONE,), keys_private=True)
    else:
        # ADD_HEAVY: a user in heavy_keys + 1 = 3 keys, beyond max_clicks_per_user = 2 (L0 > 1)
        changes = (Change.ADD_MIXED_IDS, Change.ADD_ALONE, Change.ADD_HEAVY, Change.ADD_SPREAD,
                   Change.REBATCH)
        extra = {}
    return JobAudit(
        name="centralnotice/thresholds/l0_2" if spread else
             "centralnotice/thresholds" if thresholds else
             "centralnotice/target" if target else "centralnotice",
        job=ReleaseLayerJob(
            module=centralnotice, write=write,
            request=lambda files, options: centralnotice.CentralNoticeRequest(
                config=files["config"][0], impressions=tuple(files["impressions"]),
                clicks=tuple(files["clicks"]), release=CN_RELEASE1, num_shards=2,
                options=options)),
        units=units,
        datasets=datasets,
        # impressions are never thresholded away (LOW), so every public key stays released
        # each value's interval moves with it; its std is public (null only where a threshold
        # suppressed the value, so with thresholds it is an indicator like the value)
        tables={"*/centralnotice.parquet": TableRule(
            keys=CN_CLK_HEADER[:5], public_keys=released,
            noisy=("impressions", "impressions_ci95_low", "impressions_ci95_high", "clicks",
                   "clicks_ci95_low", "clicks_ci95_high") + (("clicks_std",) if thresholds else ()),
            thresholded=("clicks", "clicks_ci95_low", "clicks_ci95_high", "clicks_std")
            if thresholds else ())},
        measures={"*/centralnotice.parquet": {"impressions": "impressions", "clicks": "clicks"}},
        changes=changes, noisy_changes=(Change.REBATCH,), slow=spread, **extra)


register(_centralnotice_audit())
register(_centralnotice_audit(thresholds=True))
register(_centralnotice_audit(thresholds=True, spread=True))
register(_centralnotice_audit(target=True))


def _reach_frequency_audit() -> JobAudit:
    from accounting.verification.audit import synthetic_dataset
    from pipelines.reach_frequency import job as reach_frequency

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
    from accounting.verification.audit import synthetic_dataset
    from accounting.budget import PrivacyBudget
    from accounting.sensitivity import ContributionBounds, Neighbouring
    from transforms.metrics import Count, Median, PrivacyUnitCount, Quantiles, Std, Sum, Variance
    from transforms.selection import PrivateSelection, SelectionStrategy

    Job = exact_aggregate_job_type()
    keys = [f"k{i}" for i in range(6)]
    units = Units(column="user", keys=("k",), public_keys=keys, fresh_keys=["z1", "z2"],
                  values={"v": [0.0, 4.0, 100.0, -3.0]}, heavy_keys=3, heavy_rows=3)
    bounds = ContributionBounds(max_partitions=2, max_contributions_per_partition=2, min_value=0, max_value=10)
    keyset = Job(value="v", metrics=[Count(), Sum(), PrivacyUnitCount()], bounds=bounds,
                 budget=PrivacyBudget(epsilon=1.0), public_keys=keys)
    direct_sum = Job(value="v", metrics=[Sum()], bounds=bounds, budget=PrivacyBudget(epsilon=1.0),
                     public_keys=keys)
    high_units = Units(column="user", keys=("k",), public_keys=keys, fresh_keys=["z1", "z2"],
                       values={"v": [100.0, 50.0]}, heavy_keys=3, heavy_rows=3)

    def high_data():
        return [synthetic_dataset(high_units, seed=2, n_units=12, batches=3,
                                  keys=["k0", "k1", "k3", "k4", "k5", "k2"])]
    # variance, std and quantiles (issue 16): derived columns, audited for structure and as noisy
    spread = Job(value="v", metrics=[Count(), Variance(), Std(), Quantiles([0.5, 0.9], branching=4, depth=2)],
                 bounds=bounds, budget=PrivacyBudget(epsilon=1.0), public_keys=keys)
    # a median by permute-and-flip over the leaves (issue 39: one quantile selects)
    median = Job(value="v", metrics=[Count(), Median()], bounds=bounds,
                 budget=PrivacyBudget(epsilon=1.0), public_keys=keys)
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
    # vector sums (issue 16): rows clipped to max_norm in L1 or L2; the units' vectors go far
    # beyond the ball, so a missing clip moves a coordinate by more than its stated bound
    vector_units = Units(column="user", keys=("k",), public_keys=keys, fresh_keys=["z1", "z2"],
                         values={"e": [[0.5, -0.5, 0.0, 0.0], [100.0, -100.0, 50.0, 0.0],
                                       [-3.0, 4.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]},
                         heavy_keys=3, heavy_rows=3)

    def vector_job(norm):
        from transforms.metrics import VectorSum

        return Job(value="e", metrics=[Count(), VectorSum(dimension=4, max_norm=1.5, norm=norm)],
                   bounds=ContributionBounds(max_partitions=2, max_contributions_per_partition=2),
                   budget=PrivacyBudget(epsilon=1.0), public_keys=keys)

    def vector_data():
        return [synthetic_dataset(vector_units, seed=3, n_units=12, batches=3,
                                  keys=["k0", "k1", "k3", "k4", "k5", "k2"])]

    # release thresholds and private selection at a small epsilon, with a key that one
    # neighbouring change moves across the threshold: the sampled released/suppressed
    # indicators (a threshold on the exact value is released on every seed on one side only)
    thresholds = Job(value="v", metrics=[Count(threshold=0.5), Sum()], bounds=bounds,
                     budget=PrivacyBudget(epsilon=0.2), public_keys=keys)
    at_threshold = Job(metrics=[Count()],
                       bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
                       budget=PrivacyBudget(epsilon=0.25, delta=1e-2),
                       selection=PrivateSelection(strategy=SelectionStrategy.LAPLACE_THRESHOLDING,
                                                  weight=3.0))
    boundary = int(at_threshold.declared().selector.threshold)   # kept iff units + noise > boundary
    selection_units = Units(column="user", keys=("k",), fresh_keys=["z1"], heavy_keys=0, heavy_rows=1)

    def selection_data():
        # k0 holds exactly `boundary` units (one more crosses), k1 a few, k2 one
        rows = [{"user": f"{k}-{i}", "k": k} for k, n in (("k0", boundary), ("k1", 3), ("k2", 1))
                for i in range(n)]
        return [Dataset(batches=[rows[0::2], rows[1::2]], name=f"at-threshold(k0={boundary})")]

    # L0 > 1 (issue 40.7): one unit moves three keys at once, each of them at the selection's
    # boundary; the sampled indicators include the joint events of the three keys (a selection
    # calibrated for one changed key carries three times its loss there)
    wide = Job(metrics=[Count()],
               bounds=ContributionBounds(max_partitions=3, max_contributions_per_partition=1),
               budget=PrivacyBudget(epsilon=0.25, delta=1e-2),
               selection=PrivateSelection(strategy=SelectionStrategy.LAPLACE_THRESHOLDING,
                                          weight=3.0))
    wide_boundary = int(wide.declared().selector.threshold)
    # ADD_HEAVY puts the new unit in heavy_keys + 1 = 3 keys (the busiest: k0-k2), 2 rows each
    wide_units = Units(column="user", keys=("k",), fresh_keys=["z1"], heavy_keys=2, heavy_rows=1)

    def wide_data():
        # k0-k2 hold exactly `wide_boundary` units each (the heavy unit crosses all three), k3 a few
        rows = [{"user": f"{k}-{i}", "k": k} for k, n in (("k0", wide_boundary), ("k1", wide_boundary),
                                                          ("k2", wide_boundary), ("k3", 2))
                for i in range(n)]
        return [Dataset(batches=[rows[0::2], rows[1::2]], name=f"three-at-threshold({wide_boundary})")]

    return [
        aggregate_audit("dp_aggregate/selection/thresholds/l0_3", wide, wide_units, wide_data,
                        changes=(Change.ADD_HEAVY, Change.REMOVE_HEAVY, Change.REBATCH),
                        noisy_changes=noisy, indicator_changes=(Change.ADD_HEAVY,), slow=True),
        aggregate_audit("dp_aggregate/keyset/thresholds", thresholds, units, data,
                        changes=(Change.REMOVE_LONE, Change.ADD_EMPTY_KEY, Change.REBATCH),
                        noisy_changes=noisy, indicator_changes=(Change.REMOVE_LONE,)),
        aggregate_audit("dp_aggregate/selection/thresholds", at_threshold, selection_units,
                        selection_data, changes=(Change.ADD_HEAVY, Change.REBATCH),
                        noisy_changes=noisy, indicator_changes=(Change.ADD_HEAVY,)),
        aggregate_audit("dp_aggregate/keyset", keyset, units, data, changes=exact_changes,
                        noisy_changes=noisy),
        # a sum released as its own measure (not derived from a normalised sum and a count):
        # its values clamped to [min_value, max_value] and its sensitivity checked directly
        # (every value of a new unit beyond max_value: each kept row moves its sum by max_value)
        aggregate_audit("dp_aggregate/keyset/direct_sum", direct_sum, high_units, high_data,
                        changes=(Change.ADD_HEAVY, Change.REBATCH), noisy_changes=()),
        aggregate_audit("dp_aggregate/keyset/vector_sum_l1", vector_job("l1"), vector_units,
                        vector_data, changes=exact_changes, noisy_changes=noisy),
        aggregate_audit("dp_aggregate/keyset/vector_sum_l2", vector_job("l2"), vector_units,
                        vector_data, changes=exact_changes, noisy_changes=noisy),
        aggregate_audit("dp_aggregate/selection", selection, units, data, changes=exact_changes,
                        noisy_changes=noisy),
        aggregate_audit("dp_aggregate/keyset/spread_metrics", spread, units, data, changes=exact_changes,
                        noisy_changes=noisy),
        aggregate_audit("dp_aggregate/keyset/median_selection", median, units, data,
                        changes=exact_changes, noisy_changes=noisy),
        # the dict / Row input path: one batch may mix id types
        aggregate_audit("dp_aggregate/keyset/dicts", keyset.with_(input="dicts"), units, data,
                        changes=(Change.ADD_MIXED_IDS, Change.REBATCH), noisy_changes=()),
        aggregate_audit("dp_aggregate/selection/substitute", selection.with_(**substitute), units,
                        data, changes=substitute_changes, noisy_changes=noisy_substitute),
        # issue 39: a public keyset (k0-k2; k2 without rows) and private selection of the keys
        # outside it, under one contribution bound, in one DPAggregate
        aggregate_audit("dp_aggregate/keyset_and_selection",
                        selection.with_(public_keys=keys[:3], outside_keys=[*keys[3:], "z1", "z2"]),
                        units, data, changes=exact_changes, noisy_changes=noisy),
    ]


for _entry in _aggregate_audits():
    register(_entry)


def _choose_bounds_audit() -> JobAudit:
    """choose_bounds (transforms/utility.py): each candidate's utility in the quantile
    mechanism moves by at most its stated sensitivity when one unit is added or removed."""
    from aggregate_kit import ChooseBoundsJob

    from accounting.verification.audit import synthetic_dataset

    job = ChooseBoundsJob()
    keys = [f"k{i}" for i in range(6)]
    units = Units(column="user", keys=("k",), public_keys=keys, fresh_keys=["z1"], heavy_keys=5,
                  heavy_rows=9)

    def data():
        return [synthetic_dataset(units, seed=4, n_units=14, batches=3, max_keys=4, max_rows=6,
                                  keys=["k0", "k1", "k3", "k4", "k5", "k2"])]

    return JobAudit(name="dp_aggregate/choose_bounds", job=job, units=units, datasets=data,
                    tables={"choice": job.rule()}, reports={"explain": ReportRule()},
                    changes=(Change.ADD_HEAVY, Change.ADD_EMPTY_KEY, Change.ADD_ALONE,
                             Change.ADD_MIXED_IDS, Change.REMOVE_HEAVY, Change.REMOVE_LONE,
                             Change.REBATCH),
                    noisy_changes=(Change.REBATCH,))


register(_choose_bounds_audit())


# ---- ARA event-level reports (k-ary randomized response per source, estimates debiased) ------

def _with_occurrence(table: Table, keys: Sequence[str]) -> Table:
    """``table`` with an ``n`` column: the how-many-th row of its ``keys`` this is (a source may
    send two identical noisy reports; the audit keys each row by (keys, n))."""
    index = [table.index(k) for k in keys]
    seen, rows = {}, []
    for row in table.rows:
        key = tuple(row[i] for i in index)
        seen[key] = seen.get(key, 0) + 1
        rows.append(tuple(row) + (str(seen[key]),))
    return Table(columns=tuple(table.columns) + ("n",), rows=rows, types=None)


@dataclass(frozen=True, kw_only=True)
class AdaptedJob(ReleaseLayerJob):
    """A ReleaseLayerJob whose released tables are read through ``adapt(name, table) -> table``
    (typed key columns of a CSV, an occurrence column for tables that may repeat a row)."""

    adapt: Callable[[str, Table], Table]

    def __call__(self, dataset: Dataset, seed: int, exact: bool) -> Release:
        import dataclasses

        release = super().__call__(dataset, seed, exact)
        return dataclasses.replace(release, tables={name: self.adapt(name, table)
                                                    for name, table in release.tables.items()})


def typed_columns(table: Table, columns: Mapping[str, Callable]) -> Table:
    """``table`` with the text of ``columns`` parsed (``{"value": int}``; empty text: None), so
    that numeric keys are ordered as numbers."""
    index = {table.index(c): parse for c, parse in columns.items()}
    rows = [tuple((index[i](v) if v != "" else None) if i in index else v
                  for i, v in enumerate(row)) for row in table.rows]
    return Table(columns=table.columns, rows=rows, types=table.types)


def _event_level_audit() -> JobAudit:
    """One source's conversions added, removed or replaced (the registered sources are public and
    fixed: the new source of an ADD / SUBSTITUTE neighbour is registered without conversions).

    The exact mode keeps the randomized response (no noise-free variant: the randomness IS the
    mechanism), but under one testing key every source's draws are the same in D and D' (keyed
    per source), so the stated sensitivity of the estimates -- "one source moves its group's rows
    by at most R / (1 - p), draws fixed" -- is checked exactly, and the noisy reports may differ
    in that source's rows only (at most 2R report rows)."""
    import itertools

    from pipelines.ara import event_level_reports as job

    cells = list(itertools.product([0, 1], [0, 1]))            # (trigger_data, window), T = w = 2
    units = Units(column="source_id", keys=("trigger_data", "window"), public_keys=cells,
                  heavy_keys=2, heavy_rows=2)
    n_units, new_source = 8, 8 + 1000          # accounting.verification.audit's new unit id: max id + 1000
    campaigns = {s: ("c1" if s % 2 else "c2") for s in [*range(1, n_units + 3), new_source]}

    def datasets():
        from accounting.verification.audit import synthetic_dataset
        d = synthetic_dataset(units, seed=13, n_units=n_units, batches=2)
        return [Dataset(batches=d.batches, name=d.name, extra=campaigns)]

    def write(dataset, folder):
        files = rows_as_csv("conversions", ["source_id", "trigger_data", "window"])(dataset, folder)
        sources = os.path.join(folder, "sources.csv")
        with open(sources, "w") as handle:
            handle.write("source_id,campaign\n")
            handle.writelines(f"{s},{c}\n" for s, c in sorted(dataset.extra.items()))
        return {**files, "sources": [sources]}

    max_reports = 2
    # the job's public order: per group, the values, then the all-values row (empty trigger_data)
    estimates = [(c, t) for c in ("c1", "c2") for t in ("0", "1", "")]
    return JobAudit(
        name="event_level_reports",
        job=AdaptedJob(
            module=job, write=write,
            adapt=lambda name, t: (_with_occurrence(t, ("source_id", "window", "trigger_data"))
                                   if name.endswith("/reports.csv") else t),
            request=lambda files, options: job.EventLevelReportsRequest(
                sources=tuple(files["sources"]), conversions=tuple(files["conversions"]),
                epsilon=3.0, batch_id="audit", trigger_data_cardinality=2, report_windows=2,
                max_reports=max_reports, group_by=("campaign",), options=options)),
        units=units, datasets=datasets, relation="add_remove",
        tables={"*/reports.csv": TableRule(keys=("source_id", "window", "trigger_data", "n"),
                                           keys_private=True, changed_keys=2 * max_reports),
                "*/estimates.csv": TableRule(keys=("campaign", "trigger_data"),
                                             noisy=("estimate", "variance",
                                                    "estimate_ci95_low", "estimate_ci95_high", "estimate_std"),
                                             public_keys=estimates, order=Order.PUBLIC)},
        measures={"*/estimates.csv": {"estimate": "event_level_reports"}},
        keys_private=True,         # the marker's row count of reports.csv is the noisy reports'
        changes=(Change.ADD_HEAVY, Change.REMOVE_HEAVY, Change.REBATCH),
        noisy_changes=(Change.REBATCH,))


register(_event_level_audit())


# ---- Local and shuffle DP: the clients' randomizers run before the job ---------------------
#
# ldp_frequencies, ldp_heavy_hitters and shuffle_sum read what clients sent: reports already
# randomized on each device (or noisy shares). A dataset here is the clients' true values, one
# row per client ({"client", "value"}); writing it runs each client's randomizer, keyed by its id
# under a fixed public testing source (as a device would, independently of the job and its key),
# so a neighbour -- one client's value replaced, the relation these jobs state -- changes that
# client's report only. The jobs add no randomness of their own ("no server-side randomness"):
# their exact and noisy testing modes release the same bytes, and their plans state no
# sensitivity (the guarantee is each report's local epsilon, or the shuffle-model analysis of
# the noisy shares, not an additive mechanism over a bounded query). So these audits check
# structure (files, schema, public rows and order, fixed columns, marker text) on a replaced
# client and on REBATCH, in one mode; there is no exact sensitivity check to make.

CLIENT_RANDOMNESS = 424242   # the simulated devices' testing seed (not the job's key)


def client_units(domain: Sequence[int]) -> Units:
    """One row per client: its value is its "key", so SUBSTITUTE_EMPTY_KEY replaces one client by
    a client holding a value no one holds."""
    return Units(column="client", keys=("value",), public_keys=[(v,) for v in domain],
                 heavy_keys=1, heavy_rows=1)


def clients_dataset(values: Sequence[int], batches: int = 2) -> Dataset:
    rows = [{"client": i + 1, "value": int(v)} for i, v in enumerate(values)]
    size = -(-len(rows) // batches)
    return Dataset(batches=[rows[i:i + size] for i in range(0, len(rows), size)],
                   name=f"clients(n={len(rows)})")


def client_ids_values(batch) -> tuple:
    import numpy as np

    ids = np.array([int(float(r["client"])) for r in batch], dtype=np.int64)
    return ids, np.array([int(r["value"]) for r in batch], dtype=np.int64)


def clients_as_reports(input_name: str, encode: Callable) -> Callable:
    """Each batch as one Parquet file of the reports ``encode(ids, values, source)`` returns."""
    def write(dataset: Dataset, folder: str) -> dict:
        from transforms.ldp.randomness import KeyedRandomness
        from transforms.ldp.sample_data import write_table

        paths = []
        for i, batch in enumerate(dataset.batches):
            ids, values = client_ids_values(batch)
            source = KeyedRandomness.for_testing(CLIENT_RANDOMNESS, "audit-clients")
            path = os.path.join(folder, f"{input_name}-{i:03d}.parquet")
            write_table(encode(ids, values, source), path)
            paths.append(path)
        return {input_name: paths}
    return write


CLIENT_CHANGES = (Change.SUBSTITUTE_EMPTY_KEY, Change.REBATCH)


def _ldp_frequencies_audit() -> JobAudit:
    import numpy as np

    from pipelines.ldp import frequencies as job
    from transforms.ldp import make_oracle
    from transforms.ldp.randomizers import randomize

    domain = 8
    oracle = make_oracle("grr", epsilon=1.5, domain_size=domain)
    values = np.random.default_rng(3).integers(0, domain - 1, 40)       # value 7: no client
    return JobAudit(
        name="ldp_frequencies",
        job=AdaptedJob(
            module=job,
            write=clients_as_reports("reports", lambda ids, values, source: randomize(
                oracle, values, source=source, ids=ids.astype(np.uint64))),
            adapt=lambda name, t: typed_columns(t, {"value": int}),
            request=lambda files, options: job.FrequenciesRequest(
                input=tuple(files["reports"]), oracle="grr", epsilon=1.5, domain_size=domain,
                collection_id="audit", options=options)),
        units=client_units(range(domain)), relation="substitute",
        datasets=lambda: [clients_dataset(values)],
        tables={"*/estimates.csv": TableRule(keys=("value",), noisy=("estimate", "frequency",
                                                                     "estimate_ci95_low", "estimate_ci95_high", "estimate_std"),
                                             public_keys=[(v,) for v in range(domain)])},
        changes=CLIENT_CHANGES, noisy_changes=())


register(_ldp_frequencies_audit())


def _ldp_heavy_hitters_audit() -> JobAudit:
    import numpy as np

    from pipelines.ldp import heavy_hitters as job
    from transforms.ldp.pem import PEMPlan, client_reports

    plan = PEMPlan(oracle="grr", epsilon=3.0, value_bits=8, top_k=3)
    rng = np.random.default_rng(4)
    popular = [17, 200, 33, 90]
    values = np.where(rng.random(240) < 0.7, rng.choice(popular, 240), rng.integers(0, 256, 240))
    return JobAudit(
        name="ldp_heavy_hitters",
        job=AdaptedJob(
            module=job,
            write=clients_as_reports("reports", lambda ids, values, source: client_reports(
                plan, values, source=source, ids=ids.astype(np.uint64))),
            adapt=lambda name, t: typed_columns(
                t, {"rank": int, "round": int} if "rank" in t.columns else {"round": int, "value": int}),
            request=lambda files, options: job.HeavyHittersRequest(
                input=tuple(files["reports"]), oracle="grr", epsilon=3.0, value_bits=8, top_k=3,
                collection_id="audit", options=options)),
        units=client_units(range(256)), relation="substitute",
        datasets=lambda: [clients_dataset(values)],
        # ranks 1..k are public; each round's candidates are post-processing of the reports
        tables={"*/heavy_hitters.csv": TableRule(
                    keys=("rank",), noisy=("value", "estimate", "frequency",
                                           "estimate_ci95_low", "estimate_ci95_high", "estimate_std"),
                    public_keys=[(r,) for r in range(1, 4)]),
                "*/rounds.csv": TableRule(keys=("round", "value"),
                                          noisy=("estimate", "frequency",
                                                 "estimate_ci95_low", "estimate_ci95_high", "estimate_std"), keys_private=True)},
        keys_private=True, changes=CLIENT_CHANGES, noisy_changes=())


register(_ldp_heavy_hitters_audit())


def _shuffle_sum_audit() -> JobAudit:
    import numpy as np

    from pipelines.ldp import shuffle_sum as job
    from transforms.ldp.shuffle import SplitAndMix, shares_table

    spec = SplitAndMix(num_clients=30, value_bound=5, epsilon=1.0, delta=1e-6)
    values = np.random.default_rng(5).integers(0, 5, 30)                  # value 5: no client
    return JobAudit(
        name="shuffle_sum",
        job=ReleaseLayerJob(
            module=job,
            write=clients_as_reports("shares", lambda ids, values, source: shares_table(
                spec.encode(values, source=source, ids=ids), spec)),
            request=lambda files, options: job.ShuffleSumRequest(
                input=tuple(files["shares"]), num_clients=30, value_bound=5, epsilon=1.0,
                delta=1e-6, collection_id="audit", options=options)),
        units=client_units(range(6)), relation="substitute",
        datasets=lambda: [clients_dataset(values)],
        # one row: the estimate and its interval are noisy; estimate_std, clients and messages
        # are public (the shuffler sees the counts) and must not move when one client's value is
        # replaced
        tables={"*/sum.csv": TableRule(keys=(), noisy=("estimate", "estimate_ci95_low",
                                                       "estimate_ci95_high"))},
        changes=CLIENT_CHANGES, noisy_changes=())


register(_shuffle_sum_audit())


def _label_dp_audit() -> JobAudit:
    """Label DP: one example's label changed (ids and features are public and fixed): the
    REPLACE_VALUES neighbour. The job randomizes server-side under its release key, each label
    with randomness keyed by the key and the example id; the exact testing mode keeps the
    randomized response (it IS the mechanism: there is no noise to switch off, and an identity
    randomizer would audit a different job). Under one testing key every other example's draw is
    the same in D and D', so the audit checks, besides structure, that the change stays on its
    example: its randomized label only (label_unbiased of one example, by at most the span
    1 / (1 - 2p) of its two values, p = 1 / (1 + e^epsilon)) and the randomized counts by one in
    at most two labels. These bounds follow from the relation and the draw being fixed; the plan
    states none (randomized response has no additive sensitivity)."""
    import math

    import numpy as np

    from pipelines.ldp import label_dp as job

    epsilon = 1.0
    p = 1.0 / (1.0 + math.exp(epsilon))
    rng = np.random.default_rng(8)
    rows = [{"example_id": i, "feature_1": round(float(x), 3), "label": "yes" if x > 0 else "no"}
            for i, x in enumerate(rng.normal(size=30))]
    units = Units(column="example_id", keys=(), values={"label": ["no", "yes"]})
    return JobAudit(
        name="label_dp",
        job=ReleaseLayerJob(
            module=job, write=rows_as_csv("rows", ["example_id", "feature_1", "label"]),
            request=lambda files, options: job.LabelDPRequest(
                input=tuple(files["rows"]), labels=("no", "yes"), epsilon=epsilon,
                features=("feature_1",), dataset_id="audit", options=options)),
        units=units, relation="substitute",
        datasets=lambda: [Dataset(batches=[rows[:15], rows[15:]], name="examples(n=30)")],
        tables={"*/dataset.parquet": TableRule(
                    keys=("example_id",), noisy=("label", "label_unbiased"),
                    bounds={"label_unbiased": Bound(l0=1, linf=1.0 / (1.0 - 2.0 * p))},
                    tolerance=1e-9 / (1.0 - 2.0 * p) + 1e-12,
                    public_keys=sorted((str(r["example_id"]),) for r in rows)),
                "*/debias.jsonl": TableRule(
                    keys=("label_index",), noisy=("randomized_count", "estimated_count",
                                                  "estimated_count_ci95_low",
                                                  "estimated_count_ci95_high",
                                                  "estimated_count_std"),
                    bounds={"randomized_count": Bound(l0=2, linf=1, l1=2)},
                    public_keys=[(0,), (1,)])},
        changes=(Change.REPLACE_VALUES, Change.REBATCH), noisy_changes=())


register(_label_dp_audit())


# ---- Masked LARk: browsers (share) -> each helper -> the ad server (combine); training -------

LARK_PARAMS = {"kind": "aggregation", "value_columns": ["value"], "lower": 0.0, "upper": 10.0,
               "epsilon": 1.0, "k": 5, "fraction_bits": 8, "num_helpers": 2}
LARK_STAGES = ("share", "helpers", "combine")


@dataclass(frozen=True, kw_only=True)
class LarkChain:
    """share -> helper 0, helper 1 -> combine (up to ``last``), each run through the release
    layer as its operator runs it, in the same testing mode; the release is every stage's,
    names prefixed by the stage (share/, helper-0/, helper-1/, combine/). A dataset is the
    browsers' records (record_id, key, value); the registered relation of every stage is the
    helpers' "replace one report's values" (the batch's reports, keys and counts fixed)."""

    last: str

    def __call__(self, dataset: Dataset, seed: int, exact: bool) -> Release:
        from pipelines.masked_lark import combine as masked_lark_combine
        from pipelines.masked_lark import helper as masked_lark_helper
        from pipelines.masked_lark import share as masked_lark_share
        from pipelines.release import ReleaseOptions

        folder = tempfile.mkdtemp(prefix="audit-lark-")
        options = lambda name: ReleaseOptions(output=os.path.join(folder, name),  # noqa: E731
                                              testing_seed=seed, exact_testing=exact)
        released = lambda name: os.path.join(folder, name, TESTING_FOLDER)  # noqa: E731
        try:
            records = rows_as_csv("records", ["record_id", "key", "value"])(dataset, folder)
            params = self._params(folder)
            masked_lark_share.run(masked_lark_share.ShareRequest(
                input=tuple(records["records"]), params=params, batch_id="b1",
                options=options("share")))
            stages = {"share": read_released(released("share"))}
            if self.last != "share":
                outputs = []
                for h in (0, 1):
                    reports = os.path.join(released("share"), "masked_lark_share", "b1",
                                           masked_lark_share.output_name(h))
                    masked_lark_helper.run(masked_lark_helper.HelperRequest(
                        input=(reports,), params=params, helper=h, batch_id="b1",
                        options=options(f"helper-{h}")))
                    stages[f"helper-{h}"] = read_released(released(f"helper-{h}"))
                    outputs.append(os.path.join(released(f"helper-{h}"), "masked_lark_helper",
                                                "b1", f"helper-{h}",
                                                masked_lark_helper.output_name(h)))
                if self.last == "combine":
                    masked_lark_combine.run(masked_lark_combine.CombineRequest(
                        helper_outputs=tuple(outputs), params=params, batch_id="b1",
                        options=options("combine")))
                    stages["combine"] = read_released(released("combine"))
            return Release(
                tables={f"{s}/{n}": t for s, r in stages.items() for n, t in r.tables.items()},
                files=[f"{s}/{n}" for s, r in stages.items() for n in r.files],
                reports={f"{s}/{n}": v for s, r in stages.items() for n, v in r.reports.items()})
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    @staticmethod
    def _params(folder: str) -> str:
        path = os.path.join(folder, "params.json")
        with open(path, "w") as handle:
            json.dump(LARK_PARAMS, handle)
        return path

    def planned(self, dataset: Dataset) -> list:
        """The helpers' plans (their Measures state the sensitivity of what combine decodes)."""
        from pipelines.masked_lark import helper as masked_lark_helper
        from pipelines.release import ReleaseOptions

        folder = tempfile.mkdtemp(prefix="audit-lark-plan-")
        try:
            params = self._params(folder)
            return [p for h in (0, 1) for p in masked_lark_helper.JOB.planned(
                masked_lark_helper.HelperRequest(
                    input=(os.path.join(folder, "none.parquet"),), params=params, helper=h,
                    batch_id="b1", options=ReleaseOptions(output=folder, testing_seed=0)))]
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _lark_records() -> list[Dataset]:
    import numpy as np

    rng = np.random.default_rng(21)
    counts = {"A": 12, "B": 6, "C": 5}          # k = 5: A and B released, C (exactly k) not
    rows, i = [], 0
    for key, count in counts.items():
        for _ in range(count):
            rows.append({"record_id": i, "key": key, "value": float(rng.integers(0, 41)) / 4})
            i += 1
    order = rng.permutation(len(rows))
    return [Dataset(batches=[[rows[j] for j in order[:12]], [rows[j] for j in order[12:]]],
                    name="records(n=23)")]


# 1000 is far beyond the declared [0, 10]: the browser must clip it (the helpers cannot)
LARK_UNITS = Units(column="record_id", keys=("key",), values={"value": [0.0, 1000.0]})
# A report is keyed by its report id: uniformly random, drawn from the record's stream, which
# the share job keys by the record's whole *content* (id and values: re-sharing another value
# with the same first share would hand a helper the difference; transforms/lark/randomness.py).
# So the replaced record's report gets a fresh id -- one report id gone, one new (changed_keys
# = 2), every other report identical -- and the helpers' batch_digest (a hash of the batch's
# report ids, which the ad server routes anyway) is as random as the ids: declared noisy. To
# anyone without the browsers' key both are uniform whatever the values. The helper and the
# report's key (public: the relation fixes it) must not move; the shares are uniform.
_LARK_REPORTS = {"share/*/reports_helper_*.parquet": TableRule(
    keys=("batch_id", "report_id"), noisy=("share_value",), keys_private=True, changed_keys=2)}
# A helper releases the keys with more than k reports (fixed by the relation) in public order;
# the params digest is public; its ring sums are uniform alone.
_LARK_HELPERS = {"helper-*/helper_*.parquet": TableRule(keys=("batch_id", "key"),
                                                         noisy=("batch_digest", "share_value"),
                                                         public_keys=[("b1", "A"), ("b1", "B")])}


def _lark_audits() -> list[JobAudit]:
    """The browsers' job spends nothing (no local noise here) and is audited for structure; the
    helpers' for structure in both modes (their output alone is uniform: nothing to bound); the
    ad server's combine -- post-processing, spending nothing -- for structure and for the exact
    sensitivity of what it decodes, which is what the helpers' measures state (one report's
    values replaced moves one key's sum by at most U - L; exact mode: noise-free helper keys)."""
    markers = {"*RELEASE.json": ReportRule(noisy_fields=MARKER_NOISY)}
    return [
        JobAudit(name="masked_lark_share", job=LarkChain(last="share"), units=LARK_UNITS,
                 datasets=_lark_records, tables=_LARK_REPORTS, relation="substitute", reports=markers,
                 changes=(Change.REPLACE_VALUES, Change.REBATCH), noisy_changes=()),
        JobAudit(name="masked_lark_helper", job=LarkChain(last="helpers"), units=LARK_UNITS,
                 datasets=_lark_records, tables={**_LARK_REPORTS, **_LARK_HELPERS},
                 relation="substitute", reports=markers, changes=(Change.REPLACE_VALUES,),
                 noisy_changes=(Change.REPLACE_VALUES, Change.REBATCH)),
        JobAudit(name="masked_lark_combine", job=LarkChain(last="combine"), units=LARK_UNITS,
                 datasets=_lark_records, relation="substitute", reports=markers,
                 tables={**_LARK_REPORTS, **_LARK_HELPERS,
                         "combine/*/aggregates.csv": TableRule(
                             keys=("batch_id", "key"),
                             noisy=("value", "value_ci95_low", "value_ci95_high"),
                             public_keys=[("b1", "A"), ("b1", "B")])},
                 measures={"combine/*/aggregates.csv": {"value": "helper-0/aggregation"}},
                 changes=(Change.REPLACE_VALUES, Change.REBATCH), noisy_changes=()),
    ]


for _entry in _lark_audits():
    register(_entry)


def _lark_train_audit() -> JobAudit:
    """The training driver: one record's features and label replaced (the helpers' gradient
    relation). Structure in both modes (coordinates and their names, steps and suppressed steps
    per epoch: public, from the record count). Exact mode (noise-free helper keys): one epoch of
    ONE step over all records, so the released model is theta - lr * gradient / n and moves by
    the helpers' stated gradient sensitivity (GradientParams.sensitivities, the plan's measure)
    times lr / n -- beyond one step the descent is not a stated bound, so the audit keeps one."""
    import numpy as np

    from pipelines.masked_lark import train as job
    from transforms.lark.params import GradientParams

    n, learning_rate = 12, 0.5
    params = {"kind": "gradient", "num_features": 2, "clip_norm": 1.0, "epsilon": 1.0, "k": 5,
              "fraction_bits": 16, "num_helpers": 2}
    model = {"weights": [0.0, 0.0], "bias": 0.0, "feature_scale": 0.03125, "feature_offset": 128.0}
    stated = GradientParams(**{k: v for k, v in params.items() if k != "kind"}).sensitivities()
    scale = learning_rate / n
    rng = np.random.default_rng(31)
    rows = [{"record_id": i, "x_0": int(rng.integers(0, 256)), "x_1": int(rng.integers(0, 256)),
             "label": int(rng.integers(0, 2))} for i in range(n)]
    columns = ["record_id", "x_0", "x_1", "label"]

    def write(dataset, folder):
        files = rows_as_csv("records", columns)(dataset, folder)
        for name, content in (("params", params), ("model", model)):
            path = os.path.join(folder, f"{name}.json")
            with open(path, "w") as handle:
                json.dump(content, handle)
            files[name] = [path]
        return files

    return JobAudit(
        name="masked_lark_train",
        job=ReleaseLayerJob(
            module=job, write=write,
            request=lambda files, options: job.TrainRequest(
                input=tuple(files["records"]), params=files["params"][0],
                model=files["model"][0], model_id="audit", epochs=1, batch_size=n,
                learning_rate=learning_rate, options=options)),
        units=Units(column="record_id", keys=(), values={"x_0": [0, 255], "x_1": [0, 255],
                                                         "label": [0, 1]}),
        relation="substitute",
        datasets=lambda: [Dataset(batches=[rows[:6], rows[6:]], name=f"records(n={n})")],
        tables={"*/model.csv": TableRule(
                    keys=("coordinate",), noisy=("value",), public_keys=[("0",), ("1",), ("2",)],
                    bounds={"value": Bound(l0=int(stated.l0), linf=stated.linf * scale,
                                           l1=stated.l1 * scale)}),
                "*/training.csv": TableRule(keys=("epoch",), public_keys=[("0",)])},
        changes=(Change.REPLACE_VALUES, Change.REBATCH), noisy_changes=(Change.REPLACE_VALUES,))


register(_lark_train_audit())
