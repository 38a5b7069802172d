"""Masked LARk: browser sharing speed, helper aggregation speed, exactness, and training accuracy.

    python benchmarks/masked_lark.py            # full run, a few minutes on 2 cores
    python benchmarks/masked_lark.py --quick    # quick: smaller sizes, fewer training settings

1. Browser side: secret-shared values per second of ``aggregation_reports`` (Algorithm 1) and
   ``gradient_reports`` (masks, fake labels, blinding), in bundles of 100k records, with the
   default OS-CSPRNG randomness and with keyed (reproducible) streams. A "value" is one ring
   element split into H = 2 shares: d per aggregation record, 2 masks + (d + 1) blinding words per
   gradient record.
2. Helper side: records per second of one helper's Algorithm 2 (parse, sum per key, merge,
   k-anonymity, noise), as pure numpy and as the Beam pipeline ``ReadFromParquetBatched |
   HelperAggregate`` on the in-process runner, timed end to end (pipeline construction to
   finish, start-up included; a process start adds ~2 s of imports on top) and in steady state
   (the difference between two input sizes); and the job ``python -m pipelines.masked_lark.helper``
   making a release of one batch, timed from process start (what a user waits for).
3. Exactness: without noise, combining both helpers' outputs must give the clear aggregate exactly
   (units of 2^-f) and the masked gradient the clear clipped gradient exactly.
4. Training (the paper's Figures 3 and 5) on the synthetic task of ``transforms.lark.data``
   (30 byte features, ~25% positives, Bayes accuracy ~0.96): test accuracy of logistic regression
   trained centrally on clear data, with central DP (one Laplace draw per step), and through the
   masked helpers (each helper adding full noise), for several psi and per-step epsilon; and
   with local DP on the features (no helper noise) against the per-feature epsilon.

The table goes to stdout, the plot to --out (PNG). The last line is
``exact_without_noise=PASS|FAIL helper_records_per_second=R accuracy_gap_at_eps1=G`` where R is
the Beam end-to-end rate of one helper and G = accuracy(central clear) - accuracy(masked helpers,
epsilon = 1 per step, psi = 1), averaged over --repeats runs.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout

import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey
from transforms import parquet_files
from transforms.lark import helper as H
from transforms.lark.browser import aggregation_reports, gradient_reports
from transforms.lark.combine import combine_aggregation, combine_gradients, gradient_vector
from transforms.lark.data import (classification_data, conversion_records, gradient_records,
                                  train_test_split)
from transforms.lark.local_dp import LocalFeatureNoise
from transforms.lark.model import LogisticModel
from transforms.lark.params import AggregationParams, GradientParams
from transforms.lark.randomness import BrowserRandomness
from transforms.randomness import SystemRandomness
from transforms.lark.training import (TrainingConfig, train_central, train_central_dp,
                                      train_masked)

BUNDLE = 100_000


def _records_with_values(n: int, d: int) -> pa.Table:
    records = conversion_records(n, num_campaigns=1000, seed=1)
    for j in range(1, d):
        records = records.append_column(f"value{j}", records.column("value"))
    return records


def _agg_params(d: int, epsilon=1.0) -> AggregationParams:
    cols = ("value",) + tuple(f"value{j}" for j in range(1, d))
    return AggregationParams(value_columns=cols, lower=0.0, upper=100.0, fraction_bits=8,
                             epsilon=epsilon, k=10)


def _best_rate(work, units: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return units / min(times)


def browser_speed(n: int, repeats: int) -> list[tuple]:
    rows = []
    for d in (1, 4):
        records = _records_with_values(n, d)
        params = _agg_params(d)
        for mode, randomness in (("secure", SystemRandomness()),
                                 ("keyed", BrowserRandomness.keyed(ReleaseKey.generate()))):
            def work():
                for i in range(0, n, BUNDLE):
                    aggregation_reports(records.slice(i, BUNDLE), params, randomness=randomness)
            rows.append((f"aggregation reports, d={d}, {mode}", d,
                         _best_rate(work, n * d, repeats)))
    x, y, _ = classification_data(n // 4, num_features=30, seed=1)
    records = gradient_records(x, y)
    for mode, randomness in (("secure", SystemRandomness()),
                             ("keyed", BrowserRandomness.keyed(ReleaseKey.generate()))):
        def work():
            for i in range(0, records.num_rows, BUNDLE):
                gradient_reports(records.slice(i, BUNDLE), num_features=30, randomness=randomness,
                                 batch_id="b")
        rows.append((f"gradient reports, d=30, {mode}", 33, _best_rate(work, records.num_rows * 33,
                                                                      repeats)))
    return rows


def _helper_reports(n: int, d: int, directory: str, batches: int = 10) -> str:
    """Helper 0's reports of n records as Parquet files (row groups of 100k), ``batches``
    batches."""
    params = _agg_params(d)
    randomness = SystemRandomness()
    records = _records_with_values(n, d)
    batch = pa.array([f"batch-{i % batches}" for i in range(n)], pa.string())
    records = records.set_column(records.column_names.index("batch_id"), "batch_id", batch)
    path = os.path.join(directory, f"helper0-{n}-{batches}.parquet")
    schema = aggregation_reports(records.slice(0, 1), params, randomness=randomness)[0].schema
    # random report ids do not compress: no dictionary for them (as a helper's store would)
    with parquet_files.writer(path, schema, use_dictionary=["batch_id", "key"]) as writer:
        for i in range(0, n, BUNDLE):
            writer.write_table(aggregation_reports(records.slice(i, BUNDLE), params,
                                                   randomness=randomness)[0],
                               row_group_size=BUNDLE)
    return path


def _beam_helper_seconds(path: str, d: int) -> float:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from transforms.lark.beam import HelperAggregate

    start = time.perf_counter()
    options = PipelineOptions(["--direct_num_workers=1"])
    with beam.Pipeline(runner="FnApiRunner", options=options) as p:
        (p | beam.io.ReadFromParquetBatched(path)
         | HelperAggregate(_agg_params(d), helper=0, release_key=ReleaseKey.generate())
         | beam.Map(lambda t: t.num_rows) | beam.combiners.Count.Globally())
    return time.perf_counter() - start


def helper_speed(n: int, repeats: int) -> tuple[list[tuple], float]:
    rows = []
    d = 1
    with tempfile.TemporaryDirectory() as tmp:
        small, large = _helper_reports(n // 4, d, tmp), _helper_reports(n, d, tmp)
        table = parquet_files.read_table(large)
        params = _agg_params(d)

        def pure():
            by_batch = {}
            for chunk in table.to_batches(BUNDLE):
                for part in H.aggregation_partials(pa.Table.from_batches([chunk]), params, 0)[0]:
                    by_batch.setdefault(part.batch_id, []).append(part)
            for parts in by_batch.values():
                H.release_aggregation(H.merge_partials(parts), params, helper=0,
                                      release_key=ReleaseKey.generate())
        rows.append(("helper Algorithm 2, pure numpy", _best_rate(pure, n, repeats)))
        end_to_end = min(_beam_helper_seconds(large, d) for _ in range(repeats))
        small_time = min(_beam_helper_seconds(small, d) for _ in range(repeats))
        beam_rate = n / end_to_end
        rows.append((f"helper Algorithm 2, Beam end to end ({n:,} records)", beam_rate))
        rows.append(("helper Algorithm 2, Beam steady state",
                     (n - n // 4) / max(end_to_end - small_time, 1e-9)))
        rows.append((f"  (Beam fixed cost: {small_time - (end_to_end - small_time) / 3:.2f} s)",
                     float("nan")))
        job_seconds = min(_helper_job_seconds(_helper_reports(n, d, tmp, batches=1), d, tmp, i)
                          for i in range(repeats))
        rows.append((f"python -m pipelines.masked_lark.helper, a release ({n:,} records, "
                     "from process start)", n / job_seconds))
    return rows, beam_rate


def _helper_job_seconds(path: str, d: int, tmp: str, attempt: int) -> float:
    """The helper job as a user runs it: a new process, preflight, the report-id scan before
    the charge, the ledger, the pipeline, publication (a fresh ledger per attempt)."""
    import json
    import subprocess
    import sys

    from pipelines.masked_lark.config import params_to_json

    params = os.path.join(tmp, "params.json")
    with open(params, "w") as handle:
        json.dump(params_to_json(_agg_params(d)), handle)
    root = os.path.join(tmp, f"job-{attempt}")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipelines.masked_lark.helper", "--input", path,
                    "--params", params, "--helper", "0", "--batch_id", "batch-0",
                    "--output", os.path.join(root, "out"),
                    "--ledger", os.path.join(root, "ledger.json"),
                    "--key_store", os.path.join(root, "keys")],
                   check=True, capture_output=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return time.perf_counter() - start


def exact_without_noise() -> bool:
    records = conversion_records(200_000, num_campaigns=500, num_batches=3, seed=2)
    params = _agg_params(1, epsilon=None)
    reports = aggregation_reports(records, params)
    outputs = []
    for h in range(2):
        parts, _ = H.aggregation_partials(reports[h], params, h)
        by_batch = {}
        for part in parts:
            by_batch.setdefault(part.batch_id, []).append(part)
        for ps in by_batch.values():
            outputs.append(H.release_aggregation(H.merge_partials(ps), params, helper=h,
                                                 release_key=None)[0])
    combined = combine_aggregation(outputs, params)
    units = params.codec.units(np.clip(records.column("value").to_numpy(), 0, 100))
    clear = pa.table({"batch_id": records.column("batch_id"), "key": records.column("key"),
                      "u": units}).group_by(["batch_id", "key"]).aggregate([("u", "sum"),
                                                                            ("u", "count")])
    clear = clear.filter(pa.compute.greater(clear.column("u_count"), params.k))
    clear = clear.sort_by([("batch_id", "ascending"), ("key", "ascending")])
    ok_agg = (clear.column("key").to_pylist() == combined.column("key").to_pylist()
              and np.array_equal(clear.column("u_sum").to_numpy(),
                                 np.ldexp(combined.column("value").to_numpy(), 8)))
    x, y, _ = classification_data(50_000, num_features=30, seed=3)
    gparams = GradientParams(num_features=30, clip_norm=1.0, epsilon=None, k=50)
    model = LogisticModel(weights=tuple(np.linspace(-0.5, 0.5, 30)), bias=-1.0,
                          feature_scale=1 / 32, feature_offset=128)
    reports = gradient_reports(gradient_records(x, y), num_features=30, batch_id="b")
    outs = [H.release_gradient(H.merge_partials(H.gradient_partials(reports[h], gparams, model,
                                                                    h)[0]),
                               gparams, model, helper=h, release_key=None)[0] for h in range(2)]
    got = gradient_vector(combine_gradients(outs, gparams, H.gradient_params_digest(gparams, model)),
                          "b", 31)
    ok_grad = np.array_equal(np.ldexp(got, 16), H.clear_gradient_units(model, gparams, x, y))
    return bool(ok_agg and ok_grad)


def training(quick: bool, repeats: int):
    x, y, xt, yt, bayes = train_test_split(5000, 5000, seed=0)
    epochs = 5 if quick else 10
    base = dict(epochs=epochs, batch_size=250, k=50)
    keys = lambda r: [ReleaseKey.for_testing(1000 + 2 * r), ReleaseKey.for_testing(1001 + 2 * r)]
    acc = lambda result: result.model.accuracy(xt, yt)
    clear = statistics.mean(acc(train_central(x, y, TrainingConfig(**base, seed=r)))
                            for r in range(repeats))
    psis = (0.1, 1.0, 10.0)
    epsilons = (0.3, 1.0, 3.0) if quick else (0.1, 0.3, 1.0, 3.0, 10.0)
    grid = []
    for psi in psis:
        for eps in epsilons:
            cfg = TrainingConfig(**base, clip_norm=psi, epsilon=eps)
            masked = acc(train_masked(x, y, cfg, helper_keys=keys(0),
                                      randomness=BrowserRandomness.for_testing(7)))
            central = acc(train_central_dp(x, y, cfg, release_key=ReleaseKey.for_testing(9)))
            grid.append((psi, eps, cfg.total_epsilon(), masked, central))
    gap_runs = []
    for r in range(repeats):
        cfg = TrainingConfig(**base, clip_norm=1.0, epsilon=1.0, seed=r)
        gap_runs.append(acc(train_masked(x, y, cfg, helper_keys=keys(r + 1),
                                         randomness=BrowserRandomness.for_testing(20 + r))))
    masked_eps1 = statistics.mean(gap_runs)
    ldp = []
    for eps_feature in ((1.0, 10.0, 100.0) if quick else (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)):
        noise = LocalFeatureNoise(epsilon_per_feature=eps_feature)
        cfg = TrainingConfig(**base, clip_norm=1.0, epsilon=None, local_noise=noise)
        ldp.append((eps_feature, noise.vector_epsilon(30),
                    acc(train_masked(x, y, cfg, randomness=BrowserRandomness.for_testing(11)))))
    return dict(bayes=bayes, clear=clear, grid=grid, masked_eps1=masked_eps1, ldp=ldp,
                epochs=epochs)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, psi in enumerate(sorted({g[0] for g in result["grid"]})):
        rows = [g for g in result["grid"] if g[0] == psi]
        color = f"C{i}"
        left.plot([g[1] for g in rows], [g[3] for g in rows], "o-", color=color,
                  label=f"masked helpers, psi={psi:g}")
        left.plot([g[1] for g in rows], [g[4] for g in rows], "s--", color=color, alpha=0.6,
                  label=f"central DP, psi={psi:g}")
    for ax in (left, right):
        ax.axhline(result["clear"], color="k", lw=1, label="central, clear")
        ax.set_xscale("log")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    left.set_xlabel("epsilon per step (each helper's Laplace noise)")
    left.set_title("Global DP on gradients (cf. paper Fig. 3)")
    left.legend(fontsize=7)
    right.plot([r[0] for r in result["ldp"]], [r[2] for r in result["ldp"]], "o-",
               label="masked helpers, local DP features")
    right.set_xlabel("epsilon per feature (local Laplace, clipped to bytes)")
    right.set_title("Local DP on features (cf. paper Fig. 5)")
    right.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--records", type=int, default=None,
                        help="records for the browser leg (default 1M, quick 400k)")
    parser.add_argument("--helper_records", type=int, default=None,
                        help="records for the helper leg (default 4M, quick 1M)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "out", "masked_lark.png"))
    args = parser.parse_args(argv)
    n = args.records or (400_000 if args.quick else 1_000_000)
    helper_n = args.helper_records or (1_000_000 if args.quick else 4_000_000)
    repeats = args.repeats or (1 if args.quick else 3)

    print(f"== browser side: shared values per second (bundles of {BUNDLE:,}, best of {repeats})")
    for name, _, rate in browser_speed(n, repeats):
        print(f"  {name:<44s} {rate / 1e6:8.2f} M values/s")
    print("== helper side: records per second (one helper, d=1, 10 batches, 1,000 keys)")
    rows, helper_rate = helper_speed(helper_n, repeats)
    for name, rate in rows:
        print(f"  {name:<52s} " + ("" if rate != rate else f"{rate / 1e6:8.2f} M records/s"))
    exact = exact_without_noise()
    print(f"== exact without noise (aggregation and masked gradient): {'PASS' if exact else 'FAIL'}")
    result = training(args.quick, repeats)
    print(f"== training (5,000 train / 5,000 test, 30 features, {result['epochs']} epochs of "
          f"batches of 250, k=50; Bayes accuracy {result['bayes']:.3f})")
    print(f"  central, clear: {result['clear']:.4f}")
    print(f"  {'psi':>5s} {'eps/step':>8s} {'eps total':>9s} {'masked':>8s} {'central DP':>10s}")
    for psi, eps, total, masked, central in result["grid"]:
        print(f"  {psi:5g} {eps:8g} {total:9g} {masked:8.4f} {central:10.4f}")
    print(f"  {'eps/feature':>11s} {'eps/vector':>10s} {'masked (local DP, no helper noise)':>34s}")
    for eps_f, eps_v, accuracy in result["ldp"]:
        print(f"  {eps_f:11g} {eps_v:10g} {accuracy:34.4f}")
    plot(result, args.out)
    gap = result["clear"] - result["masked_eps1"]
    print(f"  masked helpers at eps=1/step, psi=1 (mean of {repeats}): "
          f"{result['masked_eps1']:.4f}; plot: {args.out}")
    print(f"exact_without_noise={'PASS' if exact else 'FAIL'} "
          f"helper_records_per_second={helper_rate:.0f} accuracy_gap_at_eps1={gap:.4f}")


if __name__ == "__main__":
    main()
