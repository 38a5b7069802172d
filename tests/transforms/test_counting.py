"""Counters as pipeline output (transforms/counting.py): each counting DoFn's partial counts per
bundle, summed by the pipeline, equal to what Beam's metrics count on the in-process engine; a
counter counted where its amounts could not reach the pipeline fails loudly; windowed inputs
count in the global window."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from transforms.counting import AllCounts, Counted, Counters, CountingDoFn, SumCounts, counts_of

_GOT = {}


def _store(value, tag):
    _GOT[tag] = value  # in process: the FnApiRunner runs this in this interpreter


class _Rows(CountingDoFn):
    """A batch of ints -> its even ones; odd ones dropped and counted, by a group and a handle."""

    def __init__(self):
        self._counts = Counters("test", prefix="rows.")
        self._kept = self._counts.counter("kept")

    def process(self, batch):
        self._counts.inc("read", len(batch))
        self._counts.inc("dropped.odd", sum(1 for x in batch if x % 2))
        kept = [x for x in batch if not x % 2]
        self._kept.inc(len(kept))
        yield kept


def test_counts_are_pipeline_output_one_element_per_bundle_and_equal_to_beams_metrics():
    batches = [list(range(i * 100, i * 100 + 100)) for i in range(20)]
    p = beam.Pipeline("FnApiRunner")
    kept = p | beam.Create(batches) | "Rows" >> Counted(_Rows())
    [partials] = counts_of(p)
    assert_that(kept | beam.FlatMap(lambda b: b) | "Kept" >> beam.combiners.Count.Globally(),
                equal_to([1000]), label="kept")
    _ = partials | "Partials" >> beam.combiners.Count.Globally() | "P" >> beam.Map(_store, "partials")
    _ = p | AllCounts() | "C" >> beam.Map(_store, "counts")
    result = p.run()
    result.wait_until_finish()
    expected = {"test": {"rows.dropped.odd": 1000, "rows.kept": 1000, "rows.read": 2000}}
    assert _GOT.pop("counts") == expected
    assert 1 <= _GOT.pop("partials") < len(batches)  # per bundle, never per element or row
    metrics = {r.key.metric.name: r.committed
               for r in result.metrics().query(MetricsFilter().with_namespace("test"))["counters"]}
    assert metrics == expected["test"]


def test_a_pipeline_without_counts_counts_nothing():
    with beam.Pipeline("FnApiRunner") as p:
        _ = p | beam.Create([1]) | beam.Map(lambda x: x)
        _ = p | AllCounts() | beam.Map(_store, "none")
    assert _GOT.pop("none") == {}


def test_a_counter_counted_outside_a_counting_dofn_fails_instead_of_losing_its_amount():
    counters = Counters("test")

    def count(x, c):
        c.inc("n", 1)
        return x

    with pytest.raises(Exception, match="counted outside a CountingDoFn"):
        with beam.Pipeline("FnApiRunner") as p:
            _ = p | beam.Create([1, 2]) | beam.Map(count, counters)
    counters.inc("n", 2)  # made in this process (a DoFn's setup, a test): counts at once
    assert counters.drain() == {("test", "n"): 2} and counters.drain() == {}
    with pytest.raises(TypeError, match="CountingDoFn"):
        Counted(beam.DoFn())


def test_a_windowed_input_keeps_its_windows_and_counts_in_the_global_window():
    with beam.Pipeline("FnApiRunner") as p:
        kept = (p | beam.Create([(0, [1, 2]), (15, [3, 4, 6])])
                | beam.Map(lambda e: window.TimestampedValue(e[1], e[0]))
                | beam.WindowInto(window.FixedWindows(10))
                | "Rows" >> Counted(_Rows()))
        per_window = kept | beam.Map(len) | beam.CombineGlobally(sum).without_defaults()
        assert_that(per_window, equal_to([1, 2]))  # one sum per window: the windows were kept
        _ = p | AllCounts() | beam.Map(_store, "windowed")
    assert _GOT.pop("windowed") == {"test": {"rows.dropped.odd": 2, "rows.kept": 3, "rows.read": 5}}


def test_partial_counts_merge_by_namespace_and_name():
    fn = SumCounts()
    a = fn.add_input(fn.create_accumulator(), {("x", "n"): 2, ("y", "m"): 1})
    b = fn.add_input(fn.create_accumulator(), {("x", "n"): 3})
    assert fn.extract_output(fn.merge_accumulators([a, b])) == {"x": {"n": 5}, "y": {"m": 1}}
