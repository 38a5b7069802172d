"""ARA summary reports: optimised vs baseline configuration, RMSRE_tau on held-out data.

For each synthetic preset (Aksu et al., PoPETs 2024) a training and an independent test data
set are generated. At each epsilon the optimiser picks clip thresholds, budget split and K
(reports per source) from the training data's closed-form RMSRE_tau; the baselines split the
budget equally and take the 95th / 99th percentile of the training values (and of the reports
per source). Every configuration is then *run* on the test data: algorithms A, C, S, R with fresh
randomized rounding and fresh discrete Laplace noise, ``--repetitions`` times (numpy randomness:
a simulation, not a release). The "baseline" of the summary line is, per cell, the better of the
two baselines.

A second table measures hierarchical queries (every prefix of the slice dimensions, root to
leaves, one bucket per level and measure): the optimised configuration with and without
least-squares consistency post-processing (``transforms.ara.hierarchy``).

Prints tables, writes ``benchmarks/out/summary_reports.png``; last line:
``optimized_below_baseline=K/N median_baseline_over_optimized=R``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipelines import ara_optimize as opt  # noqa: E402
from pipelines import ara_synthetic as synthetic  # noqa: E402

EPSILONS = (1, 2, 4, 8, 16, 32, 64)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="*", default=list(synthetic.PRESETS))
    parser.add_argument("--epsilons", nargs="*", type=float, default=list(EPSILONS))
    parser.add_argument("--repetitions", type=int, default=20,
                        help="noise draws per configuration on the test data")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--no-hierarchy", action="store_true")
    parser.add_argument("--plot", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "out", "summary_reports.png"))
    args = parser.parse_args(argv)
    start = time.time()

    results = {}   # (preset, eps) -> dict
    hier = {}      # (preset, eps) -> (without, with)
    print("RMSRE_tau on held-out test data (simulated: A, C, S, R run "
          f"{args.repetitions}x with real noise); train = closed form on training data")
    print(f"{'preset':<20}{'eps':>5}{'base95':>10}{'base99':>10}{'optimized':>11}"
          f"{'base/opt':>10}{'opt(train)':>12}{'K':>4}{'C_value':>12}{'share_value':>13}")
    for p_i, name in enumerate(args.presets):
        train_data = synthetic.generate(name, args.seed + 10 * p_i)
        test_data = synthetic.generate(name, args.seed + 10 * p_i + 1)
        train = opt.workload_from_conversions(train_data)
        test = opt.workload_from_conversions(test_data)
        taus = opt.taus_from_training(train)
        rng = np.random.default_rng(args.seed + 10 * p_i + 2)
        baselines = {q: opt.baseline_parameters(train, q).to_config(train) for q in (95, 99)}
        for eps in args.epsilons:
            params, train_err = opt.optimize_parameters(train, eps, taus)
            config = params.to_config(train)
            row = {"optimized": opt.simulate_error(test, config, taus, eps, rng, args.repetitions)}
            for q, base in baselines.items():
                row[q] = opt.simulate_error(test, base, taus, eps, rng, args.repetitions)
            row["baseline"] = min(row[95], row[99])
            results[(name, eps)] = row
            m = list(train.measures).index("value")
            print(f"{name:<20}{eps:>5g}{row[95]:>10.4f}{row[99]:>10.4f}{row['optimized']:>11.4f}"
                  f"{row['baseline'] / row['optimized']:>10.2f}{train_err:>12.4f}"
                  f"{config.reports_per_source:>4}{config.clip_thresholds[m]:>12.5g}"
                  f"{params.shares[0, m]:>13.3f}")

        if not args.no_hierarchy:
            dims = train_data.dimensions
            prefixes = tuple(range(len(dims) + 1))
            h_train = opt.workload_from_conversions(train_data, prefixes)
            h_test = opt.workload_from_conversions(test_data, prefixes)
            for eps in args.epsilons:
                params, _ = opt.optimize_parameters(h_train, eps, taus)
                config = params.to_config(h_train)
                state = rng.bit_generator.state
                without = opt.simulate_error(h_test, config, taus, eps, rng, args.repetitions)
                rng.bit_generator.state = state  # same rounding and noise draws: paired runs
                with_ls = opt.simulate_error(h_test, config, taus, eps, rng, args.repetitions,
                                             consistency=True)
                hier[(name, eps)] = (without, with_ls)

    if hier:
        print()
        print("Hierarchical queries (all slice-dimension prefixes, optimised configuration): "
              "RMSRE_tau over all levels, same draws with and without least-squares consistency")
        print(f"{'preset':<20}{'eps':>5}{'levels':>7}{'raw':>10}{'consistent':>12}{'raw/cons':>10}")
        for (name, eps), (without, with_ls) in hier.items():
            levels = len(synthetic.PRESETS[name].impression_dimensions) + 1
            print(f"{name:<20}{eps:>5g}{levels:>7}{without:>10.4f}{with_ls:>12.4f}"
                  f"{without / with_ls:>10.3f}")
        ratios = [w / c for w, c in hier.values()]
        print(f"consistency_improves={sum(r > 1 for r in ratios)}/{len(ratios)} "
              f"median_raw_over_consistent={statistics.median(ratios):.3f}")

    if args.plot:
        _plot(args, results, hier)
        print(f"plot: {args.plot}")
    useful = [r["baseline"] / r["optimized"] for r in results.values() if r["baseline"] < 1]
    if useful:
        # RMSRE_tau of all-zero estimates is about 1: where the baseline is above 1 the ratio
        # mostly says the baseline is worse than releasing nothing.
        print(f"cells with baseline RMSRE_tau < 1: {len(useful)}/{len(results)}, median "
              f"baseline/optimized there = {statistics.median(useful):.3f}")
    print(f"elapsed: {time.time() - start:.1f} s")
    below = sum(r["optimized"] < r["baseline"] for r in results.values())
    ratio = statistics.median(r["baseline"] / r["optimized"] for r in results.values())
    print(f"optimized_below_baseline={below}/{len(results)} "
          f"median_baseline_over_optimized={ratio:.3f}")
    return 0


def _plot(args, results, hier) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(args.plot), exist_ok=True)
    rows = 2 if hier else 1
    fig, axes = plt.subplots(rows, len(args.presets), figsize=(5 * len(args.presets), 4 * rows),
                             squeeze=False)
    for j, name in enumerate(args.presets):
        ax = axes[0, j]
        eps = args.epsilons
        for label, key in (("baseline 95th pct", 95), ("baseline 99th pct", 99),
                           ("optimized", "optimized")):
            ax.plot(eps, [results[(name, e)][key] for e in eps], marker="o", label=label)
        ax.set(xscale="log", yscale="log", title=name, xlabel="epsilon", ylabel="RMSRE_tau (test)")
        ax.set_xticks(eps, [f"{e:g}" for e in eps])
        ax.legend()
        if hier:
            ax = axes[1, j]
            ax.plot(eps, [hier[(name, e)][0] for e in eps], marker="o", label="hierarchical, raw")
            ax.plot(eps, [hier[(name, e)][1] for e in eps], marker="o",
                    label="hierarchical, least-squares consistent")
            ax.set(xscale="log", yscale="log", title=f"{name}: hierarchy", xlabel="epsilon",
                   ylabel="RMSRE_tau (test)")
            ax.set_xticks(eps, [f"{e:g}" for e in eps])
            ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
