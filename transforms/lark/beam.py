"""Beam wiring of Masked LARk (thin: the maths lives in the sibling modules).

    records (Arrow tables) | ShareRecords           -> {helper h: report tables}   (browsers)
    helper h's reports     | HelperAggregate (Alg. 2) or HelperGradient (Alg. 3)
                                                     -> released tables, one per batch
    all helpers' outputs   | CombineHelperOutputs   -> decoded noisy aggregates (ad server)

Each helper transform is its own pipeline run with its own key: it reads one stream of reports
and refuses reports addressed to another helper. Partials are combined per batch before the
shuffle (``CombinePerKey``); a batch is released once its partials are merged. Row faults and
batch outcomes are counted in namespace ``masked_lark`` (:mod:`transforms.counting`: pipeline
output, for the operator's report, never in released tables).
"""
from __future__ import annotations

from typing import Optional

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from accounting.keys import ReleaseKey
from transforms.counting import Counted, Counters, CountingDoFn
from transforms.fanout import ByTag
from transforms.lark import browser, combine, helper as core
from transforms.lark.local_dp import LocalFeatureNoise
from transforms.lark.model import LogisticModel
from transforms.lark.params import AggregationParams, GradientParams
from transforms.parallel import ThreadedDoFn, threads_for
from transforms.randomness import RandomSource, SystemRandomness

NAMESPACE = "masked_lark"

__all__ = ["ShareRecords", "HelperAggregate", "HelperGradient", "CombineHelperOutputs",
           "MergePartialsFn", "NAMESPACE"]


def _check_key(params, release_key, owner: str, purpose: str):
    if params.epsilon is None:
        if release_key is not None:
            raise ValueError(f"{owner}: a release key without epsilon adds no noise; "
                             "give epsilon")
        return
    if not isinstance(release_key, ReleaseKey):
        raise TypeError(f"{owner}: a noisy release needs its helper's ReleaseKey")
    release_key.claim(purpose, owner)


# --------------------------------------------------------------------------- browsers

class _ShareFn(CountingDoFn):
    def __init__(self, kind: str, params, randomness: RandomSource, options: dict):
        self._kind, self._params, self._randomness, self._options = kind, params, randomness, options
        self._counters = Counters(NAMESPACE)

    def process(self, records: pa.Table):
        if records.num_rows == 0:
            return
        if self._kind == "aggregation":
            reports = browser.aggregation_reports(records, self._params,
                                                  randomness=self._randomness, **self._options)
        else:
            reports = browser.gradient_reports(records, randomness=self._randomness,
                                               **self._options)
        self._counters.inc("records_shared", records.num_rows)
        for h, table in enumerate(reports):
            yield f"helper_{h}", table  # fanned out by ByTag (no tagged outputs: transforms.fanout)


class ShareRecords(beam.PTransform):
    """Browsers' Algorithm 1 over record tables: returns {helper index: report tables}.

    ``aggregation=AggregationParams`` for Algorithm 2 reports, or ``num_features=d`` (and
    optionally ``local_noise``) for gradient reports. ``randomness`` defaults to a fresh secure
    source per pipeline construction.
    """

    def __init__(self, *, randomness: Optional[RandomSource] = None,
                 aggregation: Optional[AggregationParams] = None,
                 num_features: Optional[int] = None, num_helpers: int = 2,
                 local_noise: Optional[LocalFeatureNoise] = None,
                 batch_id: Optional[str] = None):
        super().__init__()
        if (aggregation is None) == (num_features is None):
            raise ValueError("give exactly one of aggregation= or num_features=")
        self._randomness = randomness or SystemRandomness()
        if aggregation is not None:
            self._kind, self._params = "aggregation", aggregation
            self._options = {"batch_id": batch_id}
            self._num_helpers = aggregation.num_helpers
        else:
            self._kind, self._params = "gradient", None
            self._options = {"num_features": num_features, "num_helpers": num_helpers,
                             "local_noise": local_noise, "batch_id": batch_id}
            self._num_helpers = num_helpers

    def expand(self, records):
        self._randomness.claim("ShareRecords")
        tags = [f"helper_{h}" for h in range(self._num_helpers)]
        outputs = (records
                   | "Share" >> Counted(_ShareFn(self._kind, self._params, self._randomness,
                                                 self._options))
                   | "ByHelper" >> ByTag(tags))
        return {h: outputs[tag] for h, tag in enumerate(tags)}


# --------------------------------------------------------------------------- helpers

class MergePartialsFn(beam.CombineFn):
    """Merges a batch's partials (associative, commutative: safe to lift before the shuffle)."""

    _COMPACT = 16

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, partial):
        accumulator.append(partial)
        if len(accumulator) >= self._COMPACT:
            accumulator[:] = [core.merge_partials(accumulator)]
        return accumulator

    def merge_accumulators(self, accumulators):
        merged = [p for acc in accumulators for p in acc]
        return [core.merge_partials(merged)] if len(merged) > 1 else merged

    def compact(self, accumulator):
        return [core.merge_partials(accumulator)] if len(accumulator) > 1 else accumulator

    def extract_output(self, accumulator):
        return core.merge_partials(accumulator) if accumulator else None


class _PartialsFn(CountingDoFn, ThreadedDoFn, beam.DoFn):
    """A report table -> its (batch id, partial) pairs. With threads > 1
    (:func:`transforms.parallel.threads_for`: the in-process engine's cores) tables are parsed
    and summed on that many threads of the instance (numpy and Arrow release the GIL), outputs
    in input order; a table's partials are a function of the table alone, so threads change no
    output."""

    def __init__(self, compute, threads: int = 1):
        self._compute = compute
        self._counters = Counters(NAMESPACE)
        self._threads(threads, "lark-partials")

    def process(self, table: pa.Table, timestamp=beam.DoFn.TimestampParam,
                window=beam.DoFn.WindowParam):
        yield from self._submit(self._partials, (table,), timestamp, window)

    def _partials(self, table: pa.Table):
        partials, stats = self._compute(table)
        counts = [("reports_read", stats.reports), ("reports_malformed", stats.malformed)]
        counts += [(f"reports_dropped_{name}", value) for name, value in stats.faults.items()]
        return [(partial.batch_id, partial) for partial in partials], counts

    def count(self, name: str, amount: int) -> None:
        self._counters.inc(name, amount)


class _ReleaseFn(CountingDoFn, ThreadedDoFn, beam.DoFn):
    """A batch's merged partial -> its released table (or none). With threads > 1 batches are
    screened (their report ids sorted) and noised on that many threads, outputs in input order;
    a batch's release is a function of its partial and the key alone."""

    def __init__(self, release, threads: int = 1):
        self._release = release
        self._counters = Counters(NAMESPACE)
        self._threads(threads, "lark-release")

    def process(self, element, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        _, partial = element
        if partial is None:
            return
        yield from self._submit(self._released, (partial,), timestamp, window)

    def _released(self, partial):
        table, outcome = self._release(partial)
        counts = [(f"batches_{outcome.status}", 1), ("keys_released", outcome.keys_released),
                  ("keys_suppressed_k_anonymity", outcome.keys_suppressed)]
        return ([table] if table is not None else []), counts

    def count(self, name: str, amount: int) -> None:
        self._counters.inc(name, amount)


class _AggregationCompute:
    def __init__(self, params, helper):
        self.params, self.helper = params, helper

    def __call__(self, table):
        return core.aggregation_partials(table, self.params, self.helper)


class _AggregationRelease:
    def __init__(self, params, helper, key):
        self.params, self.helper, self.key = params, helper, key

    def __call__(self, partial):
        return core.release_aggregation(partial, self.params, helper=self.helper,
                                        release_key=self.key)


class _GradientCompute:
    def __init__(self, params, model, helper):
        self.params, self.model, self.helper = params, model, helper

    def __call__(self, table):
        return core.gradient_partials(table, self.params, self.model, self.helper)


class _GradientRelease:
    def __init__(self, params, model, helper, key):
        self.params, self.model, self.helper, self.key = params, model, helper, key

    def __call__(self, partial):
        return core.release_gradient(partial, self.params, self.model, helper=self.helper,
                                     release_key=self.key)


def _helper_index(helper, num_helpers) -> int:
    if isinstance(helper, bool) or not isinstance(helper, int) or not 0 <= helper < num_helpers:
        raise ValueError(f"helper must be an index in [0, {num_helpers}), got {helper!r}")
    return helper


class HelperAggregate(beam.PTransform):
    """One helper's Algorithm 2: its report tables -> one released table per batch (rows sorted
    by key): noisy ring sums of the keys with more than k reports."""

    def __init__(self, params: AggregationParams, *, helper: int,
                 release_key: Optional[ReleaseKey]):
        super().__init__()
        self._params = params
        self._helper = _helper_index(helper, params.num_helpers)
        self._key = release_key

    def expand(self, reports):
        _check_key(self._params, self._key, "HelperAggregate",
                   f"masked-lark/aggregation/helper={self._helper}")
        return (reports
                | "Partials" >> Counted(_PartialsFn(_AggregationCompute(self._params, self._helper),
                                                    threads_for(reports.pipeline)))
                | "MergePerBatch" >> beam.CombinePerKey(MergePartialsFn())
                | "Release" >> Counted(_ReleaseFn(_AggregationRelease(
                    self._params, self._helper, self._key), threads_for(reports.pipeline))))


class HelperGradient(beam.PTransform):
    """One helper's Algorithm 3 for ``model``: its gradient report tables -> per batch with more
    than k reports, a table of noisy masked gradient sums (one row per coordinate)."""

    def __init__(self, params: GradientParams, model: LogisticModel, *, helper: int,
                 release_key: Optional[ReleaseKey]):
        super().__init__()
        if model.num_features != params.num_features:
            raise ValueError(f"model has {model.num_features} features, parameters declare "
                             f"{params.num_features}")
        self._params, self._model = params, model
        self._helper = _helper_index(helper, params.num_helpers)
        self._key = release_key

    def expand(self, reports):
        _check_key(self._params, self._key, "HelperGradient",
                   f"masked-lark/gradient/helper={self._helper}")
        return (reports
                | "Partials" >> Counted(_PartialsFn(_GradientCompute(
                    self._params, self._model, self._helper), threads_for(reports.pipeline)))
                | "MergePerBatch" >> beam.CombinePerKey(MergePartialsFn())
                | "Release" >> Counted(_ReleaseFn(_GradientRelease(
                    self._params, self._model, self._helper, self._key),
                    threads_for(reports.pipeline))))


# --------------------------------------------------------------------------- ad server

def _split_by_batch(table: pa.Table):
    for batch in sorted(set(table.column("batch_id").to_pylist())):
        yield batch, table.filter(pc.equal(table.column("batch_id"), batch))


def _batch_entries(table: pa.Table):
    return set(zip(table.column("batch_id").to_pylist(), table.column("helper").to_pylist(),
                   table.column("batch_digest").to_pylist()))


def _check_entries(entries, num_helpers):
    combine.check_batches(set(entries), num_helpers)
    return True


class _CombineBatch:
    def __init__(self, params, expected_digest):
        self.params, self.expected_digest = params, expected_digest

    def __call__(self, element, checked=None):
        _, tables = element
        tables = list(tables)
        if isinstance(self.params, AggregationParams):
            return combine.combine_aggregation(tables, self.params)
        return combine.combine_gradients(tables, self.params, self.expected_digest)


class CombineHelperOutputs(beam.PTransform):
    """The ad server's step: every helper's released tables in one PCollection (flatten the
    helpers' PCollections first: ``(h0, h1) | beam.Flatten()``) -> one decoded table per batch.

    Refuses (the pipeline fails with a LarkInputError naming batch and helpers) missing helper
    outputs, mismatched batch ids and outputs of different batches or parameters. For gradients,
    pass ``model`` (the parameters' digest includes it)."""

    def __init__(self, params, *, model: Optional[LogisticModel] = None):
        super().__init__()
        self._params = params
        if isinstance(params, GradientParams):
            if model is None:
                raise ValueError("combining gradients needs the model sent to the helpers")
            self._digest = core.gradient_params_digest(params, model)
        elif isinstance(params, AggregationParams):
            self._digest = params.digest()
        else:
            raise TypeError("params must be AggregationParams or GradientParams")

    def expand(self, outputs):
        # One global check first (small: one entry per batch and helper), so that a missing
        # helper or mismatched batch ids are reported as such, before any batch is decoded.
        checked = (outputs
                   | "BatchEntries" >> beam.FlatMap(_batch_entries)
                   | "AllEntries" >> beam.combiners.ToList()
                   | "CheckBatches" >> beam.Map(_check_entries, self._params.num_helpers))
        return (outputs
                | "ByBatch" >> beam.FlatMap(_split_by_batch)
                | "GroupBatch" >> beam.GroupByKey()
                | "Combine" >> beam.Map(_CombineBatch(self._params, self._digest),
                                        checked=beam.pvalue.AsSingleton(checked)))
