"""Every benchmark runs as its docstring says: its quick mode, the documented command as written.

Each script under benchmarks/ with a ``__main__`` block documents, in its docstring's usage
lines, one command marked ``# quick`` (small sizes, no peer virtualenv). The slow suite runs that
command from the repository root, as a user would type it (``python benchmarks/<name>.py ...``:
the script's folder first on ``sys.path``, which is why no benchmark may be named like a package,
tests/test_layout.py), and checks that it exits 0 and ends with its summary line
(``name=value`` pairs).
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
#: A documented quick command: ``python benchmarks/<name>.py ARGS  # quick...``.
QUICK = re.compile(r"^\s*(python benchmarks/(\w+)\.py\b[^#\n]*?)\s*#\s*quick\b", re.MULTILINE)
#: A summary line: ``name=value`` pairs (with words naming a group, ``|`` joining two summaries).
SUMMARY = re.compile(r"^(\w+ )*[\w\[\]]+=\S+(\s+([\w\[\]]+=\S+|\w+|\|))*\s*$")
#: Scripts the benchmarks run, not benchmarks of their own.
HELPERS = {"local_dp_pure_ldp": "local_dp.py's pure-ldp leg, inside pure-ldp's own virtualenv",
           "columnar_floor": "the columnar floor that aggregate.py and scale.py compare with"}
#: Benchmarks whose quick mode needs the peers' virtualenvs (``make bench-peers``), and the test
#: that makes them and runs it as documented.
WITH_PEERS = {"utility": "tests/test_utility_benchmark.py"}


def _benchmarks() -> dict:
    """{script name: its docstring} of every runnable benchmark script."""
    found = {}
    for name in sorted(os.listdir(BENCHMARKS)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(BENCHMARKS, name), encoding="utf-8") as handle:
            text = handle.read()
        if "__main__" in text:
            found[name[:-3]] = ast.get_docstring(ast.parse(text)) or ""
    return found


def _quick_command(name: str, docstring: str) -> str:
    commands = [m[1] for m in QUICK.finditer(docstring) if m[2] == name]
    assert len(commands) == 1, f"benchmarks/{name}.py documents {len(commands)} quick commands"
    return commands[0]


def test_every_benchmark_documents_one_quick_command():
    assert SUMMARY.match("speedup=1.5 ratio=0.3 | new_metrics rows=10 error_ratio p50=1.0")
    assert SUMMARY.match("median=1.2 separate_over_chosen[criteo]=1.199")
    assert not SUMMARY.match("whole process at 10 rows: ours 1 s")
    benchmarks = _benchmarks()
    assert "aggregate" in benchmarks and "scale" in benchmarks
    for name, docstring in benchmarks.items():
        if name not in HELPERS:
            _quick_command(name, docstring)
    for test in WITH_PEERS.values():
        assert os.path.isfile(os.path.join(ROOT, test)), test


def _quick_cases():
    return [pytest.param(name, id=name) for name in _benchmarks()
            if name not in HELPERS and name not in WITH_PEERS]


@pytest.mark.slow
@pytest.mark.parametrize("name", _quick_cases())
def test_the_quick_mode_runs_as_documented(name):
    command = _quick_command(name, _benchmarks()[name])
    argv = shlex.split(command)
    assert argv[0] == "python"
    done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines and SUMMARY.match(lines[-1]), f"{command}: last line {lines[-1:]!r}"
