"""The columnar floor: the benchmarks' DP algorithms in Polars with numpy randomness.

    python benchmarks/columnar_floor.py aggregate DATA.parquet OUT.parquet [--seed S]
    python benchmarks/columnar_floor.py keyset ROWS_DIR OUT.parquet [--seed S]

What a columnar engine on this machine takes for the same work as the toolkit's legs, so that
``benchmarks/aggregate.py`` and ``benchmarks/scale.py`` can state their time as a ratio to it
(a floor, not a peer: numpy's seeded generator instead of keyed secure randomness, floating-point
Laplace for sums, no row rules counted, no ledger). Both read Parquet with Polars (every core),
bound contributions by random priorities exactly as the toolkit's bounding defines it (per unit
the L0 keys of smallest pair priority, per unit and key the Linf rows of smallest row priority),
sum per key, join the public keyset (keys without rows get zeros) and add noise per key:

* ``aggregate``: count and sum of ``value`` clamped to [0, 10] per ``key`` over ``user_id``,
  L0 3, Linf 2, the public keyset 0..999, epsilon 1 split in halves: discrete Laplace of scale 12
  for counts (a difference of two geometric draws) and Laplace of scale 120 for sums, the
  calibration :class:`transforms.aggregate.DPAggregate` states for the same parameters;
* ``keyset``: ``benchmarks/scale.py``'s release: counts per ``key`` over ``user``, L0 1 and Linf
  1, the public keyset of its ``keyset-*.parquet`` files, epsilon 1 (discrete Laplace of scale 1).

Polars is a benchmark-only dependency (``pip install -e ".[bench]"``). Each run prints one JSON
line: its seconds (from the script's start, imports included), keys released and peak RSS.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import sys
import time

START = time.perf_counter()

L0, LINF, LOW, HIGH, NUM_KEYS = 3, 2, 0.0, 10.0, 1000
COUNT_SCALE, SUM_SCALE = 12.0, 120.0  # epsilon 1/2 each: L1 sensitivities 6 and 60
KEYSET_SCALE = 1.0  # benchmarks/scale.py: L0 = Linf = 1, epsilon 1


def _discrete_laplace(rng, scale: float, size: int):
    """Two-sided geometric noise: P(k) proportional to exp(-|k| / scale)."""
    p = 1.0 - __import__("math").exp(-1.0 / scale)
    return rng.geometric(p, size) - rng.geometric(p, size)


def _bounded(rows, unit: str, l0: int, linf: int, num_keys: int, rng):
    """Per (unit, key) the ``linf`` rows of smallest row priority, then per unit the ``l0`` keys
    of smallest pair priority (uniform numpy priorities, per row and per pair): each kept pair's
    row count and value sum. Integer units and keys below ``num_keys``: one int64 per pair."""
    import polars as pl

    value = "value" in rows.columns
    rows = rows.with_columns(pl.Series("row", rng.random(rows.height)),
                             pair=pl.col(unit) * num_keys + pl.col("key"))
    kept = [pl.len().clip(upper_bound=linf).alias("count")]
    if value:
        kept.append(pl.col("value").top_k_by("row", linf, reverse=True).sum().alias("sum"))
    pairs = rows.group_by("pair").agg(*kept)
    pairs = pairs.with_columns(pl.Series("priority", rng.random(pairs.height)),
                               unit=pl.col("pair") // num_keys, key=pl.col("pair") % num_keys)
    if l0 == 1:
        return pairs.sort("priority").unique(["unit"], keep="first", maintain_order=False)
    return pairs.filter(pl.col("priority").rank("ordinal").over("unit") <= l0)


def aggregate(data: str, out: str, seed: int) -> int:
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    rows = (pl.scan_parquet(data).select("user_id", "key", "value").drop_nulls()
            .filter(pl.col("key").is_between(0, NUM_KEYS - 1) & pl.col("value").is_finite())
            .with_columns(pl.col("value").clip(LOW, HIGH)).collect())
    pairs = _bounded(rows, "user_id", L0, LINF, NUM_KEYS, rng)
    del rows
    per_key = pairs.group_by("key").agg(pl.col("count").sum(), pl.col("sum").sum())
    keyset = pl.DataFrame({"key": np.arange(NUM_KEYS, dtype=np.int64)})
    released = keyset.join(per_key, on="key", how="left").fill_null(0).sort("key")
    released = released.with_columns(
        pl.col("count") + pl.Series(_discrete_laplace(rng, COUNT_SCALE, released.height)),
        pl.col("sum") + pl.Series(rng.laplace(0.0, SUM_SCALE, released.height)))
    released.write_parquet(out)
    return released.height


def keyset(directory: str, out: str, seed: int) -> int:
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    keys = pl.scan_parquet(sorted(glob.glob(os.path.join(directory, "keyset-*.parquet"))))
    num_keys = int(keys.select(pl.col("key").max()).collect().item()) + 1
    rows = (pl.scan_parquet(sorted(glob.glob(os.path.join(directory, "rows-*.parquet"))))
            .select("user", "key").drop_nulls()
            .join(keys, on="key", how="semi").collect())
    pairs = _bounded(rows, "user", 1, 1, num_keys, rng)
    del rows
    per_key = pairs.group_by("key").agg(pl.col("count").sum())
    released = keys.collect().join(per_key, on="key", how="left").fill_null(0)
    del pairs, per_key
    released = released.with_columns(
        pl.col("count") + pl.Series(_discrete_laplace(rng, KEYSET_SCALE, released.height)))
    released.write_parquet(out)
    return released.height


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algorithm", choices=["aggregate", "keyset"])
    parser.add_argument("data", help="the Parquet file (aggregate) or the rows/keyset directory")
    parser.add_argument("out", help="the released Parquet file")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    released = (aggregate if args.algorithm == "aggregate" else keyset)(args.data, args.out, args.seed)
    print(json.dumps({"seconds": time.perf_counter() - START, "released_keys": released,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
