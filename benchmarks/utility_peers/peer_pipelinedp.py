"""PipelineDP leg of benchmarks/utility.py: run in benchmarks/.venvs/pipelinedp (never imported
by the project). Reads the benchmark's data and plan (``--data DIR``), releases every
(query, epsilon, run) with PipelineDP's LocalBackend on the public keys, and writes
``pipelinedp.npz``: one (runs, keys) float array per ``<query>.<metric>.<epsilon>``.

Queries, each one aggregation at the whole epsilon, as a PipelineDP user writes them:
``together`` = COUNT + SUM + MEAN in one call; ``variance`` = VARIANCE alone; ``median`` =
PERCENTILE(50) alone. Laplace noise, max_partitions_contributed = 1,
max_contributions_per_partition = 1, values clamped to the plan's range.

Beside the releases, the stated noise std of the count and the sum of ``together``
(``together.count_std.<eps>``, ``together.sum_std.<eps>``): PipelineDP derives both from its
mean's two measures (``MeanCount`` and ``MeanSum`` in the accountant's mechanism specs), Laplace
of scale ``L1 / eps`` each: the count's L1 is L0 Linf = 1, the normalised sum's L1 the half-range
h, and the sum is ``normalised sum + midpoint x count``: std ``sqrt(2) hypot(h / eps_sum,
midpoint / eps_count)``. Both are unbiased additive noise on the exact answer here.
"""
import argparse
import json
from pathlib import Path

import numpy as np

FIELDS = {"together": ("count", "sum", "mean"), "variance": ("variance",), "median": ("percentile_50",)}
NAMES = {"percentile_50": "median"}


def queries(pipeline_dp) -> dict:
    return {"together": [pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.SUM, pipeline_dp.Metrics.MEAN],
            "variance": [pipeline_dp.Metrics.VARIANCE],
            "median": [pipeline_dp.Metrics.PERCENTILE(50)]}


def release(pipeline_dp, rows, keys, metrics, epsilon, low, high):
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=0)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        metrics=metrics, noise_kind=pipeline_dp.NoiseKind.LAPLACE, max_partitions_contributed=1,
        max_contributions_per_partition=1, min_value=low, max_value=high)
    extractors = pipeline_dp.DataExtractors(partition_extractor=lambda r: r[0],
                                            privacy_id_extractor=lambda r: r[1],
                                            value_extractor=lambda r: r[2])
    result = engine.aggregate(rows, params, extractors, public_partitions=keys)
    accountant.compute_budgets()
    return dict(result), {spec.name: spec.eps for spec in accountant.mechanism_specs}


def stated_stds(eps_of: dict, low: float, high: float) -> dict:
    """The count's and the sum's noise std from the mean's measures' budgets (module docstring)."""
    midpoint, half = (low + high) / 2, (high - low) / 2
    count = np.sqrt(2) / eps_of["MeanCount"]
    return {"count_std": float(count),
            "sum_std": float(np.hypot(np.sqrt(2) * half / eps_of["MeanSum"], midpoint * count))}


def main():
    parser = argparse.ArgumentParser(description="PipelineDP leg of benchmarks/utility.py (run in its virtualenv)")
    parser.add_argument("--data", required=True)
    args = parser.parse_args()
    import pipeline_dp  # after the arguments: --help runs without the peer installed

    data_dir = Path(args.data)
    plan = json.loads((data_dir / "plan.json").read_text())
    data = np.load(data_dir / "data.npz")
    key_of, values = data["key"], data["value"]
    keys = list(range(plan["keys"]))
    rows = [(int(k), i, float(v)) for i, (k, v) in enumerate(zip(key_of, values))]
    out = {}
    for query, metrics in queries(pipeline_dp).items():
        for epsilon in plan["epsilons"]:
            arrays = {f: np.empty((plan["runs"], len(keys))) for f in FIELDS[query]}
            for run in range(plan["runs"]):
                result, eps_of = release(pipeline_dp, rows, keys, metrics, epsilon, plan["low"],
                                         plan["high"])
                for f in FIELDS[query]:
                    arrays[f][run] = [getattr(result[k], f) for k in keys]
            if query == "together":
                for name, std in stated_stds(eps_of, plan["low"], plan["high"]).items():
                    out[f"together.{name}.{epsilon:g}"] = np.array(std)
            for f, array in arrays.items():
                out[f"{query}.{NAMES.get(f, f)}.{epsilon:g}"] = array
    np.savez(data_dir / "pipelinedp.npz", **out)


if __name__ == "__main__":
    main()
