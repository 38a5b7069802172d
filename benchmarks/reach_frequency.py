"""Accuracy and speed of sketch-based reach and frequency (WFA evaluation criteria).

Accuracy: for each true union reach N (10k .. 10M by default), every run simulates a campaign
with three publishers whose audiences overlap (each person is reached by publisher j with
probability 0.6 / 0.45 / 0.3, people reached by none are given to one publisher at random, so
the union is exactly N), draws each person's impressions per publisher (geometric, mean 2),
builds a real LiquidLegions sketch per publisher from the ids (m = 100,000, a = 10, fresh
campaign salt per run), unions them with the Beam CombineFn, adds the release noise (discrete
Laplace; epsilon = ln 3 is the *total* for the campaign, split over 4 scopes x 2 measures as the
pipeline does), and estimates reach and the frequency distribution 1..K (K = 10, last bin 10+).

* reach "95/5": at every N, at least 95% of runs within 5% relative error;
* frequency "80/20": at every N, at least 80% of runs with shuffle distance
  0.5 * sum_k |f_est(k) - f_true(k)| <= 0.2.

Speed: ids fingerprinted, bucketed and aggregated into one sketch per second (one core), and the
time to union 50 publisher sketches of m = 100,000 with the CombineFn.

    python benchmarks/reach_frequency.py            # full run, a few minutes on 2 cores
    python benchmarks/reach_frequency.py --quick    # quick: smaller sizes, fewer runs

The table goes to stdout, the plot of relative error vs true reach to --out (PNG); the last line
is ``reach_95_5=PASS|FAIL frequency_80_20=PASS|FAIL sketch_ids_per_second=N merge_50_seconds=S``.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import math  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipelines import quiet_beam_import  # noqa: E402

quiet_beam_import()  # no `apitools not found` warning as the first line

from accounting.keys import ReleaseKey  # noqa: E402
from transforms.sketches.beam import SketchUnionFn  # noqa: E402
from accounting.budget import PrivacyBudget  # noqa: E402
from transforms.sketches.dp import (ReachFrequencyNoise, SketchStatistics,  # noqa: E402
                                    add_global_noise, add_helper_share,
                                    helper_keys_for_testing)
from transforms.sketches.estimators import (estimate_reach, frequency_distribution,  # noqa: E402
                                            shuffle_distance)
from transforms.sketches.fingerprint import FingerprintSalt  # noqa: E402
from transforms.sketches.impressions import partial_sketches  # noqa: E402
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig  # noqa: E402

PUBLISHER_REACH = (0.6, 0.45, 0.3)
MEAN_IMPRESSIONS = 2.0
FULL_PLAN = ((10_000, 100), (30_000, 100), (100_000, 60), (300_000, 40), (1_000_000, 30),
             (3_000_000, 30), (10_000_000, 20))
QUICK_PLAN = ((10_000, 40), (100_000, 20), (1_000_000, 8))


def simulate_run(n: int, run: int, config: SketchConfig, budget: ReachFrequencyNoise,
                 release_key: ReleaseKey, max_frequency: int, helpers: int, seed: int):
    """One campaign of true union reach n: (reach estimate, estimated and true distributions)."""
    rng = np.random.default_rng([seed, n, run])
    # Distinct int64 ids: a random affine walk (odd stride) through the 64-bit space.
    start = rng.integers(0, 2 ** 62, dtype=np.int64)
    stride = np.int64(rng.integers(0, 2 ** 40) * 2 + 1)
    ids = (np.arange(n, dtype=np.int64) * stride + start)
    member = np.stack([rng.random(n) < q for q in PUBLISHER_REACH])
    nobody = ~member.any(axis=0)
    member[rng.integers(0, len(PUBLISHER_REACH), int(nobody.sum())), np.flatnonzero(nobody)] = True
    campaign = f"bench-{n}-{run}"
    salt = FingerprintSalt.for_campaign(campaign)
    union_fn = SketchUnionFn()
    acc = union_fn.create_accumulator()
    total_impressions = np.zeros(n, np.int64)
    for j in range(len(PUBLISHER_REACH)):
        rows = np.flatnonzero(member[j])
        impressions = rng.geometric(1.0 / MEAN_IMPRESSIONS, rows.size)
        total_impressions[rows] += impressions
        sketch = LiquidLegionsSketch.from_ids(config, salt, ids[rows], impressions)
        acc = union_fn.add_input(acc, sketch)
    union = union_fn.extract_output(acc)
    stats = SketchStatistics.of(union, max_frequency)
    scope = ("union", "")
    if helpers:
        noisy = stats
        for helper_key in helper_keys_for_testing(release_key, helpers).values():
            noisy = add_helper_share(noisy, helper_key, helpers, budget, campaign, scope)
    else:
        noisy = add_global_noise(stats, budget, release_key, campaign, scope)
    reach = estimate_reach(noisy.active_registers, config)
    true_hist = np.bincount(np.minimum(total_impressions, max_frequency) - 1,
                            minlength=max_frequency)
    return reach, frequency_distribution(noisy.histogram), true_hist / n


def accuracy(plan, config, budget, key, max_frequency, helpers, seed):
    rows = []
    for n, runs in plan:
        t0 = time.perf_counter()
        rel, shuffle = [], []
        for run in range(runs):
            reach, f_est, f_true = simulate_run(n, run, config, budget, key, max_frequency,
                                                helpers, seed)
            rel.append(reach / n - 1.0)
            shuffle.append(shuffle_distance(f_est, f_true))
        rel, shuffle = np.array(rel), np.array(shuffle)
        rows.append(dict(n=n, runs=runs, rel=rel, shuffle=shuffle,
                         seconds=time.perf_counter() - t0))
        r = rows[-1]
        print(f"{n:>11,d} {runs:>5d} {n * (1 + rel.mean()):>14,.0f} {rel.mean():>+9.4f} "
              f"{rel.std(ddof=1):>8.4f} {np.quantile(np.abs(rel), 0.95):>9.4f} "
              f"{np.mean(np.abs(rel) <= 0.05):>7.1%} {np.quantile(shuffle, 0.8):>9.4f} "
              f"{np.mean(shuffle <= 0.2):>7.1%} {r['seconds']:>7.1f}", flush=True)
    return rows


def sketch_speed(config, n_ids: int, repeats: int = 3):
    """Best-of-repeats rates (ids/s) of building one sketch: int ids, string ids, Arrow batch."""
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 2 ** 63 - 1, n_ids, dtype=np.int64)
    salt = FingerprintSalt.for_campaign("speed")

    def best(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    int_rate = n_ids / best(lambda: LiquidLegionsSketch.from_ids(config, salt, ids))
    n_str = max(n_ids // 5, 1)
    strings = pa.array(np.char.add("user-", ids[:n_str].astype(str)).astype(object),
                       pa.large_string())
    str_rate = n_str / best(lambda: LiquidLegionsSketch.from_ids(config, salt, strings))
    table = pa.table({"publisher": pa.array(rng.choice(["p0", "p1", "p2"], n_str)),
                      "campaign": pa.array(["c"] * n_str), "vid": ids[:n_str]})
    batch_rate = n_str / best(lambda: partial_sketches(
        table, config=config, salt_of=FingerprintSalt.for_campaign, campaigns=["c"],
        publishers=["p0", "p1", "p2"]))
    return int_rate, str_rate, batch_rate


def merge_speed(config, n_sketches=50, ids_per_sketch=200_000, repeats=3):
    """Seconds to union ``n_sketches`` publisher sketches with the CombineFn (best of repeats),
    and seconds to pickle + unpickle them (what a shuffle adds)."""
    rng = np.random.default_rng(11)
    salt = FingerprintSalt.for_campaign("merge")
    universe = rng.integers(0, 2 ** 63 - 1, 4 * ids_per_sketch, dtype=np.int64)
    sketches = [LiquidLegionsSketch.from_ids(config, salt, rng.choice(universe, ids_per_sketch),
                                             rng.geometric(0.5, ids_per_sketch))
                for _ in range(n_sketches)]
    fn = SketchUnionFn()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        merged = fn.merge_accumulators([fn.add_input(fn.create_accumulator(), s)
                                        for s in sketches])
        fn.extract_output(merged)
        best = min(best, time.perf_counter() - t0)
    t0 = time.perf_counter()
    for s in sketches:
        pickle.loads(pickle.dumps(s))
    return best, time.perf_counter() - t0, merged.active_registers()


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        ax1.scatter(np.full(r["runs"], r["n"]), r["rel"], s=8, alpha=0.5, color="tab:blue")
        ax2.scatter(np.full(r["runs"], r["n"]), r["shuffle"], s=8, alpha=0.5, color="tab:green")
    ns = [r["n"] for r in rows]
    ax1.plot(ns, [np.quantile(np.abs(r["rel"]), 0.95) for r in rows], "k--",
             label="95th pct of |rel. error|")
    for y in (0.05, -0.05):
        ax1.axhline(y, color="red", lw=0.8)
    ax1.set(xscale="log", xlabel="true reach", ylabel="relative error of reach",
            title="reach: 95/5 criterion (red: +-5%)")
    ax1.legend(loc="lower right")
    ax2.axhline(0.2, color="red", lw=0.8)
    ax2.plot(ns, [np.quantile(r["shuffle"], 0.8) for r in rows], "k--",
             label="80th pct of shuffle distance")
    ax2.set(xscale="log", xlabel="true reach", ylabel="shuffle distance",
            title="frequency 1..10+: 80/20 criterion (red: 0.2)")
    ax2.legend(loc="upper right")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 1M, fewer runs")
    parser.add_argument("--epsilon", type=float, default=math.log(3),
                        help="total epsilon per campaign (default ln 3)")
    parser.add_argument("--num_registers", type=int, default=100_000)
    parser.add_argument("--decay_rate", type=float, default=10.0)
    parser.add_argument("--max_frequency", type=int, default=10)
    parser.add_argument("--helpers", type=int, default=0,
                        help="0: global noise; n: distributed Polya shares from n helpers")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--speed_ids", type=int, default=5_000_000,
                        help="ids per sketch in the build-speed measurement")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "out", "reach_frequency.png"))
    args = parser.parse_args(argv)

    config = SketchConfig(num_registers=args.num_registers, decay_rate=args.decay_rate)
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=args.epsilon),
                                 num_publishers=len(PUBLISHER_REACH))
    key = ReleaseKey.for_testing(args.seed)  # benchmark only: a non-secret key
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    print(f"LiquidLegions m={config.num_registers} a={config.decay_rate:g}, "
          f"{len(PUBLISHER_REACH)} publishers, K={args.max_frequency}; campaign epsilon="
          f"{args.epsilon:.4f} -> union reach {budget.reach_spec().describe()}, "
          f"histogram {budget.histogram_spec().describe()}; noise: "
          f"{'global' if not args.helpers else f'{args.helpers} helpers (Polya shares)'}")
    print(f"{'true reach':>11} {'runs':>5} {'mean estimate':>14} {'mean rel':>9} {'sd rel':>8} "
          f"{'p95 |rel|':>9} {'<=5%':>7} {'p80 shuf':>9} {'<=0.2':>7} {'sec':>7}")
    rows = accuracy(plan, config, budget, key, args.max_frequency, args.helpers, args.seed)
    reach_ok = all(np.mean(np.abs(r["rel"]) <= 0.05) >= 0.95 for r in rows)
    freq_ok = all(np.mean(r["shuffle"] <= 0.2) >= 0.8 for r in rows)
    plot(rows, args.out)
    print(f"plot: {args.out}")

    int_rate, str_rate, batch_rate = sketch_speed(config, args.speed_ids)
    merge_s, pickle_s, merged_active = merge_speed(config)
    print()
    print(f"{'speed (one core)':<52} {'value':>14} {'goal':>12} {'ratio':>7}")
    print(f"{'sketch build, int64 ids (ids/s)':<52} {int_rate:>14,.0f} {2e6:>12,.0f} "
          f"{int_rate / 2e6:>6.1f}x")
    print(f"{'sketch build, string ids (ids/s)':<52} {str_rate:>14,.0f} {'':>12} "
          f"{str_rate / 2e6:>6.1f}x")
    print(f"{'arrow batch -> 3 publisher sketches (rows/s)':<52} {batch_rate:>14,.0f} "
          f"{'':>12} {batch_rate / 2e6:>6.1f}x")
    print(f"{'union of 50 sketches, m=100k, CombineFn (s)':<52} {merge_s:>14.4f} {1.0:>12.1f} "
          f"{1.0 / merge_s:>6.1f}x")
    print(f"{'pickle round trip of the 50 sketches (s)':<52} {pickle_s:>14.4f}")
    print(f"(merged sketch: {merged_active} active registers)")
    print(f"reach_95_5={'PASS' if reach_ok else 'FAIL'} "
          f"frequency_80_20={'PASS' if freq_ok else 'FAIL'} "
          f"sketch_ids_per_second={int_rate:.0f} merge_50_seconds={merge_s:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
