"""DP count+sum on the DirectRunner's engine: this project vs plain Beam vs PipelineDP.

    python benchmarks/aggregate.py [--rows 1000000 --rows 10000000] [--skip-pipelinedp]

Generates synthetic Parquet data (heavy-tailed users and keys), then runs side by side, each in
a fresh process so peak memory is its own:
  (a) ours: ReadFromParquetBatched -> DPAggregate(count + sum; L0=3, Linf=2, clamp [0, 10],
      public keyset of 1000 keys, epsilon 1) -> Parquet;
  (b) plain Beam: ReadFromParquet -> Map -> CombinePerKey(sum) (non-private);
  (c) PipelineDP's DPEngine on Beam with the same parameters (in its own virtualenv, created
      on first use under benchmarks/.venvs/, because pipeline-dp pins its own dependencies).
Prints wall time (pipeline only, and the whole process from start to exit: "process s"), rows/s
and peak RSS per leg, a utility check (empirical RMSE of released
counts against the exact bounded counts of the same release in testing mode, over >= 10,000
(key, run) samples, against the mechanism's theoretical RMSE), and ends with
``speedup_vs_pipelinedp=X ratio_to_plain_beam=Y``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

L0, LINF, LOW, HIGH, EPSILON, NUM_KEYS = 3, 2, 0.0, 10.0, 1.0, 1000
ROW_GROUP = 250_000


def generate(path: str, rows: int, seed: int = 0) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    writer = None
    for start in range(0, rows, 1_000_000):
        n = min(1_000_000, rows - start)
        # Heavy-tailed users (a few with very many rows) and keys (Zipf-like popularity).
        users = (rng.pareto(1.2, n) * 50).astype(np.int64) % max(rows // 4, 1)
        keys = np.minimum((rng.pareto(0.8, n) * 20).astype(np.int64), NUM_KEYS - 1)
        values = np.round(rng.exponential(3.0, n), 2)
        table = pa.table({"user_id": users, "key": keys, "value": values})
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=ROW_GROUP)
    writer.close()


# --------------------------------------------------------------------------- legs (subprocesses)

def leg_ours(data: str, out: str, seed: int, testing: bool) -> dict:
    import apache_beam as beam
    import pyarrow as pa
    from apache_beam.io.parquetio import ReadFromParquetBatched

    from accounting.budget import PrivacyBudget
    from accounting.sensitivity import ContributionBounds
    from transforms.aggregate import DPAggregate
    from transforms.keyset import PublicKeyset
    from transforms.metrics import Count, Sum
    from accounting.keys import ReleaseKey

    keyset = PublicKeyset.from_table(pa.table({"key": pa.array(range(NUM_KEYS), pa.int64())}))
    transform = DPAggregate(privacy_unit="user_id", keys=["key"], value="value",
                            metrics=[Count(), Sum()],
                            bounds=ContributionBounds(L0, LINF, min_value=LOW, max_value=HIGH),
                            budget=PrivacyBudget(epsilon=EPSILON), keyset=keyset,
                            release_key=ReleaseKey.for_testing(seed), testing=testing)
    start = time.perf_counter()
    with beam.Pipeline(runner="FnApiRunner") as p:
        (p | ReadFromParquetBatched(data) | transform
         | beam.io.WriteToParquetBatched(out, schema=pa.schema([("key", pa.int64()), ("count", pa.int64()),
                                                                ("sum", pa.float64())]),
                                         num_shards=1, shard_name_template=""))
    spec = next(m.noise for m in transform.plan.measures if m.name == "count")
    return {"seconds": time.perf_counter() - start, "count_std": spec.std}


def leg_plain(data: str, out: str) -> dict:
    import apache_beam as beam
    from apache_beam.io.parquetio import ReadFromParquet

    start = time.perf_counter()
    with beam.Pipeline(runner="FnApiRunner") as p:
        (p | ReadFromParquet(data) | beam.Map(lambda r: (r["key"], r["value"]))
         | beam.CombinePerKey(sum) | beam.Map(lambda kv: f"{kv[0]},{kv[1]}")
         | beam.io.WriteToText(out, num_shards=1, shard_name_template=""))
    return {"seconds": time.perf_counter() - start}


PIPELINEDP_LEG = r'''
import json, sys, time
import apache_beam as beam
from apache_beam.io.parquetio import ReadFromParquet
import pipeline_dp
data, out, l0, linf, low, high, eps, nkeys = sys.argv[1:9]
start = time.perf_counter()
with beam.Pipeline(runner="FnApiRunner") as p:
    rows = p | ReadFromParquet(data)
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=float(eps), total_delta=0)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.SUM],
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        max_partitions_contributed=int(l0), max_contributions_per_partition=int(linf),
        min_value=float(low), max_value=float(high))
    extractors = pipeline_dp.DataExtractors(partition_extractor=lambda r: r["key"],
                                            privacy_id_extractor=lambda r: r["user_id"],
                                            value_extractor=lambda r: r["value"])
    result = engine.aggregate(rows, params, extractors, public_partitions=list(range(int(nkeys))))
    accountant.compute_budgets()
    result | beam.Map(str) | beam.io.WriteToText(out, num_shards=1, shard_name_template="")
import resource
print(json.dumps({"seconds": time.perf_counter() - start,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def _pipelinedp_python() -> str:
    import apache_beam

    venv = os.path.join(HERE, ".venvs", "pipelinedp")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(os.path.join(venv, ".ready")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", f"apache-beam=={apache_beam.__version__}",
                        "pipeline-dp", "pyarrow"], check=True)
        open(os.path.join(venv, ".ready"), "w").close()
    return python


def _run_leg(command) -> dict:
    """Run a leg in a fresh process; it prints JSON with its pipeline time and its own peak RSS.
    ``process_seconds`` is the whole process, start to exit (interpreter, imports, pipeline),
    as a user running the job feels it."""
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"leg failed: {' '.join(command)}\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_seconds": elapsed}


def _self(*args) -> list:
    return [sys.executable, os.path.abspath(__file__), *args]


def utility_check(data: str, workdir: str, runs: int) -> dict:
    """Released counts vs exact bounded counts of the same release in testing mode."""
    import numpy as np
    import pyarrow.parquet as pq

    errors, std = [], None
    for run in range(runs):
        noisy_path = os.path.join(workdir, f"noisy{run}.parquet")
        exact_path = os.path.join(workdir, f"exact{run}.parquet")
        std = _run_leg(_self("--leg", "ours", "--data", data, "--out", noisy_path, "--seed", str(100 + run)))["count_std"]
        _run_leg(_self("--leg", "ours", "--data", data, "--out", exact_path, "--seed", str(100 + run), "--testing"))
        noisy = pq.read_table(noisy_path).sort_by("key").column("count").to_numpy()
        exact = pq.read_table(exact_path).sort_by("key").column("count").to_numpy()
        errors.append(noisy - exact)
    errors = np.concatenate(errors)
    rmse = float(np.sqrt(np.mean(errors.astype(float) ** 2)))
    return {"samples": int(errors.size), "rmse": rmse, "theory": std, "ratio": rmse / std}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, action="append", help="rows (repeatable); default 1M")
    parser.add_argument("--skip-pipelinedp", action="store_true", help="skip the PipelineDP leg")
    parser.add_argument("--pipelinedp-max-rows", type=int, default=10_000_000,
                        help="run PipelineDP only up to this many rows (minutes at 10M rows)")
    parser.add_argument("--utility-rows", type=int, default=300_000)
    parser.add_argument("--utility-runs", type=int, default=10)
    parser.add_argument("--leg", choices=["ours", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--testing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.leg:
        result = leg_ours(args.data, args.out, args.seed, args.testing) if args.leg == "ours" \
            else leg_plain(args.data, args.out)
        result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return

    sizes = args.rows or [1_000_000, 10_000_000]
    workdir = tempfile.mkdtemp(prefix="dp-bench-")
    table = []
    last, compared = {}, None
    for rows in sizes:
        data = os.path.join(workdir, f"data{rows}.parquet")
        generate(data, rows)
        legs = {"ours (DPAggregate)": _self("--leg", "ours", "--data", data, "--out", data + ".ours"),
                "plain Beam CombinePerKey": _self("--leg", "plain", "--data", data, "--out", data + ".plain")}
        if not args.skip_pipelinedp and rows <= args.pipelinedp_max_rows:
            legs["PipelineDP DPEngine"] = [_pipelinedp_python(), "-c", PIPELINEDP_LEG, data,
                                           data + ".pdp", str(L0), str(LINF), str(LOW), str(HIGH),
                                           str(EPSILON), str(NUM_KEYS)]
        results = {name: _run_leg(cmd) for name, cmd in legs.items()}
        for name, r in results.items():
            table.append((rows, name, r["seconds"], rows / r["seconds"], r["peak_mb"],
                          r["process_seconds"]))
        last = results
        if "PipelineDP DPEngine" in results:
            compared = results
    print(f"{'rows':>10}  {'leg':28} {'seconds':>9} {'rows/s':>12} {'peak MB':>9} {'time / ours':>12}"
          f" {'process s':>10}")
    ours_time = {rows: seconds for rows, name, seconds, *_ in table if name.startswith("ours")}
    for rows, name, seconds, rate, peak, process in table:
        print(f"{rows:>10}  {name:28} {seconds:9.2f} {rate:12,.0f} {peak:9.0f} "
              f"{seconds / ours_time[rows]:12.2f} {process:10.2f}")

    data = os.path.join(workdir, "utility.parquet")
    generate(data, args.utility_rows, seed=7)
    utility = utility_check(data, workdir, args.utility_runs)
    print(f"utility: {utility['samples']} (key, run) samples; empirical RMSE of released counts vs exact "
          f"bounded counts = {utility['rmse']:.3f}, theoretical = {utility['theory']:.3f} "
          f"(ratio {utility['ratio']:.3f}; goal within 5%: {'PASS' if abs(utility['ratio'] - 1) <= 0.05 else 'FAIL'})")

    whole = {name: r["process_seconds"] for name, r in last.items()}
    print(f"whole process (start to exit) at {sizes[-1]:,} rows: ours "
          f"{whole['ours (DPAggregate)']:.2f} s, plain Beam {whole['plain Beam CombinePerKey']:.2f} s"
          f" (ratio {whole['ours (DPAggregate)'] / whole['plain Beam CombinePerKey']:.3f}; "
          "goal <= 1)")
    ours = last["ours (DPAggregate)"]["seconds"]
    plain = last["plain Beam CombinePerKey"]["seconds"]
    # The speedup is read at the largest size where PipelineDP ran; the ratio at the largest size.
    speedup = (f"{compared['PipelineDP DPEngine']['seconds'] / compared['ours (DPAggregate)']['seconds']:.2f}"
               if compared else "skipped")
    print(f"speedup_vs_pipelinedp={speedup} ratio_to_plain_beam={ours / plain:.3f}")

if __name__ == "__main__":
    main()
