"""Beam wiring for local and shuffle DP (thin: the maths lives in the sibling modules).

Every transform takes and returns PCollections of pyarrow Tables (or RecordBatches), works on a
whole batch with numpy at a time, and combines before the shuffle (a batch becomes one small
partial: support counts, a share sum, label counts).

    reports | EstimateFrequencies(oracle[, candidates])      -> one table: value, estimate, ...
    reports | PEMHeavyHitters(plan)                          -> {"heavy_hitters", "rounds"}
    shares  | ShuffleSum(split_and_mix)                      -> one table: the estimated sum
    rows    | RandomizeLabels(randomizer, ...)               -> {"dataset", "debias"}
    values  | RandomizeReports(oracle, ...)                  -> report tables (client simulation)

Raw-data facts (reports dropped as malformed, labels outside the declared set) are counters in
the ``ldp`` namespace (pipeline output, :mod:`transforms.counting`), never columns of an output.
"""
from __future__ import annotations

from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey
from transforms.counting import Counted, Counters, CountingDoFn
from transforms.fanout import ByTag
from transforms.ldp import pem as pem_lib
from transforms.ldp.estimators import (SupportCounts, candidate_values, count_support,
                                       estimate_table)
from transforms.ldp.labels import (LabelRandomizer, debias_table, label_counts,
                                   randomize_label_table)
from transforms.ldp.oracles import Oracle
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import KeyedRandomness, record_ids
from transforms.randomness import RandomSource
from transforms.ldp.reports import report_arrays
from transforms.ldp.shuffle import SHARE_COLUMN, SplitAndMix

NAMESPACE = "ldp"

__all__ = ["EstimateFrequencies", "PEMHeavyHitters", "ShuffleSum", "RandomizeLabels",
           "RandomizeReports", "SumSupportFn", "NAMESPACE"]


def _table(batch) -> pa.Table:
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if isinstance(batch, pa.Table):
        return batch
    raise TypeError(f"expected pyarrow Tables or RecordBatches, got {type(batch).__name__}")



def _keyed(release_key: Optional[ReleaseKey], source: Optional[RandomSource], purpose: str,
           owner: str) -> RandomSource:
    if source is not None:
        return source
    if not isinstance(release_key, ReleaseKey):
        raise TypeError(f"{owner}: give release_key (an accounting.keys.ReleaseKey)")
    return KeyedRandomness(release_key, purpose)


def _claim(source: RandomSource, owner: str) -> None:
    if isinstance(source, KeyedRandomness):
        source.release_key.claim(f"ldp/{source.purpose}", owner=owner)


# --------------------------------------------------------------------------- frequency oracles

class SumSupportFn(beam.CombineFn):
    """Sum of :class:`SupportCounts` (None = nothing seen); associative and commutative."""

    def create_accumulator(self):
        return None

    def add_input(self, accumulator, counts):
        if accumulator is None:
            return SupportCounts(n=counts.n, support=counts.support.copy())
        return accumulator.merge(counts)

    def merge_accumulators(self, accumulators):
        merged = None
        for acc in accumulators:
            if acc is None:
                continue
            merged = SupportCounts(n=acc.n, support=acc.support.copy()) if merged is None else merged.merge(acc)
        return merged

    def extract_output(self, accumulator):
        return accumulator


class _CountSupport(CountingDoFn):
    """One report batch -> its SupportCounts against the candidates (fixed or a side input)."""

    def __init__(self, oracle: Oracle, candidates: Optional[np.ndarray], on_invalid: str):
        self._counts = Counters(NAMESPACE)
        self._oracle = oracle
        self._candidates = candidates
        self._on_invalid = on_invalid
        self._read = self._counts.counter("reports_read")
        self._null = self._counts.counter("reports_dropped_null")
        self._bad = self._counts.counter("reports_dropped_out_of_domain")

    def process(self, batch, candidates=None):
        arrays = report_arrays(self._oracle, _table(batch), on_invalid=self._on_invalid)
        self._read.inc(arrays.n + arrays.dropped_null + arrays.dropped_out_of_domain)
        self._null.inc(arrays.dropped_null)
        self._bad.inc(arrays.dropped_out_of_domain)
        values = self._candidates if candidates is None else candidates
        yield count_support(self._oracle, arrays, values)


def _estimates(counts: Optional[SupportCounts], oracle: Oracle, candidates: np.ndarray) -> pa.Table:
    return estimate_table(oracle, candidates, counts or SupportCounts.empty(candidates.size))


def _collect_candidates(tables, oracle: Oracle) -> np.ndarray:
    values = [t.column("value").to_numpy(zero_copy_only=False) for t in tables if t.num_rows]
    return candidate_values(oracle, np.concatenate(values) if values else np.zeros(0, np.uint64))


class EstimateFrequencies(beam.PTransform):
    """Report batches -> one table of unbiased estimates (value, estimate, frequency, std).

    ``candidates``: values to estimate -- None (the whole domain; refused for OLH above 4096
    values), an array of values, or a PCollection of tables with a ``value`` column (a public
    candidate list read from files). ``on_invalid``: "drop" malformed reports (counted) or
    "raise". Schema faults (another oracle, wrong width) always raise.
    """

    def __init__(self, oracle: Oracle, *, candidates=None, on_invalid: str = "drop"):
        super().__init__()
        if not isinstance(oracle, Oracle):
            raise TypeError("oracle must be a transforms.ldp Oracle (see make_oracle)")
        self._oracle = oracle
        self._on_invalid = on_invalid
        if isinstance(candidates, beam.PCollection):
            self._side = candidates
            self._fixed = None
        else:
            self._side = None
            self._fixed = candidate_values(oracle, candidates)

    def expand(self, reports):
        oracle = self._oracle
        if self._side is None:
            fixed = self._fixed
            counts = reports | "CountSupport" >> Counted(
                _CountSupport(oracle, fixed, self._on_invalid))
            total = counts | "Sum" >> beam.CombineGlobally(SumSupportFn())
            return total | "Estimate" >> beam.Map(_estimates, oracle, fixed)
        candidates = (self._side
                      | "CollectCandidates" >> beam.combiners.ToList()
                      | "Candidates" >> beam.Map(_collect_candidates, oracle))
        side = beam.pvalue.AsSingleton(candidates)
        counts = reports | "CountSupport" >> Counted(
            _CountSupport(oracle, None, self._on_invalid), side)
        total = counts | "Sum" >> beam.CombineGlobally(SumSupportFn())
        return total | "Estimate" >> beam.Map(_estimates, oracle, side)


# ------------------------------------------------------------------------------------------ PEM

class _SplitGroups(CountingDoFn):
    """A PEM report batch -> (tag = round) ReportArrays per group, plus its report count."""

    def __init__(self, plan: pem_lib.PEMPlan, on_invalid: str):
        self._counts = Counters(NAMESPACE)
        self._plan = plan
        self._on_invalid = on_invalid
        self._read = self._counts.counter("reports_read")
        self._null = self._counts.counter("reports_dropped_null")
        self._bad = self._counts.counter("reports_dropped_out_of_domain")
        self._group = self._counts.counter("reports_dropped_bad_group")

    def process(self, batch):
        table = _table(batch)
        self._read.inc(table.num_rows)
        for r, arrays in pem_lib.split_groups(self._plan, table, on_invalid=self._on_invalid):
            if r < 0:
                self._group.inc(arrays)
                continue
            self._null.inc(arrays.dropped_null)
            self._bad.inc(arrays.dropped_out_of_domain)
            yield "n", arrays.n  # fanned out by ByTag (no tagged outputs: transforms.fanout)
            yield f"round{r}", arrays


class _RoundSupport(beam.DoFn):
    def __init__(self, plan: pem_lib.PEMPlan, round_: int):
        self._plan = plan
        self._round = round_

    def process(self, arrays, candidates):
        yield pem_lib.round_support(self._plan, self._round, arrays, candidates)


def _round_table(counts, plan, round_, candidates, population) -> pa.Table:
    counts = counts or SupportCounts.empty(candidates.size)
    return pem_lib.round_estimates(plan, round_, candidates, counts, population)


class PEMHeavyHitters(beam.PTransform):
    """PEM report batches (with a ``group`` column) -> top-k heavy hitters, all rounds in one
    pipeline: round r's candidates reach round r's support counting as a side input computed
    from round r-1's combined estimates.

    Returns ``{"heavy_hitters": top-k table (rank, value, estimate, frequency, std, round),
    "rounds": every round's candidate estimates}``; estimates are scaled to population counts.
    """

    def __init__(self, plan: pem_lib.PEMPlan, *, on_invalid: str = "drop"):
        super().__init__()
        if not isinstance(plan, pem_lib.PEMPlan):
            raise TypeError("plan must be a PEMPlan")
        self._plan = plan
        self._on_invalid = on_invalid

    def expand(self, reports):
        plan = self._plan
        tags = [f"round{r}" for r in range(plan.rounds)]
        parts = (reports
                 | "SplitGroups" >> Counted(_SplitGroups(plan, self._on_invalid))
                 | "ByRound" >> ByTag(["n", *tags]))
        population = parts["n"] | "Population" >> beam.CombineGlobally(sum)
        candidates = reports.pipeline | "Round0Candidates" >> beam.Create(
            [plan.initial_candidates()])
        round_tables = []
        estimates = None
        for r in range(plan.rounds):
            side = beam.pvalue.AsSingleton(candidates)
            counts = (parts[tags[r]]
                      | f"Support{r}" >> beam.ParDo(_RoundSupport(plan, r), side)
                      | f"Sum{r}" >> beam.CombineGlobally(SumSupportFn()))
            estimates = counts | f"Estimate{r}" >> beam.Map(
                _round_table, plan, r, side, beam.pvalue.AsSingleton(population))
            round_tables.append(estimates)
            if r + 1 < plan.rounds:
                candidates = estimates | f"Candidates{r + 1}" >> beam.Map(
                    lambda table, r=r: pem_lib.next_candidates(plan, r, table))
        top = estimates | "TopK" >> beam.Map(pem_lib.top_k, plan.top_k)
        rounds = (round_tables | "AllRounds" >> beam.Flatten()
                  | "RoundsList" >> beam.combiners.ToList()
                  | "ConcatRounds" >> beam.Map(_concat_rounds))
        return {"heavy_hitters": top, "rounds": rounds}


def _concat_rounds(tables) -> pa.Table:
    table = pa.concat_tables(tables)
    order = np.lexsort((table.column("value").to_numpy(), table.column("round").to_numpy()))
    return table.take(order)


# -------------------------------------------------------------------------------------- shuffle

def _share_partial(batch, modulus: int):
    table = _table(batch)
    if SHARE_COLUMN not in table.column_names:
        raise ValueError(f"shuffle input needs a {SHARE_COLUMN!r} column")
    column = table.column(SHARE_COLUMN)
    if column.null_count:
        raise ValueError("shares must not be null")
    shares = column.to_numpy().astype(np.uint64)
    if shares.size and int(shares.max()) >= modulus:
        raise ValueError(f"a share is not below the protocol's modulus {modulus}: these shares "
                         "were made with other parameters")
    return shares.size, int(shares.sum(dtype=np.uint64))


class _SumShares(beam.CombineFn):
    """(messages, sum mod 2^64) pairs; exact because the modulus divides 2^64."""

    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, item):
        return acc[0] + item[0], (acc[1] + item[1]) & ((1 << 64) - 1)

    def merge_accumulators(self, accs):
        total, value = 0, 0
        for count, s in accs:
            total += count
            value = (value + s) & ((1 << 64) - 1)
        return total, value

    def extract_output(self, acc):
        return acc


def shuffle_result(partial, spec: SplitAndMix) -> pa.Table:
    messages, total = partial
    if messages % spec.messages:
        raise ValueError(f"{messages} shares is not a multiple of {spec.messages} shares per "
                         "client: incomplete input")
    clients = messages // spec.messages
    if clients < spec.num_clients:
        raise ValueError(f"only {clients} clients reported but the noise was split over "
                         f"{spec.num_clients}: the sum would carry less noise than planned")
    from transforms import error_columns

    estimate = spec.estimate(total & (spec.modulus - 1), clients)
    error = error_columns.binomial(clients * spec.noise_trials_per_client, spec.noise_probability)
    low, high, std = error_columns.arrays([estimate], error.std, error.halfwidth)
    return pa.table({"estimate": [estimate], "estimate_ci95_low": low, "estimate_ci95_high": high,
                     "estimate_std": std, "clients": [clients], "messages": [messages]})


class ShuffleSum(beam.PTransform):
    """Shuffled split-and-mix shares (tables with a ``share`` column) -> the estimated sum."""

    def __init__(self, spec: SplitAndMix):
        super().__init__()
        if not isinstance(spec, SplitAndMix):
            raise TypeError("spec must be a SplitAndMix")
        self._spec = spec

    def expand(self, shares):
        spec = self._spec
        return (shares
                | "Partial" >> beam.Map(_share_partial, spec.modulus)
                | "Sum" >> beam.CombineGlobally(_SumShares())
                | "Estimate" >> beam.Map(shuffle_result, spec))


# --------------------------------------------------------------------------------------- labels

class _RandomizeLabelBatch(CountingDoFn):
    def __init__(self, randomizer, label_column, id_column, source, unbiased_column):
        self._counts = Counters(NAMESPACE)
        self._randomizer = randomizer
        self._label = label_column
        self._id = id_column
        self._source = source
        self._unbiased = unbiased_column
        self._rows = self._counts.counter("label_rows")
        self._undeclared = self._counts.counter("labels_null_or_undeclared")

    def process(self, batch):
        table, undeclared = randomize_label_table(
            self._randomizer, _table(batch), label_column=self._label, id_column=self._id,
            source=self._source, unbiased_column=self._unbiased)
        self._rows.inc(table.num_rows)
        self._undeclared.inc(undeclared)
        yield table


class _SumCounts(beam.CombineFn):
    def __init__(self, size: int):
        self._size = size

    def create_accumulator(self):
        return np.zeros(self._size, dtype=np.int64)

    def add_input(self, acc, counts):
        acc += counts
        return acc

    def merge_accumulators(self, accs):
        out = np.zeros(self._size, dtype=np.int64)
        for acc in accs:
            out += acc
        return out

    def extract_output(self, acc):
        return acc


def _label_counts(table, randomizer, label_column):
    return label_counts(randomizer, table, label_column)


def _debias(counts, randomizer):
    return debias_table(randomizer, counts)


class RandomizeLabels(beam.PTransform):
    """Training rows -> ``{"dataset": rows with randomized labels, "debias": one table}``.

    Each row's randomness is keyed by its example id (``id_column``) under ``release_key``, so the
    export does not depend on batching; the transform claims its key purpose (one application).
    """

    def __init__(self, randomizer: LabelRandomizer, *, label_column: str, id_column: str,
                 release_key: Optional[ReleaseKey] = None, source: Optional[RandomSource] = None,
                 unbiased_column: Optional[str] = None):
        super().__init__()
        if not isinstance(randomizer, LabelRandomizer):
            raise TypeError("randomizer must be a LabelRandomizer")
        self._randomizer = randomizer
        self._label = label_column
        self._id = id_column
        self._source = _keyed(release_key, source, "labels", "RandomizeLabels")
        self._unbiased = unbiased_column

    def expand(self, rows):
        _claim(self._source, "RandomizeLabels")
        randomizer = self._randomizer
        dataset = rows | "Randomize" >> Counted(_RandomizeLabelBatch(
            randomizer, self._label, self._id, self._source, self._unbiased))
        debias = (dataset
                  | "Counts" >> beam.Map(_label_counts, randomizer, self._label)
                  | "SumCounts" >> beam.CombineGlobally(_SumCounts(randomizer.num_labels))
                  | "Debias" >> beam.Map(_debias, randomizer))
        return {"dataset": dataset, "debias": debias}


# ------------------------------------------------------------------------- client-side (sims)

class _RandomizeBatch(beam.DoFn):
    def __init__(self, oracle, value_column, id_column, source, carry):
        self._oracle = oracle
        self._value = value_column
        self._id = id_column
        self._source = source
        self._carry = tuple(carry)

    def process(self, batch):
        table = _table(batch)
        ids = record_ids(table.column(self._id).combine_chunks())
        extra = {name: table.column(name) for name in self._carry}
        yield randomize(self._oracle, table.column(self._value).combine_chunks(),
                        source=self._source, ids=ids, extra=extra)


class RandomizeReports(beam.PTransform):
    """Client values -> report tables, each client's report keyed by its integer id (a simulation
    of many clients, or a server-side randomizer). Claims its key purpose (one application)."""

    def __init__(self, oracle: Oracle, *, value_column: str = "value",
                 id_column: str = "client_id", release_key: Optional[ReleaseKey] = None,
                 source: Optional[RandomSource] = None, purpose: str = "clients",
                 carry: Sequence[str] = ()):
        super().__init__()
        self._oracle = oracle
        self._value = value_column
        self._id = id_column
        self._source = _keyed(release_key, source, purpose, "RandomizeReports")
        self._carry = carry

    def expand(self, values):
        _claim(self._source, "RandomizeReports")
        return values | "Randomize" >> beam.ParDo(_RandomizeBatch(
            self._oracle, self._value, self._id, self._source, self._carry))
