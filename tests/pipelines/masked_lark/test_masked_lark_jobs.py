"""The Masked LARk jobs end to end on the release layer: browsers (share) -> each helper -> the ad
server (combine), and the training driver. Exactness without noise, k-anonymity at exactly k,
per-helper ledger keys and spend, steps that spend nothing, pre-charge refusals, and a
neighbouring-pair check per job (the audit harness, accounting/verification/audit.py, had not landed)."""
import csv
import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from accounting.ledger import BudgetLedger
from pipelines.masked_lark import combine as masked_lark_combine
from pipelines.masked_lark.config import params_from_json
from pipelines.masked_lark import helper as masked_lark_helper
from pipelines.masked_lark import share as masked_lark_share
from pipelines.masked_lark import train as masked_lark_train
from tests.release_testkit import write_csv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SAMPLE = os.path.join(ROOT, "pipelines", "sample_data", "masked_lark")
SEED = 11
LOWER, UPPER, K = 0.0, 10.0, 10
# keys: A 20 records, B 11 (k + 1: released), C exactly k = 10 (suppressed)
COUNTS = {"A": 20, "B": 11, "C": 10}


def _params(tmp_path, epsilon=None, name="params.json", **over):
    params = {"kind": "aggregation", "value_columns": ["value"], "lower": LOWER, "upper": UPPER,
              "epsilon": epsilon, "k": K, "fraction_bits": 8, "num_helpers": 2, **over}
    path = str(tmp_path / name)
    with open(path, "w") as handle:
        json.dump(params, handle)
    return path


def _records(tmp_path, change=None, name="records.csv"):
    rng = np.random.default_rng(5)
    rows, i = [], 0
    for key, count in COUNTS.items():
        for _ in range(count):
            rows.append([i, key, float(rng.integers(0, 41)) / 4])  # on the 2^-8 grid
            i += 1
    if change is not None:
        rows[change[0]][2] = change[1]
    return write_csv(tmp_path / name, ["record_id", "key", "value"], rows), rows


def _testing(out, release_id, name):
    return os.path.join(str(out), "testing-not-a-release", release_id, name)


def _chain(tmp_path, records, params, tag, seed=SEED):
    """share -> helper 0, helper 1 -> combine, in testing mode; the combined table."""
    out = tmp_path / f"out-{tag}"
    assert masked_lark_share.main(["--input", records, "--params", params, "--batch_id", "b1",
                                   "--output", str(out / "share"),
                                   "--testing_seed", str(seed)]) == 0
    helper_files = []
    for h in (0, 1):
        reports = _testing(out / "share", "masked_lark_share/b1", f"reports_helper_{h}.parquet")
        assert masked_lark_helper.main(["--input", reports, "--params", params, "--helper",
                                        str(h), "--batch_id", "b1", "--output",
                                        str(out / f"h{h}"), "--testing_seed", str(seed)]) == 0
        helper_files.append(_testing(out / f"h{h}", f"masked_lark_helper/b1/helper-{h}",
                                     f"helper_{h}.parquet"))
    assert masked_lark_combine.main(["--helper_outputs", ",".join(helper_files), "--params",
                                     params, "--batch_id", "b1", "--output", str(out / "server"),
                                     "--testing_seed", str(seed)]) == 0
    with open(_testing(out / "server", "masked_lark_combine/b1", "aggregates.csv")) as handle:
        combined = {r["key"]: float(r["value"]) for r in csv.DictReader(handle)}
    return combined, helper_files, out


def _clear(rows):
    sums = {}
    for _, key, value in rows:
        sums[key] = sums.get(key, 0.0) + value
    return sums


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact")
    params = _params(tmp)
    records, rows = _records(tmp)
    combined, helper_files, out = _chain(tmp, records, params, "base")
    return tmp, params, rows, combined, helper_files, out


def test_exact_chain_equals_clear_sums_and_k_is_strict(exact):
    tmp, params, rows, combined, helper_files, _ = exact
    clear = _clear(rows)
    assert combined == {"A": clear["A"], "B": clear["B"]}  # C has exactly k records: suppressed
    for path in helper_files:  # one helper's sums alone are ring noise, not the sums
        table = pq.read_table(path)
        assert table.column("key").to_pylist() == ["A", "B"]
        shares = table.column("share_value").to_numpy()
        assert not np.array_equal(shares, np.array([clear["A"] * 256, clear["B"] * 256]))


def test_neighbouring_reports_share_helper_combine(exact):
    """Replace one report's value (the stated relation): every job releases the same structure
    (rows, keys, schema) and the exact decoded sums move by at most d (U - L), on its key only."""
    tmp, params, rows, combined, helper_files, out = exact
    records, rows2 = _records(tmp, change=(3, UPPER if rows[3][2] < 5 else LOWER),
                              name="neighbour.csv")
    combined2, helper_files2, out2 = _chain(tmp, records, params, "neighbour")
    assert sorted(combined2) == sorted(combined)
    diff = {k: abs(combined2[k] - combined[k]) for k in combined}
    assert 0 < diff["A"] <= 1 * (UPPER - LOWER) and diff["B"] == 0
    for h in (0, 1):
        a, b = pq.read_table(helper_files[h]), pq.read_table(helper_files2[h])
        assert a.schema == b.schema and a.column("key").equals(b.column("key"))
        s1 = _testing(out / "share", "masked_lark_share/b1", f"reports_helper_{h}.parquet")
        s2 = _testing(out2 / "share", "masked_lark_share/b1", f"reports_helper_{h}.parquet")
        assert pq.read_table(s1).schema == pq.read_table(s2).schema
        assert pq.read_table(s1).num_rows == pq.read_table(s2).num_rows == len(rows)


def _release_args(tmp_path, who):
    return ["--ledger", str(tmp_path / who / "ledger.json"),
            "--key_store", str(tmp_path / who / "keys")]


def test_noisy_helpers_charge_their_own_ledgers_and_combine_spends_nothing(exact, tmp_path,
                                                                           capsys):
    _, _, _, _, _, base = exact
    params = _params(tmp_path, epsilon=1.0)
    helper_files = []
    for h in (0, 1):
        reports = _testing(base / "share", "masked_lark_share/b1", f"reports_helper_{h}.parquet")
        assert masked_lark_helper.main(["--input", reports, "--params", params, "--helper",
                                        str(h), "--batch_id", "b1", "--output",
                                        str(tmp_path / f"h{h}")]
                                       + _release_args(tmp_path, f"helper{h}")) == 0
        ledger = BudgetLedger(str(tmp_path / f"helper{h}" / "ledger.json"),
                              str(tmp_path / f"helper{h}" / "keys"))
        record = ledger.get(f"masked_lark_helper/b1/helper-{h}")
        assert list(record["keys"]) == [f"helper-{h}"]
        assert ledger.spent(f"masked-lark-batch:b1/helper-{h}").epsilon == pytest.approx(1.0)
        helper_files.append(os.path.join(str(tmp_path / f"h{h}"), "masked_lark_helper", "b1",
                                         f"helper-{h}", "v1", f"helper_{h}.parquet"))
    capsys.readouterr()
    assert masked_lark_helper.main(["--input", reports, "--params", params, "--helper", "1",
                                    "--batch_id", "b1", "--output", str(tmp_path / "h1")]
                                   + _release_args(tmp_path, "helper1")) == 0
    assert "(reproduced)" in capsys.readouterr().out  # same key, same noise: charged once
    # the same reports under another batch id: refused by their content, nothing charged
    table = pq.read_table(_testing(base / "share", "masked_lark_share/b1",
                                   "reports_helper_0.parquet"))
    relabelled = str(tmp_path / "relabelled.parquet")
    pq.write_table(table.set_column(0, "batch_id", pa.array(["b2"] * table.num_rows)), relabelled)
    ledger_bytes = (tmp_path / "helper0" / "ledger.json").read_bytes()
    capsys.readouterr()
    assert masked_lark_helper.main(["--input", relabelled, "--params", params, "--helper", "0",
                                    "--batch_id", "b2", "--output", str(tmp_path / "h0")]
                                   + _release_args(tmp_path, "helper0")) == 2
    assert "content" in capsys.readouterr().err.lower()
    assert (tmp_path / "helper0" / "ledger.json").read_bytes() == ledger_bytes
    # the ad server: post-processing, (0, 0) recorded
    assert masked_lark_combine.main(["--helper_outputs", ",".join(helper_files), "--params",
                                     params, "--batch_id", "b1", "--output",
                                     str(tmp_path / "server")]
                                    + _release_args(tmp_path, "server")) == 0
    assert "epsilon=0, delta=0" in capsys.readouterr().out
    ledger = BudgetLedger(str(tmp_path / "server" / "ledger.json"),
                          str(tmp_path / "server" / "keys"))
    assert ledger.get("masked_lark_combine/b1")["measures"] == []
    with open(os.path.join(str(tmp_path / "server"), "masked_lark_combine", "b1", "v1",
                           "aggregates.csv")) as handle:
        rows = list(csv.DictReader(handle))
    assert [r["key"] for r in rows] == ["A", "B"]
    # each decoded value's error columns: both helpers' stated noise summed (public)
    assert list(rows[0]) == ["batch_id", "key", "value", "value_ci95_low", "value_ci95_high",
                             "value_std"]
    spec = params_from_json(json.load(open(params))).noise_spec()  # one helper's, in 2^-8 units
    for r in rows:
        assert float(r["value_std"]) == pytest.approx(math.sqrt(2) * spec.std / 256)
        half = float(r["value_ci95_high"]) - float(r["value"])
        assert half == pytest.approx(float(r["value"]) - float(r["value_ci95_low"]))
        assert half == pytest.approx(2 * spec.ci_halfwidth(0.975) / 256)  # a union bound


def test_bad_inputs_are_refused_before_any_charge(exact, tmp_path, capsys):
    base_tmp, exact_params, rows, _, helper_files, base = exact
    params = _params(tmp_path, epsilon=1.0)
    secret = "SECRET-cell-9f3a"
    bad_csv = write_csv(tmp_path / "reports.csv", ["batch_id", "report_id", "helper", "key"],
                        [["b1", "0" * 32, 0, secret]])
    reports0 = _testing(base / "share", "masked_lark_share/b1", "reports_helper_0.parquet")
    other = str(tmp_path / "other_batch.parquet")
    t = pq.read_table(helper_files[1])
    pq.write_table(t.set_column(1, "batch_digest", pa.array(["0" * 64] * t.num_rows)), other)
    replayed = str(tmp_path / "replayed.parquet")
    r0 = pq.read_table(reports0)
    pq.write_table(pa.concat_tables([r0, r0.slice(5, 1)]), replayed)
    cases = [
        (masked_lark_helper, ["--input", replayed, "--params", params, "--helper", "0",
                              "--batch_id", "b1"], ["report id twice"]),
        (masked_lark_helper, ["--input", bad_csv, "--params", params, "--helper", "0",
                              "--batch_id", "b1"], ["reports.csv", "share_value"]),
        (masked_lark_helper, ["--input", reports0, "--params", params, "--helper", "1",
                              "--batch_id", "b1"], ["another helper"]),
        (masked_lark_helper, ["--input", reports0, "--params", params, "--helper", "2",
                              "--batch_id", "b1"], ["--helper"]),
        (masked_lark_helper, ["--input", reports0, "--params", exact_params, "--helper", "0",
                              "--batch_id", "b1"], ["only with --testing_seed"]),
        (masked_lark_combine, ["--helper_outputs", helper_files[0], "--params", exact_params,
                               "--batch_id", "b1", "--testing_seed", "1"],
         ["one entry per helper"]),
        (masked_lark_combine, ["--helper_outputs", f"{helper_files[0]},{other}", "--params",
                               exact_params, "--batch_id", "b1", "--testing_seed", "1"],
         ["different sets of reports"]),
        (masked_lark_combine, ["--helper_outputs", f"{helper_files[1]},{helper_files[0]}",
                               "--params", exact_params, "--batch_id", "b1",
                               "--testing_seed", "1"], ["helper 0's output"]),
        (masked_lark_combine, ["--helper_outputs", ",".join(helper_files), "--params", params,
                               "--batch_id", "b1"], ["other public parameters"]),
        (masked_lark_share, ["--input", reports0, "--params", params, "--batch_id", "b1"],
         ["record_id"]),
        (masked_lark_train, ["--input", os.path.join(SAMPLE, "train.csv"), "--params", params,
                             "--model", os.path.join(SAMPLE, "model.json"), "--model_id", "m"],
         ["gradient parameters"]),
    ]
    for module, args, messages in cases:
        if "--testing_seed" not in args:
            args = args + _release_args(tmp_path, "refused")
        assert module.main(args + ["--output", str(tmp_path / "out")]) == 2, args
        err = capsys.readouterr().err
        for message in messages:
            assert message in err, (args, err)
        assert secret not in err
        assert not (tmp_path / "refused").exists()


def test_training_job_ledger_keys_and_neighbour(tmp_path, capsys):
    """Epochs x epsilon charged with one reserved key per helper; the testing comparison; and
    a neighbouring training set (one record's features and label replaced) releases the same
    structure (steps, suppressed steps, coordinates)."""
    args = ["--input", os.path.join(SAMPLE, "train.csv"),
            "--params", os.path.join(SAMPLE, "gradient_params.json"),
            "--model", os.path.join(SAMPLE, "model.json"), "--epochs", "2", "--batch_size", "120"]
    assert masked_lark_train.main(args + ["--model_id", "m1", "--output", str(tmp_path / "out")]
                                  + _release_args(tmp_path, "server")) == 0
    ledger = BudgetLedger(str(tmp_path / "server" / "ledger.json"),
                          str(tmp_path / "server" / "keys"))
    assert sorted(ledger.get("masked_lark_train/m1")["keys"]) == ["helper-0", "helper-1",
                                                                   "release"]
    assert ledger.spent("masked-lark-training:m1").epsilon == pytest.approx(2.0)
    folder = os.path.join(str(tmp_path / "out"), "masked_lark_train", "m1", "v1")
    assert sorted(os.listdir(folder)) == ["RELEASE.json", "model.csv", "training.csv"]

    with open(os.path.join(SAMPLE, "train.csv")) as handle:
        lines = handle.read().splitlines()
    header, first = lines[0], lines[1].split(",")
    first = [first[0]] + ["255" if int(v) < 128 else "0" for v in first[1:-1]] + \
        [str(1 - int(first[-1]))]
    neighbour = tmp_path / "neighbour.csv"
    neighbour.write_text("\n".join([header, ",".join(first)] + lines[2:]) + "\n")
    tables = []
    for name, path in (("a", os.path.join(SAMPLE, "train.csv")), ("b", str(neighbour))):
        run = args[:]
        run[1] = path
        assert masked_lark_train.main(run + ["--model_id", name, "--test_input",
                                             os.path.join(SAMPLE, "test.csv"), "--output",
                                             str(tmp_path / "t"), "--testing_seed", "3"]) == 0
        base = _testing(tmp_path / "t", f"masked_lark_train/{name}", "")
        tables.append({f: open(base + f).read() for f in ("training.csv", "comparison.csv")})
        tables[-1]["model"] = pa.csv.read_csv(base + "model.csv")
    assert tables[0]["training.csv"] == tables[1]["training.csv"]
    assert tables[0]["model"].column("parameter").equals(tables[1]["model"].column("parameter"))
    methods = [r["method"] for r in csv.DictReader(tables[0]["comparison.csv"].splitlines())]
    assert methods == ["central_clear", "central_dp", "masked_helpers"]


@pytest.mark.parametrize("module", [masked_lark_share, masked_lark_helper, masked_lark_combine,
                                    masked_lark_train])
def test_help(module, capsys):
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert "--testing_seed" in capsys.readouterr().out


def test_training_input_is_checked_before_any_charge(tmp_path, capsys):
    """The record count against --batch_size (public) is checked before the charge; one
    record's faulty value is not a refusal (tests/pipelines/release/test_row_faults.py) and never shown."""
    secret = "777"
    bad = write_csv(tmp_path / "bad.csv", ["record_id", "x_0", "x_1", "x_2", "x_3", "label"],
                    [[1, 10, 20, 30, 40, 1], [2, 10, 20, 30, secret, 0]])
    args = ["--params", os.path.join(SAMPLE, "gradient_params.json"),
            "--model", os.path.join(SAMPLE, "model.json"), "--model_id", "m",
            "--output", str(tmp_path / "out")] + _release_args(tmp_path, "server")
    assert masked_lark_train.main(["--input", bad] + args) == 2
    err = capsys.readouterr().err
    assert "fewer records than --batch_size" in err and "x_3" not in err and secret not in err
    assert masked_lark_train.main(["--input", os.path.join(SAMPLE, "train.csv"),
                                   "--batch_size", "1000"] + args) == 2
    assert "--batch_size" in capsys.readouterr().err
    assert not (tmp_path / "server").exists()


def test_gradient_chain_through_the_jobs_equals_the_clear_clipped_gradient(tmp_path):
    """Algorithm 3 end to end on the jobs without noise: browsers (real and fake labels, masks,
    blinding) -> each helper with the model -> the ad server equals the clear clipped gradient
    sum exactly in units of 2^-f; a neighbouring record moves it by at most 2 psi in L1."""
    from transforms.lark.helper import clear_gradient_units
    from transforms.lark.model import LogisticModel
    from transforms.lark.params import GradientParams

    rng = np.random.default_rng(3)
    n, d = 40, 3
    features = rng.integers(0, 256, size=(n, d))
    labels = rng.integers(0, 2, size=n)
    model_obj = {"weights": [0.5, -0.25, 0.125], "bias": 0.1, "feature_scale": 1 / 32,
                 "feature_offset": 128}
    model_path = tmp_path / "model.json"
    model_path.write_text(json.dumps(model_obj))
    params_obj = {"kind": "gradient", "num_features": d, "clip_norm": 1.0, "epsilon": None,
                  "k": 10, "fraction_bits": 16, "num_helpers": 2}
    params_path = tmp_path / "params.json"
    params_path.write_text(json.dumps(params_obj))
    model = LogisticModel.from_json(model_obj)
    params = GradientParams(**{k: v for k, v in params_obj.items() if k != "kind"})

    def chain(feats, labs, tag):
        records = write_csv(tmp_path / f"{tag}.csv", ["record_id", "x_0", "x_1", "x_2", "label"],
                            [[i, *feats[i], labs[i]] for i in range(n)])
        out = tmp_path / tag
        assert masked_lark_share.main(["--input", records, "--params", str(params_path),
                                       "--batch_id", "g1", "--output", str(out / "share"),
                                       "--testing_seed", "5"]) == 0
        files = []
        for h in (0, 1):
            reports = _testing(out / "share", "masked_lark_share/g1",
                               f"reports_helper_{h}.parquet")
            assert masked_lark_helper.main([
                "--input", reports, "--params", str(params_path), "--model", str(model_path),
                "--helper", str(h), "--batch_id", "g1", "--output", str(out / f"h{h}"),
                "--testing_seed", "5"]) == 0
            files.append(_testing(out / f"h{h}", f"masked_lark_helper/g1/helper-{h}",
                                  f"helper_{h}.parquet"))
        assert masked_lark_combine.main([
            "--helper_outputs", ",".join(files), "--params", str(params_path), "--model",
            str(model_path), "--batch_id", "g1", "--output", str(out / "server"),
            "--testing_seed", "5"]) == 0
        with open(_testing(out / "server", "masked_lark_combine/g1", "gradient.csv")) as handle:
            rows = list(csv.DictReader(handle))
        assert [int(r["coordinate"]) for r in rows] == list(range(d + 1))
        return np.array([float(r["gradient"]) for r in rows])

    got = chain(features, labels, "a")
    want = clear_gradient_units(model, params, features, labels) * 2.0 ** -16
    np.testing.assert_array_equal(got, want)
    neighbour_f, neighbour_l = features.copy(), labels.copy()
    neighbour_f[7], neighbour_l[7] = 255 - features[7], 1 - labels[7]
    moved = chain(neighbour_f, neighbour_l, "b")
    assert 0 < np.abs(moved - got).sum() <= 2 * params.clip_norm + 1e-12


def test_a_release_without_measures_must_say_why():
    from accounting.calibration import calibrate
    from accounting.measures import Measure
    from accounting.sensitivity import Sensitivities
    from pipelines.release import OutputSpec, PlannedRelease

    out = [OutputSpec(name="x.csv", sort_by=["a"], schema=pa.schema([("a", pa.int64())]))]
    with pytest.raises(ValueError, match="spends_nothing"):
        PlannedRelease(release_id="r/1", measures=[], scopes=[], outputs=out, config={})
    zero = PlannedRelease(release_id="r/1", measures=[], scopes=[], outputs=out, config={},
                          spends_nothing="post-processing")
    assert tuple(zero.guarantee()) == (0.0, 0.0)
    assert "post-processing" in zero.guarantee_json()["covers"]
    measure = Measure.of_noise("m", calibrate("discrete_laplace", epsilon=1.0, l1_sensitivity=1),
                               Sensitivities(l0=1, linf=1, l1=1, l2=1))
    with pytest.raises(ValueError, match="spends_nothing"):
        PlannedRelease(release_id="r/1", measures=[measure], scopes=[], outputs=out, config={},
                       spends_nothing="post-processing")
    with pytest.raises(ValueError, match="no scopes"):
        PlannedRelease(release_id="r/1", measures=[measure], scopes=[], outputs=out, config={})
