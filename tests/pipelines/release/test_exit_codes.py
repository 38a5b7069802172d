"""A fault trial across every job: the exit code promised, and nothing left by a refusal.

For each release job (``pipelines/*.py`` with a ``JOB``: found by reading the package, so a new
job without a row here fails :func:`test_every_job_is_tried`) a real release command on its
sample data, and per job the faults an operator meets at the edges (issue 32, item 2):

* privacy parameters at their extremes -- epsilon (and delta, where the job takes one) tiny,
  huge, infinite, NaN, negative, zero -- given as flags or in the job's configuration file;
* the ledger malformed (cut in half, garbage, wrong types, a record edited by hand, an older
  unchained version) and the key store unreadable (the ledger's chain key gone).

Every fault must exit with the code promised (0 released, 2 refused before the charge, 3 failed
after it; these faults are all refusals: 2). After exit 2 the ledger is byte for byte what it
was, the key store holds no new file and nothing is published; no message (stdout or stderr)
contains a line of an input file.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pathlib
import re
import shutil

import pytest
from release_testkit import files_under
from runners.deploy.flex_template import JOBS as JOB_COMMANDS

ROOT = pathlib.Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "pipelines" / "sample_data"

#: job -> (its flags, the sample files it reads, {fault: change}). A change is a flag and its
#: value, or ("json", file, key, value): a value written into a copied configuration file.
LARK = {"params": "aggregation_params.json"}
JOBS = {
    "centralnotice": (
        "--config {w}/centralnotice/campaigns.json --impressions {w}/centralnotice/impressions.csv "
        "--clicks {w}/centralnotice/clicks.csv "
        "--release C2026_000_fr/2026-11-29",
        ["centralnotice/campaigns.json", "centralnotice/impressions.csv",
         "centralnotice/clicks.csv", "centralnotice/protected_countries.txt"],
        "config"),
    "reach_frequency": (
        "--input {w}/reach_frequency/impressions.csv --campaigns c1,c2 --publishers pub_a,pub_b,pub_c "
        "--epsilon 1.0986", ["reach_frequency/impressions.csv"], "--epsilon"),
    "summary_reports": (
        "--input {w}/conv.csv --config {w}/config.json --epsilon 8 --batch_id A", [], "--epsilon"),
    "event_level_reports": (
        "--sources {w}/event_level/sources.csv --conversions {w}/event_level/conversions.csv "
        "--epsilon 14 --batch_id s "
        "--trigger_data_cardinality 2 --report_windows 2 --max_reports 2 --value_edges 20 "
        "--window_ends 2,30 --group_by campaign",
        ["event_level/sources.csv", "event_level/conversions.csv"], "--epsilon"),
    "ldp_frequencies": (
        "--input {w}/ldp/reports_oue.parquet --oracle oue --epsilon 2 --domain_size 32 "
        "--collection_id s", ["ldp/reports_oue.parquet"], "--epsilon"),
    "ldp_heavy_hitters": (
        "--input {w}/ldp/pem_reports.parquet --epsilon 4 --value_bits 16 --top_k 9 --collection_id s",
        ["ldp/pem_reports.parquet"], "--epsilon"),
    "shuffle_sum": (
        "--input {w}/ldp/shares.parquet --num_clients 1000 --value_bound 10 --epsilon 1 "
        "--delta 1e-6 --collection_id s", ["ldp/shares.parquet"], "--epsilon --delta"),
    "label_dp": (
        "--input {w}/ldp/training.csv --labels no,yes --epsilon 2 --features feature_1,feature_2 "
        "--dataset_id s", ["ldp/training.csv"], "--epsilon"),
    "masked_lark_share": (
        "--input {w}/masked_lark/conversions.csv --params {w}/masked_lark/aggregation_params.json "
        "--batch_id b1", ["masked_lark/conversions.csv", "masked_lark/aggregation_params.json"],
        ""),  # spends nothing: the shares use no epsilon (the helpers' noise does)
    "masked_lark_helper": (
        "--helper 0 --batch_id b1 --params {w}/masked_lark/aggregation_params.json "
        "--input {w}/reports_helper_0.parquet", ["masked_lark/aggregation_params.json"],
        "params"),
    "masked_lark_combine": (
        "--batch_id b1 --params {w}/masked_lark/aggregation_params.json "
        "--helper_outputs {w}/helper_0.parquet,{w}/helper_1.parquet",
        ["masked_lark/aggregation_params.json"], "params"),
    "masked_lark_train": (
        "--input {w}/masked_lark/train.csv --params {w}/masked_lark/gradient_params.json "
        "--model {w}/masked_lark/model.json --model_id m1 --local_noise_epsilon 4",
        ["masked_lark/train.csv", "masked_lark/gradient_params.json", "masked_lark/model.json"],
        "--local_noise_epsilon gradient"),
}
EXTREMES = {"tiny": "1e-300", "huge": "1e300", "inf": "inf", "nan": "nan", "negative": "-1",
            "zero": "0"}
DELTAS = {"one": "1", "nan": "nan", "negative": "-1e-6", "inf": "inf"}
#: Job parameters whose range or domain overflows what the computation holds (a sketch's
#: registers, a histogram's frequencies, a collection's clients, a training step, a slice
#: domain): refused before the charge -- they failed after it (memory, overflow) or exited 1.
RANGES = {
    "reach_frequency": [("--num_registers", str(10 ** 12)), ("--max_frequency", str(10 ** 18))],
    "shuffle_sum": [("--num_clients", str(10 ** 18))],
    "masked_lark_train": [("--learning_rate", "1e308")],
    "summary_reports": [("slice_dimensions", [2 ** 40, 2 ** 40]),
                        ("slice_dimensions", [2 ** 12, 2 ** 11])],
    "ldp_frequencies": [("--domain_size", str(10 ** 30))],
    "ldp_heavy_hitters": [("--value_bits", "4000"), ("--top_k", str(10 ** 18))],
    "event_level_reports": [("--trigger_data_cardinality", str(10 ** 18)),
                            ("--value_edges", "1e308,1e309")],
}
LEDGER_FAULTS = ("cut", "garbage", "wrong-types", "edited", "older-version", "chain-key-gone")


def _jobs_with_a_release_layer() -> set:
    found = set()
    for path in (ROOT / "pipelines").glob("**/*.py"):
        text = path.read_text()
        if re.search(r"^JOB = \w+\(\)", text, re.M):
            found.add(re.search(r'^NAME = "(\w+)"', text, re.M).group(1))
    return found


def test_every_job_is_tried():
    assert _jobs_with_a_release_layer() == set(JOBS)


# --------------------------------------------------------------------------- workspaces

def _run(job: str, argv) -> tuple[int, str, str]:
    main = importlib.import_module(JOB_COMMANDS[job]).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_info:
            code = exit_info.code
    return code, out.getvalue(), err.getvalue()


def _lark_inputs(folder: pathlib.Path) -> None:
    """The helpers' and the server's inputs: the sample's browser shares and helper outputs,
    made once in testing mode (no ledger)."""
    params = str(SAMPLE / "masked_lark" / "aggregation_params.json")
    out = folder / "made"
    code, _, err = _run("masked_lark_share", [
        "--input", str(SAMPLE / "masked_lark" / "conversions.csv"), "--params", params,
        "--batch_id", "b1", "--output", str(out / "share"), "--testing_seed", "1"])
    assert code == 0, err
    for h in (0, 1):
        [share] = (out / "share").rglob(f"reports_helper_{h}.parquet")
        shutil.copy(share, folder / f"reports_helper_{h}.parquet")
        code, _, err = _run("masked_lark_helper", [
            "--helper", str(h), "--batch_id", "b1", "--params", params, "--input", str(share),
            "--output", str(out / f"helper{h}"), "--testing_seed", "1"])
        assert code == 0, err
        [made] = (out / f"helper{h}").rglob(f"helper_{h}.parquet")
        shutil.copy(made, folder / f"helper_{h}.parquet")
    shutil.rmtree(out)


def _summary_inputs(folder: pathlib.Path) -> None:
    from test_fault_injection import SR_HEADER, _build_sr, _sr_rows

    from release_testkit import write_csv

    _build_sr(folder)
    write_csv(folder / "conv.csv", SR_HEADER, _sr_rows())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    """Every job's input files in one folder (copies: faults edit configuration files)."""
    folder = tmp_path_factory.mktemp("trial-inputs")
    for job, (_, files, _) in JOBS.items():
        for name in files:
            (folder / name).parent.mkdir(exist_ok=True)
            shutil.copy(SAMPLE / name, folder / name)
    _lark_inputs(folder)
    _summary_inputs(folder)
    return folder


def _workspace(inputs: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    """A fresh copy of the inputs and a chained ledger holding one earlier, unrelated
    release (so that ledger faults have a record to break)."""
    from accounting.budget import PrivacyBudget
    from accounting.ledger import BudgetLedger, ReleaseRequest, Scope
    from accounting.measures import Measure

    work = tmp_path / "w"
    shutil.copytree(inputs, work)
    (tmp_path / "private").mkdir()
    earlier = Measure(name="earlier", mechanism="recorded", epsilon=0.5,
                      neighbouring="as recorded")
    BudgetLedger(str(tmp_path / "private" / "ledger.json"), str(tmp_path / "private" / "keys")
                 ).reserve(ReleaseRequest(
                     release_id="earlier/1", measures=[earlier], input_digest="sha256:0",
                     scopes=[Scope(name="earlier", budget=PrivacyBudget(epsilon=1.0))]))
    return work


def _argv(job: str, work: pathlib.Path, root: pathlib.Path, change=()) -> list:
    flags = JOBS[job][0].format(w=work).split()
    flags += ["--output", str(root / "out"), "--ledger", str(root / "private" / "ledger.json"),
              "--key_store", str(root / "private" / "keys")]
    change = list(change)
    while change:
        flag, value = change.pop(0), change.pop(0)
        if flag in flags:
            flags[flags.index(flag) + 1] = value
        else:
            flags += [flag, value]
    return flags


@pytest.mark.parametrize("job", sorted(JOBS))
def test_the_trial_command_releases(job, inputs, tmp_path):
    """Without a fault, each job's trial command is a real release (so the refusals below are
    the faults', not a bad command's): exit 0, published, charged in the chained ledger, the
    run's hold ended; the same command again reproduces it."""
    from accounting.ledger.__main__ import main as ledger_main

    work = _workspace(inputs, tmp_path)
    argv = _argv(job, work, tmp_path)
    code, out, err = _run(job, argv)
    assert code == 0 and "(released)" in out, err
    assert any(p.name == "RELEASE.json" for p in (tmp_path / "out").rglob("*"))
    state = json.loads((tmp_path / "private" / "ledger.json").read_text())
    assert len(state["releases"]) >= 2 and not any("hold" in r for r in state["releases"].values())
    assert ledger_main(["verify", "--ledger", str(tmp_path / "private" / "ledger.json"),
                        "--key_store", str(tmp_path / "private" / "keys")]) == 0
    code, out, err = _run(job, argv)
    assert code == 0 and "(reproduced)" in out, err


# --------------------------------------------------------------------------- the faults

def _parameter_faults() -> list:
    cases = []
    for job, (_, _, where) in JOBS.items():
        for name, value in EXTREMES.items():
            for place in where.split():
                cases.append((job, f"{place.lstrip('-')}-{name}", place, value))
        if "--delta" in where:
            cases += [(job, f"delta-{name}", "--delta", value) for name, value in DELTAS.items()]
    return cases


def _set_json(path: pathlib.Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _apply(job: str, place: str, value: str, work: pathlib.Path) -> list:
    """The change of the command line (and of the configuration files) for one fault."""
    number = float(value)
    if place == "config":
        def campaign(data):
            data["campaigns"][0]["privacy"]["impressions"]["epsilon"] = number
        _set_json(work / "centralnotice" / "campaigns.json", campaign)
        return []
    if place in ("params", "gradient"):
        name = "gradient_params.json" if place == "gradient" else "aggregation_params.json"
        _set_json(work / "masked_lark" / name, lambda data: data.update(epsilon=number))
        return []
    return [place, value]


def _input_lines(work: pathlib.Path) -> set:
    """The lines of the text input files (long enough to tell apart from a message's words)."""
    lines = set()
    for rel, data in files_under(work).items():
        if rel.endswith((".csv", ".json", ".txt")):
            lines.update(line.strip() for line in data.decode("utf-8", "replace").splitlines()
                         if len(line.strip()) >= 12)
    return lines


def _check_refused(job, root, work, code, out, err, before):
    ledger_before, keys_before = before
    assert code == 2, f"{job}: exit {code}: {err or out}"
    assert (root / "private" / "ledger.json").read_bytes() == ledger_before
    assert sorted(os.listdir(root / "private" / "keys")) == keys_before
    assert not (root / "out").exists() or not any(
        p.name == "RELEASE.json" for p in (root / "out").rglob("*"))
    message = out + err
    leaked = [line for line in _input_lines(work) if line in message]
    assert not leaked, f"{job}: a message quotes an input line: {leaked[:1]}"


def _state(root: pathlib.Path) -> tuple:
    return ((root / "private" / "ledger.json").read_bytes(),
            sorted(os.listdir(root / "private" / "keys")))


@pytest.mark.parametrize("job, fault, place, value", _parameter_faults(),
                         ids=[f"{c[0]}-{c[1]}" for c in _parameter_faults()])
def test_a_parameter_at_its_extreme_is_refused_before_the_charge(job, fault, place, value,
                                                                inputs, tmp_path):
    work = _workspace(inputs, tmp_path)
    change = _apply(job, place, value, work)
    before = _state(tmp_path)
    code, out, err = _run(job, _argv(job, work, tmp_path, change))
    _check_refused(job, tmp_path, work, code, out, err, before)


RANGE_CASES = [(job, flag, value) for job, changes in RANGES.items() for flag, value in changes]


@pytest.mark.parametrize("job, flag, value", RANGE_CASES,
                         ids=[f"{j}-{f.lstrip('-')}-{i}" for i, (j, f, _) in enumerate(RANGE_CASES)])
def test_a_range_or_domain_that_overflows_is_refused_before_the_charge(job, flag, value, inputs,
                                                                      tmp_path):
    work = _workspace(inputs, tmp_path)
    change = [flag, value]
    if not flag.startswith("--"):  # a field of the job's configuration file
        _set_json(work / "config.json", lambda data: data.update({flag: value}))
        change = []
    before = _state(tmp_path)
    code, out, err = _run(job, _argv(job, work, tmp_path, change))
    _check_refused(job, tmp_path, work, code, out, err, before)


def _break_ledger(fault: str, root: pathlib.Path) -> None:
    from release_testkit import unchain

    path, keys = root / "private" / "ledger.json", root / "private" / "keys"
    data = path.read_bytes()
    if fault == "cut":
        path.write_bytes(data[:len(data) // 2])
    elif fault == "garbage":
        path.write_bytes(bytes(range(256)) * 4)
    elif fault in ("wrong-types", "edited"):
        state = json.loads(data)
        record = state["releases"]["earlier/1"]
        if fault == "wrong-types":
            record["measures"] = {"epsilon": "0.5"}
        else:
            record["measures"][0]["epsilon"] = 0.05
        path.write_text(json.dumps(state))
    elif fault == "older-version":
        unchain(path, keys, "beam-dp-release/budget-ledger/v3")
    elif fault in INTEGRITY_FAULTS:
        _break_integrity(fault, path, keys)
    else:
        next(keys.glob("ledger-chain-*")).unlink()


#: Issue 40: a ledger rolled back to an older copy, resealed with a key outside the key store,
#: or missing its witness -- each refused before the charge (tried on two jobs: one code path).
INTEGRITY_FAULTS = ("rolled-back", "resealed-elsewhere", "witness-gone")


def _break_integrity(fault: str, path: pathlib.Path, keys: pathlib.Path) -> None:
    from accounting.budget import PrivacyBudget
    from accounting.keys import ReleaseKey
    from accounting.ledger import BudgetLedger, ReleaseRequest, Scope, chain
    from accounting.measures import Measure

    older = path.read_bytes()
    BudgetLedger(str(path), str(keys)).reserve(ReleaseRequest(
        release_id="earlier/2", input_digest="sha256:2", scopes=[
            Scope(name="earlier", budget=PrivacyBudget(epsilon=1.0))],
        measures=[Measure(name="earlier", mechanism="recorded", epsilon=0.25,
                          neighbouring="as recorded")]))
    if fault == "rolled-back":
        path.write_bytes(older)
    elif fault == "witness-gone":
        next(keys.glob("ledger-witness-*")).unlink()
    else:
        key, elsewhere = ReleaseKey.generate(), path.parent.parent / "elsewhere"
        elsewhere.mkdir()
        state = json.loads(path.read_text())
        uri = elsewhere / f"ledger-chain-{state['ledger_id']}.{key.fingerprint()}.key"
        key.save(str(uri))
        del state["releases"]["earlier/2"], state["latest"]["earlier/2"]
        chain.seal(state, key.secret_bytes(), {"uri": str(uri), "fingerprint": key.fingerprint()})
        path.write_text(json.dumps(state))


LEDGER_CASES = [(job, fault) for job in JOBS for fault in LEDGER_FAULTS] + [
    (job, fault) for job in ("centralnotice", "summary_reports") for fault in INTEGRITY_FAULTS]


@pytest.mark.parametrize("job, fault", LEDGER_CASES, ids=[f"{j}-{f}" for j, f in LEDGER_CASES])
def test_a_broken_ledger_or_key_store_is_refused_before_the_charge(job, fault, inputs,
                                                                  tmp_path):
    work = _workspace(inputs, tmp_path)
    _break_ledger(fault, tmp_path)
    before = _state(tmp_path)
    code, out, err = _run(job, _argv(job, work, tmp_path))
    _check_refused(job, tmp_path, work, code, out, err, before)
    assert str(tmp_path / "private") in err  # the ledger (or its chain key) is named


# --------------------------------------------------------------------------- columns (issue 40)

#: job -> the input file (under the workspace) whose first column is named twice.
DUPLICATED_COLUMN = {
    "centralnotice": "centralnotice/clicks.csv", "reach_frequency": "reach_frequency/impressions.csv",
    "summary_reports": "conv.csv", "event_level_reports": "event_level/conversions.csv",
    "ldp_frequencies": "ldp/reports_oue.parquet", "ldp_heavy_hitters": "ldp/pem_reports.parquet",
    "shuffle_sum": "ldp/shares.parquet", "label_dp": "ldp/training.csv",
    "masked_lark_share": "masked_lark/conversions.csv",
    "masked_lark_helper": "reports_helper_0.parquet", "masked_lark_combine": "helper_0.parquet",
    "masked_lark_train": "masked_lark/train.csv",
}


def test_every_job_has_a_duplicated_column_case():
    assert set(DUPLICATED_COLUMN) == set(JOBS)


def _name_a_column_twice(path: pathlib.Path) -> str:
    """``path`` with its first column repeated as its last (same name, same values)."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        name = table.column_names[0]
        pq.write_table(pa.Table.from_arrays([*table.columns, table.column(0)],
                                            names=[*table.column_names, name]), path)
        return name
    import csv

    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows([*row, row[0]] for row in rows)
    return rows[0][0]


@pytest.mark.parametrize("job", sorted(DUPLICATED_COLUMN))
def test_a_column_named_twice_is_refused_before_the_charge(job, inputs, tmp_path):
    """Issue 40: five jobs exited 1 on a header naming a column twice, four read one of the two
    silently (which one differs between readers): refused in preflight, naming file and column."""
    work = _workspace(inputs, tmp_path)
    path = work / DUPLICATED_COLUMN[job]
    name = _name_a_column_twice(path)
    before = _state(tmp_path)
    code, out, err = _run(job, _argv(job, work, tmp_path))
    _check_refused(job, tmp_path, work, code, out, err, before)
    assert f"column {name!r} is named twice" in err and str(path) in err, err


# --------------------------------------------------------------------------- a full disk (issue 40)

def _tmpfs(folder: pathlib.Path, size: str):
    """A small tmpfs mounted at ``folder`` (root only: skipped otherwise); unmount with
    ``umount``."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')[:80]}")


def _fill(folder: pathlib.Path, leave: int) -> pathlib.Path:
    """Fill the file system of ``folder`` up to ``leave`` bytes free (page granularity)."""
    filler = folder / "filler"
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, free - leave))
    return filler


#: Free bytes left beside the ledger and key store: every step of a first release (the
#: consumed-id record, the key, the chain key, the ledger itself, the binding) meets the full disk.
FREE_BYTES = (0, 4096, 8192, 12288, 16384, 24576, 32768)


@pytest.mark.slow
@pytest.mark.parametrize("free", FREE_BYTES)
def test_a_full_ledger_or_key_store_is_exit_2_or_3_never_1(free, inputs, tmp_path):
    """A full disk under the ledger and the key store (a small tmpfs): exit 2 (nothing charged:
    no ledger, no key, no consumed-id record left) or 3 (charged, nothing published), naming the
    errno -- never exit 1; once space is freed, the same command releases, charged once."""
    import subprocess

    work = tmp_path / "w"
    shutil.copytree(inputs, work)
    private = tmp_path / "private"
    _tmpfs(private, "512k")  # room for a release's control files, a page each (ledger, witness, ...)
    try:
        filler = _fill(private, free)
        # Staging and operator reports default to the ledger's folder: kept off the small disk,
        # which holds what this test is about (ledger, bindings, consumed ids, keys, witness).
        argv = _argv("label_dp", work, tmp_path) + ["--staging_dir", str(tmp_path / "staging"),
                                                     "--report_dir", str(tmp_path / "reports")]
        code, out, err = _run("label_dp", argv)
        assert code in (0, 2, 3), f"exit {code}: {err}"
        published = [p for p in (tmp_path / "out").rglob("RELEASE.json")] \
            if (tmp_path / "out").exists() else []
        if code in (2, 3):
            assert "[Errno 28] No space left on device" in err, err
            assert not published
        if code == 2:
            assert "nothing was charged" in err
            assert not (private / "ledger.json").exists()
            keys = private / "keys"
            assert not keys.exists() or not [p for p in keys.iterdir()
                                             if not p.name.startswith("ledger-chain-")], \
                f"a key left behind: {sorted(p.name for p in keys.iterdir())}"
        filler.unlink()
        code, out, err = _run("label_dp", argv)
        assert code == 0, err
        state = json.loads((private / "ledger.json").read_text())
        assert len(state["releases"]) == 1
    finally:
        subprocess.run(["umount", str(private)], check=False)


def _chattr(flag: str, path: pathlib.Path) -> bool:
    import subprocess

    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


#: What is made immutable before a second release, and the exit code promised: the ledger, the
#: key store and the output root are probed before the charge (2); the job's folder of
#: releases is first written after it (3).
IMMUTABLE = {"ledger": ("private/ledger.json", 2), "key store": ("private/keys", 2),
             "output root": ("out", 2), "releases folder": ("out/label_dp", 3)}


@pytest.mark.slow
@pytest.mark.parametrize("place", sorted(IMMUTABLE))
def test_an_immutable_ledger_key_store_or_output_is_exit_2_or_3_never_1(place, inputs, tmp_path):
    """``chattr +i`` (root: permission bits do not stop root, an immutable file does): the
    second release exits as promised naming the errno, never 1, and a re-run once the flag is
    removed releases it."""
    if os.geteuid() != 0:
        pytest.skip("chattr needs root")
    work = _workspace(inputs, tmp_path)
    with open(work / "ldp" / "training.csv") as handle:
        lines = handle.readlines()
    (work / "first.csv").write_text("".join(lines[:101]))
    (work / "second.csv").write_text("".join(lines[:1] + lines[101:201]))
    argv = _argv("label_dp", work, tmp_path, ["--input", str(work / "first.csv")])
    assert _run("label_dp", argv)[0] == 0
    target, promised = IMMUTABLE[place]
    path = tmp_path / target
    if not _chattr("+i", path):
        pytest.skip("chattr +i is not supported here")
    second = _argv("label_dp", work, tmp_path, ["--dataset_id", "second",
                                                 "--input", str(work / "second.csv")])
    try:
        before = (tmp_path / "private" / "ledger.json").read_bytes()
        code, out, err = _run("label_dp", second)
        assert code == promised, f"exit {code}: {err}"
        assert "[Errno 1] Operation not permitted" in err or \
            f"{path} is not writable" in err, err
        assert not (tmp_path / "out" / "label_dp" / "second").exists()
        if code == 2:
            assert (tmp_path / "private" / "ledger.json").read_bytes() == before
    finally:
        _chattr("-i", path)
    code, out, err = _run("label_dp", second)
    assert code == 0, err
