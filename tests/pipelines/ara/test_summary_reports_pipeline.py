"""The ARA summary-report job end to end on the release layer (in-process engine), against the
pure algorithms; the batch is released once by its content; row and report faults counted."""
import csv
import glob
import json
import os
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from accounting.ledger import BudgetLedger
from pipelines.ara import summary_reports as cli
from pipelines.ara import optimize as opt
from pipelines.ara import synthetic
from pipelines.release import ReleaseOptions
from transforms.ara.beam import (ROUNDING_PURPOSE, SUMMARY_PURPOSE, BoundSourceContributions,
                                 SummaryReport, batch_purpose)
from transforms.ara.contribution import bound_contributions
from transforms.ara.reports import AggregatableReport
from transforms import error_columns
from transforms.ara.summary import key_bytes, noisy_summary, summary_noise_spec
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SEED = 42


def _read_output(out, batch="batch-A", *, testing=True):
    folder = os.path.join(str(out), "testing-not-a-release", "summary_reports", batch) if testing \
        else os.path.join(str(out), "summary_reports", batch, "v1")
    with open(os.path.join(folder, "summary.csv")) as f:
        rows = list(csv.reader(f))
    return rows[0], {int(r[0], 16): r[1:] for r in rows[1:]}


def _args(tmp_path, **over):
    args = {"--epsilon": "8", "--output": str(tmp_path / "out"), "--batch_id": "batch-A",
            "--testing_seed": str(SEED)}
    args.update(over)
    return [x for flag, value in args.items() if value is not None for x in (flag, value)]


def _release_args(tmp_path, **over):
    return _args(tmp_path, **{"--testing_seed": None, "--ledger": str(tmp_path / "ledger.json"),
                              "--key_store": str(tmp_path / "keys"), **over})


@pytest.fixture(scope="module")
def conversions(tmp_path_factory):
    d = tmp_path_factory.mktemp("conv")
    data = synthetic.generate("adtech_real_estate", 3, scale=0.03)
    path = str(d / "conv.parquet")
    table = data.to_arrow()
    pq.write_table(table, path)
    import pyarrow.csv as pacsv
    pacsv.write_csv(table, str(d / "conv.csv"))
    w = opt.workload_from_conversions(data)
    params, _ = opt.optimize_parameters(w, 8.0, k_candidates=[3, 6])
    config = params.to_config(w)
    config_path = str(d / "config.json")
    with open(config_path, "w") as f:
        f.write(config.to_json())
    return data, path, config, config_path


def _expected_from_conversions(data, config, epsilon, batch_id="batch-A"):
    """Algorithms A, C, S, R with the pure functions and the pipeline's keyed randomness."""
    key = ReleaseKey.for_testing(SEED)
    n = len(data)
    sources = [str(s) for s in data.source_id]
    lanes = [(s, int(o), j) for s, o in zip(sources, data.order) for j in range(config.n_queries)]
    u = RandomStreams.for_keys(key, batch_purpose(ROUNDING_PURPOSE, batch_id),
                               lanes).uniform_float()
    contrib = config.contributions(data.measures(),
                                   u.reshape((n, len(config.prefixes), len(config.columns))))
    keep = bound_contributions(data.source_id, contrib.sum(axis=(1, 2)), data.order)
    codes = config.slice_codes(data.features)
    domain = config.output_domain()
    sums = dict.fromkeys(domain, 0)
    for i in np.flatnonzero(keep):
        for l in range(len(config.prefixes)):
            for j, column in enumerate(config.columns):
                sums[config.bucket_key(l, column, codes[i, l])] += int(contrib[i, l, j])
    noisy = noisy_summary(np.array([sums[k] for k in domain]), domain, epsilon, key,
                          batch_purpose(SUMMARY_PURPOSE, batch_id))
    return {k: int(v) for k, v in zip(domain, noisy)}


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_conversions_pipeline_matches_pure_algorithms(tmp_path, conversions, fmt):
    data, path, config, config_path = conversions
    path = path.replace(".parquet", f".{fmt}")
    argv = _args(tmp_path, **{"--input": path, "--input_format": fmt, "--config": config_path})
    assert cli.main(argv) == 0
    header, rows = _read_output(tmp_path / "out")
    assert header == ["bucket", "noisy_sum", *error_columns.names("noisy_sum"),
                      "estimate", *error_columns.names("estimate")]
    expected = _expected_from_conversions(data, config, 8.0)
    assert {k: int(v[0]) for k, v in rows.items()} == expected
    assert list(rows) == sorted(rows)  # public order: by bucket
    keys = sorted(rows)
    estimates = config.reconstruct_estimates(keys, [int(rows[k][0]) for k in keys])
    at = {name: header.index(name) - 1 for name in header[1:]}
    for k, want in zip(keys, estimates.tolist()):
        got = rows[k][at["estimate"]]
        assert (got in ("", "None", "nan")) if want != want else float(got) == pytest.approx(want)
    # Error columns: the stated noise's, never the data's (the same for every bucket's sum).
    spec = summary_noise_spec(8.0)
    for k in keys:
        row = {name: rows[k][i] for name, i in at.items()}
        assert float(row["noisy_sum_std"]) == pytest.approx(spec.std)
        assert float(row["noisy_sum_ci95_high"]) - int(row["noisy_sum"]) == spec.ci_halfwidth(0.95)
        assert int(row["noisy_sum"]) - float(row["noisy_sum_ci95_low"]) == spec.ci_halfwidth(0.95)
        if row["estimate"] in ("", "None", "nan"):
            assert row["estimate_std"] == row["estimate_ci95_low"] == ""
        else:
            assert float(row["estimate_ci95_low"]) < float(row["estimate"]) < float(row["estimate_ci95_high"])
            assert float(row["estimate_std"]) >= spec.std * abs(config.scale_of_key(k)) * (1 - 1e-12)
    marker = json.load(open(tmp_path / "out" / "testing-not-a-release" / "summary_reports"
                            / "batch-A" / "RELEASE.json"))
    assert set(marker["outputs"]["summary.csv"]["errors"]) == {"noisy_sum", "estimate"}


def test_estimate_coefficients_are_algorithm_r_linear_map(conversions):
    """The estimate's error columns rest on its coefficients: they are algorithm R's linear map,
    row by row (each column of the map is R applied to a unit vector of noisy sums)."""
    _, _, config, _ = conversions
    keys = config.output_domain()
    coefficients = config.estimate_coefficients(keys)
    rows = np.array([config.reconstruct_estimates(keys, np.eye(len(keys))[j])
                     for j in range(len(keys))]).T  # rows[i, j]: estimate i's weight of sum j
    for c, row in zip(coefficients, rows):
        assert (c is None) == bool(np.isnan(row).any())
        if c is not None:
            assert sorted(row[row != 0]) == pytest.approx(sorted(x for x in c if x != 0))
    assert any(c is not None and len(c) > 1 for c in coefficients) == (config.padding_measure is not None)


def test_a_batch_is_released_once_by_its_content(tmp_path, conversions, capsys):
    """A real release; its re-run reproduces it spending nothing; the same reports under another
    label, or in another file format, are refused with the ledger unchanged."""
    data, path, config, config_path = conversions
    argv = _release_args(tmp_path, **{"--input": path, "--config": config_path})
    assert cli.main(argv) == 0
    header, first = _read_output(tmp_path / "out", testing=False)
    marker = json.load(open(tmp_path / "out" / "summary_reports" / "batch-A" / "v1" / "RELEASE.json"))
    assert marker["key_fingerprints"]["release"] != ReleaseKey.for_testing(SEED).fingerprint()
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))
    record = ledger.get("summary_reports/batch-A")
    assert record["state"] == "committed" and record["content_key"].startswith("multiset-sha256:")
    spent = ledger.spent("ara-batch:batch-A")
    assert spent.epsilon == pytest.approx(8.0)
    assert cli.main(argv) == 0
    assert _read_output(tmp_path / "out", testing=False)[1] == first
    assert ledger.spent("ara-batch:batch-A") == spent and ledger.get("summary_reports/batch-A")["runs"] == 2
    ledger_bytes = (tmp_path / "ledger.json").read_bytes()
    capsys.readouterr()
    for label, source in (("batch-B", path), ("batch-C", path.replace(".parquet", ".csv"))):
        assert cli.main(_release_args(tmp_path, **{"--input": source, "--config": config_path,
                                                   "--batch_id": label})) == 2
        assert "already charged as release 'summary_reports/batch-A'" in capsys.readouterr().err
        assert (tmp_path / "ledger.json").read_bytes() == ledger_bytes
        assert not (tmp_path / "out" / "summary_reports" / label).exists()


def test_reports_pipeline_with_bad_input_unknown_and_empty_buckets(tmp_path):
    big = (1 << 127) | 9
    lines = [
        json.dumps({"source_id": "a", "order": 0,
                    "contributions": [{"bucket": "0x10", "value": 40000},
                                      {"bucket": hex(big), "value": 20000}]}),
        json.dumps({"source_id": "a", "order": 1,   # would exceed a's budget: dropped whole
                    "contributions": [{"bucket": "0x10", "value": 10000}]}),
        json.dumps({"source_id": "a", "order": 2,   # fits exactly
                    "contributions": [{"bucket": "16", "value": 5536}]}),
        json.dumps({"source_id": "b", "contributions": [{"bucket": "0x99", "value": 7},  # unknown
                                                        {"bucket": "0x10", "value": 3}]}),
        "{this is not json",
        json.dumps({"source_id": "c", "contributions": [{"bucket": "0x1" + "0" * 32,
                                                         "value": 1}]}),   # 129-bit key
        json.dumps({"source_id": "c", "contributions": [{"bucket": "0x10", "value": -4}]}),
        "",
    ]
    reports = tmp_path / "reports.jsonl"
    reports.write_text("\n".join(lines) + "\n")
    domain = tmp_path / "domain.txt"
    domain.write_text(f"0x10\n{big}\n0x20  # declared, never contributed\n")
    request = cli.SummaryReportsRequest(
        input=(str(reports),), input_format="reports", output_domain=str(domain), epsilon=4.0,
        batch_id="batch-A", options=ReleaseOptions(output=str(tmp_path / "out"), testing_seed=SEED))
    (outcome,) = cli.run(request).releases
    header, rows = _read_output(tmp_path / "out")
    assert header == ["bucket", "noisy_sum", *error_columns.names("noisy_sum")]
    assert sorted(rows) == [0x10, 0x20, big]
    true = {0x10: 40000 + 5536 + 3, big: 20000, 0x20: 0}
    expected = noisy_summary(np.array([true[k] for k in sorted(true)]), sorted(true), 4.0,
                             ReleaseKey.for_testing(SEED),
                             batch_purpose(SUMMARY_PURPOSE, "batch-A"))
    assert [int(rows[k][0]) for k in sorted(true)] == expected.tolist()
    counters = outcome.report["counters"]
    assert counters["reports.read"] == 7  # non-blank lines
    assert counters["ara.reports_dropped_malformed_json"] == 1
    assert counters["ara.reports_dropped_bad_bucket_key"] == 1
    assert counters["ara.reports_dropped_negative_value"] == 1
    assert counters["ara.reports_dropped_source_budget_exhausted"] == 1
    assert counters["ara.unknown_bucket_contributions_dropped"] == 1
    assert counters["ara.declared_buckets_without_contributions"] == 1
    # Faults count towards the dropped-rows rule; bounding a source's budget does not.
    assert outcome.report["dropped_rows"]["reports"]["dropped"] == 3
    assert outcome.report["dropped_rows"]["reports"]["eligible"] == 7


def test_bound_and_summary_transforms():
    reports = [AggregatableReport(source_id="s", order=0, contributions=((1, 60000),)), AggregatableReport(source_id="s", order=1, contributions=((2, 6000),)),
               AggregatableReport(source_id="s", order=2, contributions=((2, 5536),)), AggregatableReport(source_id="t", order=0, contributions=((1, 9),))]
    with BeamTestPipeline(runner="FnApiRunner") as p:
        out = p | beam.Create(reports) | BoundSourceContributions(max_reports_per_source=2)
        assert_that(out, equal_to([(key_bytes(1), 60000), (key_bytes(1), 9)]))
    key = ReleaseKey.for_testing(1)
    expected = noisy_summary(np.array([5, 0]), [1, 3], 64.0, key, SUMMARY_PURPOSE)
    with BeamTestPipeline(runner="FnApiRunner") as p:
        contributions = p | "C" >> beam.Create([(key_bytes(1), 2), (key_bytes(1), 3),
                                                (key_bytes(2), 50)])
        domain = p | "D" >> beam.Create([key_bytes(1), key_bytes(3)])
        out = {"contributions": contributions, "domain": domain} | SummaryReport(64.0, key)
        assert_that(out, equal_to([(key_bytes(1), int(expected[0])),
                                   (key_bytes(3), int(expected[1]))]))


def test_bad_parameters_fail_before_claiming_the_batch(tmp_path, conversions, capsys):
    data, path, config, config_path = conversions
    table = pq.read_table(path).drop(["dim_1"])
    bad = str(tmp_path / "bad.parquet")
    pq.write_table(table, bad)
    wrong_type = str(tmp_path / "wrong_type.parquet")
    pq.write_table(pq.read_table(path).set_column(
        table.column_names.index("dim_0"), "dim_0", pa.array(["x"] * table.num_rows)), wrong_type)
    cases = [({"--input": bad, "--config": config_path}, "no column 'dim_1'"),
             ({"--input": wrong_type, "--config": config_path}, "'dim_0' has type string"),
             ({"--input": path, "--config": config_path, "--epsilon": "65"}, "epsilon"),
             ({"--input": path, "--input_format": "reports"}, "--output_domain"),
             ({"--input": path}, "--config is required"),
             ({"--input": path, "--config": config_path, "--batch_id": "../x"}, "not a valid name")]
    for over, message in cases:
        assert cli.main(_release_args(tmp_path, **over)) == 2, over
        assert message in capsys.readouterr().err
        assert not (tmp_path / "ledger.json").exists() and not (tmp_path / "keys").exists()
        assert not (tmp_path / "out").exists()


def test_help_runs():
    out = subprocess.run([sys.executable, "-m", "pipelines.ara.summary_reports", "--help"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for option in ("--input_format", "--output_domain", "--epsilon", "--batch_id", "--config"):
        assert option in out.stdout


def test_conversion_row_faults_are_counted_not_fatal(tmp_path, capsys):
    from transforms.ara.contribution import ContributionConfig
    config = ContributionConfig(measures=("count", "value"), clip_thresholds=(1.0, 20.0),
                                slice_dimensions=(2, 3), prefixes=(0, 2),
                                budgets=((1000, 2000), (3000, 4000)), reports_per_source=2)
    (tmp_path / "config.json").write_text(config.to_json())
    (tmp_path / "conv.csv").write_text(
        "source_id,order,dim_0,dim_1,value\n"
        "s1,0,0,1,10.0\n"     # valid
        "s1,1,1,2,-5\n"       # negative value: clipped to 0 by algorithm A, counted
        "s2,0,,1,3\n"         # null feature: dropped, counted
        "s3,0,2,0,4\n"        # feature outside its dimension: dropped, counted
        "s4,0,1,1,\n")        # null value: dropped, counted
    argv = _args(tmp_path, **{"--input": str(tmp_path / "conv.csv"), "--input_format": "csv",
                              "--config": str(tmp_path / "config.json")})
    # 3 of 5 rows dropped: over the default 50 %, so the operator is alerted (stderr; exit 0, or
    # the code they ask for) -- and the release is published all the same ...
    assert cli.main(argv + ["--alert_exit_code", "7"]) == 7
    assert "conversions: 3 of 5 eligible rows dropped (more than 50%)" in capsys.readouterr().err
    assert (tmp_path / "out" / "testing-not-a-release" / "summary_reports").exists()
    # ... and not alerted when the operator raises the share deliberately.
    (outcome,) = cli.run(cli.JOB.request_type(
        input=(str(tmp_path / "conv.csv"),), input_format="csv", config=str(tmp_path / "config.json"),
        epsilon=8.0, batch_id="batch-A",
        options=ReleaseOptions(output=str(tmp_path / "out"), testing_seed=SEED,
                               max_dropped_fraction=0.75))).releases
    assert outcome.report["alerts"] == []
    counters = outcome.report["counters"]
    assert counters["ara.conversion_rows"] == 5
    assert counters["ara.conversion_rows_dropped_null_or_nonfinite"] == 2
    assert counters["ara.conversion_rows_dropped_feature_out_of_range"] == 1
    assert counters["ara.conversion_values_negative_clipped_to_zero"] == 1
    assert outcome.report["dropped_rows"]["conversions"] == {
        "eligible": 5, "dropped": 3, "share": 0.6, "reasons": {
            "ara.conversion_rows_dropped_null_or_nonfinite": 2,
            "ara.conversion_rows_dropped_feature_out_of_range": 1}}
    valid = synthetic.ConversionData(
        source_id=np.array(["s1", "s1"]), order=np.array([0, 1]),
        features=np.array([[0, 1], [1, 2]]), count=np.array([1, 1]),
        value=np.array([10.0, -5.0]), dimensions=(2, 3))
    _, rows = _read_output(tmp_path / "out")
    assert {k: int(v[0]) for k, v in rows.items()} == _expected_from_conversions(valid, config, 8.0)
    assert len(rows) == len(config.output_domain()) == 2 * (1 + 6)


def test_each_batch_gets_its_own_noise_under_a_reused_key():
    key = ReleaseKey.for_testing(3)
    sums, keys = np.zeros(4, dtype=np.int64), [1, 2, 3, 4]
    a = noisy_summary(sums, keys, 1.0, key, batch_purpose(SUMMARY_PURPOSE, "day-1"))
    b = noisy_summary(sums, keys, 1.0, key, batch_purpose(SUMMARY_PURPOSE, "day-2"))
    assert a.tolist() != b.tolist()
    assert a.tolist() == noisy_summary(sums, keys, 1.0, key,
                                       batch_purpose(SUMMARY_PURPOSE, "day-1")).tolist()


def test_config_cli_feeds_the_pipeline(tmp_path, conversions):
    from pipelines.ara import config as ara_config
    from transforms.ara.contribution import ContributionConfig
    from transforms.ara.summary import parse_output_domain
    data, path, _, _ = conversions
    cfg_path, dom_path = tmp_path / "cfg.json", tmp_path / "domain.txt"
    assert ara_config.main(["--train", path, "--slice_dimensions", "2,90", "--epsilon", "4",
                            "--hierarchical", "--output", str(cfg_path),
                            "--output_domain", str(dom_path)]) == 0
    config = ContributionConfig.from_json(cfg_path.read_text())
    assert config.prefixes == (0, 1, 2) and config.slice_dimensions == (2, 90)
    assert parse_output_domain(dom_path.read_text()).keys == config.output_domain()
    assert ara_config.main(["--train", path, "--slice_dimensions", "2,90,3", "--epsilon", "4",
                            "--output", str(cfg_path)]) == 2  # no dim_2 column


def test_config_cli_holds_gamma_at_one_and_chooses_for_drift(tmp_path, conversions, capsys):
    from pipelines.ara import config as ara_config
    from transforms.ara.contribution import ContributionConfig
    _, path, _, _ = conversions
    cfg_path = tmp_path / "cfg.json"
    base = ["--train", path, "--slice_dimensions", "2,90", "--epsilon", "4",
            "--output", str(cfg_path)]
    assert ara_config.main(base + ["--selection", "training", "--estimate_scales", "one"]) == 0
    held = ContributionConfig.from_json(cfg_path.read_text())
    assert (held.scale_array == 1).all() and "estimate scales held at 1" in capsys.readouterr().out
    assert ara_config.main(base) == 0  # the default: the drift-robust choice
    assert "value drifts x0.5..x2" in capsys.readouterr().out
    assert ara_config.main(base + ["--selection", "drift_robust", "--estimate_scales", "one",
                                   "--drift_factors", "0.5,1,2"]) == 0
    out = capsys.readouterr().out
    chosen = out.split("why: ")[1].split(":")[0]
    assert chosen.startswith(("gamma_1/", "equal_split/")) and "value drifts x0.5..x2" in out
    assert (ContributionConfig.from_json(cfg_path.read_text()).scale_array == 1).all()
    assert ara_config.main(base + ["--selection", "drift_robust", "--drift_factors", "0.5,x"]) == 2
    assert "--drift_factors" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ara_config.main(base + ["--selection", "validation"])
