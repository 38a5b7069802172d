"""A run's progress lines (pipelines.release.progress) and its quiet console (--log_level)."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import threading

import pytest

from pipelines.centralnotice import job as centralnotice
from pipelines.release import cli, lifecycle
from pipelines.release.errors import ReleaseRefused
from pipelines.release.progress import PHASES, Progress
from runners.seam import LIBRARIES, library_logging

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
LINE = re.compile(r"^centralnotice: progress: phase=(?P<phase>[a-z]+) "
                  r"rows_read=(?P<rows>-|\d+) elapsed=(?P<elapsed>\d+\.\d)s$")
LIBRARY_INFO = re.compile(rf"^(INFO|DEBUG):({'|'.join(LIBRARIES)})[.:]", re.MULTILINE)


def _parsed(lines):
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed) if not m]
    return [(m["phase"], m["rows"], float(m["elapsed"])) for m in parsed]


def test_a_run_reports_each_phase_and_ticks_while_the_pipeline_runs(tmp_path):
    out = str(tmp_path / "demo")
    request = cli.parse_request(centralnotice.JOB, centralnotice.demo_arguments(
        ["--demo", "--output", out]))
    stream = io.StringIO()
    progress = Progress(centralnotice.NAME, stream=stream, interval=0.05)
    result = lifecycle.run(centralnotice.JOB, request, progress=progress)

    lines = stream.getvalue().splitlines()
    assert lines == list(progress.lines)
    parsed = _parsed(lines)
    phases = [phase for phase, _, _ in parsed]
    # every phase once as it starts, in the lifecycle's order; ticks repeat the running phase
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == list(PHASES)
    assert phases.count("compute") >= 3  # ticks every 0.05 s while the Beam run is waited for
    assert [e for _, _, e in parsed] == sorted(e for _, _, e in parsed)
    # rows read: unknown until the staged counters are read back, then the run's input rows
    first_rule = phases.index("rule")
    assert {rows for _, rows, _ in parsed[:first_rule]} == {"-"}
    counters = next(iter(result.counters.values()))
    read = counters["impressions.read"] + counters["clicks.read"]
    assert {rows for _, rows, _ in parsed[first_rule:]} == {str(read)}
    # the operator report's timing holds the lines up to the report's own phase
    for outcome in result.releases:
        report = json.load(open(outcome.report_path.replace("report.txt", "report.json")))
        assert report["progress"] == lines[:len(report["progress"])]
        assert _parsed(report["progress"])[-1][0] == "commit"
    assert not [t for t in threading.enumerate() if t.name.endswith("-progress")]


def test_the_ticking_thread_stops_when_the_pipeline_fails():
    progress = Progress("toy", stream=io.StringIO(), interval=0.01)
    progress.phase("compute")
    with pytest.raises(RuntimeError):
        with progress.ticking():
            raise RuntimeError("the runner failed")
    assert not [t for t in threading.enumerate() if t.name == "toy-progress"]
    with pytest.raises(ValueError, match="unknown phase"):
        progress.phase("sleeping")


def test_library_loggers_stay_at_warning_unless_log_level_asks_for_more(monkeypatch):
    saved = {name: logging.getLogger(name).level for name in LIBRARIES}
    monkeypatch.delenv("DASK_LOGGING__DISTRIBUTED", raising=False)
    try:
        library_logging()
        assert {logging.getLogger(n).level for n in LIBRARIES} == {logging.WARNING}
        assert os.environ["DASK_LOGGING__DISTRIBUTED"] == "warning"
        library_logging("info")
        assert {logging.getLogger(n).level for n in LIBRARIES} == {logging.INFO}
        library_logging("ERROR")  # asks for less: the libraries' warnings still show
        assert {logging.getLogger(n).level for n in LIBRARIES} == {logging.WARNING}
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
    argv = centralnotice.demo_arguments(["--demo", "--output", "out"])
    with pytest.raises(ReleaseRefused, match="--log_level"):
        cli.parse_request(centralnotice.JOB, [*argv, "--log_level", "LOUD"])
    request = cli.parse_request(centralnotice.JOB, [*argv, "--log_level", "debug"])
    assert request.options.log_level == "DEBUG"


def test_a_successful_demo_console_is_the_summary_and_progress_lines(tmp_path):
    """Even with the project's own loggers at INFO (LOGLEVEL), Beam's and the other libraries'
    INFO chatter stays off the console: stderr holds the progress lines and INFO of the
    project only."""
    env = {**os.environ, "PYTHONPATH": ROOT, "LOGLEVEL": "INFO"}
    done = subprocess.run([sys.executable, "-m", "pipelines.centralnotice", "--demo", "--output",
                           str(tmp_path / "demo")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(released)" in done.stdout and "progress:" not in done.stdout
    assert not LIBRARY_INFO.search(done.stderr), done.stderr[-3000:]
    lines = done.stderr.splitlines()
    project = [line for line in lines if not LINE.match(line)]
    assert all(line.startswith("INFO:pipelines.") for line in project), project
    assert [p for p, _, _ in _parsed([line for line in lines if LINE.match(line)])][-1] == "done"
