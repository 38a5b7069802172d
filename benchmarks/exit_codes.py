"""Exit codes a scheduler can trust: the sample release run N times, each from process start.

    python benchmarks/exit_codes.py [--runs 200] [--parallel 1] [--job centralnotice]
    python benchmarks/exit_codes.py --runs 2  # quick
        [--keep_cores DIR]

Each run is a fresh ``python -m pipelines.centralnotice --demo --output <fresh dir>`` process,
exactly as a scheduler starts it, so interpreter start-up and teardown (where a C++ thread left
running aborts the process with rc 134, "terminate called without an active exception") are
part of every run. ``--parallel 2`` runs two at a time, which loads the 2-core machine and makes
teardown races more likely. ``--keep_cores DIR`` lets aborting runs dump a core into DIR (for
``gdb -batch -ex 'thread apply all bt' python DIR/core.*``); by default no core is written.

Prints one row per distinct outcome (return code, last stderr line, count, mean seconds) and a
last line ``runs=N nonzero=K rc134=J seconds_per_run=S`` (S: mean wall time of one run).
"""
from __future__ import annotations

import argparse
import collections
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

JOBS = {
    "centralnotice": lambda out: ["-m", "pipelines.centralnotice", "--demo", "--output", str(out)],
}


def _no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _cores_allowed():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def run_once(job: str, work: Path, index: int, core_dir: Path | None) -> tuple[int, str, float]:
    """One run from process start: (return code, last stderr line, wall seconds)."""
    out = work / f"run{index}"
    cwd = core_dir / f"run{index}" if core_dir else work  # a core lands in the cwd
    cwd.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *JOBS[job](out)], cwd=cwd, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_cores_allowed if core_dir else _no_core)
    seconds = time.perf_counter() - start
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    shutil.rmtree(out, ignore_errors=True)
    if core_dir and proc.returncode == 0:  # keep only the cores of failed runs
        shutil.rmtree(cwd, ignore_errors=True)
    rc = 128 - proc.returncode if proc.returncode < 0 else proc.returncode  # as a shell reports it
    return rc, (lines[-1][:100] if lines and rc else ""), seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (load)")
    parser.add_argument("--job", choices=sorted(JOBS), default="centralnotice")
    parser.add_argument("--keep_cores", type=Path, default=None,
                        help="let aborting runs write a core into this folder")
    args = parser.parse_args(argv)
    outcomes: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="exit-codes-") as tmp, \
            ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for rc, last, seconds in pool.map(lambda i: run_once(args.job, Path(tmp), i, args.keep_cores),
                                          range(args.runs)):
            outcomes[(rc, last)].append(seconds)
            if rc:
                print(f"  run rc={rc}: {last}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - started
    print(f"{'rc':>5} {'count':>6} {'mean s':>7}  last stderr line (failed runs)")
    for (rc, last), times in sorted(outcomes.items()):
        print(f"{rc:>5} {len(times):>6} {sum(times) / len(times):>7.2f}  {last}")
    nonzero = sum(len(t) for (rc, _), t in outcomes.items() if rc != 0)
    rc134 = sum(len(t) for (rc, _), t in outcomes.items() if rc == 134)
    per_run = sum(sum(t) for t in outcomes.values()) / max(args.runs, 1)
    print(f"(parallel={args.parallel}, wall {wall:.0f} s)")
    print(f"runs={args.runs} nonzero={nonzero} rc134={rc134} seconds_per_run={per_run:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
