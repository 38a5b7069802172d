"""Fault injection: what a hostile or careless operator does to a release, and what must happen.

Each job gets a small workspace with one release already published under a ledger (built once
per test process, restored before every case). A case is one line of :data:`CASES`:

    Case(id, job, fixture, command change, expected outcome)

* ``fixture``: a function of :data:`FIXTURES` that breaks the workspace (writes a bad input,
  deletes the ledger, ...); ``None`` leaves it as it is;
* ``change``: how the command differs from the job's release command :data:`BASE`
  (``--flag value`` replaces or adds a flag, ``--flag`` adds a switch, ``-flag`` removes one;
  ``{ws}`` is the workspace, ``{key}`` a stored secret key file);
* ``expect``: :func:`refused` (exit 2: the problem named, nothing charged), :func:`failed`
  (exit 3: after the reservation, nothing published, the rule or fault named), :func:`released`
  or :func:`reproduced` (exit 0), optionally followed by a check of :data:`THEN` (e.g. a
  corrected re-run takes the reservation over without spending again).

Every case asserts, besides its own outcome: the ledger file is unchanged on every refusal (and
no key was stored); no published file was replaced by different bytes (and a failed run
published nothing); no secret key appears in any output, report, ledger or message.

Kill points named after the lifecycle's phases (a forked child running a job's ``main`` with the
phase, or a step inside it, patched to ``os._exit`` right after it) and concurrent runs are
checked at the end.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import multiprocessing
import os
import shlex
import shutil
from dataclasses import dataclass
from typing import Callable, Optional

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from release_testkit import (CN_CLK_HEADER, CN_IMP_HEADER, assert_no_secret, cn_campaign,
                             cn_config, files_under, flip_value_byte, published, read_json,
                             secrets_of, write_csv, write_json)

from pipelines.centralnotice import job as centralnotice
from pipelines.ldp import label_dp
from pipelines.reach_frequency import job as reach_frequency
from pipelines.ara import summary_reports

MAINS = {"cn": centralnotice.main, "rf": reach_frequency.main, "sr": summary_reports.main}
PRIVATE = "{ws}/private"
BASE = {
    "cn": "--config {ws}/c.json --impressions {ws}/imp.csv --clicks {ws}/clk.csv "
          "--release C1/2026-11-01 --num_shards 2",
    "rf": "--input {ws}/imp.csv --campaigns c1 --publishers pub_a,pub_b --epsilon 0.6 "
          "--campaign_budget_epsilon 1.0 --num_registers 2000 --release_prefix rf",
    "sr": "--input {ws}/conv.csv --config {ws}/config.json --epsilon 8 --batch_id A",
}
COMMON = f" --output {{ws}}/out --ledger {PRIVATE}/ledger.json --key_store {PRIVATE}/keys"


# --------------------------------------------------------------------------- workspaces

def _cn_rows(day="2026-11-01", n=12, value=lambda i: 100 + 7 * i):
    keys = [(b, c, p) for b in ("C1_dsk", "C1_mob") for c in ("DE", "FR") for p in
            ("de.wikipedia", "fr.wikipedia")]
    return [("C1",) + keys[i % len(keys)] + (day, value(i)) for i in range(n)]


def _cn_inputs(ws, name="imp.csv", rows=None):
    rows = rows if rows is not None else _cn_rows() + _cn_rows("2026-11-02")
    return write_csv(ws / name, CN_IMP_HEADER, rows)


def _build_cn(ws):
    write_json(ws / "c.json", cn_config())
    _cn_inputs(ws)
    clicks = [r[:5] + (f"u{i % 5}",) for i, r in enumerate(_cn_rows() + _cn_rows("2026-11-02"))]
    write_csv(ws / "clk.csv", CN_CLK_HEADER, clicks)


def _rf_rows(campaigns=("c1", "c2"), n=240, vid=lambda i: i % 60):
    return [(("pub_a", "pub_b")[i % 2], campaigns[i % len(campaigns)], vid(i)) for i in range(n)]


def _build_rf(ws):
    write_csv(ws / "imp.csv", ["publisher", "campaign", "vid"], _rf_rows())


SR_CONFIG = {"measures": ["count", "value"], "clip_thresholds": [1.0, 20.0],
             "slice_dimensions": [2, 3], "prefixes": [0, 2],
             "budgets": [[1000, 2000], [3000, 4000]], "reports_per_source": 2}
SR_HEADER = ["source_id", "order", "dim_0", "dim_1", "value", "report_id"]


def _sr_rows(n=40, start=0, value=lambda i: f"{i % 20}.5"):
    return [(f"s{i}", 0, i % 2, i % 3, value(i), f"r{i}") for i in range(start, start + n)]


def _build_sr(ws):
    from transforms.ara.contribution import ContributionConfig

    (ws / "config.json").write_text(ContributionConfig(
        measures=tuple(SR_CONFIG["measures"]), clip_thresholds=tuple(SR_CONFIG["clip_thresholds"]),
        slice_dimensions=tuple(SR_CONFIG["slice_dimensions"]), prefixes=tuple(SR_CONFIG["prefixes"]),
        budgets=tuple(map(tuple, SR_CONFIG["budgets"])),
        reports_per_source=SR_CONFIG["reports_per_source"]).to_json())
    write_csv(ws / "conv.csv", SR_HEADER, _sr_rows())


BUILD = {"cn": _build_cn, "rf": _build_rf, "sr": _build_sr}


def base_argv(job: str, ws) -> list[str]:
    return shlex.split((BASE[job] + COMMON).format(ws=ws))


def run_main(job: str, argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = MAINS[job](list(argv))
        except SystemExit as exit_info:  # argparse
            code = exit_info.code
    return code, out.getvalue(), err.getvalue()


class Workspace:
    """One job's workspace: built (with one published release) once per test process, then
    restored byte for byte before each case (the ledger and binding hold absolute paths, so the
    workspace keeps its path)."""

    _built: dict = {}

    def __init__(self, job, root):
        self.job, self.path = job, root / job
        self.path.mkdir(parents=True)
        BUILD[job](self.path)
        code, out, err = run_main(job, base_argv(job, self.path))
        assert code == 0, err
        self._snapshot = {rel: (data, os.stat(self.path / rel).st_mode)
                          for rel, data in files_under(self.path).items()}

    @classmethod
    def get(cls, job, factory):
        if job not in cls._built:
            cls._built[job] = cls(job, factory.mktemp("fault-workspaces"))
        ws = cls._built[job]
        ws.restore()
        return ws

    def restore(self):
        shutil.rmtree(self.path)
        for rel, (data, mode) in self._snapshot.items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            os.chmod(target, mode)

    @property
    def ledger(self):
        return self.path / "private" / "ledger.json"

    @property
    def keys(self):
        return self.path / "private" / "keys"

    def key_file(self) -> str:
        keys = release_keys(self)
        return str(self.keys / keys[0]) if keys else "<no release key>"


def _binding(ws):
    """The output root's ledger binding, beside the ledger (pipelines.release.publish)."""
    [path] = (ws.path / "private" / "ledger.json.bindings").glob("*.json")
    return path


def _legacy_root(ws):
    """An output root as an older version left it: the binding in OUTPUT, empty staging
    folders beside the releases."""
    binding = _binding(ws)
    (ws.path / "out" / ".ledger-binding.json").write_bytes(binding.read_bytes())
    binding.unlink()
    (ws.path / "out" / ".staging" / "C1" / "2026-11-01").mkdir(parents=True)


def release_keys(ws) -> list:
    """The release keys in a workspace's key store (not the ledger's own keys)."""
    return sorted(n for n in os.listdir(ws.keys) if not n.startswith("ledger-"))


def charged(ledger_path) -> float:
    """Total epsilon the ledger has charged (every record, whatever its state)."""
    try:
        state = read_json(ledger_path)
    except FileNotFoundError:
        return 0.0
    except ValueError:  # an emptied ledger
        return None
    try:
        return sum(m["epsilon"] for r in state["releases"].values() for m in r["measures"])
    except (TypeError, AttributeError, KeyError):  # a malformed ledger
        return None


# --------------------------------------------------------------------------- fixtures: break something

def _write_gz(path, text):
    with gzip.open(path, "wt") as handle:
        handle.write(text)


def _csv_text(header, rows):
    return "\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n"


def _corrupt_page(path, table, column):
    """Write ``table`` as Parquet, then overwrite the header of one data page of ``column`` in
    the second row group (the footer stays valid: only a full read finds it)."""
    pq.write_table(table, path, row_group_size=max(1, table.num_rows // 3), compression="zstd",
                   use_dictionary=False)
    meta = pq.ParquetFile(path).metadata.row_group(1).column(table.column_names.index(column))
    data = bytearray(open(path, "rb").read())
    for i in range(meta.data_page_offset, meta.data_page_offset + 16):
        data[i] = 0xFF
    open(path, "wb").write(bytes(data))


def _cn_table(rows):
    import datetime as dt

    cols = list(zip(*rows))
    return pa.table({"campaign_id": list(cols[0]), "banner_id": list(cols[1]),
                     "country": list(cols[2]), "project": list(cols[3]),
                     "date": pa.array([dt.date.fromisoformat(d) for d in cols[4]], pa.date32()),
                     "impressions": pa.array([(i * 7919) % 100003 for i in range(len(rows))], pa.int64())})


def cn_corrupt_page(ws):
    _corrupt_page(ws / "imp.parquet", _cn_table(_cn_rows("2026-11-02", 3000)), "impressions")


def fix_cn_corrupt_page(ws):
    pq.write_table(_cn_table(_cn_rows("2026-11-02", 3000)), ws / "imp.parquet")


def cn_us_dates(ws):
    _cn_inputs(ws, "bad.csv", [r[:4] + ("11/02/2026", r[5]) for r in _cn_rows("2026-11-02")])


def fix_cn_us_dates(ws):
    _cn_inputs(ws, "bad.csv", _cn_rows("2026-11-02"))


def cn_thousands(ws):
    (ws / "bad.csv").write_text(",".join(CN_IMP_HEADER) + "\n" + "".join(
        f'C1,C1_dsk,DE,de.wikipedia,2026-11-02,"1,{i:03d}"\n' for i in range(12)))


def cn_most_dropped(ws):
    good = _cn_rows("2026-11-02", 4)
    _cn_inputs(ws, "bad.csv", good + [r[:5] + ("n/a",) for r in _cn_rows("2026-11-02", 6)])


def cn_directory(ws):
    """Impressions in a folder with subfolders, a _SUCCESS marker and a hidden partial file."""
    (ws / "dir" / "sub" / "deeper").mkdir(parents=True)
    _cn_inputs(ws / "dir", "a.csv", _cn_rows("2026-11-02", 4))
    _cn_inputs(ws / "dir" / "sub", "b.csv", _cn_rows("2026-11-02", 5))
    _cn_inputs(ws / "dir" / "sub" / "deeper", "c.csv", _cn_rows("2026-11-02", 6))
    (ws / "dir" / "_SUCCESS").write_text("")
    (ws / "dir" / ".partial.csv").write_text("not,a,csv\n")


def rf_directory(ws):
    (ws / "dir" / "x" / "y").mkdir(parents=True)
    write_csv(ws / "dir" / "a.csv", ["publisher", "campaign", "vid"], _rf_rows(("c2",), 30))
    write_csv(ws / "dir" / "x" / "y" / "b.csv", ["publisher", "campaign", "vid"],
              _rf_rows(("c2",), 30, vid=lambda i: 100 + i))


CN_HEADER_SPACES = "campaign_id, banner_id,country,project,date,impressions\n"
FIXTURES: dict[str, Callable] = {
    "cn_header_spaces": lambda ws: (ws / "bad.csv").write_text(CN_HEADER_SPACES),
    "cn_gzip_named_csv": lambda ws: _write_gz(ws / "bad.csv", _csv_text(CN_IMP_HEADER, _cn_rows("2026-11-02"))),
    "cn_gzip": lambda ws: _write_gz(ws / "imp.csv.gz", _csv_text(CN_IMP_HEADER, _cn_rows("2026-11-02"))),
    "cn_corrupt_page": cn_corrupt_page,
    "cn_bad_footer": lambda ws: (fix_cn_corrupt_page(ws), (ws / "imp.parquet").write_bytes(
        (ws / "imp.parquet").read_bytes()[:-20])),
    "cn_int64_date": lambda ws: pq.write_table(_cn_table(_cn_rows("2026-11-02")).set_column(
        4, "date", pa.array([20261102] * 12, pa.int64())), ws / "imp.parquet"),
    "cn_bool_impressions": lambda ws: pq.write_table(_cn_table(_cn_rows("2026-11-02")).set_column(
        5, "impressions", pa.array([True] * 12)), ws / "imp.parquet"),
    "cn_no_impressions_column": lambda ws: write_csv(ws / "bad.csv", CN_IMP_HEADER[:5], []),
    "cn_empty_file": lambda ws: (ws / "bad.csv").write_bytes(b""),
    "cn_not_utf8": lambda ws: (ws / "bad.csv").write_bytes(b"\xff\xfe\x00c\x00a"),
    "cn_us_dates": cn_us_dates,
    "cn_thousands": cn_thousands,
    "cn_most_dropped": cn_most_dropped,
    "cn_header_only": lambda ws: write_csv(ws / "bad.csv", CN_IMP_HEADER, []),
    "cn_directory": lambda ws: cn_directory(ws),
    "cn_campaign_dotdot": lambda ws: write_json(ws / "c.json", {
        "version": 1, "campaigns": [cn_campaign(campaign_id="..")]}),
    "cn_campaign_slash": lambda ws: write_json(ws / "c.json", {
        "version": 1, "campaigns": [cn_campaign(campaign_id="C1/x")]}),
    "cn_changed_input": lambda ws: _cn_inputs(ws, rows=_cn_rows() + _cn_rows("2026-11-02") + [
        ("C1", "C1_dsk", "DE", "de.wikipedia", "2026-11-01", 5)]),
    "cn_lower_period_budget": lambda ws: (FIXTURES["cn_changed_input"](ws), write_json(
        ws / "c.json", cn_config(budget={"campaign_total": {"epsilon": 8.0},
                                         "per_period": {"epsilon": 3.0}}))),
    "cn_stale_staging": lambda ws: (ws / "private" / "staging" / "C1" / "2026-11-02" / "v1.dead").mkdir(
        parents=True) or (ws / "private" / "staging" / "C1" / "2026-11-02" / "v1.dead" / "x").write_text("old"),
    "cn_tampered_release": lambda ws: (ws / "out" / "C1" / "2026-11-01" / "v1" / "centralnotice.parquet"
                                       ).write_bytes(b"PAR1 not the published bytes"),
    # ledger and output root
    "ledger_deleted": lambda ws: ws.ledger.unlink(),
    "ledger_emptied": lambda ws: ws.ledger.write_bytes(b""),
    "ledger_replaced": lambda ws: (ws.ledger.unlink(), _fresh_ledger(ws)),
    "ledger_forgot_release": lambda ws: _forget_releases(ws),
    "ledger_symlinked": lambda ws: _symlink_ledger(ws),
    "binding_deleted": lambda ws: _binding(ws).unlink(),
    "binding_garbage": lambda ws: _binding(ws).write_text("[]"),
    "binding_emptied": lambda ws: _binding(ws).write_bytes(b""),  # a full disk, before 40.4
    "binding_cut": lambda ws: _binding(ws).write_bytes(_binding(ws).read_bytes()[:9]),
    "binding_legacy": lambda ws: _legacy_root(ws),
    # reach & frequency
    "rf_ids_unparseable": lambda ws: write_csv(ws / "bad.csv", ["publisher", "campaign", "vid"],
                                               _rf_rows(("c2",), 60, vid=lambda i: f"x{i}")),
    "rf_header_spaces": lambda ws: (ws / "bad.csv").write_text("publisher,campaign, vid\npub_a,c2,1\n"),
    "rf_gzip_named_csv": lambda ws: _write_gz(ws / "bad.csv", _csv_text(["publisher", "campaign", "vid"],
                                                                        _rf_rows(("c2",), 20))),
    "rf_bool_id": lambda ws: pq.write_table(pa.table({"publisher": ["pub_a"], "campaign": ["c2"],
                                                      "vid": [True]}), ws / "bad.parquet"),
    "rf_corrupt_page": lambda ws: _corrupt_page(ws / "imp.parquet", _rf_table(), "vid"),
    "rf_directory": lambda ws: rf_directory(ws),
    "rf_changed_input": lambda ws: write_csv(ws / "imp.csv", ["publisher", "campaign", "vid"],
                                             _rf_rows(n=242)),
    # summary reports
    "sr_bad_value_deep": lambda ws: (ws / "big.csv").write_text(
        "source_id,order,dim_0,dim_1,value,note,report_id\n"
        + "".join(f"b{i},0,{i % 2},{i % 3},{i % 20},{'n' * 2500},rb{i}\n" for i in range(450))
        + "b999,0,1,1,oops,x,rb999\n"),
    "sr_not_utf8_deep": lambda ws: (ws / "big.csv").write_bytes(
        ("source_id,order,dim_0,dim_1,value,note,report_id\n"
         + "".join(f"b{i},0,{i % 2},{i % 3},{i % 20},{'n' * 2500},rb{i}\n"
                   for i in range(450))).encode()
        + b"b999,0,1,1,3\xff\xfe,x,rb999\n"),
    "sr_domain": lambda ws: (ws / "domain.txt").write_text("0x10\n"),
    "sr_reordered_gz": lambda ws: _write_gz(ws / "again.csv.gz", _csv_text(
        ["value", "dim_1", "report_id", "source_id", "dim_0", "order"],
        [(r[4], r[3], r[5], r[0], r[2], r[1]) for r in reversed(_sr_rows())])),
    "sr_other_batch": lambda ws: write_csv(ws / "conv2.csv", SR_HEADER, _sr_rows(start=100)),
    "sr_all_values_bad": lambda ws: write_csv(ws / "conv2.csv", SR_HEADER,
                                              _sr_rows(start=100, value=lambda i: '"1,5"')),
    "sr_source_ids_missing": lambda ws: write_csv(ws / "conv2.csv", SR_HEADER,
                                                  [("",) + r[1:] for r in _sr_rows(start=100)]),
    "sr_header_spaces": lambda ws: (ws / "conv2.csv").write_text(
        "source_id ,order,dim_0,dim_1,value,report_id\n"),
    "sr_changed_config": lambda ws: (ws / "config.json").write_text(json.dumps(
        {**json.loads((ws / "config.json").read_text()), "clip_thresholds": [1.0, 10.0]})),
}
FIXES: dict[str, Callable] = {
    "cn_corrupt_page": fix_cn_corrupt_page,
    "cn_us_dates": fix_cn_us_dates,
    "cn_thousands": fix_cn_us_dates,
    "rf_corrupt_page": lambda ws: pq.write_table(_rf_table(), ws / "imp.parquet"),
    "rf_ids_unparseable": lambda ws: write_csv(ws / "bad.csv", ["publisher", "campaign", "vid"],
                                               _rf_rows(("c2",), 60)),
    "sr_all_values_bad": lambda ws: write_csv(ws / "conv2.csv", SR_HEADER, _sr_rows(start=100)),
}


def _rf_table():
    rows = _rf_rows(("c2",), 3000, vid=lambda i: i)
    return pa.table({"publisher": [r[0] for r in rows], "campaign": [r[1] for r in rows],
                     "vid": pa.array([r[2] for r in rows], pa.int64())})


def _fresh_ledger(ws):
    from accounting.budget import PrivacyBudget
    from accounting.ledger import BudgetLedger, Scope

    BudgetLedger(str(ws.ledger), str(ws.keys)).set_budget(Scope(name="x", budget=PrivacyBudget(epsilon=1)))


def rewrite_ledger(ws, change):
    """Rewrite the ledger as the release layer writes it (chained, its head MAC'd under the
    ledger's chain key): what a genuine older copy or another run's write looks like, as
    opposed to a hand edit."""
    from accounting.ledger import BudgetLedger

    ledger = BudgetLedger(str(ws.ledger), str(ws.keys))
    state = ledger.snapshot()
    change(state)
    ledger._transact(lambda data: (None, ledger._dump(state)))


def _forget_releases(ws):
    """An older copy of the ledger: same ledger id, without the published release's record."""
    def forget(state):
        state["releases"], state["latest"], state["content"] = {}, {}, {}
    rewrite_ledger(ws, forget)


def _symlink_ledger(ws):
    real = ws.path / "private" / "real" / "ledger.json"
    real.parent.mkdir()
    ws.ledger.rename(real)
    ws.ledger.symlink_to(real)


# --------------------------------------------------------------------------- follow-up checks

def then_takeover(ws, case, argv, charged_after):
    """The corrected input (a new digest) takes the reservation over: released, nothing more
    spent, a fresh key stored."""
    keys = len(release_keys(ws))
    FIXES[case.fixture](ws.path)
    code, out, err = run_main(case.job, argv)
    assert code == 0, err
    assert "took over an unpublished reservation: nothing more was spent" in out
    assert charged(ws.ledger) == pytest.approx(charged_after)
    assert len(release_keys(ws)) == keys + 1


def then_reproduce(ws, case, argv, charged_after):
    """Running it again reproduces every published byte and spends nothing."""
    before = published(ws.path / "out")
    code, out, err = run_main(case.job, argv)
    assert code == 0 and "(reproduced)" in out, err
    assert published(ws.path / "out") == before
    assert charged(ws.ledger) == pytest.approx(charged_after)


def then_rerun_writable(ws, case, argv, charged_after):
    """Nothing was consumed: the same batch with a writable output is released."""
    fixed = [str(ws.path / "out") if a.startswith(str(ws.path / "conv.csv")) else a for a in argv]
    code, out, err = run_main(case.job, fixed)
    assert code == 0 and "(released)" in out, err


def then_symlink_kept(ws, case, argv, charged_after):
    real = ws.path / "private" / "real" / "ledger.json"
    assert ws.ledger.is_symlink() and os.path.realpath(ws.ledger) == str(real)
    assert set(read_json(real)["latest"]) == {"C1/2026-11-01", "C1/2026-11-02"}
    then_reproduce(ws, case, argv, charged_after)


def then_directory_digest(ws, case, argv, charged_after):
    """Every file below the folder was read (and no hidden one), and the digest covers exactly
    those: the same files listed one by one reproduce the release; a changed file in a
    subfolder is a changed input."""
    report = read_json(ws.path / "private" / "reports" / "C1" / "2026-11-02" / "v1" / "report.json")
    assert report["counters"]["impressions.read"] == 4 + 5 + 6
    files = ",".join(str(ws.path / "dir" / p) for p in ("a.csv", "sub/b.csv", "sub/deeper/c.csv"))
    listed = [files if a == str(ws.path / "dir") else a for a in argv]
    code, out, err = run_main(case.job, listed)
    assert code == 0 and "(reproduced)" in out, err
    _cn_inputs(ws.path / "dir" / "sub" / "deeper", "c.csv", _cn_rows("2026-11-02", 7))
    code, out, err = run_main(case.job, argv)
    assert code == 2 and "input is now" in err


def then_rf_directory(ws, case, argv, charged_after):
    report = read_json(ws.path / "private" / "reports" / "rf" / "c2" / "v1" / "report.json")
    assert report["counters"]["rows_read"] == 60


def then_staging_cleaned(ws, case, argv, charged_after):
    assert not (ws.path / "private" / "staging" / "C1" / "2026-11-02" / "v1.dead").exists()
    assert not any((ws.path / "private" / "staging" / "C1" / "2026-11-02").iterdir())


def then_binding_repaired(ws, case, argv, charged_after):
    """The interrupted binding was this toolkit's own write: written again, whole."""
    assert read_json(_binding(ws))["ledger"] == str(ws.ledger)
    then_reproduce(ws, case, argv, charged_after)


def then_root_migrated(ws, case, argv, charged_after):
    """Nothing but releases is left in the public root: the binding moved beside the ledger,
    the empty staging folders are gone."""
    assert read_json(_binding(ws))["ledger_id"] == read_json(ws.ledger)["ledger_id"]
    assert not (ws.path / "out" / ".ledger-binding.json").exists()
    assert not (ws.path / "out" / ".staging").exists()
    assert sorted(p.name for p in (ws.path / "out").iterdir()) == ["C1"]


def then_alert(ws, case, argv, charged_after):
    """The alert is the operator's: in the operator report, never in what is published."""
    reports = [read_json(p) for p in (ws.path / "private" / "reports").rglob("report.json")]
    assert any(r["alerts"] for r in reports)
    for path, data in published(ws.path / "out").items():
        assert b"alert" not in data.lower() and b"eligible rows" not in data, path


def then_new_version(ws, case, argv, charged_after):
    marker = read_json(ws.path / "out" / "C1" / "2026-11-01" / "v2" / "RELEASE.json")
    assert marker["versioned_id"] == "C1/2026-11-01#2"


def then_testing_prefix(ws, case, argv, charged_after):
    markers = list((ws.path / "out" / "testing-not-a-release").rglob("RELEASE.json"))
    assert markers and all(read_json(m)["testing"] for m in markers)


THEN = {"takeover": then_takeover, "reproduce": then_reproduce, "symlink": then_symlink_kept,
        "directory": then_directory_digest, "rf_directory": then_rf_directory,
        "staging": then_staging_cleaned, "alert": then_alert,
        "binding": then_binding_repaired, "root_migrated": then_root_migrated,
        "new_version": then_new_version, "testing": then_testing_prefix,
        "writable": then_rerun_writable}


# --------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Expect:
    code: int
    says: tuple = ()
    spend: str = "same"          # "same" or "more" (epsilon charged by the ledger)
    then: Optional[str] = None


def refused(*says, then=None):
    return Expect(2, says, "same", then)


def failed(*says, spend="more", then=None):
    return Expect(3, says, spend, then)


def released(*says, spend="more", then=None):
    return Expect(0, ("(released)",) + says if spend == "more" else says, spend, then)


def alerted(code, *says, then=None):
    """Released with an operator alert, and --alert_exit_code ``code`` asked for (stderr)."""
    return Expect(code, says, "more", then)


def _published(expect: Expect) -> bool:
    """Exit 0, 4 (published, the ledger commit failed) or an operator's --alert_exit_code
    (5..125): released."""
    return expect.code == 0 or expect.code >= 4


def reproduced(*says, then=None):
    return Expect(0, ("(reproduced)",) + says, "same", then)


def submitted(*says, spend="more", then=None):
    """--submit_only: reserved (charged unless already) and staged, nothing published."""
    return Expect(0, (": submitted ", "finish it with the same flags and --finalize") + says,
                  spend, then)


@dataclass(frozen=True)
class Case:
    id: str
    job: str
    fixture: Optional[str]
    change: str
    expect: Expect


TESTING = "--testing_seed 1 -ledger -key_store"
ALERT = "ALERT (operator only; the release is published): "
DAY2 = "--release C1/2026-11-02"
CASES = [
    # ---- CentralNotice: re-runs, testing seeds, output roots
    Case("cn-rerun", "cn", None, "", reproduced(then="reproduce")),
    Case("cn-rerun-other-sharding", "cn", None, "--num_shards 5", reproduced()),
    Case("cn-next-day", "cn", None, DAY2, released("C1/2026-11-02")),
    Case("cn-testing-into-published-folder", "cn", None,
         f"{TESTING} --output {{ws}}/out/C1/2026-11-01/v1",
         refused("inside the published release {ws}/out/C1/2026-11-01/v1")),
    Case("cn-testing-into-release-subfolder", "cn", None,
         f"{TESTING} --output {{ws}}/out/C1/2026-11-01/v1/x", refused("inside the published release")),
    Case("cn-testing-beside-releases", "cn", None, TESTING,
         released("(testing)", spend="same", then="testing")),
    Case("cn-testing-seed-with-ledger", "cn", None, "--testing_seed 1",
         refused("--testing_seed makes no release")),
    Case("cn-release-into-testing-prefix", "cn", None, "--output {ws}/out/testing-not-a-release",
         refused("a release never goes there")),
    Case("cn-output-inside-release", "cn", None, "--output {ws}/out/C1/2026-11-01/v1",
         refused("choose the output root, not a release")),
    Case("cn-output-unwritable", "cn", None, f"{DAY2} --output {{ws}}/c.json/out",
         refused("--output: cannot write {ws}/c.json/out", "is not a folder")),
    Case("cn-dry-run-release", "cn", None, "--dry_run True", refused("--testing_seed")),
    # ---- the ledger: deleted, mistyped, emptied, replaced, older, symlinked, binding
    Case("cn-ledger-deleted", "cn", "ledger_deleted", "",
         refused("{ws}/private/ledger.json.bindings/", "{ws}/private/ledger.json does not exist")),
    Case("cn-ledger-mistyped", "cn", None, "--ledger {ws}/private/Ledger.json",
         refused("holds published releases of ledger", "{ws}/out/C1/2026-11-01/v1/RELEASE.json",
                 "{ws}/private/Ledger.json does not exist")),
    Case("cn-ledger-emptied", "cn", "ledger_emptied", DAY2,
         refused("{ws}/private/ledger.json.bindings/", "{ws}/private/ledger.json is not valid JSON")),
    Case("cn-ledger-replaced", "cn", "ledger_replaced", DAY2,
         refused("{ws}/private/ledger.json.bindings/", "is another ledger")),
    Case("cn-ledger-older-copy", "cn", "ledger_forgot_release", "",
         refused("{ws}/out/C1/2026-11-01/v1/RELEASE.json is a published release that ledger "
                 "{ws}/private/ledger.json does not hold")),
    Case("cn-ledger-is-a-folder", "cn", None, "--ledger {ws}/private",
         refused("--ledger {ws}/private is a folder")),
    Case("cn-key-store-is-a-file", "cn", None, f"{DAY2} --key_store {{ws}}/c.json",
         refused("--key_store: cannot write {ws}/c.json")),
    Case("cn-ledger-symlinked", "cn", "ledger_symlinked", DAY2, released(then="symlink")),
    # the binding lost: the markers name this ledger, so the root is bound again
    Case("cn-binding-deleted", "cn", "binding_deleted", DAY2, released("C1/2026-11-02", then="binding")),
    Case("cn-binding-garbage", "cn", "binding_garbage", DAY2,
         refused("{ws}/private/ledger.json.bindings/", "is not a ledger binding")),
    # an interrupted write of the binding (empty, or cut): the toolkit's own, repaired
    Case("cn-binding-emptied", "cn", "binding_emptied", DAY2, released("C1/2026-11-02", then="binding")),
    Case("cn-binding-cut", "cn", "binding_cut", DAY2, released("C1/2026-11-02", then="binding")),
    # a root of an older version: the binding leaves the public root, with the empty staging
    Case("cn-binding-in-the-public-root", "cn", "binding_legacy", DAY2,
         released("C1/2026-11-02", then="root_migrated")),
    # ---- input faults found before any charge
    Case("cn-header-with-spaces", "cn", "cn_header_spaces", f"{DAY2} --impressions {{ws}}/bad.csv",
         refused("--impressions: {ws}/bad.csv: header field 2 is column 'banner_id' with "
                 "surrounding spaces")),
    Case("cn-gzip-named-csv", "cn", "cn_gzip_named_csv", f"{DAY2} --impressions {{ws}}/bad.csv",
         refused("{ws}/bad.csv is gzip-compressed but its name does not say so")),
    Case("cn-gzip-named-gz", "cn", "cn_gzip", f"{DAY2} --impressions {{ws}}/imp.csv.gz",
         released("impressions.read=12")),
    Case("cn-parquet-bad-footer", "cn", "cn_bad_footer", f"{DAY2} --impressions {{ws}}/imp.parquet",
         refused("{ws}/imp.parquet is not a readable Parquet file")),
    Case("cn-int64-date", "cn", "cn_int64_date", f"{DAY2} --impressions {{ws}}/imp.parquet",
         refused("column 'date' has type int64, not a usable date column")),
    Case("cn-bool-impressions", "cn", "cn_bool_impressions", f"{DAY2} --impressions {{ws}}/imp.parquet",
         refused("column 'impressions' has type bool, not a usable number column")),
    Case("cn-missing-column", "cn", "cn_no_impressions_column", f"{DAY2} --impressions {{ws}}/bad.csv",
         refused("{ws}/bad.csv has no column 'impressions'")),
    Case("cn-empty-file", "cn", "cn_empty_file", f"{DAY2} --impressions {{ws}}/bad.csv",
         refused("{ws}/bad.csv has no column")),
    Case("cn-not-utf8", "cn", "cn_not_utf8", f"{DAY2} --impressions {{ws}}/bad.csv",
         refused("does not start with a UTF-8 CSV header")),
    Case("cn-nothing-matches", "cn", None, f"{DAY2} --impressions {{ws}}/nope/*.csv",
         refused("--impressions: '{ws}/nope/*.csv' matches no file")),
    Case("cn-key-file-as-input", "cn", None, f"{DAY2} --impressions {{key}}",
         refused("--impressions: {key} is a release key file")),
    Case("cn-key-file-as-csv", "cn", None, f"{DAY2} --impressions {{key}} --input_format csv",
         refused("{key} is a release key file")),
    Case("cn-key-file-as-parquet", "cn", None, f"{DAY2} --impressions {{key}} --input_format parquet",
         refused("{key} is a release key file")),
    Case("cn-campaign-dotdot", "cn", "cn_campaign_dotdot", "--release ../2026-11-01",
         refused("campaigns[0].campaign_id: must be letters, digits")),
    Case("cn-campaign-with-slash", "cn", "cn_campaign_slash", "--release C1/x/2026-11-01",
         refused("campaigns[0].campaign_id: must be letters, digits")),
    Case("cn-unscheduled-release", "cn", None, "--release C1/2026-12-01", refused("not scheduled")),
    # ---- changed input, versions, budgets
    Case("cn-changed-input", "cn", "cn_changed_input", "",
         refused("the input is now", "new_release")),
    Case("cn-changed-input-new-release", "cn", "cn_changed_input", "--new_release",
         released(then="new_version")),
    Case("cn-new-release-over-budget", "cn", "cn_lower_period_budget", "--new_release",
         refused("scope 'period:C1:2026-11-01'", "over its budget", "Nothing was charged")),
    Case("cn-tampered-published-file", "cn", "cn_tampered_release", "",
         failed("is published with other bytes (centralnotice.parquet)", spend="same")),
    # ---- deep faults: after the reservation, nothing published, taken over when corrected
    Case("cn-corrupt-parquet-page", "cn", "cn_corrupt_page", f"{DAY2} --impressions {{ws}}/imp.parquet",
         failed("the computation failed (--impressions: {ws}/imp.parquet could not be read in full",
                "takes it over without spending again", then="takeover")),
    # ---- row rules: operator-only alerts, never a refusal (pipelines/release/__init__.py)
    Case("cn-all-us-dates", "cn", "cn_us_dates", f"{DAY2} --impressions {{ws}}/bad.csv",
         released(f"{ALERT}impressions: all 12 eligible rows dropped",
                  "impressions.dropped.missing_key=12", then="alert")),
    Case("cn-all-us-dates-allowed", "cn", "cn_us_dates", f"{DAY2} --impressions {{ws}}/bad.csv "
         "--allow_dropped_rows", refused("--allow_dropped_rows was removed", "--alert_exit_code")),
    Case("cn-thousands-separators", "cn", "cn_thousands", f"{DAY2} --impressions {{ws}}/bad.csv",
         released(f"{ALERT}impressions: all 12 eligible rows dropped",
                  "impressions.dropped.unparseable=12", then="alert")),
    Case("cn-thousands-allowed-dashed", "cn", "cn_thousands", f"{DAY2} --impressions {{ws}}/bad.csv "
         "--allow-dropped-rows", refused("--allow_dropped_rows was removed")),
    Case("cn-most-rows-dropped", "cn", "cn_most_dropped", f"{DAY2} --impressions {{ws}}/bad.csv",
         released(f"{ALERT}impressions: 6 of 10 eligible rows dropped (more than 50%)",
                   then="alert")),
    Case("cn-most-rows-dropped-alert-exit-code", "cn", "cn_most_dropped",
         f"{DAY2} --impressions {{ws}}/bad.csv --alert_exit_code 9",
         alerted(9, "alert (operator only; published): C1/2026-11-02: impressions: 6 of 10")),
    Case("cn-most-rows-dropped-share-raised", "cn", "cn_most_dropped",
         f"{DAY2} --impressions {{ws}}/bad.csv --max_dropped_fraction 0.7 --alert_exit_code 9",
         released()),
    Case("cn-header-only-input", "cn", "cn_header_only", f"{DAY2} --impressions {{ws}}/bad.csv",
         released(f"{ALERT}impressions: no eligible rows", then="alert")),
    # ---- folders, stale staging, spellings
    Case("cn-directory-input", "cn", "cn_directory", f"{DAY2} --impressions {{ws}}/dir",
         released(then="directory")),
    Case("cn-stale-staging-removed", "cn", "cn_stale_staging", DAY2, released(then="staging")),
    Case("cn-dashed-flags", "cn", None, "dashed", reproduced()),
    Case("cn-dashed-flags-testing", "cn", None, f"dashed {TESTING}", released("(testing)", spend="same")),
    # ---- reach & frequency
    Case("rf-rerun", "rf", None, "", reproduced(then="reproduce")),
    Case("rf-second-campaign-over-budget", "rf", None, "--campaigns c2,c1 --new_release",
         refused("scope 'campaign:c1'", "Nothing was charged")),
    Case("rf-both-campaigns-fit", "rf", None, "--campaigns c1,c2", released("rf/c2", spend="more")),
    Case("rf-testing-into-published-folder", "rf", None, f"{TESTING} --output {{ws}}/out/rf/c1/v1",
         refused("inside the published release")),
    Case("rf-testing-beside-releases", "rf", None, TESTING,
         released("(testing)", spend="same", then="testing")),
    Case("rf-ledger-deleted", "rf", "ledger_deleted", "", refused("{ws}/private/ledger.json.bindings/",
                                                                  "does not exist")),
    Case("rf-ledger-replaced", "rf", "ledger_replaced", "", refused("is another ledger")),
    Case("rf-campaign-dotdot", "rf", None, "--campaigns ..", refused("campaign '..' is not a valid name")),
    Case("rf-campaign-escapes", "rf", None, "--campaigns c1,../../etc", refused("is not a valid name")),
    Case("rf-release-prefix-escapes", "rf", None, "--release_prefix ../x", refused("is not a valid name")),
    Case("rf-ids-unparseable", "rf", "rf_ids_unparseable", "--campaigns c2 --input {ws}/bad.csv",
         released(f"{ALERT}impressions: all 60 eligible rows dropped", "rows_missing_id=60",
                  then="alert")),
    Case("rf-ids-unparseable-allowed", "rf", "rf_ids_unparseable",
         "--campaigns c2 --input {ws}/bad.csv --allow_dropped_rows",
         refused("--allow_dropped_rows was removed")),
    Case("rf-header-with-spaces", "rf", "rf_header_spaces", "--campaigns c2 --input {ws}/bad.csv",
         refused("header field 3 is column 'vid' with surrounding spaces")),
    Case("rf-gzip-named-csv", "rf", "rf_gzip_named_csv", "--campaigns c2 --input {ws}/bad.csv",
         refused("gzip-compressed but its name does not say so")),
    Case("rf-bool-ids", "rf", "rf_bool_id", "--campaigns c2 --input {ws}/bad.parquet",
         refused("column 'vid' has type bool, not a usable id column")),
    Case("rf-corrupt-parquet-page", "rf", "rf_corrupt_page", "--campaigns c2 --input {ws}/imp.parquet",
         failed("the computation failed (--input: {ws}/imp.parquet could not be read in full",
                then="takeover")),
    Case("rf-key-file-as-input", "rf", None, "--campaigns c2 --input {key} --input_format csv",
         refused("--input: {key} is a release key file")),
    Case("rf-directory-input", "rf", "rf_directory", "--campaigns c2 --input {ws}/dir",
         released(then="rf_directory")),
    Case("rf-changed-input", "rf", "rf_changed_input", "", refused("the input is now")),
    Case("rf-dashed-flags", "rf", None, "dashed", reproduced()),
    # ---- summary reports
    Case("sr-rerun", "sr", None, "", reproduced(then="reproduce")),
    Case("sr-same-reports-other-label", "sr", None, "--batch_id B",
         refused("already charged as release 'summary_reports/A'")),
    Case("sr-same-reports-reordered-gzipped", "sr", "sr_reordered_gz",
         "--batch_id C --input {ws}/again.csv.gz", refused("already charged as release 'summary_reports/A'")),
    Case("sr-same-label-changed-config", "sr", "sr_changed_config", "", refused("the input is now")),
    Case("sr-other-batch", "sr", "sr_other_batch", "--batch_id B --input {ws}/conv2.csv", released()),
    Case("sr-bad-value-after-first-mb", "sr", "sr_bad_value_deep", "--batch_id D --input {ws}/big.csv",
         released("ara.conversion_rows_dropped_null_or_nonfinite=1")),
    Case("sr-not-utf8-after-first-mb", "sr", "sr_not_utf8_deep", "--batch_id D --input {ws}/big.csv",
         released("ara.conversion_rows_dropped_null_or_nonfinite=1",
                  "conversions.values_not_utf8=1")),
    Case("sr-unwritable-output", "sr", "sr_other_batch",
         "--batch_id B --input {ws}/conv2.csv --output {ws}/conv.csv/out",
         refused("--output: cannot write {ws}/conv.csv/out", then="writable")),
    Case("sr-all-values-bad", "sr", "sr_all_values_bad", "--batch_id B --input {ws}/conv2.csv",
         released(f"{ALERT}conversions: all 40 eligible rows dropped",
                  "ara.conversion_rows_dropped_null_or_nonfinite=40", then="alert")),
    Case("sr-all-source-ids-missing", "sr", "sr_source_ids_missing",
         "--batch_id B --input {ws}/conv2.csv --alert_exit_code 5",
         alerted(5, "alert (operator only; published): summary_reports/B: conversions: all 40 "
                    "eligible rows dropped")),
    Case("sr-batch-id-dotdot", "sr", None, "--batch_id ..", refused("--batch_id '..' is not a valid name")),
    Case("sr-header-with-spaces", "sr", "sr_header_spaces", "--batch_id B --input {ws}/conv2.csv",
         refused("header field 1 is column 'source_id' with surrounding spaces")),
    Case("sr-key-file-as-conversions", "sr", None, "--batch_id B --input {key} --input_format csv",
         refused("--input: {key} is a release key file")),
    Case("sr-key-file-as-reports", "sr", "sr_domain",
         "--batch_id B --input {key} --input_format reports --output_domain {ws}/domain.txt -config",
         refused("--input: {key} is a release key file")),
    Case("sr-epsilon-over-64", "sr", None, "--batch_id B --epsilon 65", refused("epsilon")),
    Case("sr-testing-into-published-folder", "sr", None,
         f"{TESTING} --output {{ws}}/out/summary_reports/A/v1", refused("inside the published release")),
    Case("sr-ledger-deleted", "sr", "ledger_deleted", "", refused("does not exist: deleted or mistyped")),
    Case("sr-dashed-flags", "sr", None, "dashed", reproduced()),
]


def command(case: Case, ws: Workspace) -> list[str]:
    """The job's release command with the case's change applied (see the module docstring)."""
    argv = base_argv(case.job, ws.path)
    flags: dict = {}
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[argv[i]], i = argv[i + 1], i + 2
        else:
            flags[argv[i]], i = None, i + 1
    tokens = shlex.split(case.change.format(ws=ws.path, key=ws.key_file() if "{key}" in case.change else ""))
    dashed = "dashed" in tokens
    tokens = [t for t in tokens if t != "dashed"]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            flags.pop("-" + token, None)
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            flags[token], i = tokens[i + 1], i + 2
        else:
            flags[token], i = None, i + 1
    out = []
    for flag, value in flags.items():
        out.append(flag.replace("_", "-") if dashed else flag)
        if value is not None:
            out.append(value)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault(case: Case, tmp_path_factory):
    ws = Workspace.get(case.job, tmp_path_factory)
    if case.fixture:
        FIXTURES[case.fixture](ws if case.fixture.startswith(("ledger", "binding")) else ws.path)
    argv = command(case, ws)
    ledger_before = ws.ledger.read_bytes() if ws.ledger.exists() else None
    keys_before = sorted(os.listdir(ws.keys))
    published_before = published(ws.path / "out")
    charged_before = charged(os.path.realpath(ws.ledger))

    code, out, err = run_main(case.job, argv)

    subs = {"{ws}": str(ws.path), "{key}": ws.key_file()}
    message = out if case.expect.code == 0 else err
    assert code == case.expect.code, f"exit {code}: {err or out}"
    for text in case.expect.says:
        for placeholder, value in subs.items():
            text = text.replace(placeholder, value)
        assert text in message, f"{text!r} not in {message!r}"
    after = published(ws.path / "out")
    # No published file is ever replaced by different bytes; a run that did not release
    # published nothing.
    assert {p: after.get(p) for p in published_before} == published_before
    if not _published(case.expect) or any(a.startswith(("--submit_only", "--submit-only"))
                                           for a in argv):
        assert after == published_before
    charged_after = charged(os.path.realpath(ws.ledger))
    if case.expect.code == 2:  # refused: nothing charged, nothing stored
        assert (ws.ledger.read_bytes() if ws.ledger.exists() else None) == ledger_before
        assert sorted(os.listdir(ws.keys)) == keys_before
    if case.expect.spend == "same":
        assert charged_after == (charged_before if charged_before is None
                                 else pytest.approx(charged_before))
    else:
        assert charged_after > charged_before
    # No secret anywhere: messages, outputs, reports, the ledger.
    secrets = secrets_of([ws.keys])
    assert_no_secret(secrets, [out, err], [ws.path / "out", ws.path / "private" / "reports",
                                           os.path.realpath(ws.ledger)])
    if case.expect.then:
        THEN[case.expect.then](ws, case, argv, charged_after)
        assert_no_secret(secrets_of([ws.keys]), [], [ws.path / "out", ws.path / "private" / "reports"])


def test_the_table_covers_every_job_with_sixty_cases_or_more():
    per_job = {job: sum(c.job == job for c in CASES) for job in MAINS}
    assert sum(per_job.values()) >= 60 and min(per_job.values()) >= 15, per_job
    assert len({c.id for c in CASES}) == len(CASES)
    assert all(c.fixture is None or c.fixture in FIXTURES for c in CASES)
    assert all(c.expect.then is None or c.expect.then in THEN for c in CASES)
    assert all(c.fixture in FIXES for c in CASES if c.expect.then == "takeover")


# --------------------------------------------------------------------------- kill points at the phases

def _die_after(module, name, *, when=lambda *a, **k: True):
    """Patch ``module.name`` (in a forked child only) to run, then kill the process like kill -9."""
    real = getattr(module, name)

    def dying(*args, **kwargs):
        result = real(*args, **kwargs)
        if when(*args, **kwargs):
            os._exit(137)
        return result

    setattr(module, name, dying)


def _run_killed(job, argv, patch):
    def child():
        patch()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            MAINS[job](argv)
        os._exit(0)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(120)
    return process.exitcode


#: Kill points, named after the phases of pipelines.release.lifecycle: a phase ("rule": right
#: after it returned) or a step inside one ("publish/pin"), each a function of that module.
KILL_POINTS = {"compute": "compute", "rule": "rule", "publish/pin": "pin", "publish": "publish",
               "commit/record": "commit_record"}


def _kill_after(point):
    def patch():
        from pipelines.release import lifecycle

        _die_after(lifecycle, KILL_POINTS[point])
    return patch


@pytest.mark.parametrize("point, state, visible", [
    ("compute", "reserved", False),          # staged, nothing checked or published
    ("rule", "reserved", False),             # staged and ruled, not yet pinned
    ("publish/pin", "publishing", False),    # pinned, nothing published
    ("publish", "publishing", True),         # published, not committed
    ("commit/record", "committed", True),    # committed, no operator report yet
])
def test_kill_at_a_phase_then_rerun(tmp_path_factory, point, state, visible):
    ws = Workspace.get("cn", tmp_path_factory)
    argv = base_argv("cn", ws.path) + ["--release", "C1/2026-11-02"]
    charged_before = charged(ws.ledger)
    assert _run_killed("cn", argv, _kill_after(point)) == 137
    record = read_json(ws.ledger)["releases"]["C1/2026-11-02"]
    assert record["state"] == state
    folder = ws.path / "out" / "C1" / "2026-11-02" / "v1"
    assert (folder / "RELEASE.json").exists() == visible
    assert not (ws.path / "private" / "reports" / "C1" / "2026-11-02" / "v1" / "report.json").exists()
    killed = published(ws.path / "out")
    charged_after_kill = charged(ws.ledger)
    assert charged_after_kill > charged_before
    code, out, err = run_main("cn", argv)
    assert code == 0, err
    assert ("(reproduced)" if visible else "(released)") in out
    after = published(ws.path / "out")
    assert {p: after[p] for p in killed} == killed  # what was published stays byte for byte
    assert read_json(folder / "RELEASE.json")["key_fingerprints"] == {
        n: k["fingerprint"] for n, k in record["keys"].items()}  # the pinned / reserved keys
    assert read_json(ws.ledger)["releases"]["C1/2026-11-02"]["state"] == "committed"
    assert charged(ws.ledger) == pytest.approx(charged_after_kill)  # no extra spend
    assert (ws.path / "private" / "reports" / "C1" / "2026-11-02" / "v1" / "report.json").exists()
    assert not list((ws.path / "private" / "staging").rglob("*.parquet"))  # no attempt survives


def test_every_kill_point_is_a_function_of_the_lifecycle():
    from pipelines.release import lifecycle

    assert all(callable(getattr(lifecycle, name, None)) for name in KILL_POINTS.values())
    phases = {p.split("/")[0] for p in KILL_POINTS}
    assert phases <= {"preflight", "reserve", "compute", "rule", "publish", "commit"}


def test_kill_between_gcs_objects_then_rerun(tmp_path):
    """A publication to gs:// writes objects one by one, the marker last: killed after the
    first object, the folder is not a release; the re-run completes it with identical bytes
    and spends nothing more."""
    pytest.importorskip("gcp_storage_emulator.server")
    from gcs_emulator import storage_emulator

    from accounting import gcs

    _build_cn(tmp_path)
    with storage_emulator("kill") as bucket:
        argv = shlex.split(BASE["cn"].format(ws=tmp_path)) + [
            "--output", f"gs://{bucket}/out", "--ledger", f"gs://{bucket}/private/ledger.json",
            "--key_store", f"gs://{bucket}/private/keys"]
        final = f"gs://{bucket}/out/C1/2026-11-01/v1/"

        def kill():
            from pipelines.release import storage

            _die_after(storage, "write_bytes", when=lambda path, data, **kw: path.startswith(final))

        assert _run_killed("cn", argv, kill) == 137
        objects = gcs.list_objects(final)
        assert [o.rsplit("/", 1)[1] for o in objects] == ["centralnotice.parquet"]  # marker last
        first = gcs.blob(objects[0]).download_as_bytes()
        ledger = json.loads(gcs.blob(f"gs://{bucket}/private/ledger.json").download_as_bytes())
        assert ledger["releases"]["C1/2026-11-01"]["state"] == "publishing"
        spent = sum(m["epsilon"] for m in ledger["releases"]["C1/2026-11-01"]["measures"])
        code, out, err = run_main("cn", argv)
        assert code == 0 and "(released)" in out, err
        assert [o.rsplit("/", 1)[1] for o in gcs.list_objects(final)] == ["RELEASE.json",
                                                                         "centralnotice.parquet"]
        assert gcs.blob(final + "centralnotice.parquet").download_as_bytes() == first
        ledger = json.loads(gcs.blob(f"gs://{bucket}/private/ledger.json").download_as_bytes())
        assert ledger["releases"]["C1/2026-11-01"]["state"] == "committed"
        assert sum(m["epsilon"] for r in ledger["releases"].values() for m in r["measures"]) == spent
        code, out, err = run_main("cn", argv)
        assert code == 0 and "(reproduced)" in out, err


def test_concurrent_runs_of_one_release_publish_it_once(tmp_path_factory):
    """Two runs of the same new release at once: one key, one charge, one publication; each run
    either publishes, reproduces it, or stops without publishing anything else."""
    ws = Workspace.get("cn", tmp_path_factory)
    argv = base_argv("cn", ws.path) + ["--release", "C1/2026-11-02"]
    charged_before = charged(ws.ledger)

    def child():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = MAINS["cn"](argv)
        os._exit(code)

    ctx = multiprocessing.get_context("fork")
    processes = [ctx.Process(target=child) for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    codes = sorted(p.exitcode for p in processes)
    # the loser is refused ("held by another run": nothing charged or stored), or, if it came
    # after the winner had finished, reproduces the release
    assert codes in ([0, 0], [0, 2]), codes
    record = read_json(ws.ledger)["releases"]["C1/2026-11-02"]
    assert record["state"] == "committed" and "hold" not in record
    assert charged(ws.ledger) == pytest.approx(charged_before + 2.0)  # charged once
    assert len(release_keys(ws)) == 2  # one key for the new release, no orphan
    marker = read_json(ws.path / "out" / "C1" / "2026-11-02" / "v1" / "RELEASE.json")
    assert marker["key_fingerprints"]["release"] == record["keys"]["release"]["fingerprint"]
    code, out, err = run_main("cn", argv)
    assert code == 0 and "(reproduced)" in out, err


def test_a_run_while_another_holds_the_release_is_refused_and_leaves_nothing(tmp_path_factory):
    """The loser of a race for one release -- the same input, or a changed one (which would take
    the reservation over with a fresh key) -- is refused before the charge while the winner
    computes: exit 2 "held by another run", the ledger byte for byte as it was, no key stored.
    The winner then publishes; once it has ended, the same command reproduces its release."""
    from pipelines.release import lifecycle

    ws = Workspace.get("cn", tmp_path_factory)
    argv = base_argv("cn", ws.path) + ["--release", "C1/2026-11-02"]
    ctx = multiprocessing.get_context("fork")
    reserved, go = ctx.Event(), ctx.Event()

    def winner():
        real = lifecycle.compute

        def paused(state):
            reserved.set()
            go.wait(120)
            return real(state)

        lifecycle.compute = paused
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = MAINS["cn"](argv)
        os._exit(code)

    process = ctx.Process(target=winner)
    process.start()
    try:
        assert reserved.wait(120)
        ledger, keys = ws.ledger.read_bytes(), release_keys(ws)
        for extra in ([], ["--impressions", str(_cn_inputs(ws.path, "changed.csv",
                                                            _cn_rows("2026-11-02", 7)))]):
            code, out, err = run_main("cn", argv + extra)
            assert code == 2 and "is held by another run" in err, err
            assert "Nothing was charged or stored" in err
            assert ws.ledger.read_bytes() == ledger and release_keys(ws) == keys
    finally:
        go.set()
        process.join(120)
    assert process.exitcode == 0
    record = read_json(ws.ledger)["releases"]["C1/2026-11-02"]
    assert record["state"] == "committed" and "hold" not in record
    code, out, err = run_main("cn", argv)
    assert code == 0 and "(reproduced)" in out, err


# --------------------------------------------------------------------------- issue 32: the edges
# Flags, messages, inputs and outputs, as a careless or hostile operator meets them. Same table
# form and checks as CASES (test_fault); label_dp ("ld") joins the jobs for these rows.

SECRET_TEXT = "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\npassword hunter2x\n"


def _build_ld(ws):
    from transforms.ldp.sample_data import training_rows

    training_rows(str(ws / "train.csv"), rows=60, seed=3)


def _ld_rows(ws, name, labels, start=1000):
    """label_dp training rows with ids from ``start`` (another export than the published one)."""
    write_csv(ws / name, ["example_id", "feature_1", "feature_2", "label"],
              [(start + i, 0.5, -0.25, labels(i)) for i in range(40)])


def _plant(ws, relative, target="elsewhere"):
    """Replace ``relative`` (under the workspace) by a symlink to a folder outside ``out``,
    keeping what was there (a moved copy) so only the link is new."""
    link, real = ws / relative, ws / target / relative.replace("/", "_")
    real.parent.mkdir(parents=True, exist_ok=True)
    if link.exists():
        shutil.move(str(link), str(real))
    else:
        real.mkdir(parents=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(real, target_is_directory=real.is_dir())


def _cn_parquet_checked(ws, flip=False):
    from transforms import parquet_files

    path = ws / "imp.parquet"
    parquet_files.write_table(_cn_table(_cn_rows("2026-11-02", 3000)), str(path),
                              compression="none", use_dictionary=False,
                              row_group_size=1000)
    if flip:
        flip_value_byte(path, "impressions", row_group=1)


def _rf_parquet_checked(ws, flip=False):
    from transforms import parquet_files

    parquet_files.write_table(_rf_table(), str(ws / "imp.parquet"), compression="none",
                              use_dictionary=False, row_group_size=1000)
    if flip:
        flip_value_byte(ws / "imp.parquet", "vid", row_group=2)


def _sr_parquet_checked(ws):
    from transforms import parquet_files

    rows = _sr_rows(n=3000, start=100)
    table = pa.table({"source_id": [r[0] for r in rows], "order": [r[1] for r in rows],
                      "dim_0": [r[2] for r in rows], "dim_1": [r[3] for r in rows],
                      "value": [float(r[4]) for r in rows], "report_id": [r[5] for r in rows]})
    parquet_files.write_table(table, str(ws / "conv.parquet"), compression="none",
                              use_dictionary=False, row_group_size=1000)
    flip_value_byte(ws / "conv.parquet", "value", row_group=1)


def _cut(path, header, rows, keep_newline=False):
    text = _csv_text(header, rows)
    cut = text[:text.rstrip("\n").rfind(",")]  # the last row loses its last field
    path.write_text(cut + ("\n" if keep_newline else ""))


def _key_path(ws):
    return str(sorted(k for k in (ws / "private" / "keys").iterdir()
                      if not k.name.startswith("ledger-"))[0])


EDGE_FIXTURES: dict[str, Callable] = {
    # messages
    "cn_protected_list_is_a_key": lambda ws: write_json(ws / "c.json", {
        **cn_config(), "protected_countries_file": _key_path(ws)}),
    "cn_protected_list_secret": lambda ws: ((ws / "secret.txt").write_text(SECRET_TEXT), write_json(
        ws / "c.json", {**cn_config(), "protected_countries_file": "secret.txt"})),
    "secret_text": lambda ws: (ws / "secret.txt").write_text(SECRET_TEXT),
    # inputs
    "cn_parquet_bit_flip": lambda ws: _cn_parquet_checked(ws, flip=True),
    "rf_parquet_bit_flip": lambda ws: _rf_parquet_checked(ws, flip=True),
    "sr_parquet_bit_flip": _sr_parquet_checked,
    "cn_cut_csv": lambda ws: _cut(ws / "bad.csv", CN_IMP_HEADER, _cn_rows("2026-11-02")),
    "cn_cut_csv_short_row": lambda ws: _cut(ws / "bad.csv", CN_IMP_HEADER, _cn_rows("2026-11-02"),
                                            keep_newline=True),
    "rf_cut_csv": lambda ws: _cut(ws / "bad.csv", ["publisher", "campaign", "vid"],
                                  _rf_rows(("c2",), 30)),
    "sr_cut_csv": lambda ws: _cut(ws / "conv2.csv", SR_HEADER, _sr_rows(start=100),
                                  keep_newline=True),
    "cn_header_only": FIXTURES["cn_header_only"],
    "ld_labels_upper_case": lambda ws: _ld_rows(ws, "upper.csv", lambda i: ("NO", "YES")[i % 2]),
    "ld_some_labels_upper_case": lambda ws: _ld_rows(
        ws, "mixed.csv", lambda i: "YES" if i % 8 == 0 else ("no", "yes")[i % 2]),
    "ld_labels_missing": lambda ws: _ld_rows(ws, "missing.csv", lambda i: None),
    # outputs: a symlink planted at each level of the way a release is published
    "out_campaign_link": lambda ws: _plant(ws, "out/C1"),
    "out_day_link": lambda ws: _plant(ws, "out/C1/2026-11-02"),
    "out_version_link": lambda ws: _plant(ws, "out/C1/2026-11-02/v1"),
    "out_published_version_link": lambda ws: _plant(ws, "out/C1/2026-11-01/v1"),
    "out_file_link": lambda ws: (ws / "out" / "C1" / "2026-11-02").mkdir(parents=True) or (
        ws / "out" / "C1" / "2026-11-02" / "notes").symlink_to(ws / "c.json"),
    "out_binding_link": lambda ws: _plant(ws, "out/.ledger-binding.json"),
    "staging_root_link": lambda ws: _plant(ws, "private/staging"),
    "staging_campaign_link": lambda ws: _plant(ws, "private/staging/C1"),
    "staging_day_link": lambda ws: _plant(ws, "private/staging/C1/2026-11-02"),
    "staging_attempt_link": lambda ws: _plant(ws, "private/staging/C1/2026-11-02/v1.dead"),
    "testing_prefix_link": lambda ws: _plant(ws, "out/testing-not-a-release"),
    "rf_campaign_link": lambda ws: _plant(ws, "out/rf/c2"),
    "sr_release_link": lambda ws: _plant(ws, "out/summary_reports"),
    "reports_link": lambda ws: _plant(ws, "private/reports/C1"),
    "output_root_link": lambda ws: _plant(ws, "out"),
}
EDGE_FIXES: dict[str, Callable] = {
    "cn_parquet_bit_flip": _cn_parquet_checked,
    "rf_parquet_bit_flip": _rf_parquet_checked,
}
LD_BASE = "--input {ws}/train.csv --labels no,yes --epsilon 2 --features feature_1,feature_2 " \
          "--dataset_id d1"
UNKNOWN = "no flag of the job, of the release layer or of Beam's pipeline options is spelled so"
LINK = "is a symbolic link inside the output tree"
EDGE_CASES = [
    # ---- flags: unknown, misspelt, abbreviated -> exit 2 naming the closest flag
    Case("cn-misspelt-flag", "cn", None, f"{DAY2} --max_dropped_fractoin 0.9",
         refused("unknown flag --max_dropped_fractoin (did you mean --max_dropped_fraction?)",
                 UNKNOWN)),
    Case("cn-misspelt-dashed-switch", "cn", "cn_changed_input", "--new-relase",
         refused("unknown flag --new-relase (did you mean --new_release?)")),
    Case("cn-abbreviated-flag", "cn", None, f"{DAY2} --max_dropped_frac 0.9",
         refused("unknown flag --max_dropped_frac (did you mean --max_dropped_fraction?)")),
    Case("cn-abbreviated-switch", "cn", None, f"{DAY2} --new_rel",
         refused("unknown flag --new_rel (did you mean --new_release?)")),
    Case("cn-switch-with-a-value", "cn", None, f"{DAY2} --new_release yes",
         refused("unexpected argument 'yes'")),
    Case("cn-switch-as-a-template-parameter", "cn", None, "--new_release=false",
         reproduced()),
    Case("cn-dashed-beam-flag", "cn", None, "--dask-local-workers 3", reproduced()),
    Case("rf-misspelt-beam-flag", "rf", None, "--runer DaskRunner",
         refused("unknown flag --runer (did you mean --runner?)")),
    Case("rf-abbreviated-beam-flag", "rf", None, "--temp_loc /tmp/x",
         refused("unknown flag --temp_loc (did you mean --temp_location?)")),
    Case("rf-flag-of-another-job", "rf", None, "--num_shards 4",
         refused("unknown flag --num_shards")),
    Case("sr-misspelt-flag", "sr", None, "--batch_id B --input {ws}/conv2.csv --epsilom 4",
         refused("unknown flag --epsilom (did you mean --epsilon?)")),
    Case("sr-bad-value", "sr", None, "--max_reports_per_source many",
         refused("argument --max_reports_per_source: invalid int value: 'many'")),
    Case("sr-tests-only-option", "sr", None, "--testing_seed 1 -ledger -key_store --exact_testing",
         refused("unknown flag --exact_testing")),
    # ---- messages: a key file or secret text given as configuration or list -> by name only
    Case("cn-config-is-a-key-file", "cn", None, "--config {key}",
         refused("cannot read configuration {key}: a release key file")),
    Case("cn-config-is-secret-text", "cn", "secret_text", "--config {ws}/secret.txt",
         refused("{ws}/secret.txt: not valid JSON: Expecting value at line 1 column 1",
                 then="no_secret_text")),
    Case("cn-protected-list-is-a-key-file", "cn", "cn_protected_list_is_a_key", DAY2,
         refused("protected_countries_file: cannot read {key}: a release key file")),
    Case("cn-protected-list-is-secret-text", "cn", "cn_protected_list_secret", DAY2,
         refused("{ws}/secret.txt:1: must be an ISO 3166-1 alpha-2 country code",
                 then="no_secret_text")),
    Case("sr-config-is-a-key-file", "sr", None, "--batch_id B --config {key}",
         refused("--config {key}: a release key file")),
    Case("sr-config-is-secret-text", "sr", "secret_text", "--batch_id B --config {ws}/secret.txt",
         refused("--config {ws}/secret.txt: not valid JSON", then="no_secret_text")),
    Case("rf-input-is-secret-text", "rf", "secret_text",
         "--campaigns c2 --input {ws}/secret.txt --input_format csv",
         refused("{ws}/secret.txt has no column", then="no_secret_text")),
    Case("ld-input-is-a-key-file", "ld", None, "--dataset_id d2 --input {key}",
         refused("--input: {key} is a release key file")),
    # ---- inputs: page checksums, cut CSVs, header-only files, undeclared labels
    Case("cn-parquet-bit-flip", "cn", "cn_parquet_bit_flip", f"{DAY2} --impressions {{ws}}/imp.parquet",
         failed("the computation failed (--impressions: {ws}/imp.parquet could not be read in full "
                "(a Parquet page failed its checksum", then="takeover")),
    Case("rf-parquet-bit-flip", "rf", "rf_parquet_bit_flip", "--campaigns c2 --input {ws}/imp.parquet",
         failed("{ws}/imp.parquet could not be read in full (a Parquet page failed its checksum",
                then="takeover")),
    Case("sr-parquet-bit-flip-in-preflight", "sr", "sr_parquet_bit_flip",
         "--batch_id B --input {ws}/conv.parquet",
         refused("--input: {ws}/conv.parquet could not be read (OSError", "nothing was charged")),
    Case("cn-cut-csv", "cn", "cn_cut_csv", f"{DAY2} --impressions {{ws}}/bad.csv",
         refused("--impressions: {ws}/bad.csv does not end with a line break")),
    Case("cn-cut-csv-short-last-row", "cn", "cn_cut_csv_short_row",
         f"{DAY2} --impressions {{ws}}/bad.csv",
         refused("{ws}/bad.csv: its last row has 5 of the header's 6 fields")),
    Case("rf-cut-csv", "rf", "rf_cut_csv", "--campaigns c2 --input {ws}/bad.csv",
         refused("{ws}/bad.csv does not end with a line break")),
    Case("sr-cut-csv", "sr", "sr_cut_csv", "--batch_id B --input {ws}/conv2.csv",
         refused("{ws}/conv2.csv: its last row has 5 of the header's 6 fields")),
    Case("cn-header-only-counted", "cn", "cn_header_only", f"{DAY2} --impressions {{ws}}/bad.csv",
         released("impressions.read_files_without_rows=1")),
    Case("ld-labels-in-another-case", "ld", "ld_labels_upper_case",
         "--dataset_id d2 --input {ws}/upper.csv",
         released(f"{ALERT}rows: all 40 eligible rows dropped",
                  "rows.dropped.undeclared_label=40", then="alert")),
    Case("ld-some-labels-in-another-case", "ld", "ld_some_labels_upper_case",
         "--dataset_id d2 --input {ws}/mixed.csv", released("rows.dropped.undeclared_label=5")),
    Case("ld-labels-missing", "ld", "ld_labels_missing",
         "--dataset_id d2 --input {ws}/missing.csv --alert_exit_code 6",
         alerted(6, "alert (operator only; published): label_dp/d2: rows: all 40 eligible rows "
                    "dropped")),
    # ---- outputs: a symlink at any level of a release's way -> exit 2 before the charge
    Case("cn-output-campaign-folder-link", "cn", "out_campaign_link", DAY2,
         refused("{ws}/out/C1 " + LINK, "nothing was charged")),
    Case("cn-output-day-folder-link", "cn", "out_day_link", DAY2,
         refused("{ws}/out/C1/2026-11-02 " + LINK)),
    Case("cn-output-version-folder-link", "cn", "out_version_link", DAY2,
         refused("{ws}/out/C1/2026-11-02/v1 " + LINK)),
    Case("cn-output-published-version-link", "cn", "out_published_version_link", "",
         refused("{ws}/out/C1/2026-11-01/v1 " + LINK)),
    Case("cn-output-file-link-in-a-release-folder", "cn", "out_file_link", DAY2,
         refused("{ws}/out/C1/2026-11-02/notes " + LINK)),
    Case("cn-output-binding-link", "cn", "out_binding_link", DAY2,
         refused("{ws}/out/.ledger-binding.json " + LINK)),
    # the staging root beside the ledger may itself be a link (where the operator keeps it);
    # a link below it is refused
    Case("cn-staging-root-link", "cn", "staging_root_link", DAY2, released("C1/2026-11-02")),
    Case("cn-staging-campaign-link", "cn", "staging_campaign_link", DAY2,
         refused("{ws}/private/staging/C1 " + LINK)),
    Case("cn-staging-day-link", "cn", "staging_day_link", DAY2,
         refused("{ws}/private/staging/C1/2026-11-02 " + LINK)),
    Case("cn-staging-attempt-link", "cn", "staging_attempt_link", DAY2,
         refused("{ws}/private/staging/C1/2026-11-02/v1.dead " + LINK)),
    Case("cn-testing-prefix-link", "cn", "testing_prefix_link", TESTING,
         refused("{ws}/out/testing-not-a-release " + LINK)),
    Case("cn-report-folder-link", "cn", "reports_link", DAY2,
         refused("{ws}/private/reports/C1 " + LINK)),
    Case("cn-output-root-is-a-link", "cn", "output_root_link", DAY2, released()),
    Case("rf-output-campaign-link", "rf", "rf_campaign_link", "--campaigns c2",
         refused("{ws}/out/rf/c2 " + LINK)),
    Case("sr-output-release-link", "sr", "sr_release_link", "",
         refused("{ws}/out/summary_reports " + LINK)),
    # ---- submit and finalize: two processes make one release (item 7)
    Case("cn-submit-only", "cn", None, f"{DAY2} --submit_only", submitted(then="finalize")),
    Case("cn-submit-only-dashed", "cn", None, f"{DAY2} --submit-only", submitted()),
    Case("cn-submit-only-published-release", "cn", None, "--submit_only",
         submitted(spend="same", then="finalize")),
    Case("cn-finalize-never-reserved", "cn", None, f"{DAY2} --finalize",
         refused("--finalize found no submitted release for these flags",
                 "has no record in ledger", "run them with --submit_only first")),
    Case("cn-finalize-reserved-never-submitted", "cn", "cn_parquet_bit_flip",
         f"{DAY2} --impressions {{ws}}/imp.parquet --submit_only",
         failed("the computation failed (--impressions: {ws}/imp.parquet could not be read",
                then="finalize_unsubmitted")),
    Case("cn-finalize-published-by-a-run", "cn", None, "--finalize",
         refused("C1/2026-11-01 is reserved but was never submitted")),
    Case("cn-submit-and-finalize-at-once", "cn", None, f"{DAY2} --submit_only --finalize",
         refused("--submit_only and --finalize are two runs")),
    Case("cn-submit-testing-run", "cn", None, f"{TESTING} --submit_only",
         refused("a --testing_seed run is not a release")),
    Case("cn-finalize-testing-run", "cn", None, f"{TESTING} --finalize",
         refused("a --testing_seed run is not a release")),
    Case("cn-submit-switch-as-a-template-parameter", "cn", None, f"{DAY2} --submit_only=true",
         submitted()),
    Case("cn-flex-launch-without-submit-only", "cn", None,
         f"{DAY2} --template_location gs://b/staging/template_launches/"
         "2026-11-28_02_30_07-123/job_object", refused("a Flex Template launch is --submit_only")),
    Case("rf-submit-only-one-new-one-published", "rf", None, "--campaigns c1,c2 --submit_only",
         submitted(then="finalize")),
    Case("sr-submit-only", "sr", "sr_other_batch", "--batch_id B --input {ws}/conv2.csv "
         "--submit_only", submitted(then="finalize")),
    Case("sr-finalize-never-submitted", "sr", "sr_other_batch",
         "--batch_id B --input {ws}/conv2.csv --finalize", refused("has no record in ledger")),
]


# ---- issue 32, items 2 and 5: exit codes that hold, a ledger whose records are chained
# (pipelines/release/lifecycle.py: preflight's measure checks, after_reservation, holds;
# accounting/ledger/chain.py, sealing.py, holds.py, migrate.py)

PATCHES: dict = {}       # the running test's monkeypatch (set by the ``edges`` fixture)
DISK = {"full": False}   # the simulated disk below staging / publication


def _disk_full(function):
    """Make ``pipelines.release.storage.<function>`` fail as on a full disk (ENOSPC) while
    DISK["full"]; the run after ``then_disk_freed`` finds the space again."""
    import errno

    from pipelines.release import storage

    real = getattr(storage, function)

    def full(path, *args, **kwargs):
        if DISK["full"] and (function != "write_bytes" or "/private/staging/" in str(path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, *args, **kwargs)

    DISK["full"] = True
    PATCHES["monkeypatch"].setattr(storage, function, full)


COMMIT = {"fails": False}  # the ledger commit after publication


def _commit_fails():
    """The ledger's commit after publication fails as on a full ledger folder (ENOSPC) while
    COMMIT["fails"]; ``then_commit_completed`` lets it succeed again."""
    import errno

    from accounting.ledger import BudgetLedger

    real = BudgetLedger.commit

    def full(self, *args, **kwargs):
        if COMMIT["fails"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        return real(self, *args, **kwargs)

    COMMIT["fails"] = True
    PATCHES["monkeypatch"].setattr(BudgetLedger, "commit", full)


def _cn_epsilon(ws, epsilon):
    config = cn_config()
    config["campaigns"][0]["privacy"]["impressions"]["epsilon"] = epsilon
    write_json(ws / "c.json", config)


def _sr_config(ws, **changes):
    (ws / "config.json").write_text(json.dumps({**json.loads((ws / "config.json").read_text()),
                                                **changes}))


def _edit_ledger(ws, change):
    """A hand edit: the ledger's JSON changed in place (its chain left as it was)."""
    state = read_json(ws.ledger)
    change(state)
    ws.ledger.write_text(json.dumps(state, indent=1))


def _second_release(ws):
    """Publish C1/2026-11-02 too, so that the ledger holds two chained records."""
    code, out, err = run_main("cn", base_argv("cn", ws.path) + ["--release", "C1/2026-11-02"])
    assert code == 0, err


def _swap_records(state):
    a, b = state["releases"]["C1/2026-11-01"], state["releases"]["C1/2026-11-02"]
    a["seq"], b["seq"] = b["seq"], a["seq"]


def _drop_first(state):
    del state["releases"]["C1/2026-11-01"], state["latest"]["C1/2026-11-01"]


def _recompute_chain(state):
    """What someone editing on purpose does: lower the spend, then recompute every digest and
    the head -- all but the MAC, whose key is in the key store."""
    from accounting.ledger import chain

    state["releases"]["C1/2026-11-01"]["measures"][0]["epsilon"] = 0.001
    key = state["chain"]["key"]
    chain.seal(state, os.urandom(32), key)


def _hold(ws, **hold):
    import datetime as dt

    until = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)).isoformat()
    rewrite_ledger(ws, lambda state: state["releases"]["C1/2026-11-01"].update(hold={
        "run": "another", "since": "2026-11-02T00:00:00+00:00", "until": until, **hold}))


def _dead_pid() -> int:
    process = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    process.start()
    process.join()
    return process.pid


def _release_key(ws):
    return ws.path / "private" / "keys" / next(n for n in release_keys(ws) if n.startswith("C1"))


def _key_folder(ws):
    key = _release_key(ws)
    key.unlink()
    key.mkdir()


def _strip_chain(ws, keep_key):
    from release_testkit import unchain

    chain_key = next(ws.keys.glob("ledger-chain-*"))
    data = chain_key.read_bytes()
    unchain(ws.ledger, ws.keys, "beam-dp-release/budget-ledger/v3")
    if keep_key:
        chain_key.write_bytes(data)


EXIT_FIXTURES: dict[str, Callable] = {
    "cn_epsilon_1e308": lambda ws: _cn_epsilon(ws, 1e308),
    "cn_epsilon_1e-300": lambda ws: _cn_epsilon(ws, 1e-300),
    "sr_epsilon_tiny": FIXTURES["sr_other_batch"],
    "sr_slices_overflow": lambda ws: (FIXTURES["sr_other_batch"](ws), _sr_config(
        ws, slice_dimensions=[2 ** 40, 2 ** 40])),
    "disk_full_staging": lambda ws: _disk_full("write_bytes"),
    "disk_full_publishing": lambda ws: _disk_full("rename_dir"),
    "commit_fails": lambda ws: _commit_fails(),
    "ledger_releases_a_list": lambda ws: _edit_ledger(ws, lambda s: s.update(releases=[])),
    "ledger_epsilon_a_string": lambda ws: _edit_ledger(ws, lambda s: s["releases"][
        "C1/2026-11-01"]["measures"][0].update(epsilon="0.1")),
    "ledger_release_key_deleted": lambda ws: _release_key(ws).unlink(),
    "ledger_release_key_a_folder": _key_folder,
    "ledger_chain_key_deleted": lambda ws: next(ws.keys.glob("ledger-chain-*")).unlink(),
    "ledger_held_by_a_live_run": lambda ws: _hold(ws, host="elsewhere", pid=1, started="1"),
    "ledger_hold_of_a_dead_run": lambda ws: _hold(ws, host=__import__(
        "accounting.ledger.holds", fromlist=["host_id"]).host_id(), pid=_dead_pid(), started="1"),
    "ledger_spend_lowered": lambda ws: _edit_ledger(ws, lambda s: s["releases"][
        "C1/2026-11-01"]["measures"][0].update(epsilon=0.001)),
    "ledger_budget_raised": lambda ws: _edit_ledger(ws, lambda s: s["scopes"][
        "campaign:C1"].update(epsilon=80.0)),
    "ledger_record_deleted": lambda ws: (_second_release(ws), _edit_ledger(ws, _drop_first)),
    "ledger_records_reordered": lambda ws: (_second_release(ws), _edit_ledger(ws, _swap_records)),
    "ledger_chain_recomputed": lambda ws: _edit_ledger(ws, _recompute_chain),
    "ledger_older_version": lambda ws: _strip_chain(ws, keep_key=False),
    "ledger_chain_stripped": lambda ws: _strip_chain(ws, keep_key=True),
}


def then_disk_freed(ws, case, argv, charged_after):
    """The failure record names the root cause (never file content); with the space back, the
    same command completes the release without spending again."""
    failure = read_json(ws.path / "private" / "reports" / "C1" / "2026-11-02" / "v1" /
                        "failure.json")
    assert "[Errno 28] No space left on device" in failure["detail"]
    assert "OSError" in failure["exceptions"]
    DISK["full"] = False
    code, out, err = run_main(case.job, argv)
    assert code == 0 and "(released)" in out, err
    assert charged(ws.ledger) == pytest.approx(charged_after)


def then_commit_completed(ws, case, argv, charged_after):
    """Exit 4 left the release out and its record 'publishing'; with the space back, the same
    command completes the record (reproduced, nothing more spent)."""
    states = {r["versioned_id"]: r["state"] for r in read_json(ws.ledger)["releases"].values()}
    assert states["C1/2026-11-02"] == "publishing"
    COMMIT["fails"] = False
    code, out, err = run_main(case.job, argv)
    assert code == 0 and "(reproduced)" in out, err
    assert charged(ws.ledger) == pytest.approx(charged_after)
    states = {r["versioned_id"]: r["state"] for r in read_json(ws.ledger)["releases"].values()}
    assert states["C1/2026-11-02"] == "committed"


def then_migrated(ws, case, argv, charged_after):
    """``python -m accounting.ledger migrate`` chains it once; the run then goes on, and a hand
    edit after that is caught; migrating again is refused (nothing to do)."""
    from accounting.ledger.__main__ import main as ledger_main

    flags = ["--ledger", str(ws.ledger), "--key_store", str(ws.keys)]
    assert ledger_main(["migrate", *flags]) == 0
    assert ledger_main(["verify", *flags]) == 0
    assert ledger_main(["migrate", *flags]) == 2
    code, out, err = run_main(case.job, argv)
    assert code == 0 and "(released)" in out, err
    code, out, err = run_main(case.job, base_argv(case.job, ws.path))
    assert code == 0 and "(reproduced)" in out, err


def then_not_migrated(ws, case, argv, charged_after):
    """A ledger whose chain was stripped is not chained again by migrate (it would bless the
    edits made meanwhile): refused, nothing written."""
    from accounting.ledger.__main__ import main as ledger_main

    before = ws.ledger.read_bytes()
    assert ledger_main(["migrate", "--ledger", str(ws.ledger), "--key_store", str(ws.keys)]) == 2
    assert ws.ledger.read_bytes() == before


EXIT_THEN = {"disk_freed": then_disk_freed, "commit_completed": then_commit_completed,
             "migrated": then_migrated,
             "not_migrated": then_not_migrated}
VERIFY = "{ws}/private/ledger.json does not verify: "
EXIT_CASES = [
    # ---- epsilon extremes and domains: refused before the charge (exit 2), nothing stored
    Case("cn-config-epsilon-1e308", "cn", "cn_epsilon_1e308", DAY2,
         refused("--config {ws}/c.json: campaigns[0].privacy")),
    Case("cn-config-epsilon-1e-300", "cn", "cn_epsilon_1e-300", DAY2,
         refused("release C1/2026-11-02: measure 'impressions' (epsilon=1e-300",
                 "epsilon is too small")),
    Case("rf-epsilon-1e-300", "rf", None, "--campaigns c2 --epsilon 1e-300",
         refused("release rf/c2: measure 'union/reach'", "too large for the exact samplers",
                 "Nothing was charged")),
    Case("rf-epsilon-1e300-two-campaigns", "rf", None,
         "--campaigns c2,c3 --epsilon 1e300 --campaign_budget_epsilon 1e301",
         refused("vanishes in double precision", "Nothing was charged")),
    Case("sr-epsilon-1e-300", "sr", "sr_epsilon_tiny",
         "--batch_id B --input {ws}/conv2.csv --epsilon 1e-300", refused("epsilon is too small")),
    Case("sr-slice-dimensions-overflow", "sr", "sr_slices_overflow",
         "--batch_id B --input {ws}/conv2.csv",
         refused("--config {ws}/config.json: slice_dimensions", "63-bit slice code")),
    # ---- a failure after the reservation: exit 3 naming its root cause, never content
    Case("cn-disk-full-while-staging", "cn", "disk_full_staging", DAY2,
         failed("the computation failed (OSError: [Errno 28] No space left on device: {ws}/private/"
                "staging/C1/2026-11-02/", then="disk_freed")),
    Case("cn-disk-full-while-publishing", "cn", "disk_full_publishing", DAY2,
         failed("the release failed (OSError: [Errno 28] No space left on device",
                then="disk_freed")),
    # ---- published, the ledger commit failed: exit 4 (issue 40), not 0 with a warning
    Case("cn-ledger-commit-fails-after-publication", "cn", "commit_fails", DAY2,
         Expect(4, ("C1/2026-11-02 is published but its ledger record was not committed "
                    "(OSError: [Errno 28] No space left on device: {ws}/private/ledger.json)",
                    "exit 4"), "more", "commit_completed")),
    # ---- the ledger and the key store: unreadable or malformed -> exit 2, nothing changed
    Case("cn-ledger-releases-not-an-object", "cn", "ledger_releases_a_list", DAY2,
         refused("{ws}/private/ledger.json is malformed: its 'releases' is missing or of the "
                 "wrong type")),
    Case("cn-ledger-epsilon-a-string", "cn", "ledger_epsilon_a_string", DAY2,
         refused("record 1 (release 'C1/2026-11-01') is malformed: field 'measures'")),
    Case("cn-release-key-deleted", "cn", "ledger_release_key_deleted", "",
         refused("release 'C1/2026-11-01' (ledger record 1): its key {ws}/private/keys/C1_",
                 "cannot be loaded (FileNotFoundError: No such file or directory)",
                 "Nothing was charged or changed")),
    Case("cn-release-key-a-folder", "cn", "ledger_release_key_a_folder", "",
         refused("cannot be loaded (IsADirectoryError: Is a directory)")),
    Case("cn-chain-key-deleted", "cn", "ledger_chain_key_deleted", DAY2,
         refused("its chain key {ws}/private/keys/ledger-chain-",
                 "cannot be loaded (FileNotFoundError: No such file or directory)")),
    # ---- holds: a live run's release is refused; a dead run's hold is not in the way
    Case("cn-held-by-a-live-run", "cn", "ledger_held_by_a_live_run", "",
         refused("release 'C1/2026-11-01' is held by another run (run another on elsewhere",
                 "Nothing was charged or stored")),
    Case("cn-hold-of-a-dead-run", "cn", "ledger_hold_of_a_dead_run", "", reproduced()),
    # ---- hand edits of the ledger: refused naming the record (its number and release id)
    Case("cn-ledger-spend-lowered", "cn", "ledger_spend_lowered", DAY2,
         refused(VERIFY + "record 1 (release 'C1/2026-11-01') was edited")),
    Case("cn-ledger-budget-raised", "cn", "ledger_budget_raised", DAY2,
         refused(VERIFY + "its head does not match its records and budgets (the chain ends "
                 "with record 1 (release 'C1/2026-11-01'))")),
    Case("cn-ledger-record-deleted", "cn", "ledger_record_deleted", DAY2,
         refused(VERIFY + "record 2 (release 'C1/2026-11-02') comes where record 1 should be")),
    Case("cn-ledger-records-reordered", "cn", "ledger_records_reordered", DAY2,
         refused(VERIFY + "record 1 (release 'C1/2026-11-02') does not follow the record "
                 "before it")),
    Case("cn-ledger-chain-recomputed", "cn", "ledger_chain_recomputed", DAY2,
         refused(VERIFY + "its head's MAC does not verify")),
    Case("cn-ledger-older-version", "cn", "ledger_older_version", DAY2,
         refused("python -m accounting.ledger migrate --ledger {ws}/private/ledger.json "
                 "--key_store {ws}/private/keys", then="migrated")),
    Case("cn-ledger-chain-stripped", "cn", "ledger_chain_stripped", DAY2,
         refused("the chain was removed by hand", then="not_migrated")),
]
EDGE_FIXTURES.update(EXIT_FIXTURES)
EDGE_CASES += EXIT_CASES


def then_no_secret_text(ws, case, argv, charged_after):
    """The refusal names the file, never its lines (run again to read every message)."""
    code, out, err = run_main(case.job, argv)
    assert code == 2
    for line in SECRET_TEXT.splitlines():
        for part in line.split():
            assert len(part) < 8 or part not in out + err, part


def then_finalize(ws, case, argv, charged_after):
    """Another run with the same flags and --finalize publishes what was submitted, spending
    nothing more; finalizing again reproduces it byte for byte."""
    finalize = [a for a in argv if a not in ("--submit_only", "--submit-only")] + ["--finalize"]
    before = published(ws.path / "out")
    code, out, err = run_main(case.job, finalize)
    assert code == 0 and ("(released)" in out or "(reproduced)" in out), err
    after = published(ws.path / "out")
    assert {p: after[p] for p in before} == before
    assert charged(ws.ledger) == pytest.approx(charged_after)
    code, out, err = run_main(case.job, finalize)
    assert code == 0 and "(reproduced)" in out and "(released)" not in out, err
    assert published(ws.path / "out") == after
    assert charged(ws.ledger) == pytest.approx(charged_after)
    states = {r["state"] for r in read_json(ws.ledger)["releases"].values()}
    assert states == {"committed"}


def then_finalize_unsubmitted(ws, case, argv, charged_after):
    """A submission that failed recorded no job: finalize is refused, nothing published."""
    finalize = [a for a in argv if a != "--submit_only"] + ["--finalize"]
    code, out, err = run_main(case.job, finalize)
    assert code == 2 and "is reserved but was never submitted" in err, err
    assert charged(ws.ledger) == pytest.approx(charged_after)


@pytest.fixture
def edges(monkeypatch):
    """The issue-32 fixtures and follow-ups, and label_dp as a job of the table."""
    monkeypatch.setitem(MAINS, "ld", label_dp.main)
    monkeypatch.setitem(BUILD, "ld", _build_ld)
    monkeypatch.setitem(BASE, "ld", LD_BASE)
    for name, fixture in EDGE_FIXTURES.items():
        monkeypatch.setitem(FIXTURES, name, fixture)
    for name, fix in EDGE_FIXES.items():
        monkeypatch.setitem(FIXES, name, fix)
    monkeypatch.setitem(THEN, "no_secret_text", then_no_secret_text)
    monkeypatch.setitem(THEN, "finalize", then_finalize)
    monkeypatch.setitem(THEN, "finalize_unsubmitted", then_finalize_unsubmitted)
    for name, then in EXIT_THEN.items():
        monkeypatch.setitem(THEN, name, then)
    monkeypatch.setitem(PATCHES, "monkeypatch", monkeypatch)
    monkeypatch.setitem(DISK, "full", False)
    monkeypatch.setitem(COMMIT, "fails", False)


@pytest.mark.parametrize("case", EDGE_CASES, ids=[c.id for c in EDGE_CASES])
def test_fault_at_the_edges(case: Case, tmp_path_factory, edges):
    test_fault(case, tmp_path_factory)


def test_the_edge_table_is_well_formed():
    assert len({c.id for c in CASES + EDGE_CASES}) == len(CASES) + len(EDGE_CASES)
    assert all(c.fixture is None or c.fixture in EDGE_FIXTURES or c.fixture in FIXTURES
               for c in EDGE_CASES)
    assert all(c.fixture in EDGE_FIXES for c in EDGE_CASES if c.expect.then == "takeover")


# --------------------------------------------------------------------------- row faults
# One row's bytes or one record's value is dropped (or, where the relation holds the number of
# records public, neutralised) and counted, never a refusal or a failed run (issue 30 item 3);
# a share no honest client sends is a protocol violation, refused before the charge. Same form
# as CASES; Masked LARk's browsers ("ms") and shuffle_sum ("ss") join the jobs for these rows.

MS_PARAMS = {"kind": "aggregation", "value_columns": ["value"], "lower": 0.0, "upper": 10.0,
             "epsilon": 1.0, "k": 2, "fraction_bits": 8, "num_helpers": 2}
MS_BASE = "--input {ws}/records.csv --params {ws}/params.json --batch_id b1"
SS_BASE = ("--input {ws}/shares.parquet --num_clients 30 --value_bound 5 --epsilon 1 "
           "--delta 1e-6 --collection_id c1")


def _ms_records(ws, name, start=0, value=lambda i: f"{i % 7}.5", key=lambda i: f"k{i % 2}"):
    write_csv(ws / name, ["record_id", "key", "value"],
              [(start + i, key(i), value(i)) for i in range(20)])


def _build_ms(ws):
    write_json(ws / "params.json", MS_PARAMS)
    _ms_records(ws, "records.csv")


def _ss_shares(ws, name, plant=None):
    import numpy as np

    from transforms import parquet_files
    from transforms.ldp.randomness import KeyedRandomness
    from transforms.ldp.shuffle import SplitAndMix, shares_table

    spec = SplitAndMix(num_clients=30, value_bound=5, epsilon=1.0, delta=1e-6)
    table = shares_table(spec.encode(np.arange(30, dtype=np.int64) % 6,
                                     source=KeyedRandomness.for_testing(9, "clients"),
                                     ids=np.arange(30, dtype=np.int64)), spec)
    if plant is not None:
        shares = table.column("share").to_pylist()
        shares[11] = plant(spec.modulus)
        table = pa.table({"share": pa.array(shares, pa.uint64())}).replace_schema_metadata(
            table.schema.metadata)
    parquet_files.write_table(table, str(ws / name))


def _with_bytes_not_utf8(path, line=3):
    """Line ``line``'s last value ends with a byte that is not UTF-8 (a value read as missing)."""
    lines = path.read_bytes().split(b"\n")
    lines[line] += b"\xff"
    path.write_bytes(b"\n".join(lines))


ROW_FIXTURES: dict[str, Callable] = {
    "cn_line_not_utf8": lambda ws: (write_csv(ws / "bad.csv", CN_IMP_HEADER, _cn_rows("2026-11-02")),
                                    _with_bytes_not_utf8(ws / "bad.csv")),
    "ld_line_not_utf8": lambda ws: (_ld_rows(ws, "bad.csv", lambda i: ("no", "yes")[i % 2]),
                                    _with_bytes_not_utf8(ws / "bad.csv")),
    "ms_value_not_a_number": lambda ws: _ms_records(
        ws, "bad.csv", 100, value=lambda i: "1/2" if i == 3 else f"{i % 7}.5"),
    "ms_all_values_bad": lambda ws: _ms_records(ws, "bad.csv", 100, value=lambda i: "n/a"),
    "ms_record_without_key": lambda ws: _ms_records(
        ws, "bad.csv", 100, key=lambda i: "" if i == 5 else f"k{i % 2}"),
    "ms_line_not_utf8": lambda ws: (_ms_records(ws, "bad.csv", 100),
                                    _with_bytes_not_utf8(ws / "bad.csv")),
    "ss_share_outside_the_modulus": lambda ws: _ss_shares(ws, "bad.parquet", lambda q: q + 1),
    "ss_share_missing": lambda ws: _ss_shares(ws, "bad.parquet", lambda q: None),
}
MS_BAD = "--batch_id b2 --input {ws}/bad.csv"
SS_BAD = "--collection_id c2 --input {ws}/bad.parquet"
ROW_CASES = [
    # a value whose bytes are not UTF-8 is missing: each job's rule for a missing value applies
    Case("cn-a-count-not-utf8", "cn", "cn_line_not_utf8", f"{DAY2} --impressions {{ws}}/bad.csv",
         released("impressions.dropped.missing=1", "impressions.values_not_utf8=1")),
    Case("ld-a-label-not-utf8", "ld", "ld_line_not_utf8", "--dataset_id d2 --input {ws}/bad.csv",
         released("rows.dropped.missing_label=1", "rows.values_not_utf8=1")),
    Case("ms-rerun", "ms", None, "", reproduced()),
    Case("ms-a-value-not-a-number", "ms", "ms_value_not_a_number", MS_BAD,
         released("records.dropped.value_not_a_number=1", spend="same")),
    Case("ms-every-value-bad", "ms", "ms_all_values_bad", MS_BAD,
         released(f"{ALERT}records: all 20 eligible rows dropped",
                  "records.dropped.value_not_a_number=20", spend="same", then="alert")),
    Case("ms-a-record-without-key", "ms", "ms_record_without_key", MS_BAD,
         released("records.dropped.missing_key=1", spend="same")),
    Case("ms-a-value-not-utf8", "ms", "ms_line_not_utf8", MS_BAD,
         released("records.dropped.value_missing=1", "records.values_not_utf8=1",
                  spend="same")),
    Case("ss-rerun", "ss", None, "", reproduced()),
    Case("ss-a-share-outside-the-modulus", "ss", "ss_share_outside_the_modulus", SS_BAD,
         refused("--input: {ws}/bad.parquet holds 0 missing share(s) and 1 outside [0, 2^12)",
                 "nothing was charged")),
    Case("ss-a-share-missing", "ss", "ss_share_missing", SS_BAD,
         refused("--input: {ws}/bad.parquet holds 1 missing share(s) and 0 outside")),
]


@pytest.fixture
def row_faults(edges, monkeypatch):
    """label_dp (from ``edges``), Masked LARk's browsers and shuffle_sum as jobs of the table."""
    from pipelines.masked_lark import share as masked_lark_share
    from pipelines.ldp import shuffle_sum

    for job, main, build, base in (("ms", masked_lark_share.main, _build_ms, MS_BASE),
                                   ("ss", shuffle_sum.main,
                                    lambda ws: _ss_shares(ws, "shares.parquet"), SS_BASE)):
        monkeypatch.setitem(MAINS, job, main)
        monkeypatch.setitem(BUILD, job, build)
        monkeypatch.setitem(BASE, job, base)
    for name, fixture in ROW_FIXTURES.items():
        monkeypatch.setitem(FIXTURES, name, fixture)


@pytest.mark.parametrize("case", ROW_CASES, ids=[c.id for c in ROW_CASES])
def test_row_fault(case: Case, tmp_path_factory, row_faults):
    test_fault(case, tmp_path_factory)


def test_the_row_fault_table_is_well_formed():
    ids = [c.id for c in CASES + EDGE_CASES + ROW_CASES]
    assert len(set(ids)) == len(ids)
    assert all(c.fixture is None or c.fixture in ROW_FIXTURES for c in ROW_CASES)


def test_a_symlink_planted_during_the_run_fails_it_with_nothing_published_outside(
        tmp_path_factory, monkeypatch):
    """After the checks before the charge, a link planted while the pipeline computes: exit 3,
    nothing published (inside or outside the tree); removed, a re-run takes the reservation
    over without spending again."""
    from pipelines.release import lifecycle

    ws = Workspace.get("cn", tmp_path_factory)
    argv = base_argv("cn", ws.path) + ["--release", "C1/2026-11-02"]
    outside = ws.path / "elsewhere"
    real_run = lifecycle.run_pipeline

    def plant_while_running(options, build):
        result = real_run(options, build)
        outside.mkdir()
        (ws.path / "out" / "C1" / "2026-11-02").symlink_to(outside, target_is_directory=True)
        return result

    monkeypatch.setattr(lifecycle, "run_pipeline", plant_while_running)
    before, charged_before = published(ws.path / "out"), charged(ws.ledger)
    code, out, err = run_main("cn", argv)
    assert code == 3 and f"{ws.path}/out/C1/2026-11-02 {LINK}" in err, err
    assert list(outside.iterdir()) == [] and published(ws.path / "out") == before
    charged_after = charged(ws.ledger)
    assert charged_after > charged_before  # reserved: the run failed after the charge
    monkeypatch.setattr(lifecycle, "run_pipeline", real_run)
    (ws.path / "out" / "C1" / "2026-11-02").unlink()
    code, out, err = run_main("cn", argv)
    assert code == 0 and "(released)" in out, err
    assert charged(ws.ledger) == pytest.approx(charged_after)


def test_publication_never_follows_a_link_below_the_output_root(tmp_path):
    """The last line of defence: the rename into place opens every folder below the root
    without following links (storage.rename_dir), whatever the checks before it saw."""
    from pipelines.release import storage

    root, outside, staged = tmp_path / "out", tmp_path / "outside", tmp_path / "staged"
    (root / "a").mkdir(parents=True)
    outside.mkdir()
    staged.mkdir()
    (staged / "x.csv").write_text("k\n")
    (root / "a" / "b").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError):
        storage.rename_dir(str(staged), str(root / "a" / "b" / "v1"), root=str(root))
    assert list(outside.iterdir()) == [] and (staged / "x.csv").exists()
    storage.rename_dir(str(staged), str(root / "a" / "c" / "v1"), root=str(root))
    assert (root / "a" / "c" / "v1" / "x.csv").read_text() == "k\n"
    with pytest.raises(FileExistsError):
        (tmp_path / "again").mkdir()
        storage.rename_dir(str(tmp_path / "again"), str(root / "a" / "c" / "v1"), root=str(root))


# --------------------------------------------------------------------------- issue 32: the runner
# Row counters are pipeline output, staged beside each release and read back from staging, so
# every runner gives the operator its counters and the row rules (in process, Prism, Dask); the
# runner is resolved and checked before any reservation; a Dask worker killed mid-run ends in a
# completed release after Dask's retry, or in a clean exit 3 that a re-run takes over. Same
# table form and checks as CASES (test_fault).

DASK = "--runner DaskRunner --dask_local_workers 2"  # a 2-worker local cluster for the run
DAY2_ROWS = ("impressions.read=24", "clicks.read=24")  # the whole files, both days' rows


def then_counted(ws, case, argv, charged_after):
    """The release's counters reached its operator report from staging (exact: the input's 24
    rows of each file, half of them another day's), with no alert; the staged counters file
    was not published, nor are counters in the public marker."""
    report = read_json(ws.path / "private" / "reports" / "C1" / "2026-11-02" / "v1" / "report.json")
    counters = report["counters"]
    assert counters["impressions.read"] == counters["clicks.read"] == 24, counters
    assert counters["impressions.skipped.other_release"] == 12, counters
    assert report["alerts"] == []
    folder = ws.path / "out" / "C1" / "2026-11-02" / "v1"
    assert sorted(p.name for p in folder.iterdir()) == ["RELEASE.json", "centralnotice.parquet"]
    assert b"impressions.read" not in (folder / "RELEASE.json").read_bytes()
    assert not list((ws.path / "out").rglob(".counters.json"))  # staging left no copy behind


def then_worker_killed(ws, case, argv, charged_after):
    """A worker process was killed mid-run (it left its pid in the marker); Dask ran its tasks
    again, and the counters count every row once: retried work is not counted twice."""
    assert (ws.path / "killed-once").read_text().isdigit()
    then_counted(ws, case, argv, charged_after)
    then_reproduce(ws, case, argv, charged_after)


def then_rerun_takes_over(ws, case, argv, charged_after):
    """The failed run kept its reservation and recorded its failure for the operator; the same
    command (the worker no longer killed) then publishes without spending again."""
    assert (ws.path / "killed-once").exists()
    failure = read_json(next((ws.path / "private" / "reports" / "C1" / "2026-11-02").rglob(
        "failure.json")))
    assert "KilledWorker" in failure["detail"]
    assert read_json(ws.ledger)["releases"]["C1/2026-11-02"]["state"] == "reserved"
    code, out, err = run_main(case.job, argv)
    assert code == 0 and "(released)" in out and "nothing more was spent" in out, err
    assert charged(ws.ledger) == pytest.approx(charged_after)
    then_counted(ws, case, argv, charged_after)


def then_no_failure_record(ws, case, argv, charged_after):
    """Refused in preflight: the runner's message went to the operator on stderr (asserted by
    the row), nothing was recorded as a failure and no staging was made."""
    assert not list((ws.path / "private" / "reports").rglob("failure.json"))
    assert not (ws.path / "private" / "staging" / "C1" / "2026-11-02").exists()


def _kill_a_dask_worker_once(monkeypatch, retries: bool):
    """The CentralNotice job's impressions pass a DoFn that kills the Dask worker process
    running it, once (tests/release_testkit.kill_worker_once); without ``retries`` the run's
    scheduler allows no task a worker died under (Dask's ``allowed-failures``: 0), so the run
    fails where it would otherwise retry the lost tasks elsewhere."""
    from release_testkit import kill_worker_once

    real = centralnotice.CentralNoticeJob.build

    def fixture(ws):
        def build(self, pipeline, prepared, inputs, release):
            import apache_beam as beam

            killed = inputs["impressions"] | release.label("KillAWorkerOnce") >> beam.ParDo(
                kill_worker_once(str(ws / "killed-once")))
            return real(self, pipeline, prepared, {**inputs, "impressions": killed}, release)

        monkeypatch.setattr(centralnotice.CentralNoticeJob, "build", build)
        if not retries:
            import dask

            monkeypatch.setitem(dask.config.config["distributed"]["scheduler"],
                                "allowed-failures", 0)
    return fixture


RUNNER_CASES = [
    # ---- --runner resolved and checked before any reservation, the runner's own message
    Case("cn-unknown-runner", "cn", None, f"{DAY2} --runner BogusRunner",
         refused("--runner BogusRunner: Unexpected pipeline runner: BogusRunner. Valid values "
                 "are", "nothing was charged", then="no_failure_record")),
    Case("cn-runner-class-missing", "cn", None,
         f"{DAY2} --runner apache_beam.runners.direct.direct_runner.NoSuchRunner",
         refused("has no attribute 'NoSuchRunner'", then="no_failure_record")),
    Case("cn-runner-module-missing", "cn", None, f"{DAY2} --runner some_pkg.SomeRunner",
         refused("--runner some_pkg.SomeRunner: No module named 'some_pkg'")),
    Case("cn-prism-binary-missing", "cn", None,
         f"{DAY2} --runner PrismRunner --prism_location {{ws}}/no/prism",
         refused('PrismRunner: Unable to parse binary URL "{ws}/no/prism"', "make sure the file "
                 "exists", "nothing was charged", then="no_failure_record")),
    Case("cn-direct-runner-prism-binary-missing", "cn", None,
         f"{DAY2} --runner DirectRunner --prism_location {{ws}}/no/prism",
         refused("PrismRunner: Unable to parse binary URL")),
    Case("cn-beams-own-dask-runner", "cn", None,
         f"{DAY2} --runner apache_beam.runners.dask.dask_runner.DaskRunner",
         refused("Beam's own DaskRunner drops what a DoFn emits in finish_bundle",
                 "use --runner DaskRunner", then="no_failure_record")),
    Case("rf-unknown-runner", "rf", None, "--campaigns c2 --runner Dask_Runner",
         refused("--runner Dask_Runner: Unexpected pipeline runner")),
    Case("sr-unknown-runner", "sr", None, "--batch_id B --input {ws}/conv.csv --runner nope",
         refused("--runner nope: Unexpected pipeline runner")),
    # ---- counters read back from staging (in process)
    Case("cn-counters-from-staging", "cn", None, DAY2, released(*DAY2_ROWS, then="counted")),
]
ENGINE_CASES = [
    # ---- a 2-worker local Dask cluster: counters, the row rules, no alert
    Case("cn-dask-release", "cn", None, f"{DAY2} {DASK}", released(*DAY2_ROWS, then="counted")),
    Case("cn-dask-rerun-reproduces", "cn", None, DASK, reproduced(then="reproduce")),
    Case("cn-dask-most-rows-dropped", "cn", "cn_most_dropped",
         f"{DAY2} --impressions {{ws}}/bad.csv {DASK}",
         released(f"{ALERT}impressions: 6 of 10 eligible rows dropped (more than 50%)",
                  then="alert")),
    # ---- a worker killed mid-run: Dask's retry completes it, or exit 3 and a re-run
    Case("cn-dask-worker-killed-retried", "cn", "dask_kill_worker", f"{DAY2} {DASK}",
         released(*DAY2_ROWS, then="worker_killed")),
    Case("cn-dask-worker-killed-no-retry", "cn", "dask_kill_worker_no_retry", f"{DAY2} {DASK}",
         failed("the computation failed (KilledWorker)", "the reservation stays",
                then="rerun_takes_over")),
    # ---- Prism
    Case("cn-prism-release", "cn", None, f"{DAY2} --runner PrismRunner",
         released(*DAY2_ROWS, then="counted")),
]


@pytest.fixture
def runner_rows(monkeypatch):
    """The fixtures and follow-ups of RUNNER_CASES and ENGINE_CASES."""
    for name, retries in (("dask_kill_worker", True), ("dask_kill_worker_no_retry", False)):
        monkeypatch.setitem(FIXTURES, name, _kill_a_dask_worker_once(monkeypatch, retries))
    for name, then in (("counted", then_counted), ("worker_killed", then_worker_killed),
                       ("rerun_takes_over", then_rerun_takes_over),
                       ("no_failure_record", then_no_failure_record)):
        monkeypatch.setitem(THEN, name, then)


@pytest.mark.parametrize("case", RUNNER_CASES, ids=[c.id for c in RUNNER_CASES])
def test_fault_of_the_runner(case: Case, tmp_path_factory, runner_rows):
    test_fault(case, tmp_path_factory)


@pytest.mark.runners
@pytest.mark.parametrize("case", ENGINE_CASES, ids=[c.id for c in ENGINE_CASES])
def test_fault_on_an_engine(case: Case, tmp_path_factory, runner_rows):
    if "PrismRunner" in case.change:
        from runners import cache

        if cache.cached_prism() is None:
            pytest.skip("no Prism binary: python -m runners.fetch prism")
    pytest.importorskip("distributed")
    test_fault(case, tmp_path_factory)


def test_the_runner_tables_are_well_formed():
    ids = [c.id for c in CASES + EDGE_CASES + RUNNER_CASES + ENGINE_CASES]
    assert len(set(ids)) == len(ids)
    assert all(c.fixture is None or c.fixture in FIXTURES
               or c.fixture in ("dask_kill_worker", "dask_kill_worker_no_retry")
               for c in RUNNER_CASES + ENGINE_CASES)
