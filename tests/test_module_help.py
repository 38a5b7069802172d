"""Every runnable module answers ``--help`` with a usage line (and nothing before it).

Runnable = a module under pipelines/, runners/ or benchmarks/ with a ``__main__`` block or a
``main`` function; found by reading the files, so a new job or benchmark is checked without being
listed here. A newcomer's first command is often ``python -m pipelines.NAME --help``: it must
print how to call the module, not nothing, a traceback or a library's warning.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from runners.harness import REPO_ROOT, project_env

# Modules with a ``main`` that are not run on their own, and why.
NOT_RUNNABLE = {
    "pipelines.release.cli": "the jobs' shared command line: main(job, argv); run a job module",
}


def _runnable() -> list[tuple[str, list[str]]]:
    found = []
    for folder in ("pipelines", "runners", "benchmarks"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT)
            if any(part.startswith(".") or part in ("out", "__pycache__") for part in relative.parts):
                continue
            text = path.read_text()
            package_main = path.name == "__main__.py"  # ``python -m PACKAGE``
            if not package_main and not re.search(r"^if __name__ == .__main__.:|^def main\(", text, re.M):
                continue
            module = ".".join(relative.with_suffix("").parts[:-1] if package_main else
                              relative.with_suffix("").parts)
            if module in NOT_RUNNABLE:
                continue
            # benchmarks are scripts (python benchmarks/<name>.py), the rest modules (python -m)
            command = [str(relative)] if folder == "benchmarks" else ["-m", module]
            found.append((module, command))
    return found


RUNNABLE = _runnable()


def test_the_runnable_modules_are_found():
    names = {module for module, _ in RUNNABLE}
    assert {"pipelines.centralnotice", "pipelines.ara.event_tuning", "runners.profiles",
            "benchmarks.scale"} <= names
    assert len(names) >= 30


# One process runs every module's --help as ``python -m`` / ``python FILE`` would (runpy, with
# sys.argv set), so Beam is imported once; the fresh-process test below checks the first line of
# a real ``python -m`` call, where Beam's import-time warning would show.
_DRIVER = """
import contextlib, io, json, runpy, sys
results = {}
for module, command in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [command[-1], "--help"]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if command[0] == "-m":
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(command[0], run_name="__main__")
        except SystemExit as exit:
            code = exit.code or 0
        except BaseException as error:
            code, _ = 1, err.write(repr(error))
    results[module] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps():
    import json

    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(RUNNABLE)], cwd=REPO_ROOT,
                          env=project_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("module", [m for m, _ in RUNNABLE])
def test_module_answers_help_with_a_usage_line(helps, module):
    code, out, err = helps[module]
    assert code == 0, err[-2000:]
    first = out.lstrip().splitlines()[0] if out.strip() else ""
    assert first.startswith("usage:"), (first, err[-1000:])
    assert "Traceback" not in err, err[-1000:]


@pytest.mark.parametrize("command", [["-m", "pipelines.centralnotice", "--help"],
                                     ["-m", "runners.profiles", "--runner", "FlinkRunner"]])
def test_first_line_of_a_fresh_process_is_the_module_s_own(command):
    """Beam logs ``apitools not found`` on import without google-apitools (not installed: only its
    BigQuery IO needs it); the CLI entries import Beam without it (runners.beam_import.quiet_beam_import)."""
    done = subprocess.run([sys.executable, *command], cwd=REPO_ROOT, env=project_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "apitools" not in done.stderr and "Warning" not in done.stderr, done.stderr[-1000:]
