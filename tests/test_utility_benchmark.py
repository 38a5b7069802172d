"""benchmarks/utility.py's quick mode, exactly as its docstring documents it: ``make bench-peers``
(PipelineDP and OpenDP in virtualenvs of their own) then ``python benchmarks/utility.py
--quick``. Slow: the first run installs the peers from the package index."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from runners.harness import REPO_ROOT, project_env

METRICS = ("count", "sum", "mean", "variance", "median")


@pytest.mark.slow
def test_the_quick_utility_benchmark_runs_as_documented():
    doc = (REPO_ROOT / "benchmarks" / "utility.py").read_text()
    assert "    make bench-peers" in doc and "    python benchmarks/utility.py [--quick]" in doc
    subprocess.run(["make", "bench-peers"], cwd=REPO_ROOT, check=True, capture_output=True)
    run = subprocess.run([sys.executable, "benchmarks/utility.py", "--quick"], cwd=REPO_ROOT,
                         env=project_env(), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    rows = [line.split() for line in lines if line.split()[:1] and line.split()[0] in METRICS]
    # every metric at every epsilon, each with a finite ratio to the best peer and its SE; the
    # count and the sum also by the legs' stated noise (exact), which is then the ratio
    assert sorted({(r[0], r[1]) for r in rows}) == sorted((m, e) for m in METRICS for e in ("0.1", "1", "8"))
    assert all(0 < float(r[-1]) < float("inf") for r in rows)
    # The measured SE is finite, except where a peer's draws all had error 0 (the count at
    # epsilon 8 on 40 key-draws: a discrete Laplace of scale 1/4 is 0 with probability 0.96, so
    # all 40 are 0 about one run in four): the measured ratio is then inf with no SE, and the
    # count's ratio is its stated one, which the assertions below check.
    assert all(float(r[-3]) >= 0 or (r[0] in ("count", "sum") and r[-3] == "nan") for r in rows)
    assert all((r[-2] != "-") == (r[0] in ("count", "sum")) for r in rows)
    assert all(r[-1] == r[-2] for r in rows if r[0] in ("count", "sum"))
    assert lines[-2].startswith("measured ratios above 1 by more than 2 SE: ")
    assert re.fullmatch(r"worst_ratio_to_best_peer=\d+\.\d{3} \(\w+@[\d.]+, "
                        r"(stated|measured \+/- \d+\.\d{3})\)", lines[-1]), lines[-1]
