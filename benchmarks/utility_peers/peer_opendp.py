"""OpenDP leg of benchmarks/utility.py: run in benchmarks/.venvs/opendp (never imported by the
project). Reads the benchmark's data and plan (``--data DIR``) and writes ``opendp.npz``: one
(runs, keys) float array per ``<query>.<metric>.<epsilon>``.

Per key (a public key; each unit contributes one value to one key, so a key's data set is a
vector with symmetric distance 1 between neighbours), as an OpenDP user composes it:

* ``together``: a count (``make_count`` + ``make_laplace``: integer, geometric noise) at epsilon/2
  and a clamped sum (``make_clamp`` + ``make_sum`` + ``make_laplace``) at epsilon/2; the mean is
  their ratio (OpenDP's own ``make_mean`` needs the size to be public). OpenDP has no variance
  for an unknown size, so it sits out the variance row.
* ``median``: ``make_quantile_score_candidates`` over the plan's candidates (alpha 0.5) +
  ``make_noisy_max`` (MaxDivergence: report-noisy-max with exponential noise, i.e.
  permute-and-flip), its scale found by ``binary_search_param`` for epsilon.

Beside the releases, the stated noise std of the count and the sum (``together.count_std.<eps>``,
``together.sum_std.<eps>``, one number each): the count's discrete Laplace at the scale the search
found (variance ``2p / (1 - p)^2``, ``p = exp(-1 / scale)``), the sum's Laplace (``sqrt(2)
scale``). Both are unbiased additive noise on the exact answer (no value is clamped here), so
these are their exact RMSEs.
"""
import argparse
import json
from pathlib import Path

import numpy as np


def measurements(dp, epsilon, low, high, candidates):
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance()
    count_scale = dp.binary_search_param(
        lambda s: space >> dp.t.then_count() >> dp.m.then_laplace(s), d_in=1, d_out=epsilon / 2)
    count = space >> dp.t.then_count() >> dp.m.then_laplace(count_scale)
    bounded = space >> dp.t.then_clamp((low, high)) >> dp.t.then_sum()
    sum_scale = dp.binary_search_param(lambda s: bounded >> dp.m.then_laplace(s), d_in=1,
                                       d_out=epsilon / 2)
    total = bounded >> dp.m.then_laplace(sum_scale)
    scores = space >> dp.t.then_quantile_score_candidates(list(candidates), alpha=0.5)
    median = dp.binary_search_chain(
        lambda s: scores >> dp.m.then_noisy_max(dp.max_divergence(), scale=s, negate=True),
        d_in=1, d_out=epsilon)
    for m in (count, total, median):
        assert m.map(1) <= epsilon + 1e-9
    p = np.exp(-1.0 / count_scale)
    stated = {"count_std": float(np.sqrt(2 * p) / (1 - p)), "sum_std": float(np.sqrt(2) * sum_scale)}
    return count, total, median, stated


def main():
    parser = argparse.ArgumentParser(description="OpenDP leg of benchmarks/utility.py (run in its virtualenv)")
    parser.add_argument("--data", required=True)
    args = parser.parse_args()
    import opendp.prelude as dp  # after the arguments: --help runs without the peer installed

    dp.enable_features("contrib")
    data_dir = Path(args.data)
    plan = json.loads((data_dir / "plan.json").read_text())
    data = np.load(data_dir / "data.npz")
    order = np.argsort(data["key"], kind="stable")
    per_key = np.split(data["value"][order], np.cumsum(np.bincount(data["key"], minlength=plan["keys"]))[:-1])
    per_key = [v.tolist() for v in per_key]
    candidates = np.asarray(plan["candidates"], dtype=float)
    out = {}
    shape = (plan["runs"], plan["keys"])
    for epsilon in plan["epsilons"]:
        count, total, median, stated = measurements(dp, epsilon, plan["low"], plan["high"], candidates)
        for name, std in stated.items():
            out[f"together.{name}.{epsilon:g}"] = np.array(std)
        c, s, m = np.empty(shape), np.empty(shape), np.empty(shape)
        for run in range(plan["runs"]):
            for k, values in enumerate(per_key):
                c[run, k] = count(values)
                s[run, k] = total(values)
                m[run, k] = candidates[median(values)]
        out[f"together.count.{epsilon:g}"] = c
        out[f"together.sum.{epsilon:g}"] = s
        out[f"together.mean.{epsilon:g}"] = np.clip(s / np.maximum(c, 1), plan["low"], plan["high"])
        out[f"median.median.{epsilon:g}"] = m
    np.savez(data_dir / "opendp.npz", **out)


if __name__ == "__main__":
    main()
