"""Noise throughput: keyed streams plus exact samplers for one million output keys.

    python benchmarks/noise.py [--keys N] [--repeats R]
    python benchmarks/noise.py --keys 20000 --repeats 1  # quick

Prints a table (seconds per million keys for each mechanism, median of R runs, and the share of
that spent deriving the per-key streams) and ends with ``noise_seconds_per_million=S
noise_cpu_seconds_per_million=C``, S being the median over mechanisms of the full wall time
(streams + sampling) of a count release, C the same in CPU time of this process (what the work
costs whatever else the machine runs; goal S <= 0.5 on a quiet machine).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from accounting.calibration import NoiseKind, calibrate  # noqa: E402
from accounting.keys import ReleaseKey  # noqa: E402
from transforms.noise import RandomStreams, add_noise  # noqa: E402


def _specs():
    return {
        "discrete_laplace (count, eps=1)": (calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=1, l1_sensitivity=1), True),
        "laplace (sum, eps=1, L1=10)": (calibrate(NoiseKind.LAPLACE, epsilon=1, l1_sensitivity=10), False),
        "discrete_gaussian (rho=0.015)": (calibrate(NoiseKind.DISCRETE_GAUSSIAN, epsilon=1, delta=1e-7, l2_sensitivity=1), True),
        "gaussian (eps=1, delta=1e-7)": (calibrate(NoiseKind.GAUSSIAN, epsilon=1, delta=1e-7, l2_sensitivity=1), False),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    n = args.keys
    # Output keys as a release has them: (campaign, country, day-index) Arrow columns.
    rng = np.random.default_rng(0)
    keys = pa.table({"campaign": pa.array(rng.integers(0, 500, n)).cast(pa.string()),
                     "country": pa.array(np.array(["DE", "FR", "JP", "BR"])[rng.integers(0, 4, n)]),
                     "day": pa.array(np.arange(n, dtype=np.int64))})
    release_key = ReleaseKey.generate()
    rows = []
    totals, cpus = [], []
    for name, (spec, integer) in _specs().items():
        values = np.zeros(n, dtype=np.int64) if integer else np.zeros(n)
        stream_times, total_times, cpu_times = [], [], []
        for r in range(args.repeats):
            start, cpu = time.perf_counter(), time.process_time()
            streams = RandomStreams.for_keys(release_key, f"{name}/{r}", keys)
            mid = time.perf_counter()
            noisy = add_noise(spec, values, streams)
            end = time.perf_counter()
            stream_times.append(mid - start)
            total_times.append(end - start)
            cpu_times.append(time.process_time() - cpu)
        scale = 1e6 / n
        total = statistics.median(total_times) * scale
        totals.append(total)
        cpus.append(statistics.median(cpu_times) * scale)
        rows.append((name, total, cpus[-1], statistics.median(stream_times) * scale,
                     float(np.std(noisy)), spec.std))
    print(f"{'mechanism':34} {'s/million':>10} {'cpu s':>7} {'streams s':>10} {'std':>10} {'theory':>10}")
    for name, total, cpu, stream, std, theory in rows:
        print(f"{name:34} {total:10.3f} {cpu:7.3f} {stream:10.3f} {std:10.3f} {theory:10.3f}")
    print(f"keys={n} repeats={args.repeats} (secure AES-keyed streams, exact integer samplers); "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"noise_seconds_per_million={statistics.median(totals):.3f} "
          f"noise_cpu_seconds_per_million={statistics.median(cpus):.3f}")


if __name__ == "__main__":
    main()
