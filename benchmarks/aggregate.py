"""DP count+sum on the DirectRunner's engine: this toolkit vs plain Beam, a columnar floor, PipelineDP.

    python benchmarks/aggregate.py [--rows 1000000 --rows 10000000] [--repeats 3] [--skip-pipelinedp]
    python benchmarks/aggregate.py --rows 20000 --repeats 1 --skip-pipelinedp --utility-rows 3000 --utility-runs 1 --new-metrics-rows 20000  # quick

Generates synthetic Parquet data (heavy-tailed users and keys), then runs side by side, each in
a fresh process so peak memory and CPU time are its own, the legs in turn ``--repeats`` times
(paired runs: each round runs every leg once, so a busy machine slows them alike; the table
shows medians, the ratios are medians of each round's ratios):

* toolkit default: the script as a user writes it, no options --
  ``with beam.Pipeline() as p: p | ReadParquetTables(data) | DPAggregate(count + sum; L0=3,
  Linf=2, clamp [0, 10], public keyset of 1000 keys, epsilon 1) | WriteReleasedParquet(out)``;
* toolkit tuned: the same on the options the jobs run with (``pipeline_options_for`` with
  ``--runner=FnApiRunner``: the runner profile, no Prism attempt first);
* plain Beam: ReadFromParquet -> Map -> CombinePerKey(sum) (non-private);
* columnar floor: the same DP algorithm in Polars with numpy randomness
  (``benchmarks/columnar_floor.py aggregate``; no secure noise);
* PipelineDP's DPEngine on Beam with the same parameters, up to ``--pipelinedp-max-rows`` (in
  its own virtualenv, made by ``make bench-peers``, run on first use: PipelineDP is never a
  dependency).

Prints per leg wall time (pipeline only, and the whole process from start to exit: "process s",
what the ratios use), CPU seconds of the process (user + system: the work done, whatever else the
machine runs), rows/s and peak RSS, a utility check (empirical RMSE of released counts against
the exact bounded counts of the same release in testing mode, over >= 10,000 (key, run) samples,
against the mechanism's theoretical RMSE), and ends with ``default_over_floor=X
tuned_over_floor=Y default_cpu_over_floor=C peak_over_floor=Z default_over_plain_beam=W
speedup_vs_pipelinedp=V | ...``
(whole-process wall ratios at the largest size, and the default leg's CPU time over the floor's:
``default_cpu_over_floor``; peak memory of the default leg over the floor's;
the speedup at the largest size PipelineDP ran; goals: ``default_over_floor <= 1.5`` and
``peak_over_floor < 1`` at 10M rows).

New metrics (``--new-metrics-rows N``, repeatable; ``--only-new-metrics`` runs just these): on
the same data with a 2-d vector column, ours (``Percentiles([50, 90]) + Variance()`` and
``VectorSum(L1 norm 5)``, two DPAggregates of epsilon 1 each) against PipelineDP (PERCENTILE(50),
PERCENTILE(90), VARIANCE and VECTOR_SUM, two aggregations of epsilon 1 each, same bounds; the
vector sums select keys privately with delta 1e-6, as PipelineDP 0.3's vector sum fails with public
partitions; note PipelineDP clips each unit's per-key vector sum, ours each row): time
of each side from process start, and per metric the RMSE over keys with >= 100 rows against the
exact value on all rows (clamped / clipped, unbounded), so both sides' bounding bias counts. Its
summary line: ``new_metrics rows=N speedup_vs_pipelinedp=X error_ratio p50=.. p90=.. variance=..
vector_sum=..`` (ours / PipelineDP RMSE; goal <= 1.1 and speedup >= 5 at 10M rows).
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
    from transforms import parquet_files

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
            writer = parquet_files.writer(path, table.schema)
        writer.write_table(table, row_group_size=ROW_GROUP)
    writer.close()


# --------------------------------------------------------------------------- legs (subprocesses)

def _in_process_options():
    """The in-process engine as the project's jobs run on it (its runner profile)."""
    from runners.profiles import pipeline_options_for

    return pipeline_options_for(["--runner=FnApiRunner"])


def leg_ours(data: str, out: str, seed: int, testing: bool, tuned: bool = True) -> dict:
    """The user's script: ReadParquetTables -> DPAggregate -> WriteReleasedParquet, on a plain
    ``beam.Pipeline()`` (``tuned=False``) or on the jobs' options."""
    import apache_beam as beam
    import pyarrow as pa

    from accounting.budget import PrivacyBudget
    from accounting.keys import ReleaseKey
    from accounting.sensitivity import ContributionBounds
    from transforms.aggregate import Compute, DPAggregate, Keys
    from transforms.keyset import PublicKeyset
    from transforms.metrics import Count, Sum
    from transforms.tables import ReadParquetTables, WriteReleasedParquet

    keyset = PublicKeyset.from_table(pa.table({"key": pa.array(range(NUM_KEYS), pa.int64())}))
    transform = DPAggregate(
        compute=Compute(metrics=[Count(), Sum()], value="value"),
        keys=Keys(privacy_unit="user_id", columns=["key"], keyset=keyset),
        bounds=ContributionBounds(max_partitions=L0, max_contributions_per_partition=LINF,
                                                     min_value=LOW, max_value=HIGH),
        budget=PrivacyBudget(epsilon=EPSILON),
        release_key=ReleaseKey.for_testing(seed),
        testing=testing)
    start = time.perf_counter()
    with (beam.Pipeline(options=_in_process_options()) if tuned else beam.Pipeline()) as p:
        (p | ReadParquetTables(data, columns=["user_id", "key", "value"]) | transform
         | WriteReleasedParquet(out, keys=["key"]))
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


# --------------------------------------------------------------------------- new metrics

VECTOR_NORM = 5.0


def generate_vectors(path: str, rows: int, seed: int = 0) -> None:
    """The ``generate`` data plus ``vec``: a 2-d vector of length ~value at a random angle."""
    import numpy as np
    import pyarrow as pa
    from transforms import parquet_files

    generate(path + ".base", rows, seed)
    table = parquet_files.read_table(path + ".base")
    rng = np.random.default_rng(seed + 1)
    angle = rng.uniform(0, 2 * np.pi, table.num_rows)
    value = table.column("value").to_numpy()
    flat = np.stack([value * np.cos(angle), value * np.sin(angle)], axis=1).ravel()
    table = table.append_column("vec", pa.FixedSizeListArray.from_arrays(pa.array(flat), 2))
    parquet_files.write_table(table, path, row_group_size=ROW_GROUP)
    os.remove(path + ".base")


def leg_ours_new(data: str, out: str, seed: int) -> dict:
    start = time.perf_counter()
    import apache_beam as beam
    import pyarrow as pa

    from accounting.budget import PrivacyBudget
    from accounting.keys import ReleaseKey
    from accounting.sensitivity import ContributionBounds
    from transforms.aggregate import Compute, DPAggregate, Keys
    from transforms.keyset import PublicKeyset
    from transforms.metrics import Percentiles, Variance, VectorSum
    from transforms.tables import ReadParquetTables, WriteReleasedParquet

    keyset = PublicKeyset.from_table(pa.table({"key": pa.array(range(NUM_KEYS), pa.int64())}))
    key = ReleaseKey.for_testing(seed)
    scalar = DPAggregate(
        compute=Compute(metrics=[Percentiles([50, 90]), Variance()], value="value"),
        keys=Keys(privacy_unit="user_id", columns=["key"], keyset=keyset),
        bounds=ContributionBounds(max_partitions=L0, max_contributions_per_partition=LINF,
                                                   min_value=LOW, max_value=HIGH),
        budget=PrivacyBudget(epsilon=EPSILON),
        release_key=key.derive("a"))
    from transforms.selection import PrivateSelection

    # Private key selection, as PipelineDP's vector sum needs (see PIPELINEDP_NEW_LEG).
    vector = DPAggregate(
        compute=Compute(metrics=[VectorSum(dimension=2, max_norm=VECTOR_NORM, norm="l1")], value="vec"),
        keys=Keys(privacy_unit="user_id", columns=["key"], selection=PrivateSelection()),
        bounds=ContributionBounds(max_partitions=L0, max_contributions_per_partition=LINF),
        budget=PrivacyBudget(epsilon=EPSILON, delta=1e-6),
        release_key=key.derive("b"))
    with beam.Pipeline(options=_in_process_options()) as p:
        rows = p | ReadParquetTables(data, columns=["user_id", "key", "value", "vec"])
        (rows | "Scalar" >> scalar
         | "WriteScalar" >> WriteReleasedParquet(out + ".scalar.parquet", keys=["key"]))
        (rows | "Vector" >> vector
         | "WriteVector" >> WriteReleasedParquet(out + ".vector.parquet", keys=["key"]))
    return {"seconds": time.perf_counter() - start}


PIPELINEDP_NEW_LEG = r'''
import time
start = time.perf_counter()
import json, sys
import apache_beam as beam
import numpy as np
from apache_beam.io.parquetio import ReadFromParquet
import pipeline_dp
data, out, l0, linf, low, high, eps, nkeys, norm = sys.argv[1:10]
with beam.Pipeline(runner="FnApiRunner") as p:
    rows = p | ReadFromParquet(data)
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=2 * float(eps), total_delta=1e-6)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
    common = dict(noise_kind=pipeline_dp.NoiseKind.LAPLACE, max_partitions_contributed=int(l0),
                  max_contributions_per_partition=int(linf))
    scalar = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.PERCENTILE(50), pipeline_dp.Metrics.PERCENTILE(90),
                 pipeline_dp.Metrics.VARIANCE], min_value=float(low), max_value=float(high), **common)
    vector = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.VECTOR_SUM], vector_size=2, vector_max_norm=float(norm),
        vector_norm_kind=pipeline_dp.aggregate_params.NormKind.L1, **common)
    public = list(range(int(nkeys)))
    # PipelineDP 0.3's vector sum fails with public partitions ("Improper number of dimensions
    # to norm" building their empty accumulators): both sides select keys privately there.
    a = engine.aggregate(rows, scalar, pipeline_dp.DataExtractors(
        partition_extractor=lambda r: r["key"], privacy_id_extractor=lambda r: r["user_id"],
        value_extractor=lambda r: r["value"]), public_partitions=public)
    b = engine.aggregate(rows, vector, pipeline_dp.DataExtractors(
        partition_extractor=lambda r: r["key"], privacy_id_extractor=lambda r: r["user_id"],
        value_extractor=lambda r: np.asarray(r["vec"], dtype=float)))
    accountant.compute_budgets()
    def dump(kv):
        fields = {k: (np.asarray(v).tolist()) for k, v in kv[1]._asdict().items()}
        return json.dumps({"key": int(kv[0]), **fields})
    a | "DumpA" >> beam.Map(dump) | "WriteA" >> beam.io.WriteToText(out + ".scalar", num_shards=1, shard_name_template="")
    b | "DumpB" >> beam.Map(dump) | "WriteB" >> beam.io.WriteToText(out + ".vector", num_shards=1, shard_name_template="")
import resource
print(json.dumps({"seconds": time.perf_counter() - start,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def exact_new_metrics(data: str) -> dict:
    """Per key (>= 100 rows): p50, p90, variance of clamped values, sum of clipped vectors."""
    import numpy as np
    from transforms import parquet_files

    table = parquet_files.read_table(data)
    keys = table.column("key").to_numpy()
    values = np.clip(table.column("value").to_numpy(), LOW, HIGH)
    vec = np.stack(table.column("vec").to_numpy(zero_copy_only=False))
    norms = np.abs(vec).sum(axis=1)
    vec = vec * np.minimum(1.0, VECTOR_NORM / np.maximum(norms, 1e-300))[:, None]
    order = np.argsort(keys, kind="stable")
    keys, values, vec = keys[order], values[order], vec[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(keys)]
    exact = {}
    for s, e in zip(starts, ends):
        if e - s >= 100:
            v = values[s:e]
            exact[int(keys[s])] = {"p50": np.quantile(v, 0.5), "p90": np.quantile(v, 0.9), "variance": v.var(),
                                   "vector_sum": vec[s:e].sum(axis=0)}
    return exact


def _rmse(exact: dict, released: dict, metric: str) -> float:
    import numpy as np

    errors = [np.sum((np.asarray(released[k], dtype=float) - np.asarray(e[metric])) ** 2)
              for k, e in exact.items() if k in released]
    return float(np.sqrt(np.mean(errors))) if errors else float("nan")


def new_metrics_comparison(rows: int, workdir: str, skip_pipelinedp: bool) -> str:
    from transforms import parquet_files

    data = os.path.join(workdir, f"vectors{rows}.parquet")
    # Data and exact values in a process of their own: a child inherits its parent's peak RSS
    # (Linux keeps ru_maxrss across fork and exec), so the parent stays small.
    _run_leg(_self("--leg", "prepare_new", "--data", data, "--out", data + ".exact.json",
                   "--seed", str(rows)))
    with open(data + ".exact.json") as handle:
        exact = {int(k): v for k, v in json.load(handle).items()}
    ours = _run_leg(_self("--leg", "ours_new", "--data", data, "--out", data + ".ours"))
    scalar = parquet_files.read_table(data + ".ours.scalar.parquet").to_pylist()
    vector = parquet_files.read_table(data + ".ours.vector.parquet").to_pylist()
    released = {"p50": {r["key"]: r["percentile_p50"] for r in scalar},
                "p90": {r["key"]: r["percentile_p90"] for r in scalar},
                "variance": {r["key"]: r["variance"] for r in scalar},
                "vector_sum": {r["key"]: r["vector_sum"] for r in vector}}
    ours_err = {m: _rmse(exact, released[m], m) for m in released}
    print(f"new metrics, {rows} rows, {len(exact)} keys with >= 100 rows; RMSE against exact values on all rows")
    print(f"{'leg':28} {'seconds':>9} {'peak MB':>9} " + " ".join(f"{m:>11}" for m in ours_err))
    print(f"{'ours (DPAggregate)':28} {ours['seconds']:9.2f} {ours['peak_mb']:9.0f} "
          + " ".join(f"{v:11.4g}" for v in ours_err.values()))
    if skip_pipelinedp:
        return f"new_metrics rows={rows} speedup_vs_pipelinedp=skipped"
    pdp = _run_leg([_pipelinedp_python(), "-c", PIPELINEDP_NEW_LEG, data, data + ".pdp", str(L0), str(LINF),
                    str(LOW), str(HIGH), str(EPSILON), str(NUM_KEYS), str(VECTOR_NORM)])
    a = [json.loads(line) for line in open(data + ".pdp.scalar")]
    b = [json.loads(line) for line in open(data + ".pdp.vector")]
    theirs = {"p50": {r["key"]: r["percentile_50"] for r in a}, "p90": {r["key"]: r["percentile_90"] for r in a},
              "variance": {r["key"]: r["variance"] for r in a},
              "vector_sum": {r["key"]: r["vector_sum"] for r in b}}
    their_err = {m: _rmse(exact, theirs[m], m) for m in theirs}
    print(f"{'PipelineDP DPEngine':28} {pdp['seconds']:9.2f} {pdp['peak_mb']:9.0f} "
          + " ".join(f"{v:11.4g}" for v in their_err.values()))
    ratios = " ".join(f"{m}={ours_err[m] / their_err[m]:.3f}" for m in ours_err)
    return (f"new_metrics rows={rows} speedup_vs_pipelinedp={pdp['seconds'] / ours['seconds']:.2f} "
            f"error_ratio {ratios}")


def _pipelinedp_python() -> str:
    """PipelineDP's virtualenv (``make bench-peers``, made on first use)."""
    python = os.path.join(HERE, ".venvs", "pipelinedp", "bin", "python")
    if not os.path.exists(os.path.join(HERE, ".venvs", "pipelinedp", ".ready")):
        subprocess.run(["make", "bench-peers"], cwd=ROOT, check=True)
    return python


def _run_leg(command) -> dict:
    """Run a leg in a fresh process; it prints JSON with its pipeline time and its own peak RSS.
    ``process_seconds`` is the whole process, start to exit (interpreter, imports, pipeline),
    as a user running the job feels it; ``cpu_seconds`` its user + system time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"leg failed: {' '.join(command)}\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_seconds": elapsed,
            "cpu_seconds": cpu}


def _self(*args) -> list:
    return [sys.executable, os.path.abspath(__file__), *args]


def utility_check(data: str, workdir: str, runs: int) -> dict:
    """Released counts vs exact bounded counts of the same release in testing mode."""
    import numpy as np
    from transforms import parquet_files

    errors, std = [], None
    for run in range(runs):
        noisy_path = os.path.join(workdir, f"noisy{run}.parquet")
        exact_path = os.path.join(workdir, f"exact{run}.parquet")
        std = _run_leg(_self("--leg", "ours", "--data", data, "--out", noisy_path, "--seed", str(100 + run)))["count_std"]
        _run_leg(_self("--leg", "ours", "--data", data, "--out", exact_path, "--seed", str(100 + run), "--testing"))
        noisy = parquet_files.read_table(noisy_path).sort_by("key").column("count").to_numpy()
        exact = parquet_files.read_table(exact_path).sort_by("key").column("count").to_numpy()
        errors.append(noisy - exact)
    errors = np.concatenate(errors)
    rmse = float(np.sqrt(np.mean(errors.astype(float) ** 2)))
    return {"samples": int(errors.size), "rmse": rmse, "theory": std, "ratio": rmse / std}


DEFAULT, TUNED, PLAIN, FLOOR, PIPELINEDP = ("toolkit default (user script)", "toolkit tuned (job options)",
                                            "plain Beam CombinePerKey", "columnar floor (Polars)",
                                            "PipelineDP DPEngine")


def _median(values):
    import statistics

    return statistics.median(values)


def compare(rows: int, workdir: str, repeats: int, pipelinedp: bool) -> dict:
    """The legs at ``rows`` rows, in turn ``repeats`` times: {leg: [result per round]}."""
    data = os.path.join(workdir, f"data{rows}.parquet")
    generate(data, rows)
    legs = {DEFAULT: _self("--leg", "default", "--data", data, "--out", data + ".default"),
            TUNED: _self("--leg", "ours", "--data", data, "--out", data + ".ours"),
            PLAIN: _self("--leg", "plain", "--data", data, "--out", data + ".plain"),
            FLOOR: [sys.executable, os.path.join(HERE, "columnar_floor.py"), "aggregate", data,
                    data + ".floor"]}
    if pipelinedp:
        legs[PIPELINEDP] = [_pipelinedp_python(), "-c", PIPELINEDP_LEG, data, data + ".pdp",
                            str(L0), str(LINF), str(LOW), str(HIGH), str(EPSILON), str(NUM_KEYS)]
    rounds = {name: [] for name in legs}
    for _ in range(repeats):
        for name, command in legs.items():
            if name == PIPELINEDP and rounds[name]:
                continue  # minutes per run: once is enough for its ratio
            rounds[name].append(_run_leg(command))
    return rounds


def _ratio(rounds: dict, leg: str, to: str, field: str = "process_seconds") -> float:
    """The median over rounds of ``leg``'s ``field`` over ``to``'s in the same round."""
    pairs = zip(rounds[leg], rounds[to])
    return _median([a[field] / b[field] for a, b in pairs])


def print_table(results: dict) -> None:
    print(f"{'rows':>10}  {'leg':31} {'pipeline s':>10} {'process s':>10} {'cpu s':>7} "
          f"{'rows/s':>12} {'peak MB':>8} {'process / floor':>16}")
    for rows, rounds in results.items():
        for name, runs in rounds.items():
            process = _median([r["process_seconds"] for r in runs])
            print(f"{rows:>10}  {name:31} {_median([r['seconds'] for r in runs]):10.2f} "
                  f"{process:10.2f} {_median([r['cpu_seconds'] for r in runs]):7.2f} "
                  f"{rows / process:12,.0f} {_median([r['peak_mb'] for r in runs]):8.0f} "
                  f"{_ratio(rounds, name, FLOOR):16.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, action="append", help="rows (repeatable); default 1M and 10M")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of paired runs per size")
    parser.add_argument("--skip-pipelinedp", action="store_true", help="skip the PipelineDP leg")
    parser.add_argument("--pipelinedp-max-rows", type=int, default=1_000_000,
                        help="run PipelineDP only up to this many rows (a minute at 1M rows)")
    parser.add_argument("--utility-rows", type=int, default=300_000)
    parser.add_argument("--utility-runs", type=int, default=10)
    parser.add_argument("--new-metrics-rows", type=int, action="append",
                        help="rows for the new-metrics comparison (repeatable); default 1M")
    parser.add_argument("--only-new-metrics", action="store_true",
                        help="run only the new-metrics comparison (percentiles, variance, vector sum)")
    parser.add_argument("--leg", choices=["ours", "default", "plain", "ours_new", "prepare_new"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--testing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.leg:
        if args.leg == "prepare_new":
            generate_vectors(args.data, args.seed)  # this leg gets the row count as --seed
            exact = exact_new_metrics(args.data)
            with open(args.out, "w") as handle:
                json.dump({k: {m: (v.tolist() if hasattr(v, "tolist") else float(v)) for m, v in e.items()}
                           for k, e in exact.items()}, handle)
            result = {}
        elif args.leg == "ours_new":
            result = leg_ours_new(args.data, args.out, args.seed)
        elif args.leg in ("ours", "default"):
            result = leg_ours(args.data, args.out, args.seed, args.testing, tuned=args.leg == "ours")
        else:
            result = leg_plain(args.data, args.out)
        result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return

    workdir = tempfile.mkdtemp(prefix="dp-bench-")
    new_lines = [new_metrics_comparison(rows, workdir, args.skip_pipelinedp)
                 for rows in (args.new_metrics_rows or [1_000_000])]
    if args.only_new_metrics:
        print(new_lines[-1])
        return
    sizes = args.rows or [1_000_000, 10_000_000]
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{args.repeats} round(s) of paired runs per size (medians)")
    results = {rows: compare(rows, workdir, args.repeats,
                             not args.skip_pipelinedp and rows <= args.pipelinedp_max_rows)
               for rows in sizes}
    print_table(results)

    data = os.path.join(workdir, "utility.parquet")
    generate(data, args.utility_rows, seed=7)
    utility = utility_check(data, workdir, args.utility_runs)
    print(f"utility: {utility['samples']} (key, run) samples; empirical RMSE of released counts vs exact "
          f"bounded counts = {utility['rmse']:.3f}, theoretical = {utility['theory']:.3f} "
          f"(ratio {utility['ratio']:.3f}; goal within 5%: {'PASS' if abs(utility['ratio'] - 1) <= 0.05 else 'FAIL'})")

    last = results[sizes[-1]]
    compared = [rows for rows in sizes if PIPELINEDP in results[rows]]
    speedup = f"{_ratio(results[compared[-1]], PIPELINEDP, DEFAULT):.2f}" if compared else "skipped"
    peak = _median([r["peak_mb"] for r in last[DEFAULT]]) / _median([r["peak_mb"] for r in last[FLOOR]])
    print(f"at {sizes[-1]:,} rows, whole processes: default / floor and tuned / floor in wall time "
          "(goal <= 1.5) and in CPU time, default peak / floor peak (goal < 1), default / plain "
          "Beam; PipelineDP / default at " + (f"{compared[-1]:,} rows" if compared else "no size (skipped)"))
    print(f"default_over_floor={_ratio(last, DEFAULT, FLOOR):.3f} "
          f"tuned_over_floor={_ratio(last, TUNED, FLOOR):.3f} "
          f"default_cpu_over_floor={_ratio(last, DEFAULT, FLOOR, 'cpu_seconds'):.3f} "
          f"peak_over_floor={peak:.3f} "
          f"default_over_plain_beam={_ratio(last, DEFAULT, PLAIN):.3f} "
          f"speedup_vs_pipelinedp={speedup} | {new_lines[-1]}")

if __name__ == "__main__":
    main()
