"""The base install (``pip install -e .``, what ``make demo`` installs) runs the demo and every
job's command line without the optional extras: no Dask, no Google Cloud libraries.

The test environment has the extras, so they are hidden here from a subprocess
(``sys.modules[name] = None`` makes their import fail as if they were not installed).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ("dask", "distributed", "google.cloud.storage", "polars", "selenium")


def _without_extras(module: str, *args: str, cwd) -> subprocess.CompletedProcess:
    hide = "; ".join(f"sys.modules[{name!r}] = None" for name in OPTIONAL)
    code = f"import sys; {hide}; from {module} import main; sys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_the_demo_runs_without_the_optional_extras(tmp_path):
    done = _without_extras("pipelines.centralnotice", "--demo", "--output", str(tmp_path / "demo"),
                           cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "null = SUPPRESSED" in done.stdout


def test_a_jobs_help_needs_no_optional_extra(tmp_path):
    done = _without_extras("pipelines.ara.summary_reports", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--epsilon" in done.stdout
