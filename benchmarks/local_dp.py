"""Local DP: estimator variance vs theory (and vs pure-ldp), PEM heavy hitters, and throughput.

    python benchmarks/local_dp.py [--quick] [--skip-pure-ldp] [--pem-clients 1000000,10000000]
        [--variance-samples 20000] [--out benchmarks/out/local_dp] [--threads 2]
    python benchmarks/local_dp.py --quick --skip-pure-ldp  # quick: smaller sizes, no pure-ldp

Legs (each prints a table):

1. *Variance.* For every oracle (binary RR, GRR, SUE, RAPPOR, OUE, OLH), epsilon in {0.5, 1, 2,
   4} and domain size in {2, 16, 256, 4096, 65536} (binary RR: 2 only), n = 1,000 clients with
   Zipf(1.3) values are randomized (keyed streams, seeded testing keys) in enough repeated runs
   that about ``--variance-samples`` (value, run) estimates are pooled. The cell's ratio is the
   mean of (estimate - truth)^2 / Var_formula over them -- the empirical variance over runs of an
   unbiased estimator, relative to the exact formula in transforms/ldp/oracles.py, whose sampling
   error at 20,000 samples is about 1%; a cell passes when the ratio is within 5% of 1. (OLH is
   evaluated on at most 512 candidate values: the top 256 and 256 others.)
2. *pure-ldp* (``pip install pure-ldp`` in a virtualenv of this benchmark's own,
   ``benchmarks/.venvs/pure-ldp``, made on first use). GRR/OUE/SUE: pure-ldp's servers aggregate
   *the same reports* (the first run of each cell with d <= 4096); their estimates must equal
   ours up to the 2^-32 probability grid (max |diff| in units of the estimate's std). OLH hashes
   with xxhash, so it cannot read our reports: pure-ldp's own client and server run on the same
   values (d = 16, 100 runs), and the standardized errors of both are compared (variance ratio to
   the formula and a two-sample Kolmogorov-Smirnov p-value). Times of both, client and server,
   at d = 1,000: 200,000 clients for GRR and OUE, 10,000 for OLH (pure-ldp's OLH server hashes
   every domain value for every report).
3. *PEM.* The seed's setting (n = 1,000, MAXBITLEN 16, TOPK 9, GRR, 20 repetitions), GRR at
   n = 1M, and n in ``--pem-clients`` with OLH, for the four seed distributions (Poisson 5 / 100, uniform [0,14] /
   [0,100]) and several epsilons: F1, NCR, NDCG against the simulated truth, a PNG plot of NDCG
   against epsilon, and one run of the Beam pipeline (all rounds, side inputs) at n = 1M
   checked against the in-memory rounds.
4. *Throughput* (measured last, on this shared 2-core machine): client values randomized per
   second with keyed AES streams (the secure default; OUE needs one uniform per domain bit, so
   its rate is per client at d = 64 and has no goal), and reports aggregated per second -- GRR
   and OUE over 1,000 values, OLH against 1,000 candidates -- in-process, and through a Beam
   pipeline (in-process runner) reading Parquet report files, as a job does, to the estimate
   table, timed from pipeline construction to finish (start-up included).

The last line is ``variance_within_5pct=K/N pem_ndcg_1m=X reports_per_second=R``: K of N variance
cells within 5%; X the mean NDCG over the four seed distributions at n = 1M clients, OLH,
epsilon = 1; R the OLH reports per second aggregated against 1,000 candidates through Beam from
Parquet files (the slowest oracle's aggregation rate).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from transforms.ldp import KeyedRandomness, make_oracle, simulate  # noqa: E402
from transforms.ldp import hashing  # noqa: E402
from transforms.ldp.estimators import (candidate_values, count_support,  # noqa: E402
                                       estimate_frequencies)
from transforms.ldp.evaluation import score_top_k, true_top_k  # noqa: E402
from transforms.ldp.pem import PEMPlan, client_reports, heavy_hitters  # noqa: E402
from transforms.ldp.randomizers import randomize  # noqa: E402
from transforms.ldp.reports import report_arrays  # noqa: E402

ORACLES = ["binary_rr", "grr", "sue", "rappor", "oue", "olh"]
EPSILONS = [0.5, 1.0, 2.0, 4.0]
DOMAINS = [2, 16, 256, 4096, 65536]
PURE_LDP_VERSION = "1.2.0"


# --------------------------------------------------------------------------------- 1. variance

def _values(n, d, seed):
    dist = simulate.zipf(1.3, d)
    ids = np.arange(n, dtype=np.uint64)
    return simulate.client_values(dist, ids, KeyedRandomness.for_testing(seed, "values"), d)


def _olh_candidates(truth, seed):
    d = truth.size
    if d <= 512:
        return np.arange(d, dtype=np.uint64)
    top = np.argsort(-truth, kind="stable")[:256]
    rest = np.setdiff1d(np.arange(d), top)
    others = np.random.default_rng(seed).choice(rest, size=256, replace=False)
    return np.unique(np.concatenate([top, others])).astype(np.uint64)


def _per_run_support(oracle, arrays, runs, n, candidates):
    """(runs, C) support counts of ``runs`` consecutive blocks of n reports."""
    name = oracle.oracle_name
    if name in ("grr", "binary_rr"):
        run = np.repeat(np.arange(runs), n)
        flat = np.bincount(run * oracle.domain_size + arrays.report.astype(np.int64),
                           minlength=runs * oracle.domain_size)
        return flat.reshape(runs, oracle.domain_size)[:, candidates.astype(np.intp)]
    if name == "olh":
        if candidates.size <= 32:
            out = np.empty((runs, candidates.size), dtype=np.int64)
            for j, v in enumerate(candidates):
                h = hashing.hash16(arrays.hash_a, arrays.hash_b,
                                   np.full(arrays.n, v, np.uint64))
                hit = hashing.bucket_of(h, oracle.buckets) == arrays.report
                out[:, j] = hit.reshape(runs, n).sum(axis=1)
            return out
        return np.stack([hashing.support_counts(arrays.hash_a[r * n:(r + 1) * n],
                                                arrays.hash_b[r * n:(r + 1) * n],
                                                arrays.report[r * n:(r + 1) * n],
                                                candidates, oracle.buckets)
                         for r in range(runs)])
    d = oracle.domain_size
    if d <= 4096:
        bits = np.unpackbits(arrays.bits, axis=1, bitorder="little")[:, :d]
        return bits.reshape(runs, n, d).sum(axis=1)[:, candidates.astype(np.intp)]
    return np.stack([count_support(oracle, arrays_slice(arrays, r, n), candidates).support
                     for r in range(runs)])


def arrays_slice(arrays, r, n):
    from transforms.ldp.reports import ReportArrays
    return ReportArrays(n=n, bits=arrays.bits[r * n:(r + 1) * n])


def variance_cell(name, epsilon, d, n, target, seed):
    oracle = make_oracle(name, epsilon=epsilon, domain_size=d)
    values = _values(n, d, seed)
    truth = np.bincount(values.astype(np.int64), minlength=d)
    candidates = _olh_candidates(truth, seed) if name == "olh" else np.arange(d, dtype=np.uint64)
    effective = candidates.size - (1 if name in ("grr", "binary_rr") else 0)
    runs = max(1, math.ceil(target / effective))
    variance = oracle.variance(n, truth[candidates.astype(np.intp)])
    per_chunk = max(1, min(runs, 2_000_000 // n,
                           (64 << 20) // (n * d) if name in ("sue", "oue", "rappor") else runs))
    source = KeyedRandomness.for_testing(seed, "variance")
    squared, samples, seconds = 0.0, 0, 0.0
    first = None
    for r0 in range(0, runs, per_chunk):
        chunk = min(per_chunk, runs - r0)
        ids = np.arange(r0 * n, (r0 + chunk) * n, dtype=np.uint64)
        start = time.perf_counter()
        reports = randomize(oracle, np.tile(values, chunk), source=source, ids=ids)
        arrays = report_arrays(oracle, reports)
        support = _per_run_support(oracle, arrays, chunk, n, candidates)
        estimate = oracle.estimate(support, n)
        seconds += time.perf_counter() - start
        squared += float(((estimate - truth[candidates.astype(np.intp)]) ** 2 / variance).sum())
        samples += estimate.size
        if first is None:
            first = {"reports": reports.slice(0, n), "estimate": estimate[0]}
    ratio = squared / samples
    return {"oracle": name, "epsilon": epsilon, "d": d, "n": n, "runs": runs,
            "samples": samples, "ratio": ratio, "within": abs(ratio - 1) < 0.05,
            "seconds": seconds, "first": first, "oracle_obj": oracle, "truth": truth}


def leg_variance(args):
    rows = []
    for name in ORACLES:
        for epsilon in EPSILONS:
            for d in ([2] if name == "binary_rr" else DOMAINS):
                if args.quick and d > 4096:
                    continue
                rows.append(variance_cell(name, epsilon, d, args.variance_clients,
                                          args.variance_samples, seed=int(epsilon * 100) + d))
    print("\n== 1. estimator variance vs the exact formula (ratio = empirical / theoretical) ==")
    print(f"{'oracle':<10} {'eps':>4} {'d':>6} {'runs':>6} {'samples':>8} {'ratio':>7} "
          f"{'ok':>3} {'seconds':>8}")
    for row in rows:
        print(f"{row['oracle']:<10} {row['epsilon']:>4g} {row['d']:>6} {row['runs']:>6} "
              f"{row['samples']:>8} {row['ratio']:>7.4f} {'yes' if row['within'] else 'NO':>3} "
              f"{row['seconds']:>8.2f}")
    return rows


# -------------------------------------------------------------------------------- 2. pure-ldp

PURE_LDP_REQUIREMENTS = [f"pure-ldp=={PURE_LDP_VERSION}", "numpy", "scipy",
                         # pure_ldp imports scikit-learn and statsmodels (for RAPPOR) when it is imported
                         "scikit-learn", "statsmodels",
                         # pure-ldp hashes str; xxhash 3 accepts only bytes
                         "xxhash<3"]


def _pure_ldp_python() -> str:
    venv = HERE / ".venvs" / "pure-ldp"
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    wanted = "\n".join(PURE_LDP_REQUIREMENTS)
    if not ready.exists() or ready.read_text() != wanted:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PURE_LDP_REQUIREMENTS],
                       check=True)
        ready.write_text(wanted)
    return str(python)


def leg_pure_ldp(variance_rows, args):
    from scipy import stats

    try:
        python = _pure_ldp_python()
    except (subprocess.CalledProcessError, OSError) as err:
        print(f"\n== 2. pure-ldp: unavailable ({err}) ==")
        return None
    work = Path(tempfile.mkdtemp(prefix="local_dp_pure_ldp_"))
    tasks, ours = [], []
    for row in variance_rows:
        if row["oracle"] not in ("grr", "oue", "sue") or row["d"] > 4096:
            continue
        oracle = row["oracle_obj"]
        arrays = report_arrays(oracle, row["first"]["reports"])
        if row["oracle"] == "grr":
            data = arrays.report.astype(np.int64)
        else:
            data = np.unpackbits(arrays.bits, axis=1, bitorder="little")[:, :row["d"]]
        path = f"reports_{len(tasks)}.npy"
        np.save(work / path, data)
        start = time.perf_counter()
        ours_estimate = estimate_frequencies(oracle, row["first"]["reports"])
        ours_seconds = time.perf_counter() - start
        tasks.append({"kind": "same_reports", "oracle": row["oracle"], "epsilon": row["epsilon"],
                      "d": row["d"], "reports": path})
        ours.append((row, ours_estimate.column("estimate").to_numpy(), ours_seconds))
    olh_cells = []
    for epsilon in EPSILONS:
        d, n, runs = 16, 1000, args.pure_ldp_olh_runs
        values = _values(n, d, seed=7).astype(np.int64)
        np.save(work / f"olh_values_{epsilon}.npy", values)
        tasks.append({"kind": "own_olh", "epsilon": epsilon, "d": d,
                      "values": f"olh_values_{epsilon}.npy", "runs": runs, "seed": 11})
        olh_cells.append((epsilon, d, n, runs, values))
    timing_cells = []
    for oracle_name, n in (("grr", args.pure_ldp_timing_clients),
                           ("oue", args.pure_ldp_timing_clients),
                           ("olh", args.pure_ldp_timing_clients // 20)):
        d = 1000
        values = _values(n, d, seed=3).astype(np.int64)
        np.save(work / f"timing_{oracle_name}.npy", values)
        tasks.append({"kind": "timing", "oracle": oracle_name, "epsilon": 1.0, "d": d,
                      "values": f"timing_{oracle_name}.npy"})
        timing_cells.append((oracle_name, n, d, values))
    (work / "tasks.json").write_text(json.dumps(tasks))
    start = time.perf_counter()
    proc = subprocess.run([python, str(HERE / "local_dp_pure_ldp.py"), str(work / "tasks.json"),
                           str(work / "results.json")], capture_output=True, text=True)
    leg_seconds = time.perf_counter() - start
    if proc.returncode:
        print("\n== 2. pure-ldp: failed ==\n" + proc.stderr[-2000:])
        return None
    results = json.loads((work / "results.json").read_text())
    same_results = results[:len(ours)]
    olh_results = results[len(ours):len(ours) + len(olh_cells)]
    timing_results = results[len(ours) + len(olh_cells):]
    print(f"\n== 2. pure-ldp {PURE_LDP_VERSION} (its process took {leg_seconds:.1f} s) ==")
    print("same reports, estimates compared (max over cells of |ours - pure-ldp| / std):")
    same = []
    by_oracle = {}
    for (row, estimate, seconds), result in zip(ours, same_results):
        oracle = row["oracle_obj"]
        std = np.sqrt(oracle.variance(row["n"], row["truth"]))
        diff = float(np.max(np.abs(estimate - np.asarray(result["estimates"])) / std))
        same.append(diff)
        by_oracle.setdefault(row["oracle"], []).append(diff)
    for name, diffs in by_oracle.items():
        print(f"  {name:<4} {len(diffs):>3} cells (eps x d <= 4096): max {max(diffs):.2e} std "
              "(the 2^-32 probability grid)")
    print(f"\n{'OLH eps':<8} {'d':>3} {'runs':>5} {'ours var ratio':>15} {'pure var ratio':>15} "
          f"{'KS p':>6}   (own randomization each; standardized errors compared)")
    olh_rows = []
    for (epsilon, d, n, runs, values), result in zip(olh_cells, olh_results):
        oracle = make_oracle("olh", epsilon=epsilon, domain_size=d)
        truth = np.bincount(values, minlength=d)
        var = oracle.variance(n, truth)
        source = KeyedRandomness.for_testing(99, "pure-ldp-compare")
        ours_z = []
        for r in range(runs):
            reports = randomize(oracle, values, source=source,
                                ids=np.arange(r * n, (r + 1) * n))
            est = estimate_frequencies(oracle, reports).column("estimate").to_numpy()
            ours_z.append((est - truth) / np.sqrt(var))
        pure_z = ((np.asarray(result["estimates"]) - truth) / np.sqrt(var)).reshape(-1)
        ours_z = np.concatenate(ours_z)
        ks = stats.ks_2samp(ours_z, pure_z).pvalue
        olh_rows.append({"epsilon": epsilon, "ours_ratio": float(np.mean(ours_z ** 2)),
                         "pure_ratio": float(np.mean(pure_z ** 2)), "ks_p": float(ks)})
        print(f"{epsilon:<8g} {d:>3} {runs:>5} {np.mean(ours_z ** 2):>15.3f} "
              f"{np.mean(pure_z ** 2):>15.3f} {ks:>6.3f}")
    print(f"\n{'timing':<6} {'n':>8} {'d':>5} {'ours client s':>14} {'ours server s':>14} "
          f"{'pure client s':>14} {'pure server s':>14} {'speedup':>8}")
    timing_rows = []
    for (name, n, d, values), result in zip(timing_cells, timing_results):
        oracle = make_oracle(name, epsilon=1.0, domain_size=d)
        source = KeyedRandomness.for_testing(3, "timing")
        start = time.perf_counter()
        reports = randomize(oracle, values, source=source, ids=np.arange(n))
        client = time.perf_counter() - start
        start = time.perf_counter()
        estimate_frequencies(oracle, reports)
        server = time.perf_counter() - start
        speedup = (result["client_seconds"] + result["server_seconds"]) / (client + server)
        timing_rows.append({"oracle": name, "n": n, "d": d, "ours_client": client,
                            "ours_server": server, "pure_client": result["client_seconds"],
                            "pure_server": result["server_seconds"]})
        print(f"{name:<6} {n:>8,} {d:>5} {client:>14.3f} {server:>14.3f} "
              f"{result['client_seconds']:>14.3f} {result['server_seconds']:>14.3f} "
              f"{speedup:>7.0f}x")
    return {"same_reports_max_std_diff": max(same) if same else None, "olh": olh_rows,
            "timing": timing_rows}


# -------------------------------------------------------------------------------------- 3. PEM

def pem_run(plan, dist, n, seed, batch=1 << 20):
    sim = simulate.Simulation(distribution=dist, num_clients=n, seed=seed, batch_size=batch)
    # Independent client randomness per setting (the values depend on the seed only).
    source = KeyedRandomness.for_testing(seed + 1, f"pem-clients/{plan.oracle}/{plan.epsilon}")
    reports = [client_reports(plan, sim.values(ids), source=source, ids=ids)
               for ids in sim.id_batches()]
    top, _ = heavy_hitters(plan, reports)
    truth = true_top_k(sim.true_counts(1 << plan.value_bits), plan.top_k)
    return score_top_k(top.column("value").to_pylist(), truth, plan.top_k), reports, top


def leg_pem(args):
    dists = simulate.seed_distributions()
    rows = []
    seed_eps = [0.5, 1, 2, 4, 8, 12]
    for name, dist in dists.items():
        for epsilon in seed_eps:
            plan = PEMPlan(oracle="grr", epsilon=epsilon, value_bits=16, top_k=9)
            scores = [pem_run(plan, dist, 1000, seed=rep)[0] for rep in range(args.pem_reps)]
            rows.append({"n": 1000, "oracle": "grr", "distribution": name, "epsilon": epsilon,
                         **{k: float(np.mean([getattr(s, k) for s in scores]))
                            for k in ("f1", "ncr", "ndcg")}})
    settings = [(n, "olh") for n in args.pem_clients]
    if 1_000_000 in args.pem_clients:
        settings.insert(0, (1_000_000, "grr"))  # the seed's oracle at scale, for comparison
    for n, oracle in settings:
        for name, dist in dists.items():
            for epsilon in EPSILONS:
                plan = PEMPlan(oracle=oracle, epsilon=epsilon, value_bits=16, top_k=9)
                start = time.perf_counter()
                scores = pem_run(plan, dist, n, seed=1)[0]
                rows.append({"n": n, "oracle": oracle, "distribution": name, "epsilon": epsilon,
                             "seconds": time.perf_counter() - start, **scores.as_dict()})
    print("\n== 3. PEM heavy hitters (MAXBITLEN 16, TOPK 9): F1 / NCR / NDCG ==")
    print(f"{'n':>9} {'oracle':<6} {'distribution':<11} {'eps':>4} {'F1':>6} {'NCR':>6} "
          f"{'NDCG':>6} {'seconds':>8}")
    for row in rows:
        secs = f"{row['seconds']:>8.1f}" if "seconds" in row else f"{'':>8}"
        print(f"{row['n']:>9,} {row['oracle']:<6} {row['distribution']:<11} {row['epsilon']:>4g} "
              f"{row['f1']:>6.3f} {row['ncr']:>6.3f} {row['ndcg']:>6.3f} {secs}")
    return rows


def plot_pem(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({(r["n"], r["oracle"]) for r in rows})
    sizes.sort(key=lambda s: (s[1] != "grr", s[0]))
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 4), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (n, oracle) in zip(axes, sizes):
        for dist in sorted({r["distribution"] for r in rows}):
            pts = sorted((r["epsilon"], r["ndcg"]) for r in rows
                         if r["n"] == n and r["oracle"] == oracle and r["distribution"] == dist)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=dist)
        ax.set_xscale("log", base=2)
        ax.set_title(f"PEM, {oracle.upper()}, n = {n:,}")
        ax.set_xlabel("local epsilon")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("NDCG (top 9)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def leg_pem_beam(n, workdir):
    from transforms.ldp.beam import PEMHeavyHitters

    plan = PEMPlan(oracle="olh", epsilon=1.0, value_bits=16, top_k=9)
    _, reports, expected = pem_run(plan, simulate.seed_distributions()["poisson5"], n, seed=1,
                                   batch=1 << 18)
    glob = _write_parquet(reports, os.path.join(workdir, "pem"), "reports")
    seconds, got = _run_beam(glob, PEMHeavyHitters(plan), os.path.join(workdir, "pem.arrow"))
    same = got.equals(expected)
    print(f"\nBeam PEM (one pipeline, {plan.rounds} rounds, side inputs) reading {n:,} reports "
          f"from Parquet, OLH eps=1, poisson5: {seconds:.1f} s ({n / seconds / 1e6:.2f} M "
          f"reports/s); top-9 identical to the in-memory rounds: {same}")
    return {"seconds": seconds, "identical": same}


# ------------------------------------------------------------------------------ 4. throughput

def _rate(count, fn, repeat=3):
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return count / best


def leg_throughput(args, workdir):
    from transforms.ldp.beam import EstimateFrequencies

    rows = []
    n = args.throughput_clients
    batch = 1 << 20
    source = KeyedRandomness.for_testing(5, "throughput")
    for name, d in (("binary_rr", 2), ("grr", 1000), ("olh", 1 << 16), ("oue", 64)):
        oracle = make_oracle(name, epsilon=1.0, domain_size=d)
        values = np.arange(batch, dtype=np.uint64) % np.uint64(d)
        ids = np.arange(batch, dtype=np.uint64)
        total = n if name != "oue" else n // 16

        def work(oracle=oracle, values=values, ids=ids, total=total):
            for start in range(0, total, batch):
                randomize(oracle, values, source=source, ids=ids + np.uint64(start))
        rows.append(("randomize", f"{name} (d={d})", _rate(total, work, repeat=2)))
    aggregations = {}
    for name, d, candidates, total in (
            ("grr", 1000, None, n), ("oue", 1000, None, min(n, 4_000_000)),
            ("olh", 1 << 16, np.arange(1000, dtype=np.uint64) * 61, n)):
        oracle = make_oracle(name, epsilon=1.0, domain_size=d)
        per = 1 << 19
        tables = [randomize(oracle, (np.arange(per, dtype=np.uint64) * 7 + i) % np.uint64(d),
                            source=source, ids=np.arange(i * per, (i + 1) * per))
                  for i in range(total // per)]
        values = candidate_values(oracle, candidates)
        label = f"{name} (d={d}" + (", 1,000 candidates)" if candidates is not None else ")")

        def kernel(tables=tables, oracle=oracle, values=values):
            for t in tables:
                count_support(oracle, report_arrays(oracle, t), values, threads=args.threads)
        count = len(tables) * per
        rows.append(("aggregate in-process", label, _rate(count, kernel, repeat=2)))
        glob = _write_parquet(tables, os.path.join(workdir, name), "reports")
        del tables
        seconds, _ = _run_beam(glob, EstimateFrequencies(oracle, candidates=candidates),
                               os.path.join(workdir, f"{name}.arrow"))
        rows.append(("aggregate, Beam from files", f"{label} x{count / 1e6:.1f}M", count / seconds))
        aggregations[name] = count / seconds
    print("\n== 4. throughput on this machine (2 shared cores; best of repeats; Beam timed from "
          "pipeline construction to finish, reading Parquet report files) ==")
    goals = {"randomize": 5e6, "grr": 2e6, "oue": 2e6, "olh": 1e6}
    for kind, what, rate in rows:
        oracle = what.split(" ")[0]
        goal = goals["randomize"] if kind == "randomize" else goals.get(oracle, 0)
        met = "met" if rate >= goal else "NOT met"
        mark = "" if kind == "aggregate in-process" or (kind == "randomize" and oracle == "oue") \
            else f"  (goal {goal / 1e6:g}M/s: {met})"
        print(f"{kind:<26} {what:<38} {rate / 1e6:>8.2f} M/s{mark}")
    return rows, aggregations


# -------------------------------------------------------------------------------- Beam helpers

def _write_parquet(tables, folder, stem):
    """Report batches as Parquet part files (as a job reads them); returns the glob."""
    from transforms import parquet_files
    os.makedirs(folder, exist_ok=True)
    for i, table in enumerate(tables):
        parquet_files.write_table(table, os.path.join(folder, f"{stem}-{i:05d}.parquet"),
                                  row_group_size=1 << 17)
    return os.path.join(folder, f"{stem}-*.parquet")


def _save_table(table, path):
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _run_beam(glob, transform, output):
    """Read Parquet report files, apply ``transform``; returns (seconds, output table)."""
    import apache_beam as beam
    from apache_beam.io.parquetio import ReadFromParquetBatched
    from runners.profiles import pipeline_options_for

    start = time.perf_counter()
    with beam.Pipeline(options=pipeline_options_for([])) as p:
        out = p | ReadFromParquetBatched(glob) | transform
        if isinstance(out, dict):
            out = out["heavy_hitters"]
        out | beam.Map(_save_table, output)
    seconds = time.perf_counter() - start
    return seconds, pa.ipc.open_file(output).read_all()


# ------------------------------------------------------------------------------------------ main

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller runs: no 2^16 domains, 5,000 variance samples, n = 1M PEM")
    parser.add_argument("--skip-pure-ldp", action="store_true")
    parser.add_argument("--variance-samples", type=int, default=20_000)
    parser.add_argument("--variance-clients", type=int, default=1000)
    parser.add_argument("--pure-ldp-olh-runs", type=int, default=100)
    parser.add_argument("--pure-ldp-timing-clients", type=int, default=200_000)
    parser.add_argument("--pem-clients", default="1000000,10000000")
    parser.add_argument("--pem-reps", type=int, default=20)
    parser.add_argument("--throughput-clients", type=int, default=10_000_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(HERE / "out" / "local_dp"))
    parser.add_argument("--legs", default="variance,pure-ldp,pem,throughput",
                        help="comma-separated subset of the legs to run (pure-ldp needs variance)")
    args = parser.parse_args(argv)
    if args.quick:
        args.variance_samples = min(args.variance_samples, 5000)
        args.pem_clients = "1000000"
        args.pem_reps = min(args.pem_reps, 5)
        args.pure_ldp_olh_runs = min(args.pure_ldp_olh_runs, 30)
        args.pure_ldp_timing_clients = min(args.pure_ldp_timing_clients, 50_000)
        args.throughput_clients = min(args.throughput_clients, 4_000_000)
    args.pem_clients = [int(x) for x in str(args.pem_clients).split(",") if x]
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()

    legs = set(args.legs.split(","))
    variance_rows = leg_variance(args) if "variance" in legs else []
    pure = None
    if "pure-ldp" in legs and variance_rows and not args.skip_pure_ldp:
        pure = leg_pure_ldp(variance_rows, args)
    pem_rows, beam_pem, throughput, aggregation = [], None, [], {}
    workdir = tempfile.mkdtemp(prefix="local_dp_bench_")
    try:
        if "pem" in legs:
            pem_rows = leg_pem(args)
            plot_path = os.path.join(args.out, "pem_ndcg.png")
            plot_pem(pem_rows, plot_path)
            print(f"plot: {plot_path}")
            if 1_000_000 in args.pem_clients:
                beam_pem = leg_pem_beam(1_000_000, workdir)
        if "throughput" in legs:
            throughput, aggregation = leg_throughput(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    within = sum(r["within"] for r in variance_rows)
    ndcg_1m = [r["ndcg"] for r in pem_rows
               if r["n"] == 1_000_000 and r["oracle"] == "olh" and r["epsilon"] == 1.0]
    summary = {
        "variance": [{k: v for k, v in r.items() if k not in ("first", "oracle_obj", "truth")}
                     for r in variance_rows],
        "pure_ldp": pure, "pem": pem_rows, "pem_beam": beam_pem,
        "throughput": [{"kind": k, "what": w, "per_second": r} for k, w, r in throughput],
        "seconds": time.perf_counter() - started,
    }
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(summary, handle, indent=1, default=float)
    print(f"\ntotal {summary['seconds']:.0f} s; results: {os.path.join(args.out, 'results.json')}")
    ndcg = f"{np.mean(ndcg_1m):.3f}" if ndcg_1m else "not_run"
    rate = f"{aggregation['olh']:.0f}" if "olh" in aggregation else "not_run"
    print(f"variance_within_5pct={within}/{len(variance_rows)} pem_ndcg_1m={ndcg} "
          f"reports_per_second={rate}")


if __name__ == "__main__":
    main()
