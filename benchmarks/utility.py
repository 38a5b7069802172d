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
``|midrank(released) / n - 1/2|``; then ``ratio`` = ours / the best peer (<= 1: at or below every
peer; ``inf`` where a peer's error was exactly 0 in a short run). The last line is
``worst_ratio_to_best_peer=X`` (the largest ratio, and where).
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
            query, _ = name.split(".", 1)
            for metric in QUERIES[query]:
                column = table.column(metric).to_numpy(zero_copy_only=False).astype(float)
                out.setdefault(f"{query}.{metric}.{name.split('.', 1)[1]}", []).append(column)
    return {k: np.stack(v) for k, v in out.items()}


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


def error(metric: str, released: np.ndarray, exact: dict) -> float:
    if metric == "median":
        return float(rank_error(released, exact["sorted"]).mean())
    return float(np.sqrt(np.mean((released - exact[metric][None, :]) ** 2)))


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
          f"{'ratio':>7}")
    worst = (0.0, "")
    for query, metrics in QUERIES.items():
        for metric in metrics:
            for epsilon in epsilons:
                name = f"{query}.{metric}.{epsilon:g}"
                errors = {leg: error(metric, released[name], exact)
                          for leg, released in legs.items() if name in released}
                best = min(v for leg, v in errors.items() if leg != "ours")
                ratio = errors["ours"] / best if best > 0 else (1.0 if errors["ours"] == 0 else math.inf)
                if ratio > worst[0]:
                    worst = (ratio, f"{metric}@{epsilon:g}")
                cells = [f"{errors[leg]:11.4g}" if leg in errors else f"{'-':>11}"
                         for leg in ("ours", "pipelinedp", "opendp")]
                kind = "rank err" if metric == "median" else "RMSE"
                print(f"{metric:9} {epsilon:7g} {kind:>10} {' '.join(cells)} {ratio:7.3f}")
    print(f"worst_ratio_to_best_peer={worst[0]:.3f} ({worst[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
