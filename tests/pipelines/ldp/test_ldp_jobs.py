"""The local/shuffle-DP jobs on the release layer (in-process engine): a real release in the
ledger, refusals before any charge, and a neighbouring-pair check per job (add or remove one
client's reports / one example): the released schema, row set and order stay public, and the
difference stays within what one client can change."""
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from accounting.ledger import BudgetLedger
from pipelines.ldp import label_dp
from pipelines.ldp import frequencies as ldp_frequencies
from pipelines.ldp import heavy_hitters as ldp_heavy_hitters
from pipelines.ldp import shuffle_sum
from pipelines.release import cli as release_cli
from transforms.ldp import make_oracle, sample_data
from transforms import error_columns
from transforms.ldp.estimators import estimate_frequencies
from transforms.ldp.pem import PEMPlan
from transforms.ldp.randomness import KeyedRandomness
from transforms.ldp.shuffle import SplitAndMix, shares_table

from release_testkit import assert_no_secret, secrets_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SEED = 7
JOBS = {"ldp_frequencies": (ldp_frequencies, ["--oracle", "--candidates", "--collection_id"]),
        "ldp_heavy_hitters": (ldp_heavy_hitters, ["--value_bits", "--top_k", "--bits_per_round"]),
        "shuffle_sum": (shuffle_sum, ["--num_clients", "--value_bound", "--delta", "--sigma"]),
        "label_dp": (label_dp, ["--labels", "--features", "--prior", "--id_column"])}


def _testing_output(root, job, release, name):
    return os.path.join(str(root), "testing-not-a-release", job, release, name)


def _read(path) -> pa.Table:
    if path.endswith(".parquet"):
        return pq.read_table(path)
    if path.endswith(".jsonl"):
        with open(path) as handle:
            return pa.Table.from_pylist([json.loads(line) for line in handle])
    return pacsv.read_csv(path)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_help_names_the_job_flags(name):
    module, flags = JOBS[name]
    text = release_cli.build_parser(module.JOB)[0].format_help()
    for flag in flags + ["--input", "--epsilon", "--testing_seed", "--ledger", "--key_store"]:
        assert flag in text


def test_python_m_help_runs():
    out = subprocess.run([sys.executable, "-m", "pipelines.ldp.heavy_hitters", "--help"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--top_k" in out.stdout


# ------------------------------------------------------------------------- a real release

@pytest.fixture(scope="module")
def grr_reports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grr")
    path = str(folder / "reports.parquet")
    table = sample_data.frequency_reports(path, oracle="grr", epsilon=1.5, domain_size=8,
                                          clients=400, seed=3)
    return path, table


def _freq_args(path, out, **over):
    args = {"--input": path, "--oracle": "grr", "--epsilon": "1.5", "--domain_size": "8",
            "--collection_id": "c1", "--output": str(out)}
    args.update(over)
    return [x for flag, value in args.items() if value is not None for x in (flag, value)]


def test_frequency_release_charges_the_local_epsilon_once(tmp_path, grr_reports):
    path, table = grr_reports
    argv = _freq_args(path, tmp_path / "out", **{"--ledger": str(tmp_path / "ledger.json"),
                                                  "--key_store": str(tmp_path / "keys")})
    assert ldp_frequencies.main(argv) == 0
    released = pacsv.read_csv(str(tmp_path / "out" / "ldp_frequencies" / "c1" / "v1" /
                                  "estimates.csv"))
    oracle = make_oracle("grr", epsilon=1.5, domain_size=8)
    expected = estimate_frequencies(oracle, table)
    assert released.column("value").to_pylist() == list(range(8))
    np.testing.assert_allclose(released.column("estimate").to_numpy(),
                               expected.column("estimate").to_numpy(), rtol=1e-12)
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))
    record = ledger.get("ldp_frequencies/c1")
    (measure,) = record["measures"]
    assert measure["noise"] is None and measure["sensitivities"] is None
    assert measure["mechanism"] == "grr" and "replace one client's value" in measure["neighbouring"]
    assert measure["epsilon"] == pytest.approx(oracle.realised_epsilon)
    spent = ledger.spent("ldp-collection:c1")
    assert spent.epsilon == pytest.approx(1.5, abs=1e-6)
    assert ldp_frequencies.main(argv) == 0  # an identical re-run spends nothing
    assert ledger.spent("ldp-collection:c1") == spent and ledger.get("ldp_frequencies/c1")["runs"] == 2


# ------------------------------------------------------------------ refused before the charge

@pytest.fixture(scope="module")
def inputs(tmp_path_factory, grr_reports):
    folder = tmp_path_factory.mktemp("inputs")
    pem = str(folder / "pem.parquet")
    sample_data.pem_reports(pem, plan=PEMPlan(oracle="grr", epsilon=3.0, value_bits=8, top_k=3),
                            clients=300, seed=4)
    spec = SplitAndMix(num_clients=50, value_bound=5, epsilon=1.0, delta=1e-6)
    shares = str(folder / "shares.parquet")
    sample_data.shuffle_shares(shares, spec=spec, clients=50, seed=5)
    few = str(folder / "few.parquet")
    pq.write_table(pq.read_table(shares).slice(spec.messages), few)  # 49 clients' worth
    train = str(folder / "train.csv")
    sample_data.training_rows(train, rows=50, seed=6)
    bad_candidates = str(folder / "candidates.txt")
    with open(bad_candidates, "w") as handle:
        handle.write("3\nsecret-value-17\n")
    return {"grr": grr_reports[0], "pem": pem, "shares": shares, "few": few, "train": train,
            "candidates": bad_candidates}


_PEM = ["--epsilon", "3", "--value_bits", "8", "--top_k", "3", "--oracle", "grr",
        "--collection_id", "c1"]
_SHUFFLE = ["--num_clients", "50", "--value_bound", "5", "--epsilon", "1", "--delta", "1e-6",
            "--collection_id", "c1"]
_LABELS = ["--labels", "no,yes", "--epsilon", "1", "--features", "feature_1",
           "--dataset_id", "d1"]
REFUSALS = [
    (ldp_frequencies, "grr", ["--oracle", "grr", "--epsilon", "1", "--domain_size", "8",
                              "--collection_id", "c1"], "randomized as"),
    (ldp_frequencies, "grr", ["--oracle", "oue", "--epsilon", "1.5", "--domain_size", "8",
                              "--collection_id", "c1"], "column 'bits'"),
    (ldp_frequencies, "grr", ["--oracle", "grr", "--epsilon", "1.5", "--domain_size", "8",
                              "--collection_id", "c1", "--candidates", "{candidates}"],
     "candidates.txt:2: not an integer"),
    (ldp_frequencies, "grr", ["--oracle", "olh", "--epsilon", "1.5", "--domain_size", "65536",
                              "--collection_id", "c1"], "--candidates"),
    (ldp_frequencies, "grr", ["--oracle", "grr", "--epsilon", "100", "--domain_size", "8",
                              "--collection_id", "c1"], "epsilon"),
    (ldp_heavy_hitters, "pem", [*_PEM[:5], "4", *_PEM[6:]], "PEM plan"),
    (ldp_heavy_hitters, "grr", _PEM, "'group'"),
    (shuffle_sum, "shares", [*_SHUFFLE[:7], "1e-5", *_SHUFFLE[8:]], "split-and-mix parameters"),
    (shuffle_sum, "few", _SHUFFLE, "less noise than planned"),
    (label_dp, "train", [*_LABELS, "--label_column", "target"], "no column 'target'"),
    (label_dp, "train", ["--labels", "yes", *_LABELS[2:]], "two distinct"),
    (label_dp, "grr", _LABELS, "no column 'example_id'"),
]


@pytest.mark.parametrize("module,source,argv,message", REFUSALS)
def test_bad_input_is_refused_before_the_charge(tmp_path, inputs, capsys, module, source, argv,
                                                message):
    argv = [a.format(**inputs) for a in argv]
    code = module.main(["--input", inputs[source], *argv, "--output", str(tmp_path / "out"),
                        "--ledger", str(tmp_path / "ledger.json"),
                        "--key_store", str(tmp_path / "keys")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert "secret-value-17" not in err
    assert not (tmp_path / "ledger.json").exists() and not (tmp_path / "out").exists()


# ------------------------------------------------------------------ neighbouring pairs

def _drop_row(path, target, row):
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table.slice(0, row), table.slice(row + 1)]), target)
    return target


def test_frequency_neighbours(tmp_path, grr_reports):
    path, _ = grr_reports
    smaller = _drop_row(path, str(tmp_path / "minus_one.parquet"), 17)
    out = {}
    for name, source in (("all", path), ("minus_one", smaller)):
        assert ldp_frequencies.main(_freq_args(source, tmp_path / name,
                                               **{"--testing_seed": str(SEED)})) == 0
        out[name] = pacsv.read_csv(_testing_output(tmp_path / name, "ldp_frequencies", "c1",
                                                   "estimates.csv"))
    assert out["all"].schema == out["minus_one"].schema
    assert out["all"].column("value").to_pylist() == out["minus_one"].column("value").to_pylist()
    p, q = make_oracle("grr", epsilon=1.5, domain_size=8).support_probabilities()
    # One report moves each support count by 0 or 1 and n by 1: estimate = (support - n q)/(p - q).
    diff = out["all"].column("estimate").to_numpy() - out["minus_one"].column("estimate").to_numpy()
    assert np.all(diff >= -q / (p - q) - 1e-9) and np.all(diff <= (1 - q) / (p - q) + 1e-9)
    assert np.count_nonzero(np.isclose(diff, (1 - q) / (p - q))) == 1  # its own value only


def test_heavy_hitter_neighbours(tmp_path, inputs):
    smaller = _drop_row(inputs["pem"], str(tmp_path / "minus_one.parquet"), 5)
    out = {}
    for name, source in (("all", inputs["pem"]), ("minus_one", smaller)):
        assert ldp_heavy_hitters.main(["--input", source, *_PEM, "--output", str(tmp_path / name),
                                       "--testing_seed", str(SEED)]) == 0
        out[name] = {f: pacsv.read_csv(_testing_output(tmp_path / name, "ldp_heavy_hitters", "c1",
                                                       f))
                     for f in ("heavy_hitters.csv", "rounds.csv")}
    for f in ("heavy_hitters.csv", "rounds.csv"):
        assert out["all"][f].schema == out["minus_one"][f].schema
    top = {k: v["heavy_hitters.csv"] for k, v in out.items()}
    assert top["all"].column("rank").to_pylist() == top["minus_one"].column("rank").to_pylist() \
        == [1, 2, 3]
    # Round 0 estimates every prefix of the public start length: the same rows, same order.
    first = {k: v["rounds.csv"].filter(pa.compute.equal(v["rounds.csv"].column("round"), 0))
             for k, v in out.items()}
    assert first["all"].column("value").to_pylist() == first["minus_one"].column("value").to_pylist()
    # Round 0's estimate is N (S/n0 - q)/(p - q), scaled from group 0 (n0 clients) to all N: one
    # client fewer moves it by at most (1 + (N - 1)/(n0 - 1))/(p - q) (N drops by one; if the
    # client was in group 0, n0 and S drop too and S/n0 moves by at most 1/(n0 - 1)).
    groups = pq.read_table(inputs["pem"]).column("group").to_numpy()
    N, n0 = groups.size, int((groups == 0).sum())
    plan = PEMPlan(oracle="grr", epsilon=3.0, value_bits=8, top_k=3)
    p, q = plan.oracle_for_round(0).support_probabilities()
    diff = first["all"].column("estimate").to_numpy() - first["minus_one"].column("estimate").to_numpy()
    assert np.abs(diff).max() <= (1 + (N - 1) / (n0 - 1)) / (p - q) + 1e-9
    # Later rounds' candidates are post-processing of the reports: they may differ, by design.


def test_shuffle_sum_neighbours(tmp_path, capsys):
    """The stated relation: one client's value replaced (the collection holds exactly
    --num_clients clients' shares; more is refused as a possible replay)."""
    spec = SplitAndMix(num_clients=40, value_bound=5, epsilon=1.0, delta=1e-6)
    values = np.random.default_rng(1).integers(0, 6, 40)
    replaced = values.copy()
    replaced[0] = 5 - values[0] if values[0] != 5 - values[0] else 0
    source = KeyedRandomness.for_testing(2, "clients")
    args = ["--num_clients", "40", "--value_bound", "5", "--epsilon", "1", "--delta", "1e-6",
            "--collection_id", "c1", "--testing_seed", str(SEED)]
    out, shares = {}, {}
    for name, vals in (("all", values), ("replaced", replaced)):
        shares[name] = spec.encode(vals, source=source, ids=np.arange(40))
        path = str(tmp_path / f"{name}.parquet")
        pq.write_table(shares_table(shares[name], spec), path)
        assert shuffle_sum.main(["--input", path, *args, "--output", str(tmp_path / name)]) == 0
        out[name] = pacsv.read_csv(
            _testing_output(tmp_path / name, "shuffle_sum", "c1", "sum.csv"),
            convert_options=pacsv.ConvertOptions(column_types=shuffle_sum.SCHEMA))
    assert out["all"].schema == out["replaced"].schema and out["all"].num_rows == 1
    printed = capsys.readouterr().out
    assert "by trust model" in printed and "    local: " in printed  # beside the local model
    diff = out["all"].column("estimate")[0].as_py() - out["replaced"].column("estimate")[0].as_py()
    # The client's noise share is keyed by its id: the sums differ by its value change only.
    assert diff == pytest.approx(float(values[0]) - float(replaced[0]))
    assert abs(diff) <= spec.value_bound
    whole = shuffle_sum.main(["--input", str(tmp_path / "all.parquet"), *args,
                              "--output", str(tmp_path / "again")])
    assert whole == 0  # the exact sum is reproduced: shares sum to values + noise mod q
    exact = spec.estimate(spec.sum_shares(shares["all"]), 40)
    assert out["all"].column("estimate")[0].as_py() == pytest.approx(exact)
    # Error columns: the planned clients' summed Binomial noise (public), around the estimate.
    row = out["all"].to_pylist()[0]
    error = error_columns.binomial(spec.noise_trials, spec.noise_probability)
    assert row["estimate_std"] == pytest.approx(math.sqrt(spec.variance))
    assert row["estimate_ci95_high"] - row["estimate"] == pytest.approx(error.halfwidth)
    assert row["estimate"] - row["estimate_ci95_low"] == pytest.approx(error.halfwidth)
    assert row["estimate_std"] == out["replaced"].to_pylist()[0]["estimate_std"]


def test_label_export_neighbours(tmp_path, inputs):
    rows = pacsv.read_csv(inputs["train"])
    labels = rows.column("label").to_pylist()
    # The neighbour: example 20 removed and example 9's label flipped (two neighbouring steps).
    flipped = [("yes" if v == "no" else "no") if i == 9 else v for i, v in enumerate(labels)]
    neighbour = rows.set_column(3, "label", pa.array(flipped))
    variants = {"all": rows,
                "neighbour": pa.concat_tables([neighbour.slice(0, 20), neighbour.slice(21)])}
    out = {}
    for name, table in variants.items():
        path = str(tmp_path / f"{name}.parquet")
        pq.write_table(table, path)
        assert label_dp.main(["--input", path, *_LABELS, "--output", str(tmp_path / name),
                              "--testing_seed", str(SEED)]) == 0
        out[name] = {f: _read(_testing_output(tmp_path / name, "label_dp", "d1", f))
                     for f in ("dataset.parquet", "debias.jsonl")}
    full = out["all"]["dataset.parquet"]
    assert all(v["dataset.parquet"].schema == full.schema for v in out.values())
    assert full.column("example_id").to_pylist() == sorted(str(i) for i in range(50))
    # Every other example's randomized label is as it was; only example 9's row may differ.
    kept = full.filter(pa.compute.not_equal(full.column("example_id"), "20"))
    other = out["neighbour"]["dataset.parquet"]
    assert other.column("example_id").equals(kept.column("example_id"))
    differs = [i for i, (a, b) in enumerate(zip(kept.to_pylist(), other.to_pylist())) if a != b]
    assert all(kept.column("example_id")[i].as_py() == "9" for i in differs)
    counts = [np.asarray(v["debias.jsonl"].column("randomized_count").to_pylist())
              for v in out.values()]
    assert np.abs(counts[0] - counts[1]).sum() <= 3  # one removed, one changed


def test_label_export_refuses_the_same_labels_under_another_id(tmp_path, inputs, capsys):
    base = ["--input", inputs["train"], "--labels", "no,yes", "--epsilon", "1",
            "--output", str(tmp_path / "out"), "--ledger", str(tmp_path / "ledger.json"),
            "--key_store", str(tmp_path / "keys")]
    assert label_dp.main([*base, "--dataset_id", "d1"]) == 0
    assert label_dp.main([*base, "--dataset_id", "d2"]) == 2
    printed = capsys.readouterr()
    assert "already charged" in printed.err
    secrets = secrets_of([tmp_path / "keys"])
    assert secrets  # the export's randomness is keyed by a stored release key
    assert_no_secret(secrets, texts=[printed.out, printed.err],
                     roots=[tmp_path / "out", tmp_path / "reports"])
    record = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys")).get("label_dp/d1")
    assert record["content_key"].startswith("multiset-sha256:labels:")
    (measure,) = record["measures"]
    assert measure["noise"] is None and "one example's label" in measure["neighbouring"]
    assert glob.glob(str(tmp_path / "out" / "label_dp" / "d2")) == []


def test_malformed_reports_count_towards_the_dropped_rows_alert(tmp_path, capsys):
    from transforms.ldp.reports import report_schema

    schema = pa.schema([pa.field("report", pa.uint32())],
                       metadata=report_schema(make_oracle("grr", epsilon=1.0, domain_size=10)).metadata)
    path = str(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"report": pa.array([1, 99, 99, 99, None, 5, 99, 99, 8, 1],
                                                pa.uint32())}, schema=schema), path)
    argv = ["--input", path, "--oracle", "grr", "--epsilon", "1", "--domain_size", "10",
            "--collection_id", "c", "--output", str(tmp_path / "out"), "--testing_seed", "1"]
    assert ldp_frequencies.main(argv + ["--alert_exit_code", "5"]) == 5
    err = capsys.readouterr().err
    assert "6 of 10 eligible rows dropped" in err and "reports_dropped_out_of_domain=5" in err
    # An operator-only alert: the release is published all the same.
    assert glob.glob(str(tmp_path / "out" / "testing-not-a-release" / "ldp_frequencies" / "c"
                         / "*.csv"))


def test_bundled_sample_is_what_the_generator_makes(tmp_path):
    from pipelines.ldp import data as ldp_data

    for path in ldp_data.generate_sample(str(tmp_path)):
        bundled = os.path.join(ldp_data.SAMPLE_DIR, os.path.basename(path))
        if path.endswith(".parquet"):
            assert pq.read_table(path).equals(pq.read_table(bundled))
            assert pq.read_schema(path).metadata == pq.read_schema(bundled).metadata
        else:
            with open(path, "rb") as new, open(bundled, "rb") as old:
                assert new.read() == old.read()


def test_flat_reports_may_be_csv(tmp_path, grr_reports, capsys):
    _, table = grr_reports
    path = str(tmp_path / "reports.csv")
    lines = ["report"] + [str(v) for v in table.column("report").to_pylist()] + ["x", "-3"]
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    assert ldp_frequencies.main(_freq_args(path, tmp_path / "out",
                                           **{"--testing_seed": str(SEED)})) == 0
    printed = capsys.readouterr().out  # "x" is no integer, -3 is outside the domain
    assert "ldp.reports_dropped_null=1, ldp.reports_dropped_out_of_domain=1" in printed
    released = pacsv.read_csv(_testing_output(tmp_path / "out", "ldp_frequencies", "c1",
                                              "estimates.csv"))
    expected = estimate_frequencies(make_oracle("grr", epsilon=1.5, domain_size=8), table)
    np.testing.assert_allclose(released.column("estimate").to_numpy(),
                               expected.column("estimate").to_numpy(), rtol=1e-12)


def test_frequency_and_label_releases_carry_approximate_intervals_and_say_so(tmp_path, grr_reports,
                                                                            inputs):
    """Issue 39.6: the estimates' ``_ci95_low`` / ``_ci95_high`` columns are the transforms'
    plug-in intervals (estimate -/+ 1.96 std, clipped), and RELEASE.json's errors statement says
    that they are approximate and on what assumptions."""
    path, table = grr_reports
    assert ldp_frequencies.main(_freq_args(path, tmp_path / "f", **{"--testing_seed": str(SEED)})) == 0
    released = _read(_testing_output(tmp_path / "f", "ldp_frequencies", "c1", "estimates.csv"))
    expected = estimate_frequencies(make_oracle("grr", epsilon=1.5, domain_size=8), table)
    assert released.column_names == ["value", "estimate", "frequency", "estimate_ci95_low",
                                     "estimate_ci95_high", "estimate_std"]
    for column in ("estimate_ci95_low", "estimate_ci95_high", "estimate_std"):
        np.testing.assert_allclose(released.column(column).to_numpy(),
                                   expected.column(column).to_numpy(), rtol=1e-12)
    with open(_testing_output(tmp_path / "f", "ldp_frequencies", "c1", "RELEASE.json")) as handle:
        statement = json.load(handle)["outputs"]["estimates.csv"]["errors"]["estimate"]
    assert "APPROXIMATE 95% interval (plug-in variance, normal approximation)" in statement
    assert "clipped to [0, n]" in statement and "assumes many reports" in statement

    assert label_dp.main(["--input", inputs["train"], *_LABELS, "--output", str(tmp_path / "l"),
                          "--testing_seed", str(SEED)]) == 0
    debias = _read(_testing_output(tmp_path / "l", "label_dp", "d1", "debias.jsonl"))
    estimate, low, high, std = (np.asarray(debias.column(c).to_pylist(), dtype=float) for c in (
        "estimated_count", "estimated_count_ci95_low", "estimated_count_ci95_high",
        "estimated_count_std"))
    n = float(np.sum(debias.column("randomized_count").to_pylist()))
    np.testing.assert_allclose(low, np.clip(estimate - 1.959963984540054 * std, 0, n), rtol=1e-12)
    np.testing.assert_allclose(high, np.clip(estimate + 1.959963984540054 * std, 0, n), rtol=1e-12)
    with open(_testing_output(tmp_path / "l", "label_dp", "d1", "RELEASE.json")) as handle:
        statement = json.load(handle)["outputs"]["debias.jsonl"]["errors"]["estimated_count"]
    assert "APPROXIMATE 95% interval" in statement and "assumes many examples" in statement
