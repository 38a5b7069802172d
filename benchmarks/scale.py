"""Public-keyset DPAggregate at Wikimedia scale: in process vs a Dask cluster of 1 and 2 workers.

    python benchmarks/scale.py [--keys 10000000 --keys 30000000 --keys 125000000]
                               [--rows_per_key 1.6] [--engines in_process,dask1,dask2,floor]
                               [--dask_up_to N] [--max_gb G] [--cn_peak_gb G]
    python benchmarks/scale.py --keys 100000 --engines in_process,floor --ceiling_files 0  # quick

For each keyset size N the benchmark generates (once, cached under --work_dir) a public keyset of N
integer keys (files of 1M keys) and about ``rows_per_key x N`` rows (default 1.6: 200M rows at 125M keys) whose keys
follow a Zipf law (exponent 1.1 over the key ranks, so most keys have no rows and are released as
noisy zeros, as in a pageview release) and whose users are heavy-tailed; both as Parquet files of
1M rows. Each leg runs in a fresh process (``--leg``): ``Create(files) -> read Arrow batches ->
DPAggregate(count; L0=1, Linf=1; keyset from a PCollection with its size stated, as the row count
of the keyset files is public, its key shards staged as files under the work directory
(``--keyset_via staging``, transforms.keyset_staging) or sent through the shuffle
(``--keyset_via shuffle``); epsilon 1) -> count released keys``
on the in-process FnApiRunner or on a local Dask cluster (runners.dask_cluster) of 1 or 2 worker
processes; the ``floor`` leg is the same keyset release in Polars with numpy randomness
(``benchmarks/columnar_floor.py keyset``: every core, no secure noise, a benchmark-only extra).
The parent measures, from process start (imports included), wall time, rows/s, keys/s
and the peak memory of the whole process tree (the leg and every Dask scheduler, nanny and
worker it starts: RSS summed over the tree, sampled every 0.1 s).

Goals (issue 15): peak memory grows with the largest shard, not the keyset (<= 4 GB at 125M keys),
>= 2M keys/s end to end, 2 Dask workers >= 1.6x faster than 1. The machine's cores may be shared:
the table says how many were free (load average) when each leg ran.

When a Dask leg ran, a probe then measures the machine's own ceiling for 2 over 1 (``--ceiling_files``,
:func:`ceiling`): the job's filtering, bounding and noise, without an engine, in one process and in
two at once; what the Dask ratio loses below it is the engine's (start-up, side inputs, shuffles).

Last line: ``keys_125m_seconds=S peak_gb_125m=G dask_2_over_1=R cn_peak_gb=M
floor_ratio=F floor_keys=K`` (``nan`` for what was not measured; ``floor_ratio`` is the in-process
leg's wall time over the floor's at the largest keyset K both ran, goal <= 1.5; ``dask_2_over_1`` is at the largest keyset both Dask legs ran, named on the line
before; ``cn_peak_gb`` is taken from ``benchmarks/centralnotice.py`` via --cn_peak_gb, or nan). A
leg holding more than ``--max_gb`` (default 20) or running past ``--timeout`` is stopped and
reported as such; ``--dask_up_to N`` skips the Dask legs above N keys.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

FILE_ROWS = 1_000_000
ZIPF_EXPONENT = 1.1
EPSILON = 1.0


# --------------------------------------------------------------------------- data

def generate(directory: str, keys: int, rows: int, seed: int = 0) -> list[str]:
    """Rows files (user, key) and the keyset file; returns the row file paths."""
    import numpy as np
    import pyarrow as pa
    from transforms import parquet_files

    os.makedirs(directory, exist_ok=True)
    done = os.path.join(directory, ".complete-v2")  # v2: keyset files of FILE_ROWS keys
    files = [os.path.join(directory, f"rows-{i:05d}.parquet")
             for i in range(math.ceil(rows / FILE_ROWS))]
    if os.path.exists(done):
        return files
    rng = np.random.default_rng(seed)
    for i, path in enumerate(files):
        n = min(FILE_ROWS, rows - i * FILE_ROWS)
        # Zipf over ranks 1..keys by rejection of numpy's unbounded sampler.
        ranks = rng.zipf(ZIPF_EXPONENT, n)
        ranks = np.where(ranks <= keys, ranks, rng.integers(1, keys + 1, n))
        users = (rng.pareto(1.2, n) * 1000).astype(np.int64) % max(rows // 3, 1)
        parquet_files.write_table(
            pa.table({"user": users, "key": (ranks - 1).astype(np.int64)}), path)
    for start in range(0, keys, FILE_ROWS):
        stop = min(keys, start + FILE_ROWS)
        parquet_files.write_table(
            pa.table({"key": pa.array(np.arange(start, stop, dtype=np.int64))}),
            os.path.join(directory, f"keyset-{start // FILE_ROWS:05d}.parquet"))
    open(done, "w").close()
    return files


# --------------------------------------------------------------------------- one leg (child)

def _read(path: str):
    from transforms import parquet_files
    for batch in parquet_files.open_file(path).iter_batches(batch_size=250_000):
        yield batch


def leg(directory: str, engine: str, keyset_via: str = "staging") -> dict:
    import glob
    import shutil

    import apache_beam as beam

    from accounting.budget import PrivacyBudget
    from accounting.keys import ReleaseKey
    from accounting.sensitivity import ContributionBounds
    from runners import seam
    from runners.profiles import pipeline_options_for
    from transforms.aggregate import Compute, DPAggregate, Keys
    from transforms.keyset import PublicKeyset
    from transforms.metrics import Count

    rows = sorted(glob.glob(os.path.join(directory, "rows-*.parquet")))
    keysets = sorted(glob.glob(os.path.join(directory, "keyset-*.parquet")))
    argv = ["--runner=FnApiRunner"] if engine == "in_process" else \
        ["--runner=DaskRunner", f"--dask_local_workers={engine[-1]}"]
    out = {}

    import pyarrow as pa
    from transforms import parquet_files

    keyset_size = sum(parquet_files.open_file(path).metadata.num_rows for path in keysets)  # public
    staging = os.path.join(directory, f".staging-{engine}") if keyset_via == "staging" else None

    def build(p):
        keys = (p | "KeysetFiles" >> beam.Create(keysets)
                | "ReadKeyset" >> beam.FlatMap(_read).with_output_types(pa.RecordBatch))
        released = (p | "RowFiles" >> beam.Create(rows)
                    | "ReadRows" >> beam.FlatMap(_read).with_output_types(pa.RecordBatch)
                    | DPAggregate(
                        compute=Compute(metrics=[Count()]),
                        keys=Keys(privacy_unit="user", columns=["key"], keyset=PublicKeyset.from_pcollection(keys, ["key"], expected_size=keyset_size,
                                                                       staging_dir=staging)),
                        bounds=ContributionBounds(max_partitions=1,
                                                            max_contributions_per_partition=1),
                        budget=PrivacyBudget(epsilon=EPSILON),
                        release_key=ReleaseKey.for_testing(1)))
        (released | beam.Map(lambda t: t.num_rows) | beam.CombineGlobally(sum)
         | beam.Map(lambda n: open(os.path.join(directory, f".released-{engine}"), "w")
                    .write(str(n))))

    try:
        seam.run(pipeline_options_for(argv), build)
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
    with open(os.path.join(directory, f".released-{engine}")) as handle:
        out["released_keys"] = int(handle.read())
    return out


# --------------------------------------------------------------------------- machine ceiling

def _ceiling_work(paths: list[str], keyset_size: int) -> float:
    """The job's per-row and per-key work without an engine, on ``paths`` (row files): canonical
    unit ids, the keyset filter's lookups (a filter of ``keyset_size`` keys, built before the
    clock starts), priorities and L0/Linf bounding of every batch, then noise for as many keys
    as rows; returns its seconds."""
    import numpy as np
    import pyarrow as pa

    from accounting.calibration import NoiseKind, calibrate
    from accounting.keys import ReleaseKey
    from transforms import bounding
    from transforms.membership import KeyFilter, filter_words
    from transforms.noise import RandomStreams, add_noise
    from transforms.partials import routing_hash
    from transforms.privacy_units import canonical_unit_dictionary

    key = ReleaseKey.for_testing(1)
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=EPSILON, l1_sensitivity=1)
    keyset = KeyFilter.empty(filter_words(keyset_size))
    for start in range(0, keyset_size, FILE_ROWS):
        keys = np.arange(start, min(keyset_size, start + FILE_ROWS), dtype=np.int64)
        keyset.add(routing_hash(pa.table({"key": keys})))
    start = time.perf_counter()
    for path in paths:
        for batch in _read(path):
            table = pa.table({"user": canonical_unit_dictionary(batch.column(0)),
                              "key": batch.column(1)})
            table = table.filter(keyset.contains(routing_hash(table.select(["key"]))))
            bounding.bound(bounding.prioritize(table, "user", ["key"], key), 1, 1)
            streams = RandomStreams.for_keys(key, "ceiling", pa.table({"key": batch.column(1)}))
            add_noise(spec, np.zeros(batch.num_rows, dtype=np.int64), streams)
    return time.perf_counter() - start


def ceiling(directory: str, keyset_size: int, files: int = 6) -> float:
    """How much faster two processes do the job's work than one on this machine: one process
    over ``2 x files`` row files, then two at once over ``files`` each; the ratio of the first's
    time to the slower of the two. Cores shared with a neighbour, or memory bandwidth that two
    processes share (the key filter and bounding read memory at random), set it below 2; it is
    the most a 2-worker cluster could gain over 1 here, before any engine overhead."""
    import glob
    from concurrent.futures import ProcessPoolExecutor

    paths = sorted(glob.glob(os.path.join(directory, "rows-*.parquet")))[:2 * files]
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_ceiling_work, [paths[:1]] * 2, [keyset_size] * 2))  # imports, caches warm
        one = pool.submit(_ceiling_work, paths, keyset_size).result()
        both = list(pool.map(_ceiling_work, [paths[:files], paths[files:]], [keyset_size] * 2))
    return one / max(both)


# --------------------------------------------------------------------------- parent

def _tree_rss(pid: int) -> int:
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_leg(directory: str, engine: str, timeout: float, max_gb: float = float("inf"),
            keyset_via: str = "staging") -> dict:
    import psutil

    load = os.getloadavg()[0]
    start = time.perf_counter()
    command = [sys.executable, __file__, "--leg", engine, "--work_dir", directory,
               "--keyset_via", keyset_via]
    if engine == "floor":
        command = [sys.executable, os.path.join(HERE, "columnar_floor.py"), "keyset", directory,
                   os.path.join(directory, ".released-floor.parquet")]
    child = subprocess.Popen(command,
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = 0
    while child.poll() is None:
        peak = max(peak, _tree_rss(child.pid))
        if time.perf_counter() - start > timeout:
            child.kill()
            raise TimeoutError(f"{engine} exceeded {timeout} s")
        if peak > max_gb * 2**30:  # stop before the machine runs out of memory
            for proc in psutil.Process(child.pid).children(recursive=True):
                proc.kill()
            child.kill()
            raise MemoryError(f"{engine} exceeded {max_gb} GB")
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    output = child.stdout.read()
    if child.returncode != 0:
        raise RuntimeError(f"{engine} failed with exit code {child.returncode}")
    result = json.loads(output.strip().splitlines()[-1])
    return {**result, "seconds": seconds, "peak_gb": peak / 2**30, "load": load}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, action="append")
    parser.add_argument("--rows_per_key", type=float, default=1.6)
    parser.add_argument("--engines", default="in_process,dask1,dask2,floor")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "beam-dp-scale"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--dask_up_to", type=int, default=10**12,
                        help="run the Dask legs only for keysets of at most this many keys")
    parser.add_argument("--max_gb", type=float, default=20.0,
                        help="stop a leg whose process tree holds more than this (GB)")
    parser.add_argument("--cn_peak_gb", type=float, default=float("nan"),
                        help="peak GB of benchmarks/centralnotice.py, for the last line")
    parser.add_argument("--keyset_via", choices=["staging", "shuffle"], default="staging",
                        help="how the keyset's key shards reach the release shards: staged as "
                             "files (transforms.keyset_staging) or through the shuffle")
    parser.add_argument("--ceiling_files", type=int, default=6,
                        help="row files per process of the machine-ceiling probe (0: skip it)")
    parser.add_argument("--leg", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.leg:
        print(json.dumps(leg(args.work_dir, args.leg, args.keyset_via)))
        return 0
    sizes = args.keys or [10_000_000, 30_000_000, 125_000_000]
    engines = args.engines.split(",")
    print(f"{'keys':>12} {'rows':>12} {'engine':>10} {'seconds':>9} {'rows/s':>11} "
          f"{'keys/s':>11} {'peak GB':>8} {'load':>5} {'released':>11}")
    results = {}
    for keys in sizes:
        rows = int(keys * args.rows_per_key)
        directory = os.path.join(args.work_dir, f"k{keys}_r{rows}")
        generate(directory, keys, rows)
        for engine in engines:
            if engine.startswith("dask") and keys > args.dask_up_to:
                continue
            try:
                r = run_leg(directory, engine, args.timeout, args.max_gb, args.keyset_via)
            except (TimeoutError, MemoryError, RuntimeError) as error:
                print(f"{keys:>12,} {rows:>12,} {engine:>10} stopped: {error}", flush=True)
                continue
            results[(keys, engine)] = r
            print(f"{keys:>12,} {rows:>12,} {engine:>10} {r['seconds']:>9.1f} "
                  f"{rows / r['seconds']:>11,.0f} {keys / r['seconds']:>11,.0f} "
                  f"{r['peak_gb']:>8.2f} {r['load']:>5.1f} {r['released_keys']:>11,}", flush=True)
            assert r["released_keys"] == keys, "a public keyset releases every key"
    nan = float("nan")
    if args.ceiling_files and any(e.startswith("dask") for e in engines):
        at = max(k for k in sizes if (k, "dask1") in results or (k, "dask2") in results) \
            if any(e[1].startswith("dask") for e in results) else sizes[0]
        probe = os.path.join(args.work_dir, f"k{at}_r{int(at * args.rows_per_key)}")
        print(f"machine ceiling: 2 processes doing the job's filtering, bounding and noise "
              f"without an engine are {ceiling(probe, at, args.ceiling_files):.2f}x as fast as 1 "
              f"({at:,} keys, {args.ceiling_files} row files each)", flush=True)
    big = results.get((125_000_000, "in_process"), {})
    both = [k for k in sizes if (k, "dask1") in results and (k, "dask2") in results]
    ratio = nan
    if both:
        at = max(both)
        ratio = results[(at, "dask1")]["seconds"] / results[(at, "dask2")]["seconds"]
        print(f"dask_2_over_1 at {at:,} keys ({int(at * args.rows_per_key):,} rows), the largest "
              f"keyset both Dask legs ran")
    floored = [k for k in sizes if (k, "in_process") in results and (k, "floor") in results]
    floor_ratio = nan
    if floored:
        at = max(floored)
        floor_ratio = results[(at, "in_process")]["seconds"] / results[(at, "floor")]["seconds"]
        print(f"floor_ratio at {at:,} keys: in process {results[(at, 'in_process')]['seconds']:.1f} s "
              f"({results[(at, 'in_process')]['peak_gb']:.2f} GB) vs the columnar floor "
              f"{results[(at, 'floor')]['seconds']:.1f} s ({results[(at, 'floor')]['peak_gb']:.2f} GB)")
    print(f"keys_125m_seconds={big.get('seconds', nan):.1f} peak_gb_125m={big.get('peak_gb', nan):.2f} "
          f"dask_2_over_1={ratio:.2f} cn_peak_gb={args.cn_peak_gb:.2f} floor_ratio={floor_ratio:.2f} "
          f"floor_keys={max(floored) if floored else 0}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
