"""DoFns on several threads (bounding's batches, the release's key shards) change no output, no
window, no counter."""
import types

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from transforms import bounding_stage
from transforms import parallel
from transforms.aggregate import Compute, DPAggregate, Keys, Output
from transforms.bounding_stage import BoundedKeyPartials, BoundingConfig
from transforms.metrics import Count, Sum
from transforms.keyset import PublicKeyset
from transforms.privacy_units import UnitIdError
from transforms.selection import PrivateSelection

BOUNDS = ContributionBounds(max_partitions=2, max_contributions_per_partition=1)


def _batches(seed: int, count: int = 12, rows: int = 3_000):
    """Arrow batches with repeated users and keys, some null ids and keys outside the keyset."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        users = rng.integers(0, 400, rows).astype(object)
        users[rng.random(rows) < 0.01] = None
        out.append(pa.table({"user": pa.array(list(users), pa.int64()),
                             "k": pa.array(rng.integers(0, 60, rows))}))
    return out


def _config(keyset=None):
    return BoundingConfig(unit="user", keys=["k"], value=None, bounds=BOUNDS, keyset=keyset,
                          release_key=ReleaseKey.for_testing(5), num_shards=4)


_COLLECTED = {}


def _store(rows, tag):
    _COLLECTED[tag] = rows  # in process: the FnApiRunner runs this in this interpreter


def _collected(p, pcoll, tag):
    """Run ``p``; ``pcoll``'s elements (as a list) and the run's counters."""
    _ = pcoll | "Collect" >> beam.combiners.ToList() | "Store" >> beam.Map(_store, tag)
    result = p.run()
    result.wait_until_finish()
    counters = {r.key.metric.name: r.committed
                for r in result.metrics().query(MetricsFilter())["counters"]}
    return _COLLECTED.pop(tag), counters


def _run(threads: int, *, windowed: bool, pcollection_keyset: bool):
    """Per (window start, key): the count of bounded rows, and the job's counters."""
    batches = _batches(3)
    p = beam.Pipeline("FnApiRunner")
    rows = p | beam.Create(list(enumerate(batches)), reshuffle=False)
    if windowed:  # batch i at time 10 * (i % 3): three fixed windows of 10 s
        rows = (rows | beam.Map(lambda e: window.TimestampedValue(e[1], 10 * (e[0] % 3)))
                | "Fixed" >> beam.WindowInto(window.FixedWindows(10)))
    else:
        rows = rows | beam.Map(lambda e: e[1])
    keyset = None
    if pcollection_keyset:
        keys = p | "Keys" >> beam.Create([pa.table({"k": pa.array(np.arange(50))})])
        keyset = PublicKeyset.from_pcollection(keys, ["k"], expected_size=50)
    partials = rows | BoundedKeyPartials(_config(keyset), keyset, threads=threads)
    tag = (threads, windowed, pcollection_keyset)
    counted = (partials
         | beam.FlatMap(lambda t, w=beam.DoFn.WindowParam: [
             (int(w.start) if hasattr(w, "start") else -1, k, c)
             for k, c in zip(t.column("k").to_pylist(), t.column("count").to_pylist())])
         | "Global" >> beam.WindowInto(window.GlobalWindows()))
    rows, counters = _collected(p, counted, tag)
    return sorted(rows), counters


@pytest.mark.parametrize("windowed,pcollection_keyset", [(False, False), (True, False), (False, True)])
def test_threads_give_the_same_partials_windows_and_counters(windowed, pcollection_keyset):
    one = _run(1, windowed=windowed, pcollection_keyset=pcollection_keyset)
    three = _run(3, windowed=windowed, pcollection_keyset=pcollection_keyset)
    assert one == three
    rows, counters = one
    assert rows and counters["rows_read"] == 36_000 and counters["dropped_null_privacy_unit"] > 0
    if windowed:
        assert {start for start, _, _ in rows} == {0, 10, 20}
    if pcollection_keyset:
        assert counters["dropped_outside_keyset"] > 0


def test_an_error_in_a_thread_fails_the_bundle_naming_the_column():
    bad = pa.table({"user": pa.array([1.5] * 10), "k": pa.array(np.arange(10))})
    with pytest.raises(Exception, match="user") as err:
        with beam.Pipeline("FnApiRunner") as p:
            _ = (p | beam.Create(_batches(4, count=3) + [bad], reshuffle=False)
                 | BoundedKeyPartials(_config(), threads=2))
    assert "UnitIdError" in repr(err.value) or isinstance(err.value, UnitIdError)


def test_the_dofn_keeps_at_most_twice_threads_batches_in_flight():
    fn = bounding_stage._PrepareAndBound(_config(), threads=2)
    fn.setup()
    try:
        fn.start_bundle()
        emitted = []
        for batch in _batches(5, count=6, rows=500):
            emitted += list(fn.process(batch, None, 0, window.GlobalWindow()))
            assert fn._work.in_flight() <= 4  # 2 x threads
        emitted += list(fn.finish_bundle())
    finally:
        fn.teardown()
    plain = [out for batch in _batches(5, count=6, rows=500)
             for out in bounding_stage._PrepareAndBound(_config())._prepare(batch, None)[0]]
    assert [(w.value[0], w.value[1].to_pydict()) for w in emitted] == \
        [(s, t.to_pydict()) for s, t in plain]  # the same outputs, in input order
    assert all(w.windows == [window.GlobalWindow()] for w in emitted)


def _threads(*argv, requested=None):
    """The threads a DoFn of a pipeline built with the options of ``argv`` (the runner profile
    applied) would use."""
    from runners.profiles import pipeline_options_for

    pipeline = types.SimpleNamespace(options=pipeline_options_for(list(argv)))
    return parallel.threads_for(pipeline, requested)


def test_threads_only_on_the_in_process_engine_with_one_worker(monkeypatch):
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda _: set(range(16)), raising=False)
    assert _threads("--runner=FnApiRunner") == parallel.MAX_THREADS
    assert _threads() == parallel.MAX_THREADS  # DirectRunner
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    assert _threads("--runner=DirectRunner") == 2
    assert _threads("--runner=DirectRunner", requested=3) == 2  # the default caps a request
    assert _threads("--runner=FnApiRunner", "--dofn_threads=3") == 3  # given: wins over the default
    for argv in (["--runner=FlinkRunner"], ["--runner=PrismRunner"], ["--runner=SparkRunner"],
                 ["--runner=DaskRunner"], ["--runner=DirectRunner", "--prism_location=/x/prism"],
                 ["--runner=FnApiRunner", "--direct_num_workers=2"],
                 ["--runner=FnApiRunner", "--direct_num_workers=0"]):
        assert _threads(*argv) == 1, argv
    assert _threads("--runner=DaskRunner", requested=3) == 1  # the workers' threads run bundles
    # The project's Dask translation keeps what finish_bundle emits: more threads may be given.
    assert _threads("--runner=DaskRunner", "--dofn_threads=2", requested=3) == 2
    # Options no profile filled: the runner they name decides (in process by default).
    plain = types.SimpleNamespace(options=PipelineOptions([]))
    assert parallel.threads_for(plain) == 2 and parallel.threads_for(plain, 3) == 2
    flink = types.SimpleNamespace(options=PipelineOptions(["--runner=FlinkRunner"]))
    assert parallel.threads_for(flink) == 1 and parallel.threads_for(flink, 3) == 3
    assert parallel.batch_rows(plain) == parallel.BATCH_ROWS
    with pytest.raises(ValueError, match="threads"):
        BoundedKeyPartials(_config(), threads=0)
    with pytest.raises(ValueError, match="dofn_threads must be at least 1"):
        parallel.threads_for(types.SimpleNamespace(options=PipelineOptions(["--dofn_threads=0"])))


def _dofn_threads(pipeline) -> list:
    """The threads of every threaded DoFn applied in ``pipeline``."""
    from apache_beam.pipeline import PipelineVisitor

    found = []

    class Visitor(PipelineVisitor):
        def visit_transform(self, node):
            work = getattr(getattr(node.transform, "fn", None), "_work", None)
            if isinstance(work, parallel.OrderedThreads):
                found.append(work.threads)

    pipeline.visit(Visitor())
    return found


def _aggregate(rows, seed):
    return rows | DPAggregate(
        compute=Compute(metrics=[Count(), Sum()], value="v"),
        keys=Keys(privacy_unit="user", columns=["k"],
                  keyset=PublicKeyset.from_table(pa.table({"k": pa.array(np.arange(10))}))),
        bounds=ContributionBounds(max_partitions=3, max_contributions_per_partition=2,
                                  min_value=0, max_value=10),
        budget=PrivacyBudget(epsilon=1.0), release_key=ReleaseKey.for_testing(seed))


def test_a_plain_pipeline_uses_the_cores_of_the_in_process_engine(monkeypatch):
    """``beam.Pipeline()`` as a user writes it (no options, no runner profile): on the
    in-process engine every threaded DoFn of DPAggregate (bounding, keyset routing, noise) gets
    the machine's cores, at most MAX_THREADS; on a runner that runs bundles itself, one."""
    if parallel.cores() > 1:  # this machine, unpatched: more than one thread
        assert parallel.threads_for(beam.Pipeline()) == min(parallel.cores(), parallel.MAX_THREADS) > 1
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda _: set(range(8)), raising=False)
    for seed, pipeline in enumerate((beam.Pipeline(), beam.Pipeline("FnApiRunner"),
                                     beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])))):
        assert parallel.threads_for(pipeline) == parallel.MAX_THREADS
        _aggregate(pipeline | beam.Create([pa.table({"user": [1], "k": [1], "v": [1.0]})]), 50 + seed)
        threads = _dofn_threads(pipeline)
        assert len(threads) >= 2 and set(threads) == {parallel.MAX_THREADS}, threads
    for seed, argv in enumerate((["--direct_num_workers=2"], ["--dofn_threads=1"],
                                 ["--runner=PrismRunner"])):
        pipeline = beam.Pipeline(options=PipelineOptions(argv))
        _aggregate(pipeline | beam.Create([pa.table({"user": [1], "k": [1], "v": [1.0]})]), 60 + seed)
        assert set(_dofn_threads(pipeline)) == {1}


def _released(threads: int, kind: str, tmp_path, monkeypatch):
    """DPAggregate (count and sum, thresholds on) with ``threads`` chosen for the in-process
    engine (``--dofn_threads``); the released rows and the counters."""
    rng = np.random.default_rng(11)
    batches = [pa.table({"user": pa.array(rng.integers(0, 3_000, 4_000)),
                         "k": pa.array(rng.integers(0, 20 if kind == "selection" else 300, 4_000)),
                         "v": pa.array(rng.random(4_000) * 10)}) for _ in range(6)]
    p = beam.Pipeline("FnApiRunner", options=PipelineOptions([f"--dofn_threads={threads}"]))
    keyset, selection = None, None
    if kind == "table":
        keyset = PublicKeyset.from_table(pa.table({"k": pa.array(np.arange(0, 400, 2))}))
    elif kind in ("pcollection", "staged"):
        keys = p | "Keys" >> beam.Create([pa.table({"k": pa.array(np.arange(s, s + 100))})
                                          for s in range(0, 400, 100)])
        keyset = PublicKeyset.from_pcollection(
            keys, ["k"], expected_size=400,
            staging_dir=str(tmp_path / f"staging-{threads}") if kind == "staged" else None)
    else:
        selection = PrivateSelection()
    tag = ("dp", threads, kind)
    released = (p | beam.Create(batches, reshuffle=False)
         | DPAggregate(
             compute=Compute(metrics=[Count(threshold=3), Sum()], value="v"),
             keys=Keys(privacy_unit="user", columns=["k"], keyset=keyset, selection=selection),
             output=Output(num_shards=5),
             bounds=ContributionBounds(max_partitions=3, max_contributions_per_partition=2,
                                                 min_value=0, max_value=10),
             budget=PrivacyBudget(epsilon=1.0, delta=1e-6),
             release_key=ReleaseKey.for_testing(9))
         | beam.FlatMap(lambda t: t.to_pylist()))
    rows, counters = _collected(p, released, tag)
    return sorted(rows, key=lambda r: r["k"]), counters


@pytest.mark.parametrize("kind", ["table", "pcollection", "staged", "selection"])
def test_threaded_release_gives_the_same_bytes_and_counters(kind, tmp_path, monkeypatch):
    one = _released(1, kind, tmp_path, monkeypatch)
    three = _released(3, kind, tmp_path, monkeypatch)
    assert one == three
    rows, counters = one
    assert rows and counters["keys_released"] == len(rows)
    if kind != "selection":
        assert counters.get("keys_suppressed_by_threshold", 0) > 0  # the threshold bites


def test_ordered_threads_return_results_in_submission_order():
    import pickle
    import time

    work = parallel.OrderedThreads(3, "test")
    work.start()
    try:
        got = []
        for i in range(8):  # earlier elements sleep longer: they finish last
            got += list(work.submit(lambda x: (time.sleep(0.02 * (8 - x)), x)[1], (i,), i, None))
            assert work.in_flight() <= 6  # 2 x threads
        got += list(work.drain())
        assert [r for r, _, _ in got] == list(range(8)) and [t for _, t, _ in got] == list(range(8))
        with pytest.raises(ZeroDivisionError):
            list(work.submit(lambda: 1 / 0, (), 0, None)) + list(work.drain())
        clone = pickle.loads(pickle.dumps(work))
        assert clone.threads == 3 and clone.in_flight() == 0 and clone._pool is None
    finally:
        work.stop()
    inline = parallel.OrderedThreads(1)
    assert list(inline.submit(lambda x: x + 1, (1,), 5, "w")) == [(2, 5, "w")]
    with pytest.raises(ValueError):
        parallel.OrderedThreads(0)


def test_the_options_a_profile_fills_are_known_to_beam_in_a_fresh_process():
    """Beam discards flags of an options class it has not seen: the profiles import the view
    they fill, so a main that builds its options first keeps them."""
    import subprocess
    import sys

    from runners.harness import REPO_ROOT, project_env

    code = ("from runners.profiles import pipeline_options_for\n"
            "print(pipeline_options_for(['--runner=dask']).get_all_options()['dofn_threads'])")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=project_env(),
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1" and "Discarding unparseable" not in done.stderr
