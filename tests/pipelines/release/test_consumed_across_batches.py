"""Issue 30, item 1: each report, source, client report and record aggregated at most once across
batches -- the findings "Overlapping ARA batches" and "Replays the jobs cannot see", each run the
way an operator runs the job (its CLI), against a real ledger where the rule is across batches.

Every test here failed on the code before the consumed-id records (main f02cb62): overlapping and
replayed batches were released. Refusals (ids held by earlier batches) exit 2 with nothing reserved: the ledger, the key store
and the consumed-id records are byte for byte as before, and no output folder appears.
"""
from __future__ import annotations

import csv
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.ara import event_level_reports
from pipelines.ldp import label_dp
from pipelines.ldp import frequencies as ldp_frequencies
from pipelines.ldp import heavy_hitters as ldp_heavy_hitters
from pipelines.masked_lark import share as masked_lark_share
from pipelines.masked_lark import train as masked_lark_train
from pipelines.ldp import shuffle_sum
from pipelines.ara import summary_reports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SAMPLE = os.path.join(ROOT, "pipelines", "sample_data")


# --------------------------------------------------------------------------- helpers

def _release(tmp_path) -> list[str]:
    return ["--output", str(tmp_path / "out"), "--ledger", str(tmp_path / "private" / "ledger.json"),
            "--key_store", str(tmp_path / "private" / "keys")]


def _private(tmp_path) -> dict:
    """Every private file (ledger, keys, consumed-id records; not the operator's reports)."""
    root = tmp_path / "private"
    out = {}
    for folder, _, names in os.walk(root):
        if os.path.relpath(folder, root).startswith("reports"):
            continue
        for name in names:
            path = os.path.join(folder, name)
            if not name.endswith(".lock"):
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, root)] = handle.read()
    return out


def _refused(main, argv, tmp_path, capsys, *expected) -> str:
    """Run ``main(argv)``: it must exit 2 naming ``expected``, leaving every private file as it
    was and publishing nothing new."""
    before = _private(tmp_path)
    published = sorted(os.listdir(tmp_path / "out")) if (tmp_path / "out").exists() else []
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err
    assert _private(tmp_path) == before, "a refused batch changed the ledger, keys or records"
    after = sorted(os.listdir(tmp_path / "out")) if (tmp_path / "out").exists() else []
    assert after == published
    return err


def _counters(tmp_path, release_id, version=1) -> dict:
    path = tmp_path / "private" / "reports" / release_id / f"v{version}" / "report.json"
    with open(path) as handle:
        return json.load(handle)["counters"]


def _testing_counters(out, release_id) -> dict:
    path = os.path.join(str(out), "testing-not-a-release", ".reports", release_id, "v1",
                        "report.json")
    with open(path) as handle:
        return json.load(handle)["counters"]


def _ledger_record(tmp_path, versioned_id) -> dict:
    with open(tmp_path / "private" / "ledger.json") as handle:
        return json.load(handle)["releases"].get(versioned_id)


# --------------------------------------------------------------------------- ARA summary reports

def _report(report_id, source, value, bucket=0x10, order=0) -> str:
    return json.dumps({"report_id": report_id, "source_id": source, "order": order,
                       "contributions": [{"bucket": hex(bucket), "value": value}]})


def _reports(path, lines) -> str:
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return str(path)


def _summary(tmp_path, batch, path, *extra) -> list[str]:
    domain = tmp_path / "domain.txt"
    domain.write_text("0x10\n0x11\n")
    return ["--input", str(path), "--input_format", "reports", "--output_domain", str(domain),
            "--epsilon", "4", "--batch_id", batch, *_release(tmp_path), *extra]


def test_an_overlapping_summary_batch_is_refused_or_its_consumed_reports_removed(tmp_path, capsys):
    """The finding: a batch made of an earlier batch plus one late report has a new content
    digest, a fresh ara-batch scope -- and every source of the first batch lost epsilon twice."""
    first = [_report(f"r{i}", f"s{i}", 1000 + i) for i in range(5)]
    a = _reports(tmp_path / "a.jsonl", first)
    b = _reports(tmp_path / "b.jsonl", first + [_report("late", "s9", 500)])
    assert summary_reports.main(_summary(tmp_path, "A", a)) == 0
    _refused(summary_reports.main, _summary(tmp_path, "B", b), tmp_path, capsys,
             "5 of its 6 report ids were already consumed by summary_reports/A (5)")
    assert summary_reports.main(_summary(tmp_path, "B", b, "--skip_consumed")) == 0
    assert _counters(tmp_path, "summary_reports/B")["ara.reports_removed_already_consumed"] == 5
    assert _counters(tmp_path, "summary_reports/B")["ara.reports_kept"] == 1
    assert _ledger_record(tmp_path, "summary_reports/B")["consumed"][
        summary_reports.REPORT_IDS]["count"] == 1
    # a re-run of B reproduces (its record says what it removed); nothing more is spent
    assert summary_reports.main(_summary(tmp_path, "B", b, "--skip_consumed")) == 0
    # the late report is B's now: a third batch holding it is refused, naming B
    c = _reports(tmp_path / "c.jsonl", [_report("late", "s9", 500), _report("new", "s8", 7)])
    _refused(summary_reports.main, _summary(tmp_path, "C", c), tmp_path, capsys,
             "1 of its 2 report ids were already consumed by summary_reports/B (1)")


def test_a_new_version_of_a_summary_batch_does_not_aggregate_its_reports_again(tmp_path, capsys):
    first = [_report(f"r{i}", f"s{i}", 100) for i in range(3)]
    a = _reports(tmp_path / "a.jsonl", first)
    assert summary_reports.main(_summary(tmp_path, "A", a)) == 0
    more = _reports(tmp_path / "a2.jsonl", first + [_report("r9", "s9", 100)])
    _refused(summary_reports.main, _summary(tmp_path, "A", more, "--new_release"), tmp_path,
             capsys, "3 of its 4 report ids were already consumed by summary_reports/A (3)")
    assert summary_reports.main(_summary(tmp_path, "A", more, "--new_release",
                                         "--skip_consumed")) == 0
    assert _counters(tmp_path, "summary_reports/A", 2)["ara.reports_removed_already_consumed"] == 3


def test_a_conversion_file_given_twice_is_aggregated_once(tmp_path):
    """Conversions (algorithm A in the job): a file given twice in one batch -- every report
    id twice, alike -- aggregates each report once, and each source's budget is asked once."""
    from pipelines.ara import synthetic
    from transforms.ara.contribution import ContributionConfig

    data = synthetic.generate("adtech_real_estate", 5, scale=0.005).to_arrow()
    pq.write_table(data, tmp_path / "a.parquet")
    shutil.copy(tmp_path / "a.parquet", tmp_path / "again.parquet")
    config = tmp_path / "config.json"
    config.write_text(ContributionConfig(
        measures=("count", "value"), clip_thresholds=(1.0, 20000.0), slice_dimensions=(2, 90),
        prefixes=(0, 2), budgets=((8000, 8000), (8000, 8000)), reports_per_source=2).to_json())

    def argv(batch, path, root):
        return ["--input", path, "--config", str(config), "--epsilon", "8",
                "--batch_id", batch, *_release(root)]

    # once, and twice on a ledger of its own
    assert summary_reports.main(argv("A", str(tmp_path / "a.parquet"), tmp_path)) == 0
    once = _ledger_record(tmp_path, "summary_reports/A")["consumed"]
    both = f"{tmp_path / 'a.parquet'},{tmp_path / 'again.parquet'}"
    assert summary_reports.main(argv("B", both, tmp_path / "other")) == 0
    counters = _counters(tmp_path / "other", "summary_reports/B")
    assert counters["ara.reports_dropped_identical_copies_in_batch"] == data.num_rows
    assert "ara.reports_removed_conflicting_copies_in_batch" not in counters
    twice = _ledger_record(tmp_path / "other", "summary_reports/B")["consumed"]
    assert twice[summary_reports.REPORT_IDS]["count"] == once[summary_reports.REPORT_IDS]["count"]
    for field in ("count", "amount"):   # the hashes are keyed by each ledger's own secret
        assert twice[summary_reports.SOURCE_BUDGET][field] == \
            once[summary_reports.SOURCE_BUDGET][field]


def test_overlapping_conversion_batches_are_refused(tmp_path, capsys):
    """Conversions (algorithm A in the job) carry the report id of the report each becomes."""
    from pipelines.ara import synthetic
    from transforms.ara.contribution import ContributionConfig

    data = synthetic.generate("adtech_real_estate", 5, scale=0.005).to_arrow()
    half = data.slice(0, data.num_rows // 2)
    pq.write_table(half, tmp_path / "a.parquet")
    pq.write_table(data, tmp_path / "b.parquet")
    config = tmp_path / "config.json"
    config.write_text(ContributionConfig(
        measures=("count", "value"), clip_thresholds=(1.0, 20000.0), slice_dimensions=(2, 90),
        prefixes=(0, 2), budgets=((8000, 8000), (8000, 8000)), reports_per_source=2).to_json())

    def argv(batch, path, *extra):
        return ["--input", str(path), "--config", str(config), "--epsilon", "8",
                "--batch_id", batch, *_release(tmp_path), *extra]

    assert summary_reports.main(argv("A", tmp_path / "a.parquet")) == 0
    _refused(summary_reports.main, argv("B", tmp_path / "b.parquet"), tmp_path, capsys,
             f"{half.num_rows} of its {data.num_rows} report ids were already consumed by "
             "summary_reports/A")
    assert summary_reports.main(argv("B", tmp_path / "b.parquet", "--skip_consumed")) == 0
    assert _counters(tmp_path, "summary_reports/B")[
        "ara.reports_removed_already_consumed"] == half.num_rows
    # real releases need the report ids: a conversions file without them is refused
    pq.write_table(data.drop_columns(["report_id"]), tmp_path / "no_ids.parquet")
    _refused(summary_reports.main, argv("C", tmp_path / "no_ids.parquet"), tmp_path, capsys,
             "has no column 'report_id'")


def test_a_sources_l1_budget_holds_across_summary_batches(tmp_path):
    """Algorithm C's 65,536 per source, as in the browser: over all of the source's batches."""
    a = _reports(tmp_path / "a.jsonl", [_report("r1", "s", 60000)])
    b = _reports(tmp_path / "b.jsonl", [_report("r2", "s", 30000), _report("r3", "t", 30000),
                                        _report("r4", "s", 5000, order=1)])
    assert summary_reports.main(_summary(tmp_path, "A", a)) == 0
    assert summary_reports.main(_summary(tmp_path, "B", b)) == 0
    counters = _counters(tmp_path, "summary_reports/B")
    # s has 5,536 left: its 30,000 report is dropped, its 5,000 report fits; t is untouched
    assert counters["ara.reports_dropped_source_budget_exhausted"] == 1
    assert counters["ara.reports_kept"] == 2
    budget = _ledger_record(tmp_path, "summary_reports/B")["consumed"][summary_reports.SOURCE_BUDGET]
    assert budget["count"] == 2 and budget["amount"] == 5536 + 30000


def test_report_ids_within_one_batch_and_missing_ids(tmp_path, capsys):
    lines = [_report("r1", "s1", 10), _report("r1", "s2", 20), _report("r2", "s3", 30),
             _report("r2", "s3", 30),
             json.dumps({"source_id": "s4", "contributions": [{"bucket": "0x10", "value": 1}]})]
    path = _reports(tmp_path / "dup.jsonl", lines)
    out = tmp_path / "testing"
    testing = ["--input", path, "--input_format", "reports", "--output_domain",
               _reports(tmp_path / "domain.txt", ["0x10"]), "--epsilon", "4",
               "--batch_id", "T", "--output", str(out), "--testing_seed", "3"]
    # a report sent twice never refuses the batch (issue 40): identical copies keep one, copies
    # that differ are all removed, counted apart
    assert summary_reports.main(testing) == 0
    counters = _testing_counters(out, "summary_reports/T")
    assert counters["ara.reports_removed_conflicting_copies_in_batch"] == 2   # both r1
    assert counters["ara.reports_dropped_identical_copies_in_batch"] == 1     # r2's second
    assert "ara.reports_removed_already_consumed" not in counters
    assert counters["ara.reports_kept"] == 2                        # r2, and s4 (testing: no id)
    # in a real release a report without an id is a fault: dropped and counted
    domain = tmp_path / "domain.txt"
    real = ["--input", path, "--input_format", "reports", "--output_domain", str(domain),
            "--epsilon", "4", "--batch_id", "R", "--skip_consumed", *_release(tmp_path)]
    assert summary_reports.main(real) == 0
    assert _counters(tmp_path, "summary_reports/R")["ara.reports_dropped_missing_report_id"] == 1
    # the sources' budgets: r2's identical copy asks nothing more (s3: 30, once); the removed
    # conflicting copies of r1 still count in what s1 and s2 ask (conservative)
    budget = _ledger_record(tmp_path, "summary_reports/R")["consumed"][summary_reports.SOURCE_BUDGET]
    assert budget["count"] == 3 and budget["amount"] == 10 + 20 + 30
    # reports without any report id (an older format) are refused before the charge
    bare = _reports(tmp_path / "bare.jsonl", [json.dumps(
        {"source_id": "s5", "contributions": [{"bucket": "0x10", "value": 1}]})])
    bare_argv = ["--input", bare, "--input_format", "reports", "--output_domain", str(domain),
                 "--epsilon", "4", "--batch_id", "Q", *_release(tmp_path)]
    _refused(summary_reports.main, bare_argv, tmp_path, capsys,
             "none of its reports has a report_id (1 without)")


# --------------------------------------------------------------------------- event-level reports

def _event_batch(tmp_path, name, sources) -> list[str]:
    """A batch of the sample: its sources and their conversions (plus one new source)."""
    sample = os.path.join(SAMPLE, "event_level")
    with open(os.path.join(sample, "sources.csv")) as handle:
        rows = list(csv.reader(handle))
    with open(os.path.join(sample, "conversions.csv")) as handle:
        conversions = list(csv.reader(handle))
    wanted = {r[0] for r in rows[1:] if r[0] in sources}
    src = tmp_path / f"{name}-sources.csv"
    conv = tmp_path / f"{name}-conversions.csv"
    with open(src, "w", newline="") as handle:
        csv.writer(handle).writerows([rows[0]] + [r for r in rows[1:] if r[0] in wanted])
    with open(conv, "w", newline="") as handle:
        csv.writer(handle).writerows([conversions[0]] +
                                     [r for r in conversions[1:] if r[0] in wanted])
    return ["--sources", str(src), "--conversions", str(conv), "--epsilon", "14",
            "--trigger_data_cardinality", "2", "--report_windows", "2", "--max_reports", "2",
            "--value_edges", "20", "--window_ends", "2,30", "--group_by", "campaign"]


def test_an_overlapping_event_level_batch_is_refused_or_its_sources_removed(tmp_path, capsys):
    """The finding: one extra source row, and every common source was re-randomized with an
    independent key (2 x 14 per source; k overlapping batches, k x epsilon)."""
    ids = [str(1000 + i) for i in range(400)]
    first = _event_batch(tmp_path, "a", set(ids[:200]))
    second = _event_batch(tmp_path, "b", set(ids[:201]))
    assert event_level_reports.main(first + ["--batch_id", "A", *_release(tmp_path)]) == 0
    _refused(event_level_reports.main, second + ["--batch_id", "B", *_release(tmp_path)],
             tmp_path, capsys,
             "200 of its 201 sources were already consumed by event_level_reports/A (200)")
    assert event_level_reports.main(second + ["--batch_id", "B", "--skip_consumed",
                                              *_release(tmp_path)]) == 0
    counters = _counters(tmp_path, "event_level_reports/B")
    assert counters["ara_event_level.source_rows_removed_already_consumed"] == 200
    assert counters["ara_event_level.sources_randomized"] == 1
    with open(second[3]) as handle:   # the conversions of the 200 removed sources
        removed = sum(1 for r in list(csv.reader(handle))[1:] if r[0] != ids[200])
    assert counters["ara_event_level.conversion_rows_removed_already_consumed"] == removed
    assert counters.get("ara_event_level.conversion_rows_dropped_source_not_registered", 0) == 0


def test_duplicated_source_registrations_in_one_event_level_batch(tmp_path):
    """Issue 40: a source registered twice within a batch never refuses it. Registered again
    as it was (the same campaign), one registration is kept and its conversions stay; registered
    again differently, every registration of it and its conversions are removed, counted, and
    nothing of it is recorded as consumed."""
    batch = _event_batch(tmp_path, "a", {str(1000 + i) for i in range(50)})
    sources = batch[1]
    with open(sources) as handle:
        rows = list(csv.reader(handle))
    other = {"c1": "c2", "c2": "c3", "c3": "c1"}
    again = rows[:6] + [[r[0], other.get(r[1], r[1] + "x")] for r in rows[6:11]]
    with open(tmp_path / "again.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(again)          # 5 sources as they were, 5 otherwise
    batch[1] = f"{sources},{tmp_path / 'again.csv'}"
    assert event_level_reports.main(batch + ["--batch_id", "D", *_release(tmp_path)]) == 0
    counters = _counters(tmp_path, "event_level_reports/D")
    assert counters["ara_event_level.source_rows_dropped_identical_copies_in_batch"] == 5
    assert counters["ara_event_level.source_rows_removed_conflicting_copies_in_batch"] == 10
    assert counters["ara_event_level.sources_randomized"] == 45
    with open(batch[3]) as handle:   # the conversions of the 5 conflicting sources
        conflicting = {r[0] for r in again[6:]}
        removed = sum(1 for r in list(csv.reader(handle))[1:] if r[0] in conflicting)
    assert counters["ara_event_level.conversion_rows_removed_conflicting_copies_in_batch"] == \
        removed
    assert _ledger_record(tmp_path, "event_level_reports/D")["consumed"][
        event_level_reports.SOURCES]["count"] == 45


# --------------------------------------------------------------------------- local DP

def _ldp_reports(tmp_path, name, ids) -> str:
    table = pq.read_table(os.path.join(SAMPLE, "ldp", "reports_oue.parquet"))
    keep = np.isin(table.column("client_id").to_numpy(), np.asarray(ids, dtype=np.uint64))
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(table.filter(keep), path)
    return path


def _frequencies(path, collection, *extra) -> list[str]:
    return ["--input", path, "--oracle", "oue", "--epsilon", "2", "--domain_size", "32",
            "--collection_id", collection, *extra]


def test_a_replayed_ldp_report_batch_is_refused_or_counted(tmp_path, capsys):
    """The finding: a report batch given twice was counted twice, without a counter."""
    path = _ldp_reports(tmp_path, "day", range(1000))
    shutil.copy(path, tmp_path / "again.parquet")
    twice = f"{path},{tmp_path / 'again.parquet'}"
    out = tmp_path / "testing"
    # issue 40: a replay never refuses the collection; a client's identical reports count once,
    # a client whose reports differ loses them all, counted (a client is one id: the rule
    # depends on that client's reports only)
    assert ldp_frequencies.main(_frequencies(twice, "c1", "--output", str(out),
                                             "--testing_seed", "1")) == 0
    counters = _testing_counters(out, "ldp_frequencies/c1")
    assert counters["ldp.reports_dropped_identical_copies_in_batch"] == 1000
    assert "ldp.reports_removed_conflicting_copies_in_batch" not in counters
    # a collection with a replayed part, half of it changed: those clients' reports are removed
    part = pq.read_table(_ldp_reports(tmp_path, "part", range(100)))
    bits = part.column("bits").to_pylist()
    changed = [bytes(b ^ 0xFF for b in v) if i % 2 else v for i, v in enumerate(bits)]
    part = part.set_column(0, "bits", pa.array(changed, part.schema.field("bits").type))
    pq.write_table(part, tmp_path / "part.parquet")
    mixed = f"{path},{tmp_path / 'part.parquet'}"
    assert ldp_frequencies.main(_frequencies(mixed, "c2", "--output", str(out),
                                             "--testing_seed", "1")) == 0
    counters = _testing_counters(out, "ldp_frequencies/c2")
    assert counters["ldp.reports_dropped_identical_copies_in_batch"] == 50
    assert counters["ldp.reports_removed_conflicting_copies_in_batch"] == 100
    assert counters["ldp.reports_read"] == 950


def test_a_replayed_report_batch_is_refused_in_a_release(tmp_path, capsys):
    day = _ldp_reports(tmp_path, "day", range(1000))
    late = _ldp_reports(tmp_path, "late", range(900, 1200))       # 100 clients replayed
    both = f"{day},{late}"
    assert ldp_frequencies.main(_frequencies(both, "c1", *_release(tmp_path))) == 0
    counters = _counters(tmp_path, "ldp_frequencies/c1")
    assert counters["ldp.reports_dropped_identical_copies_in_batch"] == 100
    # another collection (another day) is another scope: the same clients report again
    assert ldp_frequencies.main(_frequencies(day, "c2", *_release(tmp_path))) == 0
    # real releases need the client ids
    no_ids = str(tmp_path / "no_ids.parquet")
    pq.write_table(pq.read_table(day).drop_columns(["client_id"]), no_ids)
    _refused(ldp_frequencies.main, _frequencies(no_ids, "c3", *_release(tmp_path)), tmp_path,
             capsys, "has no column 'client_id'")


def test_replayed_pem_reports_are_removed(tmp_path):
    path = os.path.join(SAMPLE, "ldp", "pem_reports.parquet")
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 500), tmp_path / "again.parquet")
    argv = ["--input", f"{path},{tmp_path / 'again.parquet'}", "--epsilon", "4",
            "--value_bits", "16", "--top_k", "9", "--collection_id", "c1", *_release(tmp_path)]
    assert ldp_heavy_hitters.main(argv) == 0
    counters = _counters(tmp_path, "ldp_heavy_hitters/c1")
    assert counters["ldp.reports_dropped_identical_copies_in_batch"] == 500


def test_an_overlapping_label_export_is_refused_or_only_new_examples_exported(tmp_path, capsys):
    with open(os.path.join(SAMPLE, "ldp", "training.csv")) as handle:
        rows = list(csv.reader(handle))
    for name, part in (("a", rows[1:101]), ("b", rows[51:151])):
        with open(tmp_path / f"{name}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows([rows[0]] + part)

    def argv(path, dataset, *extra):
        return ["--input", str(path), "--labels", "no,yes", "--epsilon", "2", "--features",
                "feature_1,feature_2", "--dataset_id", dataset, *_release(tmp_path), *extra]

    assert label_dp.main(argv(tmp_path / "a.csv", "d1")) == 0
    _refused(label_dp.main, argv(tmp_path / "b.csv", "d2"), tmp_path, capsys,
             "50 of its 100 examples were already consumed by label_dp/d1 (50)")
    assert label_dp.main(argv(tmp_path / "b.csv", "d2", "--skip_consumed")) == 0
    exported = pq.read_table(tmp_path / "out" / "label_dp" / "d2" / "v1" / "dataset.parquet")
    assert exported.num_rows == 50
    assert sorted(exported.column("example_id").to_pylist(), key=int) == \
        [str(i) for i in range(100, 150)]


def test_a_replayed_share_batch_is_refused(tmp_path, capsys):
    """The finding: shuffle_sum summed a replayed batch -- twice the shares --num_clients allows."""
    path = os.path.join(SAMPLE, "ldp", "shares.parquet")
    shutil.copy(path, tmp_path / "again.parquet")
    argv = ["--input", f"{path},{tmp_path / 'again.parquet'}", "--num_clients", "1000",
            "--value_bound", "10", "--epsilon", "1", "--delta", "1e-6", "--collection_id", "c1",
            *_release(tmp_path)]
    _refused(shuffle_sum.main, argv, tmp_path, capsys,
             "shares of 2000 clients, more than --num_clients 1000 allows")


# --------------------------------------------------------------------------- Masked LARk

def _with_duplicates(source, target) -> str:
    """``source`` plus record 5 again as it is and record 6 again with its last column
    changed."""
    with open(source) as handle:
        rows = list(csv.reader(handle))
    changed = rows[7][:-1] + [rows[7][-1] + "1"]
    with open(target, "w", newline="") as handle:
        csv.writer(handle).writerows(rows + [rows[6], changed])
    return str(target)


def test_a_duplicated_record_is_removed_by_the_browsers_job(tmp_path):
    """The finding: each copy got a fresh report id, so no helper could see the replay. Since
    issue 40 every copy is removed (counted) instead of refusing the batch -- identical or not:
    a record's identity is public and its values private, so whether copies agree must not
    decide what is shared (pipelines/release/consumption.py, rule 1)."""
    sample = os.path.join(SAMPLE, "masked_lark")
    records = _with_duplicates(os.path.join(sample, "conversions.csv"), tmp_path / "records.csv")
    argv = ["--input", records, "--params", os.path.join(sample, "aggregation_params.json"),
            "--batch_id", "b1", *_release(tmp_path)]
    assert masked_lark_share.main(argv) == 0
    counters = _counters(tmp_path, "masked_lark_share/b1")
    assert "records_dropped_identical_copies_in_batch" not in counters
    assert counters["records_removed_repeated_in_batch"] == 4   # both records, every copy


def test_a_duplicated_record_is_removed_by_the_training_driver(tmp_path):
    sample = os.path.join(SAMPLE, "masked_lark")
    records = _with_duplicates(os.path.join(sample, "train.csv"), tmp_path / "train.csv")
    argv = ["--input", records, "--params", os.path.join(sample, "gradient_params.json"),
            "--model", os.path.join(sample, "model.json"), "--model_id", "m1", "--epochs", "1",
            *_release(tmp_path)]
    assert masked_lark_train.main(argv) == 0
    counters = _counters(tmp_path, "masked_lark_train/m1")
    assert "records_dropped_identical_copies_in_batch" not in counters
    assert counters["records_removed_repeated_in_batch"] == 4   # both records, every copy
