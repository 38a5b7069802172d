"""Event-level reports for conversion counts: exact error, choice of R, comparison with summaries.

The ad tech's tooling (like ``pipelines.ara.optimize`` for summary reports). Question: at equal
epsilon, how well do debiased event-level reports (``transforms.ara.event_level``,
``transforms.ara.event_debias``) estimate the number of conversions per impression slice, compared
with a summary report? For counting, the best event-level configuration has one trigger-data
value and one window (N = 1 cell, k = R + 1 states: the least noise per source); R, the reports a
source may send, trades the bias of sources with more than R conversions against the noise of
a larger state space, and is chosen on training data.

Exact error per slice s (sources i in s, c_i conversions, ``a_i = min(c_i, R)``):
``bias = sum a_i - x_s`` and ``variance = event_debias.exact_variance(a)``; RMSRE_tau is the root
mean square over the non-empty slices of ``(bias^2 + variance) / max(tau, x_s)^2`` -- the
summary reports' metric (``pipelines.ara.optimize``). The set of registered sources per slice is
public (the ad tech registered them); the synthetic data lists sources with at least one
conversion, which omits only impressions with none (probability e^-10 per impression).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from transforms.ara.event_debias import debias_groups, uniform_moments
from transforms.ara.event_level import MAX_REPORTS, EventLevelConfig, randomize_states


def _per_source(data) -> tuple[np.ndarray, np.ndarray, int]:
    """(finest slice of each source, conversions of each source, number of slices)."""
    dims = tuple(data.dimensions)
    codes = np.ravel_multi_index(data.features.T, dims) if dims else np.zeros(len(data), np.int64)
    _, src = np.unique(data.source_id, return_inverse=True)
    conversions = np.bincount(src)
    slice_of = np.zeros(conversions.size, dtype=np.int64)
    slice_of[src] = codes
    return slice_of, conversions, int(np.prod(dims)) if dims else 1


def counting_config(max_reports: int, epsilon: float) -> EventLevelConfig:
    """One trigger-data value, one window: the event-level configuration for counting."""
    return EventLevelConfig(trigger_data_cardinality=1, report_windows=1, max_reports=max_reports,
                            epsilon=epsilon)


def count_error(data, config: EventLevelConfig, tau: float) -> float:
    """Exact RMSRE_tau of the debiased per-slice conversion counts (module docstring)."""
    slice_of, conversions, slices = _per_source(data)
    a = np.minimum(conversions, config.max_reports).astype(np.float64)
    x = np.bincount(slice_of, weights=conversions, minlength=slices)
    bias = np.bincount(slice_of, weights=a, minlength=slices) - x
    p = config.flip_probability
    mu, u2 = uniform_moments(config, config.cells)
    per_source = ((1 - p) * p * a * a - 2 * (1 - p) * p * mu * a + p * u2 - p * p * mu * mu) \
        / (1 - p) ** 2
    var = np.bincount(slice_of, weights=per_source, minlength=slices)
    ne = x > 0
    return float(math.sqrt(np.mean((bias[ne] ** 2 + var[ne]) / np.maximum(tau, x[ne]) ** 2)))


def best_counting_config(train, epsilon: float, tau: float,
                         candidates: Sequence[int] = range(1, MAX_REPORTS + 1)
                         ) -> tuple[EventLevelConfig, float]:
    """The R minimising the exact training error: (configuration, training RMSRE_tau)."""
    scored = [(count_error(train, counting_config(r, epsilon), tau), r) for r in candidates]
    err, r = min(scored)
    return counting_config(r, epsilon), err


def simulate_count_error(test, config: EventLevelConfig, tau: float, release_key,
                         repetitions: int = 20) -> float:
    """RMSRE_tau of really randomizing every source (keyed streams under ``release_key``, one
    purpose per repetition) and debiasing per slice."""
    from transforms.noise import RandomStreams
    slice_of, conversions, slices = _per_source(test)
    a = np.minimum(conversions, config.max_reports)
    cells = np.where(np.arange(config.max_reports)[None, :] < a[:, None], 0, -1)
    true_states = config.encode(cells)
    x = np.bincount(slice_of, weights=conversions, minlength=slices)
    n = np.bincount(slice_of, minlength=slices).astype(np.float64)
    ne = x > 0
    sq = 0.0
    for rep in range(repetitions):
        streams = RandomStreams.for_range(release_key, f"event-level-simulation/{rep}", a.size)
        noisy = config.decode(randomize_states(true_states, config, streams))
        m = (noisy >= 0).sum(axis=1).astype(np.float64)
        est, _ = debias_groups(n, np.bincount(slice_of, weights=m, minlength=slices),
                               np.bincount(slice_of, weights=m * m, minlength=slices),
                               config, config.cells)
        sq += float(np.mean(((est[ne] - x[ne]) / np.maximum(tau, x[ne])) ** 2))
    return math.sqrt(sq / repetitions)


def main(argv: Sequence[str] | None = None) -> int:
    """Choose R on a synthetic training set and compare with a summary report at equal epsilon."""
    import argparse

    from pipelines.ara import optimize as opt
    from pipelines.ara import synthetic

    parser = argparse.ArgumentParser(
        prog="python -m pipelines.ara.event_tuning",
        description="Event-level reports for conversion counts: choose R (the reports a source "
                    "may send) on synthetic training data and compare the exact error on test "
                    "data with a summary report's at equal epsilon (RMSRE_tau, lower is better).")
    parser.add_argument("--preset", choices=sorted(synthetic.PRESETS), default="adtech_travel",
                        help="synthetic data set (Aksu et al., PoPETs 2024; pipelines.ara.synthetic)")
    parser.add_argument("--epsilons", default="1,4,14",
                        help="comma-separated epsilons per source (the API allows <= 14)")
    parser.add_argument("--scale", type=float, default=0.25, help="data size relative to the preset")
    parser.add_argument("--seed", type=int, default=2024, help="seed of the synthetic data")
    args = parser.parse_args(argv)
    epsilons = [float(e) for e in args.epsilons.split(",") if e]

    train = synthetic.generate(args.preset, args.seed, scale=args.scale)
    test = synthetic.generate(args.preset, args.seed + 1, scale=args.scale)
    count_train = opt.workload_from_conversions(train, measures=("count",))
    count_test = opt.workload_from_conversions(test, measures=("count",))
    taus = opt.taus_from_training(count_train)
    tau = float(taus[0])
    print(f"preset {args.preset}, scale {args.scale:g}: {len(train)} training and {len(test)} test "
          f"conversions; RMSRE_tau with tau = {tau:g} (exact, no simulation)")
    print(f"{'epsilon':>8}{'R':>4}{'event-level':>13}{'summary':>10}  better")
    for epsilon in epsilons:
        config, _ = best_counting_config(train, epsilon, tau)
        event = count_error(test, config, tau)
        summary = opt.expected_error(count_test, opt.optimize(count_train, epsilon).config, taus,
                                     epsilon)
        print(f"{epsilon:>8g}{config.max_reports:>4}{event:>13.4f}{summary:>10.4f}  "
              f"{'event-level' if event < summary else 'summary'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
