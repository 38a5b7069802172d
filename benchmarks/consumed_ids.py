"""What a ledger's consumed-id records cost a release: the same ARA summary-report release, side
by side, against an empty ledger and against a ledger that holds 10M consumed report ids.

    python benchmarks/consumed_ids.py [--conversions 300000] [--ledger_ids 10000000]
    python benchmarks/consumed_ids.py --conversions 2000 --ledger_ids 20000  # quick
        [--sources 2000000] [--repeats 2]

Every release of ``pipelines.ara.summary_reports`` checks its report ids (at most once) and its
sources' L1 budgets against every earlier batch's record inside the ledger's reservation
(``accounting/ledger/consumed.py``): it reads and verifies (SHA-256) the records of both
namespaces and searches them with ``numpy.searchsorted``. The full ledger here is built with the
ledger's own API: ``--ledger_ids`` random report ids and ``--sources`` source budgets recorded by
ten earlier batches (what ten 1M-report batches leave behind). The release is a real one (ledger,
key store, publication) on synthetic conversions (``pipelines.ara.synthetic``, adtech_real_estate
preset) through the in-process engine; after one warm-up run the runs alternate (empty, full,
empty, full, ...).

Prints one row per run (ledger, total seconds, seconds in the reservation, consumed ids in the
ledger) and a last line ``conversions=N ledger_ids=M median_empty=S median_full=S
ratio=R reserve_full=S`` (ratio: median full / median empty; the target is at most 1.10).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # before benchmarks/: the project's packages first


def _conversions(folder: str, target: int) -> tuple[str, str, int]:
    """A conversions file of about ``target`` rows and a contribution configuration."""
    from pipelines.ara import synthetic
    from transforms import parquet_files
    from transforms.ara.contribution import ContributionConfig

    data = synthetic.generate("adtech_real_estate", 1, scale=max(target / 53830.0, 0.01))
    table = data.to_arrow().slice(0, target)
    path = os.path.join(folder, "conversions.parquet")
    parquet_files.write_table(table, path)
    config = os.path.join(folder, "config.json")
    with open(config, "w") as handle:
        handle.write(ContributionConfig(
            measures=("count", "value"), clip_thresholds=(1.0, 20000.0),
            slice_dimensions=(2, 90), prefixes=(0, 2), budgets=((8000, 8000), (8000, 8000)),
            reports_per_source=2).to_json())
    return path, config, table.num_rows


def _full_ledger(template: str, ids: int, sources: int, batches: int = 10) -> None:
    """A ledger whose earlier batches consumed ``ids`` report ids and ``sources`` source budgets
    (random, disjoint from the release's), built with the ledger API."""
    from accounting.budget import PrivacyBudget
    from accounting.ledger import BudgetLedger, ConsumedIds, ReleaseRequest, Scope
    from accounting.measures import Measure
    from pipelines.ara.summary_reports import REPORT_IDS, SOURCE_BUDGET

    ledger = BudgetLedger(os.path.join(template, "ledger.json"), os.path.join(template, "keys"))
    rng = np.random.default_rng(0)
    for b in range(batches):
        n, m = ids // batches, sources // batches
        words = rng.integers(0, 2**63, size=(n, 2), dtype=np.int64)
        report_ids = [f"{x:016x}{y:016x}" for x, y in words.tolist()]
        source_ids = [f"earlier-source-{b}-{i}" for i in range(m)]
        ledger.reserve(ReleaseRequest(
            release_id=f"summary_reports/earlier-{b}",
            measures=[Measure(name="summary", mechanism="recorded", epsilon=1.0)],
            input_digest=f"sha256:earlier-{b}",
            scopes=[Scope(name=f"ara-batch:earlier-{b}", budget=PrivacyBudget(epsilon=64))],
            consumes=[ConsumedIds(namespace=REPORT_IDS, ids=report_ids, noun="report ids"),
                      ConsumedIds(namespace=SOURCE_BUDGET, ids=source_ids, limit=65536,
                                  amounts=np.full(m, 16000), noun="sources")]))


def _release(work: str, template: str, conversions: str, config: str) -> tuple[float, float]:
    """One real release into a fresh copy of ``template`` (ledger and key store): (seconds,
    seconds inside BudgetLedger.reserve)."""
    from accounting.ledger import BudgetLedger
    from pipelines.ara import summary_reports
    from pipelines.release import ReleaseOptions

    private = os.path.join(work, "private")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, private)
    spent = []
    reserve = BudgetLedger.reserve

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return reserve(self, *args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    BudgetLedger.reserve = timed
    try:
        start = time.perf_counter()
        summary_reports.run(summary_reports.SummaryReportsRequest(
            input=(conversions,), config=config, epsilon=8.0, batch_id="today",
            options=ReleaseOptions(output=os.path.join(work, "out"),
                                   ledger=os.path.join(private, "ledger.json"),
                                   key_store=os.path.join(private, "keys"))))
        return time.perf_counter() - start, sum(spent)
    finally:
        BudgetLedger.reserve = reserve


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversions", type=int, default=300_000)
    parser.add_argument("--ledger_ids", type=int, default=10_000_000)
    parser.add_argument("--sources", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.INFO)
    root = tempfile.mkdtemp(prefix="consumed-ids-bench-")
    try:
        conversions, config, rows = _conversions(root, args.conversions)
        empty = os.path.join(root, "empty")
        os.makedirs(empty)
        full = os.path.join(root, "full")
        start = time.perf_counter()
        # Built where every run uses it (work/private): a ledger names its keys inside its own
        # key store, so the template is the saved copy of that folder, restored whole (ledger and
        # key store, with its witness) before each run.
        _full_ledger(os.path.join(root, "work", "private"), args.ledger_ids, args.sources)
        shutil.copytree(os.path.join(root, "work", "private"), full)
        built = time.perf_counter() - start
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(full) for f in fs)
        print(f"conversions: {rows}; full ledger: {args.ledger_ids} report ids + {args.sources} "
              f"source budgets, {size / 2**20:.0f} MiB, built in {built:.0f} s")
        _release(os.path.join(root, "work"), empty, conversions, config)  # warm-up, not counted
        print(f"{'run':>4} {'ledger':>7} {'seconds':>9} {'reserve s':>10}")
        times = {"empty": [], "full": [], "reserve_full": []}
        for i in range(args.repeats):
            for name, template in (("empty", empty), ("full", full)):
                seconds, reserve = _release(os.path.join(root, "work"), template, conversions,
                                            config)
                times[name].append(seconds)
                if name == "full":
                    times["reserve_full"].append(reserve)
                print(f"{i:>4} {name:>7} {seconds:>9.2f} {reserve:>10.2f}")
        empty_s, full_s = statistics.median(times["empty"]), statistics.median(times["full"])
        print(f"conversions={rows} ledger_ids={args.ledger_ids} median_empty={empty_s:.2f} "
              f"median_full={full_s:.2f} ratio={full_s / empty_s:.3f} "
              f"reserve_full={statistics.median(times['reserve_full']):.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
