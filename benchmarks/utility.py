"""Error at equal epsilon: this toolkit vs PipelineDP and OpenDP on the same data and budget.

    make bench-peers                     # benchmarks/.venvs/pipelinedp and benchmarks/.venvs/opendp
    python benchmarks/utility.py [--quick] [--keys 250] [--runs 2] [--epsilons 0.1,1,8] [--seed 0]
    python benchmarks/utility.py --quick  # quick: 40 keys, 1 run (after make bench-peers)

Data (synthetic, :func:`generate`): ``--keys`` public keys, 200-1,000 privacy units each, one row
per unit (so L0 = Linf = 1), values in [0, 100] (100 x Beta(2, 5), continuous). Every leg releases
on the public keys with Laplace noise for real values, each query at the whole epsilon:

* ``together``: count + sum + mean in one release, as a user asking for all three writes it;
* ``variance``: the variance alone;
* ``median``: the median alone.

Legs: **ours** in-process (``DPAggregate`` on the in-process engine, default metric options but
the median's resolution, ``Median(branching=32, depth=2)``: 1,024 leaves of width 0.098, as
fine as OpenDP's candidates; a fresh testing key per run); **PipelineDP** (``benchmarks/utility_peers/peer_pipelinedp.py``,
LocalBackend) and **OpenDP** (``benchmarks/utility_peers/peer_opendp.py``: count and clamped sum
at epsilon/2 each, mean their ratio; the median by ``make_quantile_score_candidates`` on a 0.1
grid + ``make_noisy_max``) each as a subprocess of its own virtualenv, made by ``make
bench-peers`` (peers are never dependencies of the project). OpenDP has no variance for an
unknown size: it sits that row out.

Per metric and epsilon: the RMSE over ``keys x runs`` key-draws against the exact value on all
rows (nothing is dropped by bounding here), for the median the mean rank error
``|midrank(released) / n - 1/2|``; then

* ``measured``: ours / the best peer's measured error, and ``+/-SE`` its Monte Carlo standard
  error (delta method over the key-draws, paired by key: :func:`ratio_and_se`). Where a leg's
  error is the same in expectation as ours (the same mechanism), the measured ratio is 1 give or
  take its SE, above 1 about half the time: a ratio is a deficit only when it is above 1 by
  several SEs. The mean at epsilon 0.1 is heavy-tailed (a noisy sum over a noisy count;
  PipelineDP's is not clamped to the range), so one run's SE there is itself rough: ``--runs 8
  --epsilons 0.1`` (2,000 key-draws) narrows it.
* ``stated``: for the count and the sum, whose released noise is unbiased and additive on the
  exact answer in every leg (nothing is clamped here), the ratio of the legs' stated noise
  std -- each leg's exact RMSE, no Monte Carlo error: ours from the released ``<metric>_std``
  column, the peers' from the noise their own calibration chose (the peer scripts' docstrings).
  A discrete count at epsilon 8 is 0 in most draws (OpenDP's at epsilon 4: in 96% of them), so
  its measured RMSE rests on a few nonzero draws and this is the one to read.
* ``ratio``: ``stated`` where there is one, else ``measured`` (<= 1: at or below every peer).

The line before the last lists the measured ratios above 1 by more than 2 SEs (with the stated
one beside, where there is one: in ``--quick``'s 40 draws an SE is itself rough); the last line is
``worst_ratio_to_best_peer=X (metric@epsilon, stated | measured +/- SE)``: the largest ratio.
``--quick`` (40 keys, 1 run) is the smoke test the slow test suite runs; a measurement uses the
defaults (500 key-draws) or more ``--runs``.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

LOW, HIGH = 0.0, 100.0
PEERS = {"pipelinedp": HERE / "utility_peers" / "peer_pipelinedp.py",
         "opendp": HERE / "utility_peers" / "peer_opendp.py"}
QUERIES = {"together": ("count", "sum", "mean"), "variance": ("variance",), "median": ("median",)}
#: Metrics whose error is each leg's stated noise std (unbiased additive noise in every leg).
STATED = ("count", "sum")
#: OpenDP's median candidates: a 0.1 grid over the range.
OPENDP_CANDIDATES = [round(LOW + 0.1 * i, 1) for i in range(int((HIGH - LOW) / 0.1) + 1)]


def peer_python(name: str) -> Path:
    return HERE / ".venvs" / name / "bin" / "python"


def generate(keys: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(key of each row, value of each row): one row per unit, 200-1,000 units per key."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(200, 1001, keys)
    key = np.repeat(np.arange(keys), sizes)
    return key, HIGH * rng.beta(2.0, 5.0, key.size)


def truth(key: np.ndarray, value: np.ndarray, keys: int) -> dict:
    groups = np.split(value[np.argsort(key, kind="stable")], np.cumsum(np.bincount(key, minlength=keys))[:-1])
    return {"count": np.array([g.size for g in groups], float), "sum": np.array([g.sum() for g in groups]),
            "mean": np.array([g.mean() for g in groups]), "variance": np.array([g.var() for g in groups]),
            "sorted": [np.sort(g) for g in groups]}


def rank_error(released: np.ndarray, sorted_groups: list) -> np.ndarray:
    """|midrank / n - 1/2| of each released median ((runs, keys) -> same shape)."""
    out = np.empty(released.shape)
    for k, group in enumerate(sorted_groups):
        below = np.searchsorted(group, released[:, k], side="left")
        at_or_below = np.searchsorted(group, released[:, k], side="right")
        out[:, k] = np.abs((below + at_or_below) / (2 * group.size) - 0.5)
    return out


def ours(data_dir: Path, plan: dict) -> dict:
    """Every (query, epsilon) of every run, each run one in-process pipeline of them all."""
    from pipelines import quiet_beam_import

    quiet_beam_import()  # before Beam: no `apitools not found` warning
    import apache_beam as beam
    import pyarrow as pa

    from accounting.budget import PrivacyBudget
    from accounting.keys import ReleaseKey
    from accounting.sensitivity import ContributionBounds
    from runners.profiles import pipeline_options_for
    from transforms.aggregate import Compute, DPAggregate, Keys
    from transforms import parquet_files
    from transforms.keyset import PublicKeyset
    from transforms.metrics import Median
    from transforms.tables import ReadParquetTables, WriteReleasedParquet

    # The median on 1024 leaves (width 0.098), OpenDP's candidates' resolution (0.1).
    asked = {"median": [Median(branching=32, depth=2)]}

    keyset = PublicKeyset.from_table(pa.table({"key": pa.array(range(plan["keys"]), pa.int64())}))
    bounds = ContributionBounds(max_partitions=1, max_contributions_per_partition=1,
                                min_value=LOW, max_value=HIGH)
    out = {}
    for run in range(plan["runs"]):
        written = {}
        with beam.Pipeline(options=pipeline_options_for(["--runner=FnApiRunner"])) as p:
            rows = p | ReadParquetTables(str(data_dir / "rows.parquet"))
            for query, metrics in QUERIES.items():
                for epsilon in plan["epsilons"]:
                    name = f"{query}.{epsilon:g}"
                    key = ReleaseKey.for_testing(1000 * plan["seed"] + run).derive(name)
                    release = DPAggregate(
                        compute=Compute(metrics=asked.get(query, list(metrics)), value="value"),
                        keys=Keys(privacy_unit="unit", columns=["key"], keyset=keyset),
                        bounds=bounds, budget=PrivacyBudget(epsilon=epsilon), release_key=key)
                    path = data_dir / f"ours.{run}.{name}.parquet"
                    (rows | f"Release {name}" >> release
                     | f"Write {name}" >> WriteReleasedParquet(str(path), keys=["key"]))
                    written[name] = path
        for name, path in written.items():
            table = parquet_files.read_table(str(path)).sort_by("key")
            query, epsilon = name.split(".", 1)
            for metric in QUERIES[query]:
                column = table.column(metric).to_numpy(zero_copy_only=False).astype(float)
                out.setdefault(f"{query}.{metric}.{epsilon}", []).append(column)
            for metric in STATED if query == "together" else ():
                # the released error column: one stated std for every key (public keys, one split)
                stated = np.unique(table.column(f"{metric}_std").to_numpy(zero_copy_only=False))
                assert stated.size == 1, (name, metric, stated)
                out[f"{query}.{metric}_std.{epsilon}"] = [stated[0]]
    return {k: np.stack(v) if k.split(".")[1] in QUERIES[k.split(".")[0]] else np.array(v[0])
            for k, v in out.items()}


def peer(name: str, data_dir: Path) -> dict:
    python = peer_python(name)
    if not python.exists():
        raise SystemExit(f"no {name} virtualenv at {python.parent.parent}: run `make bench-peers`")
    proc = subprocess.run([str(python), str(PEERS[name]), "--data", str(data_dir)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {name} leg failed:\n{proc.stderr[-3000:]}")
    with np.load(data_dir / f"{name}.npz") as released:
        return {k: released[k] for k in released.files}


def losses(metric: str, released: np.ndarray, exact: dict) -> np.ndarray:
    """Each key-draw's loss, flat in (run, key) order: the squared error, or for the median
    the rank error."""
    if metric == "median":
        return rank_error(released, exact["sorted"]).ravel()
    return ((released - exact[metric][None, :]) ** 2).ravel()


def error(metric: str, loss: np.ndarray) -> float:
    """The RMSE (the median: the mean rank error) from :func:`losses`."""
    return float(loss.mean() if metric == "median" else math.sqrt(loss.mean()))


def ratio_and_se(metric: str, ours_loss: np.ndarray, peer_loss: np.ndarray) -> tuple:
    """ours / peer of :func:`error`, and its standard error by the delta method over the
    key-draws, paired by (run, key): ``log ratio = p (log mean(a) - log mean(b))`` with ``p`` 1/2
    for an RMSE, 1 for a mean rank error, so ``Var(log ratio) ~ p^2 Var(a_i / mean(a) - b_i /
    mean(b)) / n`` (the keys' sizes, shared by both legs, enter both terms). ``(inf, nan)``
    where the peer's error is 0 and ours is not."""
    a, b = ours_loss.mean(), peer_loss.mean()
    power = 1.0 if metric == "median" else 0.5
    if b == 0:
        return (1.0, 0.0) if a == 0 else (math.inf, math.nan)
    ratio = (a / b) ** power
    if a == 0:
        return 0.0, 0.0
    spread = np.std(ours_loss / a - peer_loss / b, ddof=1) / math.sqrt(ours_loss.size)
    return ratio, ratio * power * float(spread)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 keys, 1 run: a smoke test")
    parser.add_argument("--keys", type=int, default=None, help="public keys (default 250)")
    parser.add_argument("--runs", type=int, default=None, help="releases per leg (default 2)")
    parser.add_argument("--epsilons", default="0.1,1,8")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    keys = args.keys or (40 if args.quick else 250)
    runs = args.runs or (1 if args.quick else 2)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    key, value = generate(keys, args.seed)
    exact = truth(key, value, keys)
    plan = {"keys": keys, "runs": runs, "epsilons": epsilons, "seed": args.seed, "low": LOW,
            "high": HIGH, "candidates": OPENDP_CANDIDATES}
    legs, seconds = {}, {}
    with tempfile.TemporaryDirectory(prefix="utility-bench-") as tmp:
        data_dir = Path(tmp)
        import pyarrow as pa

        from transforms import parquet_files

        parquet_files.write_table(pa.table({"unit": np.arange(key.size), "key": key, "value": value}),
                                  str(data_dir / "rows.parquet"))
        np.savez(data_dir / "data.npz", key=key, value=value)
        (data_dir / "plan.json").write_text(json.dumps(plan))
        for name, leg in (("ours", lambda: ours(data_dir, plan)),
                          ("pipelinedp", lambda: peer("pipelinedp", data_dir)),
                          ("opendp", lambda: peer("opendp", data_dir))):
            start = time.perf_counter()
            legs[name] = leg()
            seconds[name] = time.perf_counter() - start
    print(f"utility at equal epsilon: {keys} public keys, {key.size} rows (one per unit), values in "
          f"[{LOW:g}, {HIGH:g}], L0 = Linf = 1, {runs} run(s): {keys * runs} key-draws per cell")
    print("leg seconds: " + ", ".join(f"{n} {s:.1f}" for n, s in seconds.items()))
    print(f"{'metric':9} {'epsilon':>7} {'error':>10} {'ours':>11} {'pipelinedp':>11} {'opendp':>11} "
          f"{'measured':>9} {'+/-SE':>6} {'stated':>7} {'ratio':>7}")
    worst, beyond = (0.0, "", ""), []
    for query, metrics in QUERIES.items():
        for metric in metrics:
            for epsilon in epsilons:
                name = f"{query}.{metric}.{epsilon:g}"
                loss = {leg: losses(metric, released[name], exact)
                        for leg, released in legs.items() if name in released}
                errors = {leg: error(metric, v) for leg, v in loss.items()}
                best = min((leg for leg in errors if leg != "ours"), key=errors.get)
                measured, se = ratio_and_se(metric, loss["ours"], loss[best])
                std = f"{query}.{metric}_std.{epsilon:g}"
                stated_legs = {leg: float(released[std]) for leg, released in legs.items()
                               if std in released}
                stated = None
                if metric in STATED:
                    assert set(stated_legs) == set(legs), (std, sorted(stated_legs))
                    stated = stated_legs["ours"] / min(v for leg, v in stated_legs.items() if leg != "ours")
                ratio = measured if stated is None else stated
                if measured > 1 and not (measured - 1 <= 2 * se):
                    beyond.append(f"{metric}@{epsilon:g} {measured:.3f} +/- {se:.3f}"
                                  + ("" if stated is None else f" (stated {stated:.3f})"))
                if ratio > worst[0]:
                    how = "stated" if stated is not None else f"measured +/- {se:.3f}"
                    worst = (ratio, f"{metric}@{epsilon:g}", how)
                cells = [f"{errors[leg]:11.4g}" if leg in errors else f"{'-':>11}"
                         for leg in ("ours", "pipelinedp", "opendp")]
                kind = "rank err" if metric == "median" else "RMSE"
                print(f"{metric:9} {epsilon:7g} {kind:>10} {' '.join(cells)} {measured:9.3f} {se:6.3f} "
                      f"{'-' if stated is None else f'{stated:.3f}':>7} {ratio:7.3f}")
    print("measured ratios above 1 by more than 2 SE: " + ("; ".join(beyond) or "none"))
    print(f"worst_ratio_to_best_peer={worst[0]:.3f} ({worst[1]}, {worst[2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
