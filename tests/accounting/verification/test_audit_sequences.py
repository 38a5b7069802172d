"""Neighbouring-pair audits of two-batch sequences (issue 30): the ARA jobs (summary reports,
event-level) and the local-DP jobs, against one real ledger.

A unit's rows in batch 1 that come back in batch 2 -- replayed, or re-sent with the whole of
batch 1 -- must add nothing: batch 2 is refused before the charge, or (``--skip_consumed``) it is
byte for byte the release of the world that never had the unit (``accounting.verification.audit.
audit_sequences``; the two worlds get the same keys, ``tests/sequence_kit.py``). A summary-report
source with new reports in both batches must move the released sums by at most 65,536 in L1
over both batches together, the bound each batch's noise is calibrated to. Local-DP collections
are released once (their scope is budgeted at the clients' epsilon), so their "two batches" are
two report batches of one collection. Each audit is also run on the job with its consumed-id
check switched off (``Job.consumes`` returning nothing): it must fail there. The refusal paths
and the heavier variants are marked slow (``make test-slow``).
"""
from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest
from audit_kit import _with_occurrence, typed_columns
from sequence_kit import SequenceJob, marker_rule

from accounting.verification.audit import (AuditSpec, BatchSequence, Bound, Dataset, Order, TableRule, Units,
                              audit_sequences, sequence_pairs, synthetic_dataset)
from pipelines.release import Job

REPLAYS = (BatchSequence.REPLAY, BatchSequence.OVERLAP)


def _audit(job, spec, first, second, kinds, *, replays_kept_once=False, **pairs):
    return audit_sequences(job, spec, sequence_pairs(first, second, spec.units, kinds, **pairs),
                           replays_kept_once=replays_kept_once)


def _split(dataset: Dataset, column: str) -> tuple:
    """Batch 1: the units of the first half of the dataset's files; batch 2: the other units
    (a unit's rows in one batch only: what comes back in batch 2 is the pair's doing)."""
    half = len(dataset.batches) // 2
    mine = {r[column] for b in dataset.batches[:half] for r in b}
    return (Dataset(batches=[[r for r in b if r[column] in mine] for b in dataset.batches],
                    name="b1", extra=dataset.extra),
            Dataset(batches=[[r for r in b if r[column] not in mine] for b in dataset.batches],
                    name="b2", extra=dataset.extra))


def _without_consumes(monkeypatch, module):
    """The job as it was before the consumed-id records: nothing declared, nothing checked."""
    monkeypatch.setattr(type(module.JOB), "consumes", Job.consumes)


# --------------------------------------------------------------------------- ARA summary reports

BUCKETS = [0x10, 0x11, 0x12, 0x13]
SUMMARY_UNITS = Units(column="source_id", keys=("bucket",), public_keys=BUCKETS,
                      values={"value": [40000, 30000, 7, 65536]}, heavy_keys=2, heavy_rows=1)


def _summary_job(skip: bool) -> SequenceJob:
    from pipelines.ara import summary_reports

    def write(dataset, folder, batch):
        domain = os.path.join(folder, "domain.txt")
        with open(domain, "w") as handle:
            handle.writelines(f"{b:#x}\n" for b in BUCKETS)
        path = os.path.join(folder, f"reports-{batch}.jsonl")
        with open(path, "w") as handle:
            for row in dataset.rows():
                handle.write(json.dumps({
                    "report_id": row["report_id"], "source_id": row["source_id"],
                    "order": row.get("order", 0),
                    "contributions": [{"bucket": hex(row["bucket"]), "value": row["value"]}]})
                    + "\n")
        return {"reports": [path], "domain": [domain]}

    return SequenceJob(module=summary_reports, write=write, skip=skip,
                       request=lambda files, options, batch, skip: summary_reports.SummaryReportsRequest(
                           input=tuple(files["reports"]), input_format="reports",
                           output_domain=files["domain"][0], epsilon=4.0, batch_id=batch,
                           skip_consumed=skip, options=options))


def _summary_data() -> tuple:
    d = synthetic_dataset(SUMMARY_UNITS, seed=5, n_units=8, batches=4)
    n = iter(range(10**6))
    batches = [[{**r, "report_id": f"rep-{next(n)}"} for r in b] for b in d.batches]
    return _split(Dataset(batches=batches, name="reports"), "source_id")


def _summary_spec() -> AuditSpec:
    released = [f"{b:#034x}" for b in BUCKETS]
    # the stated sensitivity of the plan's measure: one source moves the sums by at most
    # 65,536 in L1 (and in any one bucket)
    return AuditSpec(job=None, units=SUMMARY_UNITS, reports=marker_rule(("outputs.*.sha256",)),
                     tables={"summary.csv": TableRule(
                         # the interval moves with the value, by its bound; the std is public
                         keys=("bucket",), public_keys=released,
                         noisy=("noisy_sum", "noisy_sum_ci95_low", "noisy_sum_ci95_high"),
                         bounds={c: Bound(l0=len(BUCKETS), linf=65536, l1=65536) for c in (
                             "noisy_sum", "noisy_sum_ci95_low", "noisy_sum_ci95_high")})})


def _split_reports(unit, batch):
    """A new source with a 40,000 report in batch 1 and a 30,000 one in batch 2: 70,000 over
    both, so batch 2 may only spend what is left (25,536): the 30,000 report is dropped."""
    value = (40000, 30000)[batch]
    return [{"source_id": unit, "bucket": BUCKETS[batch], "value": value, "order": batch,
             "report_id": f"split-{unit}-{batch}"}]


@pytest.mark.parametrize("skip", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_summary_reports_second_batch_adds_nothing(skip):
    first, second = _summary_data()
    result = _audit(_summary_job(skip), _summary_spec(), first, second,
                    (*REPLAYS, BatchSequence.SPLIT), split_rows=_split_reports)
    result.assert_ok()
    assert len(result.pairs) == 3


def test_summary_reports_without_consumed_ids_fail_the_sequence_audit(monkeypatch):
    from pipelines.ara import summary_reports

    _without_consumes(monkeypatch, summary_reports)
    first, second = _summary_data()
    result = _audit(_summary_job(True), _summary_spec(), first, second,
                    (BatchSequence.OVERLAP, BatchSequence.SPLIT), split_rows=_split_reports)
    assert not result.passed
    assert {"replayed rows changed batch 2", "sequence l1"} <= result.checks_failed(), str(result)


# --------------------------------------------------------------------------- event-level reports

EVENT_UNITS = Units(column="source_id", keys=("trigger_data", "window"),
                    public_keys=[(t, w) for t in (0, 1) for w in (0, 1)], heavy_keys=2,
                    heavy_rows=2)


def _event_job(skip: bool) -> SequenceJob:
    from pipelines.ara import event_level_reports

    def write(dataset, folder, batch):
        conversions = os.path.join(folder, f"conversions-{batch}.csv")
        with open(conversions, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["source_id", "trigger_data", "window"])
            writer.writerows([r["source_id"], r["trigger_data"], r["window"]]
                             for r in dataset.rows())
        # the batch registers its public sources (all of batch 1's, conversions or not) and
        # every source its rows name (a replayed source is registered again)
        registered = set(dataset.extra["registered"]) | {r["source_id"] for r in dataset.rows()}
        sources = os.path.join(folder, f"sources-{batch}.csv")
        with open(sources, "w") as handle:
            handle.write("source_id,campaign\n")
            handle.writelines(f"{s},{'c1' if s % 2 else 'c2'}\n" for s in sorted(registered))
        return {"sources": [sources], "conversions": [conversions]}

    return SequenceJob(
        module=event_level_reports, write=write, skip=skip,
        adapt=lambda name, t: (_with_occurrence(t, ("source_id", "window", "trigger_data"))
                               if name == "reports.csv" else t),
        request=lambda files, options, batch, skip: event_level_reports.EventLevelReportsRequest(
            sources=tuple(files["sources"]), conversions=tuple(files["conversions"]),
            epsilon=3.0, batch_id=batch, trigger_data_cardinality=2, report_windows=2,
            max_reports=2, group_by=("campaign",), skip_consumed=skip, options=options))


def _event_data() -> tuple:
    d = synthetic_dataset(EVENT_UNITS, seed=13, n_units=10, batches=4)
    first, second = _split(d, "source_id")
    # batch 1 registers its sources (public), batch 2 its own; each batch also registers a
    # source of each campaign without conversions (every group has sources in both)
    mine = sorted({r["source_id"] for r in first.rows()})
    return (Dataset(batches=first.batches, name="b1", extra={"registered": mine + [9001, 9002]}),
            Dataset(batches=second.batches, name="b2", extra={"registered": [9003, 9004]}))


def _event_spec() -> AuditSpec:
    import math

    from pipelines.ara.event_level_reports import estimate_sensitivities, event_config

    class _Request:
        trigger_data_cardinality, report_windows, max_reports, epsilon = 2, 2, 2, 3.0

    stated = estimate_sensitivities(event_config(_Request))
    estimates = [(c, t) for c in ("c1", "c2") for t in ("0", "1", "")]
    assert math.isfinite(stated.l1)
    return AuditSpec(job=None, units=EVENT_UNITS, reports=marker_rule((
        "outputs.*.sha256", "outputs.*.rows", "summary.*")),
        tables={"reports.csv": TableRule(keys=("source_id", "window", "trigger_data", "n"),
                                         keys_private=True, changed_keys=2 * 2),
                "estimates.csv": TableRule(keys=("campaign", "trigger_data"),
                                           noisy=("estimate", "variance",
                                                  "estimate_ci95_low", "estimate_ci95_high", "estimate_std"),
                                           public_keys=estimates, order=Order.PUBLIC,
                                           bounds={"estimate": Bound.of(stated)})})


@pytest.mark.parametrize("skip", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_event_level_second_batch_adds_nothing(skip):
    first, second = _event_data()
    _audit(_event_job(skip), _event_spec(), first, second, REPLAYS).assert_ok()


@pytest.mark.slow
def test_event_level_without_consumed_ids_fails_the_sequence_audit(monkeypatch):
    from pipelines.ara import event_level_reports

    _without_consumes(monkeypatch, event_level_reports)
    first, second = _event_data()
    result = _audit(_event_job(True), _event_spec(), first, second, (BatchSequence.REPLAY,))
    assert "replayed rows changed batch 2" in result.checks_failed(), str(result)


# --------------------------------------------------------------------------- local DP

CLIENT_UNITS = Units(column="client", keys=("value",), public_keys=[(v,) for v in range(8)],
                     heavy_keys=1, heavy_rows=1)


def _clients(n=60, seed=3) -> tuple:
    values = np.random.default_rng(seed).integers(0, 7, n)
    rows = [{"client": i + 1, "value": int(v)} for i, v in enumerate(values)]
    return (Dataset(batches=[rows[:n // 2]], name="b1"), Dataset(batches=[rows[n // 2:]],
                                                                   name="b2"))


def _client_reports(encode):
    def write(dataset, folder, batch):
        from transforms.ldp.randomness import KeyedRandomness
        from transforms.ldp.sample_data import with_client_ids, write_table

        ids = np.array([r["client"] for r in dataset.rows()], dtype=np.uint64)
        values = np.array([r["value"] for r in dataset.rows()], dtype=np.int64)
        # each client's device randomizes once: its report is keyed by its id (a replay is a
        # copy of the same report)
        source = KeyedRandomness.for_testing(424242, "audit-clients")
        path = os.path.join(folder, f"reports-{batch}.parquet")
        write_table(with_client_ids(encode(ids, values, source), ids), path)
        return {"reports": [path]}
    return write


def _frequencies_job(skip: bool) -> SequenceJob:
    from pipelines.ldp import frequencies as ldp_frequencies
    from transforms.ldp import make_oracle
    from transforms.ldp.randomizers import randomize

    oracle = make_oracle("grr", epsilon=1.5, domain_size=8)
    return SequenceJob(
        module=ldp_frequencies, single_release=True, skip=skip,
        write=_client_reports(lambda ids, values, source: randomize(oracle, values,
                                                                    source=source, ids=ids)),
        request=lambda files, options, batch, skip: ldp_frequencies.FrequenciesRequest(
            input=tuple(files["reports"]), oracle="grr", epsilon=1.5, domain_size=8,
            collection_id=batch, skip_consumed=skip, options=options))


def _heavy_hitters_job(skip: bool) -> SequenceJob:
    from pipelines.ldp import heavy_hitters as ldp_heavy_hitters
    from transforms.ldp.pem import PEMPlan, client_reports

    plan = PEMPlan(oracle="grr", epsilon=3.0, value_bits=8, top_k=3)
    return SequenceJob(
        module=ldp_heavy_hitters, single_release=True, skip=skip,
        adapt=lambda name, t: typed_columns(
            t, {"rank": int, "round": int} if "rank" in t.columns else {"round": int, "value": int}),
        write=_client_reports(lambda ids, values, source: client_reports(
            plan, values, source=source, ids=ids)),
        request=lambda files, options, batch, skip: ldp_heavy_hitters.HeavyHittersRequest(
            input=tuple(files["reports"]), oracle="grr", epsilon=3.0, value_bits=8, top_k=3,
            collection_id=batch, skip_consumed=skip, options=options))


def _ldp_spec(tables) -> AuditSpec:
    return AuditSpec(job=None, units=CLIENT_UNITS, tables=tables,
                     reports=marker_rule(("outputs.*.sha256",)))


FREQUENCIES = {"estimates.csv": TableRule(keys=("value",), noisy=("estimate", "frequency",
                                                                  "estimate_ci95_low", "estimate_ci95_high", "estimate_std"),
                                          public_keys=[(str(v),) for v in range(8)])}
HEAVY_HITTERS = {"heavy_hitters.csv": TableRule(keys=("rank",), noisy=(
                     "value", "estimate", "frequency",
                     "estimate_ci95_low", "estimate_ci95_high", "estimate_std"), public_keys=[(1,), (2,), (3,)]),
                 "rounds.csv": TableRule(keys=("round", "value"), noisy=(
                     "estimate", "frequency",
                     "estimate_ci95_low", "estimate_ci95_high", "estimate_std"), keys_private=True)}


@pytest.mark.parametrize("skip", [True, False])
def test_ldp_frequencies_replayed_report_batch_adds_nothing(skip):
    first, second = _clients()
    _audit(_frequencies_job(skip), _ldp_spec(FREQUENCIES), first, second, REPLAYS,
           replays_kept_once=True).assert_ok()


@pytest.mark.slow
@pytest.mark.parametrize("skip", [True, False])
def test_ldp_heavy_hitters_replayed_report_batch_adds_nothing(skip):
    first, second = _clients(n=240, seed=4)
    _audit(_heavy_hitters_job(skip), _ldp_spec(HEAVY_HITTERS), first, second, REPLAYS,
           replays_kept_once=True).assert_ok()


def test_ldp_frequencies_without_the_check_fail_the_sequence_audit(monkeypatch):
    from pipelines.ldp import frequencies as ldp_frequencies

    _without_consumes(monkeypatch, ldp_frequencies)
    first, second = _clients()
    result = _audit(_frequencies_job(True), _ldp_spec(FREQUENCIES), first, second,
                    (BatchSequence.REPLAY,), replays_kept_once=True)
    assert "replayed rows changed batch 2" in result.checks_failed(), str(result)


def _label_job(skip: bool) -> SequenceJob:
    from pipelines.ldp import label_dp

    def write(dataset, folder, batch):
        path = os.path.join(folder, f"rows-{batch}.csv")
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["example_id", "feature_1", "label"])
            writer.writerows([r["example_id"], r["feature_1"], r["label"]]
                             for r in dataset.rows())
        return {"rows": [path]}

    return SequenceJob(
        module=label_dp, write=write, skip=skip,
        request=lambda files, options, batch, skip: label_dp.LabelDPRequest(
            input=tuple(files["rows"]), labels=("no", "yes"), epsilon=1.0,
            features=("feature_1",), dataset_id=batch, skip_consumed=skip, options=options))


LABEL_UNITS = Units(column="example_id", keys=(), values={"label": ["no", "yes"]})


def _label_data() -> tuple:
    rng = np.random.default_rng(8)
    rows = [{"example_id": i, "feature_1": round(float(x), 3), "label": "yes" if x > 0 else "no"}
            for i, x in enumerate(rng.normal(size=30))]
    return Dataset(batches=[rows[:15]], name="b1"), Dataset(batches=[rows[15:]], name="b2")


def _label_spec() -> AuditSpec:
    # batch 1 with and without one example: the example's row, one label's count
    return AuditSpec(job=None, units=LABEL_UNITS, reports=marker_rule((
        "outputs.*.sha256", "outputs.*.rows", "summary.*")),
        tables={"dataset.parquet": TableRule(keys=("example_id",), noisy=("label", "label_unbiased"),
                                             keys_private=True, changed_keys=1),
                "debias.jsonl": TableRule(keys=("label_index",), noisy=(
                    "randomized_count", "estimated_count",
                    "estimated_count_ci95_low", "estimated_count_ci95_high", "estimated_count_std"),
                    public_keys=[(0,), (1,)], bounds={"randomized_count": Bound(l0=1, linf=1)})})


@pytest.mark.parametrize("skip", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_label_dp_second_export_adds_nothing(skip):
    first, second = _label_data()
    _audit(_label_job(skip), _label_spec(), first, second, REPLAYS).assert_ok()


@pytest.mark.slow
def test_label_dp_without_consumed_ids_fails_the_sequence_audit(monkeypatch):
    from pipelines.ldp import label_dp

    _without_consumes(monkeypatch, label_dp)
    first, second = _label_data()
    result = _audit(_label_job(True), _label_spec(), first, second, (BatchSequence.REPLAY,))
    assert "replayed rows changed batch 2" in result.checks_failed(), str(result)
