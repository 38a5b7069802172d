"""Time of the same job on each runner, at 1M and 10M rows.

    python benchmarks/runner_engines.py [--rows 1000000,10000000]
        [--runners direct,direct-mp2,prism,flink,spark] [--job demo_release] [--data_dir DIR]
    python benchmarks/runner_engines.py --rows 10000 --runners direct  # quick

Each run is a fresh ``python -m <job main>`` process, as a user would start it, so the time
includes interpreter and runner start-up (job server, Prism binary, Flink mini cluster). Runners
whose artifacts are not cached (``python -m runners.fetch ...``) are reported as unavailable.
All runs of one size must write the same output (keyed noise); the table says if one did not.
Last line: ``rows=N <runner>_seconds=S ... outputs_identical=PASS|FAIL`` (the largest size).

Jobs: ``demo_release`` (runners/demo_release.py, noisy row counts per public key),
``centralnotice`` (one release of pipelines/centralnotice/job.py on pipelines.centralnotice.data's
synthetic dataset: rows = impression rows, plus half as many clicks) and ``reach_frequency``
(pipelines/reach_frequency/job.py on synthetic impressions). Another pipeline joins by adding a
:class:`BenchJob` to ``JOBS``: how to write its input at a given size and its main's arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipelines import quiet_beam_import  # noqa: E402

quiet_beam_import()  # no `apitools not found` warning as the first line

from runners import cache  # noqa: E402
from runners.harness import RunnerCase, read_outputs, run_pipeline_main  # noqa: E402


@dataclasses.dataclass(frozen=True)
class BenchJob:
    module: str
    write_input: Callable[[Path, int], Path]        # (dir, rows) -> input path
    args: Callable[[Path, Path], list[str]]         # (input path, output dir) -> main's args
    output_glob: str


def _write_csv(path: Path, rows: int, seed: int, columns: Callable) -> Path:
    """A CSV of ``rows`` rows written in chunks of 1M (``columns(rng, start, n)`` -> dict of
    arrays); kept if it already exists."""
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    chunk = 1_000_000
    with open(path, "wb") as handle:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            pacsv.write_csv(pa.table(columns(rng, start, n)), handle, pacsv.WriteOptions(
                include_header=start == 0, quoting_style="none"))
    return path


def write_demo_rows(directory: Path, rows: int) -> Path:
    return _write_csv(directory / f"demo_rows_{rows}.csv", rows, 1, lambda rng, start, n: {
        "user": pa.array(np.arange(start, start + n)),
        "campaign": pa.array(rng.choice(np.array(list("abcdefghij")), n)),
        "impressions": pa.array(rng.integers(0, 10, n))})


def write_impressions(directory: Path, rows: int) -> Path:
    """Impression rows for pipelines.reach_frequency: 3 publishers, 2 campaigns, ids drawn from
    rows / 4 virtual people (so people have several impressions)."""
    return _write_csv(directory / f"impressions_{rows}.csv", rows, 2, lambda rng, start, n: {
        "publisher": pa.array(rng.choice(np.array(["pub_a", "pub_b", "pub_c"]), n)),
        "campaign": pa.array(rng.choice(np.array(["c1", "c2"]), n)),
        "vid": pa.array(rng.integers(0, max(rows // 4, 1), n))})


def write_centralnotice(directory: Path, rows: int) -> Path:
    """A synthetic CentralNotice dataset (pipelines.centralnotice.data) with ``rows`` impression
    rows and half as many clicks."""
    from pipelines.centralnotice.data import generate_dataset
    path = directory / f"centralnotice_{rows}"
    if not (path / "clicks.parquet").exists():
        generate_dataset(str(path), impression_rows=rows, clicks=rows // 2, seed=0)
    return path


def centralnotice_args(data: Path, out: Path) -> list[str]:
    """The first scheduled release of the first campaign (reads all rows, releases its slice)."""
    from pipelines.centralnotice.config import load_config
    release = load_config(str(data / "campaigns.json")).campaigns[0].releases()[0].release_id
    return ["--config", str(data / "campaigns.json"),
            "--impressions", str(data / "impressions.parquet"),
            "--clicks", str(data / "clicks.parquet"), "--release", release,
            "--output", str(out), "--testing_seed", "7"]


JOBS = {
    "demo_release": BenchJob(
        "runners.demo_release", write_demo_rows,
        lambda data, out: ["--input", str(data), "--output", str(out / "counts.csv"),
                           "--key_column", "campaign", "--keys", "a,b,c,d,e,f,g,h,i,j",
                           "--epsilon", "1", "--testing_seed", "7"],
        "counts.csv"),
    "centralnotice": BenchJob("pipelines.centralnotice", write_centralnotice, centralnotice_args,
                              "**/centralnotice.parquet"),
    "reach_frequency": BenchJob(
        "pipelines.reach_frequency", write_impressions,
        lambda data, out: ["--input", str(data), "--output", str(out),
                           "--campaigns", "c1,c2", "--publishers", "pub_a,pub_b,pub_c",
                           "--epsilon", "1.0986", "--testing_seed", "7"],
        "rf.jsonl"),
}


def _available(name: str) -> str | None:
    """Why a runner cannot run here, or None."""
    if name.startswith("prism") and not cache.cached_prism():
        return "no Prism binary (python -m runners.fetch prism)"
    if name.startswith("flink") and not cache.cached_flink_versions():
        return "no Flink job server jar (python -m runners.fetch flink)"
    if name.startswith("spark") and not cache.cached_jar(cache.SPARK_ARTIFACT):
        return "no Spark job server jar (python -m runners.fetch spark)"
    return None


RUNNERS = {
    "direct": RunnerCase(label="direct (FnApiRunner)", runner="DirectRunner"),
    "direct-mp2": RunnerCase(label="FnApiRunner, 2 processes", runner="FnApiRunner",
                             args=("--direct_num_workers=2", "--direct_running_mode=multi_processing")),
    "prism": RunnerCase(label="PrismRunner, LOOPBACK", runner="PrismRunner"),
    "flink": RunnerCase(label="FlinkRunner [local], LOOPBACK", runner="FlinkRunner"),
    "spark": RunnerCase(label="SparkRunner local[2], LOOPBACK", runner="SparkRunner"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1000000,10000000")
    parser.add_argument("--runners", default=",".join(RUNNERS))
    parser.add_argument("--job", default="demo_release", choices=sorted(JOBS))
    parser.add_argument("--data_dir", default=None, help="where inputs are kept (default: temp)")
    args = parser.parse_args(argv)
    job = JOBS[args.job]
    sizes = [int(r) for r in args.rows.split(",")]
    names = [r.strip() for r in args.runners.split(",")]
    unknown = [n for n in names if n not in RUNNERS]
    if unknown:
        parser.error(f"unknown runners {unknown}; choose from {sorted(RUNNERS)}")

    with tempfile.TemporaryDirectory() as scratch:
        data_dir = Path(args.data_dir or scratch)
        data_dir.mkdir(parents=True, exist_ok=True)
        print(f"job {args.job}; each run is a fresh process (start-up included)\n")
        print(f"{'rows':>10s}  {'runner':32s} {'seconds':>8s} {'rows/s':>10s} "
              f"{'vs direct':>9s}  note")
        identical = True
        for rows in sizes:
            t0 = time.perf_counter()
            data = job.write_input(data_dir, rows)
            print(f"{rows:>10d}  {'(write input)':32s} {time.perf_counter() - t0:8.1f}")
            baseline, reference = None, None
            timed = {}
            for name in names:
                case = RUNNERS[name]
                reason = _available(name)
                if reason:
                    print(f"{rows:>10d}  {case.label:32s} {'-':>8s} {'-':>10s} {'-':>9s}  {reason}")
                    continue
                out = Path(tempfile.mkdtemp(dir=scratch))
                t0 = time.perf_counter()
                try:
                    run_pipeline_main(job.module, job.args(data, out), case.argv(),
                                      in_process=False, timeout=3600)
                except Exception as exc:  # report and go on to the next runner
                    detail = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines()
                    print(f"{rows:>10d}  {case.label:32s} {'FAILED':>8s}  "
                          f"{detail[-1][:200] if detail else type(exc).__name__}", flush=True)
                    continue
                seconds = time.perf_counter() - t0
                output = read_outputs(str(out / job.output_glob))
                if reference is None:
                    reference = output
                note = "" if output == reference else "OUTPUT DIFFERS"
                identical = identical and not note
                timed[name] = seconds
                baseline = baseline or (seconds if name == "direct" else None)
                ratio = f"{seconds / baseline:8.2f}x" if baseline else f"{'-':>9s}"
                print(f"{rows:>10d}  {case.label:32s} {seconds:8.1f} {rows / seconds:10.0f} "
                      f"{ratio}  {note}", flush=True)
    print(f"rows={sizes[-1]} " + " ".join(f"{n.replace('-', '_')}_seconds={t:.1f}" for n, t in timed.items())
          + f" outputs_identical={'PASS' if identical else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
