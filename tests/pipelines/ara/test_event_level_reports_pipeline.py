"""The event-level reports job on the release layer: what it releases, its neighbours, refusals."""
from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pyarrow as pa
import pytest

from accounting.keys import ReleaseKey
from pipelines.ara import event_level_reports as job
from tests.release_testkit import read_json, write_csv
from transforms.ara.event_beam import EVENT_PURPOSE
from transforms.ara.event_debias import debias_groups, variance_floor
from transforms.ara.event_level import EventLevelConfig, randomize_states
from transforms.noise import RandomStreams

SEED = 11
T, W, R, EPS = 2, 2, 2, 1.0
CONFIG = EventLevelConfig(trigger_data_cardinality=T, report_windows=W, max_reports=R,
                          epsilon=EPS)


def _data(rng=np.random.default_rng(5), n=60):
    sources = [(f"s{i:03d}", ["a", "b", "c"][i % 3]) for i in range(n)]
    conversions = []
    for sid, _ in sources:
        for order in range(int(rng.integers(0, 4))):
            conversions.append((sid, order, int(rng.integers(0, T)), int(rng.integers(0, W))))
    return sources, conversions


SOURCES, CONVERSIONS = _data()


def _write(folder, sources=SOURCES, conversions=CONVERSIONS, extra_conversions=()):
    os.makedirs(folder, exist_ok=True)
    return (write_csv(os.path.join(folder, "sources.csv"), ["source_id", "campaign"], sources),
            write_csv(os.path.join(folder, "conversions.csv"),
                      ["source_id", "order", "trigger_data", "window"],
                      list(conversions) + list(extra_conversions)))


def _argv(tmp_path, sources, conversions, **over):
    args = {"--sources": sources, "--conversions": conversions, "--epsilon": str(EPS),
            "--batch_id": "b1", "--trigger_data_cardinality": str(T), "--report_windows": str(W),
            "--max_reports": str(R), "--group_by": "campaign", "--output": str(tmp_path / "out"),
            "--testing_seed": str(SEED)}
    args.update(over)
    return [x for flag, value in args.items() if value is not None for x in (flag, value)]


def _released(out, batch="b1", testing=True):
    folder = os.path.join(str(out), "testing-not-a-release", job.NAME, batch) if testing \
        else os.path.join(str(out), job.NAME, batch, "v1")
    tables = {}
    for name in (job.REPORTS, job.ESTIMATES):
        with open(os.path.join(folder, name)) as handle:
            tables[name] = list(csv.reader(handle))
    return tables, read_json(os.path.join(folder, "RELEASE.json"))


def _expected_reports(sources, conversions):
    """The browser's reports from the pure mechanism (first R triggers by order, keyed lanes)."""
    ids = [sid for sid, _ in sources]
    cells = np.full((len(ids), R), -1, dtype=np.int64)
    for i, sid in enumerate(ids):
        mine = sorted((o, w * T + t) for s, o, t, w in conversions if s == sid)[:R]
        cells[i, :len(mine)] = [c for _, c in mine]
    streams = RandomStreams.for_keys(ReleaseKey.for_testing(SEED), EVENT_PURPOSE,
                                     pa.table({"source_id": pa.array(ids, pa.string())}))
    noisy = CONFIG.decode(randomize_states(CONFIG.encode(cells), CONFIG, streams))
    return sorted([ids[i], str(c // T), str(c % T)]
                  for i, row in enumerate(noisy.tolist()) for c in row if c >= 0)


def test_testing_run_releases_the_mechanisms_reports_and_their_debiased_counts(tmp_path):
    sources, conversions = _write(tmp_path / "in", extra_conversions=[
        ("s001", 9, 5, 0),        # trigger data outside its cardinality: dropped, counted
        ("zzz", 0, 0, 0)])        # a source nobody registered: dropped, counted
    assert job.main(_argv(tmp_path, sources, conversions)) == 0
    tables, marker = _released(tmp_path / "out")
    reports, estimates = tables[job.REPORTS], tables[job.ESTIMATES]
    assert reports[0] == ["source_id", "window", "trigger_data"]
    assert reports[1:] == _expected_reports(SOURCES, CONVERSIONS)
    # estimates: every group x (trigger data, all), debiased from the released reports alone
    assert estimates[0] == ["campaign", "trigger_data", "sources", "estimate", "variance",
                            "estimate_ci95_low", "estimate_ci95_high", "estimate_std"]
    group_of = dict(SOURCES)
    for row in estimates[1:]:
        group, t = row[0], row[1]
        members = [sid for sid, g in SOURCES if g == group]
        per_source = np.zeros(len(members))
        for sid, _, tr in reports[1:]:
            if group_of[sid] == group and (t == "" or tr == t):
                per_source[members.index(sid)] += 1
        est, var = debias_groups(np.array([len(members)]), np.array([per_source.sum()]),
                                 np.array([(per_source ** 2).sum()]), CONFIG,
                                 W if t else CONFIG.cells)
        assert int(row[2]) == len(members)
        assert float(row[3]) == pytest.approx(est[0]) and float(row[4]) == pytest.approx(var[0])
        # the approximate interval: estimate -/+ 1.96 std, clipped to [0, R sources]
        std = float(row[7])
        # the unbiased estimate clamped at the least variance a group of its size can have
        floor = variance_floor(np.array([len(members)]), CONFIG, W if t else CONFIG.cells)[0]
        assert std == pytest.approx(math.sqrt(max(var[0], floor)))
        assert float(row[5]) == pytest.approx(min(max(est[0] - 1.959963984540054 * std, 0.0),
                                                  CONFIG.max_reports * len(members)))
        assert float(row[6]) == pytest.approx(min(max(est[0] + 1.959963984540054 * std, 0.0),
                                                  CONFIG.max_reports * len(members)))
    assert [(r[0], r[1]) for r in estimates[1:]] == [
        (g, t) for g in "abc" for t in ("0", "1", "")]
    measure = marker["measures"][0]
    assert measure["mechanism"] == "k_ary_randomized_response" and measure["epsilon"] == EPS
    statement = marker["outputs"][job.ESTIMATES]["errors"]["estimate"]
    assert "APPROXIMATE 95% interval (plug-in variance, normal approximation)" in statement
    assert "clipped to [0, R sources]" in statement and "groups of many sources" in statement
    assert marker["guarantee"]["epsilon"] == EPS
    report = json.dumps(read_json(next(
        os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "out") for f in fs
        if f == "report.json")))
    assert "conversion_rows_dropped_trigger_data_outside_cardinality" in report
    assert "conversion_rows_dropped_source_not_registered" in report
    assert "zzz" not in json.dumps(tables)


def test_one_sources_conversions_change_no_structure_and_move_values_within_sensitivity(tmp_path):
    """Neighbours: one source with and without its conversions (same public key). The
    estimates keep every row and public column; only its group's estimates move, by at most the
    stated L-inf sensitivity (and in total by at most L1); other sources' reports are the same."""
    full_reports = _expected_reports(SOURCES, CONVERSIONS)

    def without(sid):
        return [c for c in CONVERSIONS if c[0] != sid]

    # a source whose conversions are reported truthfully under this key (no flip): the
    # neighbours then differ in their released values, not only in their inputs
    target = next(sid for sid, _ in SOURCES if any(c[0] == sid for c in CONVERSIONS)
                  and _expected_reports(SOURCES, without(sid)) != full_reports)
    runs = {}
    for name, conversions in (("with", CONVERSIONS),
                              ("without", without(target))):
        sources, conv = _write(tmp_path / name, conversions=conversions)
        assert job.main(_argv(tmp_path / name, sources, conv)) == 0
        runs[name] = _released(tmp_path / name / "out")
    (full, marker), (neighbour, _) = runs["with"], runs["without"]
    stated = marker["measures"][0]["sensitivities"]
    assert stated["linf"] == pytest.approx(R / (1 - CONFIG.flip_probability))
    a, b = full[job.ESTIMATES], neighbour[job.ESTIMATES]
    assert len(a) == len(b) and [r[:3] for r in a] == [r[:3] for r in b]
    group = dict(SOURCES)[target]
    moved = [abs(float(x[3]) - float(y[3])) for x, y in zip(a[1:], b[1:])]
    for x, change in zip(a[1:], moved):
        assert change <= stated["linf"] + 1e-9
        assert x[0] == group or change == 0.0
    assert sum(moved) <= stated["l1"] + 1e-9 and max(moved) > 0
    others = [r for r in full[job.REPORTS][1:] if r[0] != target]
    assert others == [r for r in neighbour[job.REPORTS][1:] if r[0] != target]
    assert sum(r[0] == target for r in neighbour[job.REPORTS][1:]) <= R


@pytest.mark.parametrize("over,message", [
    ({"--epsilon": "20"}, "epsilon must be in (0, 14]"),
    ({"--trigger_data_cardinality": "40"}, "trigger_data_cardinality must be in [1, 32]"),
    ({"--max_reports": "20", "--trigger_data_cardinality": "32", "--report_windows": "5"},
     "above the API's limit"),
    ({"--value_edges": "10,5", "--window_ends": "2,30"}, "strictly ascending"),
    ({"--value_edges": "10", "--window_ends": "2"}, "one end per report window"),
    ({"--group_by": "estimate"}, "is a column of the released estimates"),
    ({"--group_by": "country"}, "country"),
    ({"--batch_id": "../x"}, "--batch_id"),
])
def test_bad_requests_are_refused_before_any_charge(tmp_path, capsys, over, message):
    sources, conversions = _write(tmp_path / "in")
    argv = _argv(tmp_path, sources, conversions, **{
        "--testing_seed": None, "--ledger": str(tmp_path / "ledger.json"),
        "--key_store": str(tmp_path / "keys"), **over})
    assert job.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ledger.json").exists() and not (tmp_path / "out").exists()


def test_a_release_is_charged_once_by_its_content(tmp_path, capsys):
    sources, conversions = _write(tmp_path / "in")
    argv = _argv(tmp_path, sources, conversions, **{
        "--testing_seed": None, "--ledger": str(tmp_path / "ledger.json"),
        "--key_store": str(tmp_path / "keys")})
    assert job.main(argv) == 0
    first, marker = _released(tmp_path / "out", testing=False)
    assert marker["key_fingerprints"]["release"] != ReleaseKey.for_testing(SEED).fingerprint()
    assert job.main(argv) == 0  # a re-run reproduces the release, spending nothing
    assert _released(tmp_path / "out", testing=False)[0] == first
    ledger = (tmp_path / "ledger.json").read_bytes()
    capsys.readouterr()
    assert job.main(argv[:argv.index("--batch_id") + 1] + ["b2"]
                    + argv[argv.index("--batch_id") + 2:]) == 2
    assert "already charged as release 'event_level_reports/b1'" in capsys.readouterr().err
    assert (tmp_path / "ledger.json").read_bytes() == ledger


def test_help_lists_the_request_and_release_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        job.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in ("--sources", "--conversions", "--epsilon", "--max_reports", "--value_edges",
                   "--group_by", "--testing_seed", "--ledger"):
        assert option in out


def test_a_run_without_ledger_is_refused_unless_it_is_a_testing_run(tmp_path, capsys):
    sources, conversions = _write(tmp_path / "in")
    assert job.main(_argv(tmp_path, sources, conversions, **{"--testing_seed": None})) == 2
    assert "--testing_seed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
