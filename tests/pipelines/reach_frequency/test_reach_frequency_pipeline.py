"""The reach & frequency job end to end on the release layer (in-process engine): equality with
the computation without Beam (CSV, Parquet, distributed helpers), refusals before any work, row
rules, gs://, and the ledger (one release per campaign, all or nothing, identical re-runs)."""
import json
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from gcs_emulator import storage_emulator

from accounting.keys import ReleaseKey
from accounting.ledger import BudgetLedger
from pipelines.reach_frequency.job import ReachFrequencyRequest, main, run
from pipelines.release import ReleaseOptions
from transforms.sketches.beam import BuildSketches, SketchUnionFn, estimate_record
from accounting.budget import PrivacyBudget
from transforms.sketches.dp import (ReachFrequencyNoise, SketchStatistics, add_global_noise,
                                    add_helper_share)
from transforms.sketches.fingerprint import FingerprintSalt
from transforms.sketches.impressions import ImpressionColumns, partial_sketches
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "pipelines", "sample_data",
                      "reach_frequency", "impressions.csv")


def _expected(table, *, campaigns, publishers, config, epsilon, seed, k=10, helpers=0,
              columns=ImpressionColumns(), id_type="int", secret=b""):
    """The release computed without Beam from the same rows and the same testing key."""
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=epsilon), num_publishers=len(publishers))
    key = ReleaseKey.for_testing(seed)

    def salt(c):
        return FingerprintSalt.for_campaign(c, secret)

    built, _ = partial_sketches(table, config=config, salt_of=salt, columns=columns,
                                id_type=id_type, campaigns=campaigns, publishers=publishers)
    built = dict(built)
    rows = []
    for c in campaigns:
        per_pub = {p: built.get((c, p), LiquidLegionsSketch.empty(config, salt(c)))
                   for p in publishers}
        scopes = [(("union", ""), LiquidLegionsSketch.union(per_pub.values()))]
        scopes += [(("publisher", p), s) for p, s in per_pub.items()]
        for scope, sketch in scopes:
            stats = SketchStatistics.of(sketch, k)
            if helpers:
                # The job's testing keys: helper-i derived from the seed's key (the release
                # layer's testing mode); real releases reserve one key per helper.
                for helper_key in [key.subkey(f"key:helper-{i}") for i in range(helpers)]:
                    stats = add_helper_share(stats, helper_key, helpers, budget, c, scope)
                mode = f"distributed/{helpers}"
            else:
                stats = add_global_noise(stats, budget, key, c, scope)
                mode = "global"
            rows.append(json.loads(json.dumps(estimate_record(c, scope, stats, config, budget,
                                                              mode))))
    return rows


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _released(out, campaigns, *, testing=True, version=1, prefix="reach_frequency"):
    """Every released row of the campaigns' releases under an output root, in file order."""
    rows = []
    for campaign in campaigns:
        folder = os.path.join(str(out), "testing-not-a-release", prefix, campaign) if testing \
            else os.path.join(str(out), prefix, campaign, f"v{version}")
        got = _read_jsonl(os.path.join(folder, "reach_frequency.jsonl"))
        assert {r["campaign"] for r in got} == {campaign}
        rows.extend(got)
    return rows


def _by_key(rows):
    return {(r["campaign"], r["scope"], r["publisher"]): r for r in rows}


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--input", "--campaigns", "--publishers", "--epsilon", "--num_registers",
                   "--decay_rate", "--max_frequency", "--num_helpers", "--testing_seed",
                   "--ledger", "--key_store", "--new_release", "--campaign_budget_epsilon"):
        assert option in text


def test_csv_release_equals_the_direct_computation(tmp_path):
    out = tmp_path / "rf"
    rc = main(["--input", SAMPLE, "--output", str(out), "--campaigns", "c1,c2",
               "--publishers", "pub_a,pub_b,pub_c", "--epsilon", "1.0986", "--testing_seed", "7",
               "--num_registers", "20000"])
    assert rc == 0
    got = _released(out, ["c1", "c2"])
    table = pacsv.read_csv(SAMPLE, convert_options=pacsv.ConvertOptions(
        column_types={"publisher": pa.string(), "campaign": pa.string(), "vid": pa.string()},
        strings_can_be_null=True))
    want = _expected(table, campaigns=["c1", "c2"], publishers=["pub_a", "pub_b", "pub_c"],
                     config=SketchConfig(num_registers=20_000, decay_rate=10.0), epsilon=1.0986, seed=7)
    assert _by_key(got) == _by_key(want)
    # Public order: per campaign, by (scope, publisher); the union (no publisher) last.
    assert [(r["scope"], r["publisher"]) for r in got[:4]] == [
        ("publisher", "pub_a"), ("publisher", "pub_b"), ("publisher", "pub_c"), ("union", None)]
    union = _by_key(got)[("c1", "union", None)]
    assert abs(union["reach"] / 2500 - 1) < 0.05  # the sample's c1 reaches 2,500 people
    assert sum(union["frequency"]) == pytest.approx(1.0, abs=1e-5)
    assert union["k_plus_reach"][0] == pytest.approx(union["reach"], rel=1e-5)


def test_parquet_distributed_release_with_empty_and_single_id_publishers(tmp_path):
    rng = np.random.default_rng(1)
    part1 = pa.table({"pub": ["big"] * 3000, "camp": ["c1"] * 3000,
                      "person": [f"u{i}" for i in range(3000)]})
    part2 = pa.table({"pub": ["big"] * 2000 + ["solo"] * 3 + ["big"] * 500,
                      "camp": ["c1"] * 2003 + ["c2"] * 500,
                      "person": [f"u{i}" for i in rng.integers(2000, 4000, 2000)]
                      + ["u17"] * 3 + [f"v{i}" for i in range(500)]})
    pq.write_table(part1, tmp_path / "imp-1.parquet")
    pq.write_table(part2, tmp_path / "imp-2.parquet", row_group_size=700)
    request = ReachFrequencyRequest(
        input=(str(tmp_path / "imp-*.parquet"),), campaigns=("c1", "c2", "c3"),
        publishers=("big", "solo", "silent"), publisher_column="pub", campaign_column="camp",
        id_column="person", id_type="string", epsilon=3.0, num_helpers=3, num_registers=5000,
        max_frequency=4, sketch_salt="shared",
        options=ReleaseOptions(output=str(tmp_path / "rf"), testing_seed=11))
    result = run(request)
    assert [o.release_id for o in result.releases] == [
        "reach_frequency/c1", "reach_frequency/c2", "reach_frequency/c3"]
    got = _by_key(_released(tmp_path / "rf", ["c1", "c2", "c3"]))
    cols = ImpressionColumns(publisher="pub", campaign="camp", person="person")
    want = _expected(pa.concat_tables([part1, part2]), campaigns=["c1", "c2", "c3"],
                     publishers=["big", "silent", "solo"], config=SketchConfig(num_registers=5000, decay_rate=10.0),
                     epsilon=3.0, seed=11, k=4, helpers=3, columns=cols, id_type="string",
                     secret=b"shared")
    assert got == _by_key(want)
    assert len(got) == 3 * 4  # every declared campaign x (3 publishers + union)
    assert got[("c1", "union", None)]["noise"] == "distributed/3"
    assert abs(got[("c1", "union", None)]["reach"] / 4000 - 1) < 0.1
    # Declared publishers/campaigns without rows release pure noise, never an absence.
    assert ("c3", "union", None) in got and ("c1", "publisher", "silent") in got
    # Each release states its measures: (3 publishers + union) x (reach, frequency).
    marker = result.releases[0].marker
    assert len(marker["measures"]) == 8 and marker["guarantee"]["epsilon"] == pytest.approx(3.0)
    # ... split through one SharedBudget per campaign: 8 parts, each spent by its measure.
    from pipelines.reach_frequency.job import JOB

    planned = JOB.planned(request)[0]
    assert len(planned.budget.names) == 8 and planned.budget.total.epsilon == 3.0
    assert planned.guarantee() == planned.budget.guarantee()
    assert planned.guarantee().delta == pytest.approx(marker["guarantee"]["delta"])
    assert "== union/reach ==" in planned.explain()
    assert result.releases[0].report["counters"]["rows_read"] == 5503


@pytest.mark.parametrize("args, message", [
    (["--epsilon", "1"], "--input"),
    (["--input", SAMPLE, "--campaigns", "c1", "--publishers", "p"], "--epsilon"),
    (["--input", "/nonexistent/*.csv", "--campaigns", "c1", "--publishers", "p",
      "--epsilon", "1"], "matches no file"),
    (["--input", SAMPLE, "--campaigns", "c1", "--publishers", "p",
      "--epsilon", "1", "--id_column", "person"], "no column 'person'"),
    (["--input", SAMPLE, "--campaigns", " , ", "--publishers", "p",
      "--epsilon", "1"], "--campaigns"),
    (["--input", SAMPLE, "--campaigns", "c1", "--publishers", "p",
      "--epsilon", "1", "--delta", "1e-6", "--noise_kind", "discrete_gaussian",
      "--num_helpers", "2"], "num_helpers"),
    (["--input", SAMPLE, "--campaigns", "c1", "--publishers", "p",
      "--epsilon", "-1"], "epsilon"),
    (["--input", SAMPLE, "--campaigns", "c1", "--publishers", "p",
      "--epsilon", "1", "--decay_rate", "-2"], "decay_rate"),
    (["--input", SAMPLE, "--campaigns", "c1/x", "--publishers", "p",
      "--epsilon", "1"], "not a valid name"),
    (["--input", SAMPLE, "--campaigns", "c1", "--publishers", "p", "--epsilon", "1",
      "--release_prefix", "../up"], "not a valid name"),
])
def test_bad_parameters_fail_before_any_work(args, message, capsys, tmp_path):
    try:
        code = main(args + ["--output", str(tmp_path / "out"), "--testing_seed", "1"])
    except SystemExit as exit_info:  # argparse: a required flag is missing
        code = exit_info.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_build_sketches_counts_dropped_rows_and_merges_batches():
    config = SketchConfig(num_registers=2000, decay_rate=10.0)
    batches = [
        pa.table({"publisher": ["p1", "p1", "p2", "p9", None],
                  "campaign": ["c", "c", "c", "c", "c"],
                  "vid": pa.array(["1", "2", "oops", "4", "5"])}),
        pa.table({"publisher": ["p1", "p2", "p2"], "campaign": ["c", "c", "zz"],
                  "vid": pa.array(["2", "3", None])}),
    ]
    salt = FingerprintSalt.for_campaign("c")
    want = [(("c", "p1"), LiquidLegionsSketch.from_ids(config, salt, np.array([1, 2, 2]))),
            (("c", "p2"), LiquidLegionsSketch.from_ids(config, salt, np.array([3])))]
    p = BeamTestPipeline(runner="FnApiRunner")
    sketches = (p | beam.Create(batches, reshuffle=False)
                | BuildSketches(config, campaigns=["c"], publishers=["p1", "p2"]))
    assert_that(sketches, equal_to(want))
    result = p.run()
    result.wait_until_finish()
    counters = {m.key.metric.name: m.committed
                for m in result.metrics().query()["counters"]}
    assert counters["rows_read"] == 8
    assert counters["rows_used"] == 4
    assert counters["rows_missing_id"] == 1
    assert counters["rows_missing_key"] == 1
    assert counters["rows_undeclared_key"] == 2


def test_union_combine_fn_in_any_grouping():
    config = SketchConfig(num_registers=300, decay_rate=10.0)
    salt = FingerprintSalt.for_campaign("c")
    rng = np.random.default_rng(4)
    parts = [LiquidLegionsSketch.from_ids(config, salt, rng.integers(0, 500, 40))
             for _ in range(7)]
    fn = SketchUnionFn()
    direct = LiquidLegionsSketch.union(parts)
    left = fn.merge_accumulators([fn.add_input(fn.add_input(fn.create_accumulator(), parts[0]),
                                               parts[1]),
                                  fn.create_accumulator()]
                                 + [fn.add_input(fn.create_accumulator(), s) for s in parts[2:]])
    assert fn.extract_output(left) == direct
    assert fn.extract_output(fn.create_accumulator()) is None
    assert parts[0] == LiquidLegionsSketch.union([parts[0]])  # inputs are never mutated
    # Only the first accumulator may be modified, even when it is the empty (None) one.
    second = fn.add_input(fn.create_accumulator(), parts[1])
    snapshot = second.copy()
    merged = fn.merge_accumulators([None, second, fn.add_input(None, parts[2])])
    assert second == snapshot and merged == parts[1].merge(parts[2])


def test_gs_input_and_output_through_the_storage_emulator(tmp_path):
    """Input, output, ledger and keys on gs://: a release, its identical re-run, and a testing
    run equal to the same testing run on the local file."""
    pytest.importorskip("gcp_storage_emulator.server")
    from google.cloud import storage

    common = ["--campaigns", "c1,c2", "--publishers", "pub_a,pub_b,pub_c", "--epsilon", "1.0986",
              "--num_registers", "20000"]
    with storage_emulator("rf"):
        client = storage.Client.create_anonymous_client()
        client.bucket("rf").blob("logs/impressions.csv").upload_from_filename(SAMPLE)
        on_gcs = ["--input", "gs://rf/logs/*.csv", "--output", "gs://rf/out"] + common
        real = on_gcs + ["--ledger", "gs://rf/private/ledger.json", "--key_store", "gs://rf/private/keys"]
        assert main(real) == 0
        name = "out/reach_frequency/c1/v1/reach_frequency.jsonl"
        first = client.bucket("rf").blob(name).download_as_bytes()
        assert client.bucket("rf").blob("out/reach_frequency/c2/v1/RELEASE.json").exists()
        ledger = BudgetLedger("gs://rf/private/ledger.json", "gs://rf/private/keys")
        spent = ledger.spent("campaign:c1")
        assert main(real) == 0
        assert client.bucket("rf").blob(name).download_as_bytes() == first
        assert ledger.spent("campaign:c1") == spent and ledger.get("reach_frequency/c1")["runs"] == 2
        assert main(on_gcs + ["--testing_seed", "7"]) == 0
        text = client.bucket("rf").blob(
            "out/testing-not-a-release/reach_frequency/c1/reach_frequency.jsonl").download_as_text()
    local = tmp_path / "local"
    assert main(["--input", SAMPLE, "--output", str(local), "--testing_seed", "7"] + common) == 0
    assert [json.loads(line) for line in text.splitlines()] == _released(local, ["c1"])


def test_ledger_charges_each_campaign_once_and_refuses_overspending(tmp_path, capsys):
    common = ["--input", SAMPLE, "--campaigns", "c1,c2", "--publishers", "pub_a,pub_b,pub_c",
              "--num_registers", "10000", "--ledger", str(tmp_path / "ledger.json"),
              "--key_store", str(tmp_path / "keys"), "--campaign_budget_epsilon", "1.0",
              "--output", str(tmp_path / "out")]
    assert main(common + ["--epsilon", "0.5"]) == 0
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))
    records = {r["release_id"]: r for r in ledger.records()}
    assert set(records) == {"reach_frequency/c1", "reach_frequency/c2"}
    assert all(r["state"] == "committed" for r in records.values())
    assert len(records["reach_frequency/c1"]["measures"]) == 8  # (3 publishers + union) x 2
    assert records["reach_frequency/c1"]["scopes"] == ["campaign:c1"]
    assert ledger.spent("campaign:c1").epsilon == pytest.approx(0.5)
    assert records["reach_frequency/c1"]["keys"]["release"]["fingerprint"] != \
        records["reach_frequency/c2"]["keys"]["release"]["fingerprint"]  # a key per release
    first = _released(tmp_path / "out", ["c1", "c2"], testing=False)
    # Same input and parameters: the same keys, the same release, nothing more spent.
    assert main(common + ["--epsilon", "0.5"]) == 0
    assert _released(tmp_path / "out", ["c1", "c2"], testing=False) == first
    assert ledger.spent("campaign:c1").epsilon == pytest.approx(0.5)
    # A new version on top would exceed the campaign budget of 1.0: refused before any output.
    ledger_bytes = (tmp_path / "ledger.json").read_bytes()
    capsys.readouterr()
    assert main(common + ["--epsilon", "0.6", "--new_release"]) == 2
    assert "over its budget" in capsys.readouterr().err
    assert not (tmp_path / "out" / "reach_frequency" / "c1" / "v2").exists()
    assert (tmp_path / "ledger.json").read_bytes() == ledger_bytes
    # Within the budget: both campaigns get version 2 with fresh keys.
    assert main(common + ["--epsilon", "0.25", "--new_release"]) == 0
    assert ledger.spent("campaign:c2").epsilon == pytest.approx(0.75)
    assert _released(tmp_path / "out", ["c1"], testing=False, version=2) != first[:4]
    # A testing seed never goes with a ledger.
    assert main(common + ["--epsilon", "0.5", "--testing_seed", "1"]) == 2


def test_distributed_noise_release_reserves_an_independent_key_per_helper(tmp_path):
    """A real release with --num_helpers n reserves n helper keys of its own per campaign, each
    driving one helper stage, and charges the distributed sampler's extra delta."""
    common = ["--input", SAMPLE, "--campaigns", "c1,c2", "--publishers", "pub_a,pub_b,pub_c",
              "--num_registers", "2000", "--ledger", str(tmp_path / "ledger.json"),
              "--key_store", str(tmp_path / "keys"), "--campaign_budget_epsilon", "1.0",
              "--output", str(tmp_path / "out"), "--epsilon", "0.5", "--num_helpers", "2",
              "--max_frequency", "3"]
    assert main(common) == 0
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))
    records = {r["release_id"]: r for r in ledger.records()}
    fingerprints = [records[f"reach_frequency/{c}"]["keys"][name]["fingerprint"]
                    for c in ("c1", "c2") for name in ("release", "helper-0", "helper-1")]
    assert len(set(fingerprints)) == 6  # no key shared between helpers, campaigns or roles
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=0.5), num_publishers=3)
    slack = budget.charged_specs(2, 3)["frequency"].delta - budget.histogram_spec().delta
    assert slack > 0
    spent = ledger.spent("campaign:c1")
    assert spent.epsilon == pytest.approx(0.5) and spent.delta >= 4 * slack
    rows = _released(tmp_path / "out", ["c1", "c2"], testing=False)
    assert {r["noise"] for r in rows} == {"distributed/2"}
    # The same input again: the same keys reproduce the same bytes, nothing more spent.
    assert main(common) == 0
    assert _released(tmp_path / "out", ["c1", "c2"], testing=False) == rows
    assert ledger.spent("campaign:c1") == spent
