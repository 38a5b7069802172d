"""The release stage: from exact per-key partials to noisy, thresholded released rows.

Input: a PCollection of Arrow tables of exact per-key partial aggregates (key columns plus
partial columns; a key may appear in many tables). The stage

1. routes partials to key shards by a public hash of the key and sums them (a CombineFn);
2. chooses the released keys: a public keyset (left join, so keys without rows get zeros and
   no key outside the keyset survives), or private key selection over the keys seen;
3. draws each measure's noise per key from the release key and the measure's name (each name
   once per key object: :meth:`accounting.keys.ReleaseKey.claim` at construction);
4. computes the output columns (a measure, or a mean from two measures) and applies release
   thresholds, which are post-processing.

**Output order** (the rule for every released table, file and list of this project; other
modules refer here). Nothing but noisy values and public information may shape an output, and
the order of rows is part of an output: a table emitted "keys with rows first" (a left join's
natural order) tells which keys had data. So every released table is sorted by its key columns
(ascending), whatever the data, in keyset and in private-selection mode alike; which keys share
one emitted table is decided by the public routing hash of the key. A PCollection has no order:
a sink that gathers several tables (or records) into one file sorts the union by the key
columns, never by arrival order.

:class:`~transforms.aggregate.DPAggregate` feeds it bounded partials; pipelines whose privacy
unit is not a row-owning person (CentralNotice impressions, split into blocks of k) feed it
their own partials with their own noise specs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from accounting.calibration import NoiseSpec
from transforms.partials import routing_hash, shard_of, split_by_shard, sum_partials
from transforms.arrow_coder import table_list_coder
from transforms.keyset import PublicKeyset, rows_to_table
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise

NAMESPACE = "dp_release"
#: The stream purpose of private key selection's random decisions: a name no measure can take
#: (DPAggregate refuses it as a metric name; NoisyRelease refuses it as a measure name).
SELECTION_PURPOSE = "key_selection"


def noise_purpose(name: str) -> str:
    """The key claim (ReleaseKey.claim) of the noise stream labelled ``name``."""
    return f"noise:{name}"


@dataclass(frozen=True, kw_only=True)
class NoisedPartial:
    """Where the release stage draws noise per key: the partial column it noises and how.

    Not a measure: what a release spends and states (mechanism, sensitivities, cost) is an
    :class:`accounting.measures.Measure`, the one measure type; a NoisedPartial only wires one
    measure's calibrated ``spec`` (``Measure.noise``) to a partial column and to its keyed noise
    streams, which are labelled by ``name`` (a job may label streams more narrowly than the
    measure's name, e.g. per campaign).

    name: unique per release; it labels the noise streams. partial: the partial column holding
    the exact answer. spec: the calibrated noise (None only in testing mode). integer: integer
    answers and integer noise. columns: for a vector answer (a quantile tree's nodes, a vector
    sum's coordinates), its partial columns; its noisy answer is then a (keys, len(columns))
    array, each coordinate drawn from its own lane (key, coordinate).
    """

    name: str
    partial: str
    spec: Optional[NoiseSpec] = None
    integer: bool = True
    columns: tuple = ()

    def exact(self, table: pa.Table) -> np.ndarray:
        """The exact answers: (keys,) for a scalar measure, (keys, width) for a vector one."""
        dtype = np.int64 if self.integer else np.float64
        if not self.columns:
            return table.column(self.partial).to_numpy(zero_copy_only=False).astype(dtype)
        return np.stack([table.column(c).to_numpy(zero_copy_only=False).astype(dtype)
                         for c in self.columns], axis=1).reshape(table.num_rows, len(self.columns))

    def noisy(self, exact: np.ndarray, release_key: ReleaseKey, keys: pa.Table) -> np.ndarray:
        if not self.columns:
            return add_noise(self.spec, exact, RandomStreams.for_keys(release_key, self.name, keys))
        width = len(self.columns)
        lanes = keys.take(pa.array(np.repeat(np.arange(keys.num_rows), width)))
        lanes = lanes.append_column("__coordinate", pa.array(np.tile(np.arange(width), keys.num_rows)))
        streams = RandomStreams.for_keys(release_key, self.name, lanes)
        return add_noise(self.spec, exact.reshape(-1), streams).reshape(exact.shape)


#: The former name, kept while branches written against it are merged (wave 3); use NoisedPartial.
NoisyMeasure = NoisedPartial


@dataclass(frozen=True, kw_only=True)
class OutputColumn:
    """A released column: one noised partial (``measure``: its name), or
    ``derive(noisy answers by name) -> array``.

    follows: the name of an earlier column whose threshold this one shares (an error column
    of a value): in ``threshold_mode="value"`` it is null wherever that value is suppressed,
    so an interval around a suppressed value cannot reveal it.
    """

    name: str
    measure: Optional[str] = None
    derive: Optional[Callable[[Mapping[str, np.ndarray]], np.ndarray]] = None
    threshold: Optional[float] = None
    follows: Optional[str] = None

    def values(self, noisy: Mapping[str, np.ndarray]) -> np.ndarray:
        return noisy[self.measure] if self.derive is None else self.derive(noisy)


#: Tags of the keyset join's two inputs.
_KEYSET, _TOTALS = 0, 1
_SHARD_TABLE = Tuple[int, pa.Table]
_TAGGED = Tuple[int, Tuple[int, pa.Table]]


def _tagged(element, tag):
    shard, table = element
    if table is not None and table.num_rows:
        yield shard, (tag, table)


def _route_by_key(table, key_columns, num_shards):
    if table is None or table.num_rows == 0:
        return
    shards = shard_of(routing_hash(table.select(key_columns)), num_shards)
    yield from split_by_shard(table, shards)


class _SumPartialsFn(beam.CombineFn):
    """Per key shard: sum the per-key partials (accumulator: a list of non-empty tables)."""

    def __init__(self, key_columns):
        self._keys = list(key_columns)

    def _summed(self, tables):
        total = sum_partials(tables, self._keys)
        return [] if total is None else [total]

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, table):
        if table is not None and table.num_rows:
            accumulator.append(table)
        if len(accumulator) > 64:
            accumulator = self._summed(accumulator)
        return accumulator

    def merge_accumulators(self, accumulators):
        return self._summed([t for acc in accumulators for t in acc])

    def extract_output(self, accumulator):
        return sum_partials(accumulator, self._keys) if accumulator else None

    def get_accumulator_coder(self):
        return table_list_coder()


def sorted_by_keys(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``table`` in the public release order: ascending by the key columns (module docstring)."""
    return table.sort_by([(k, "ascending") for k in keys]) if table.num_rows > 1 else table


def keyset_tables(element, columns) -> pa.Table:
    """Keys from a PCollection keyset element (dict, tuple, Row, RecordBatch or Table)."""
    if isinstance(element, pa.RecordBatch):
        return pa.Table.from_batches([element]).select(columns)
    if isinstance(element, pa.Table):
        return element.select(columns)
    if hasattr(element, "_asdict"):
        element = element._asdict()
    return rows_to_table([element], columns)


class _RouteKeyset(beam.DoFn):
    """Keyset batches (built on workers from chunk offsets, or from a PCollection) by key shard."""

    def __init__(self, keyset: PublicKeyset, keys, num_shards, from_pcollection: bool):
        self._keyset = keyset
        self._keys = list(keys)
        self._num_shards = num_shards
        self._from_pcollection = from_pcollection

    def process(self, element):
        if self._from_pcollection:
            table = keyset_tables(element, self._keys)
            table = table.filter(pa.array(~self._keyset.excluded_mask(table)))
        else:
            table = self._keyset.batch_at(element)
        if table.num_rows:
            yield from _route_by_key(table, self._keys, self._num_shards)


@dataclass(frozen=True, kw_only=True)
class _ReleaseSettings:
    """What the release DoFn needs (one picklable value)."""

    keys: tuple
    keyset: Optional[PublicKeyset]
    selector: object
    measures: tuple
    outputs: tuple
    partial_types: Mapping[str, pa.DataType]
    release_key: ReleaseKey
    testing: bool
    threshold_mode: str


class _NoiseAndRelease(beam.DoFn):
    def __init__(self, settings: _ReleaseSettings):
        self._s = settings

    def _zeros(self, keys: pa.Table) -> pa.Table:
        columns = {k: keys.column(k) for k in self._s.keys}
        for name, typ in self._s.partial_types.items():
            columns[name] = pa.array(np.zeros(keys.num_rows), pa.float64()).cast(typ)
        return pa.table(columns)

    def process(self, element):
        _, value = element
        if self._s.keyset is not None:  # the keyset join: (tag, table) pairs
            keysets, totals = [], []
            for tag, table in value:
                if table.num_rows:
                    (keysets if tag == _KEYSET else totals).append(table)
            if not keysets:
                return
            keys = pa.concat_tables(keysets, promote_options="permissive").select(self._s.keys)
            keys = keys.group_by(list(self._s.keys), use_threads=False).aggregate([])  # distinct
            if totals:
                total = self._s.keyset.cast_like(sum_partials(totals, self._s.keys))
                joined = keys.join(total, keys=self._s.keys, join_type="left outer", use_threads=False)
                zeros = self._zeros(joined)
                table = pa.table({name: pc.coalesce(joined.column(name), zeros.column(name))
                                  if name in joined.column_names else zeros.column(name)
                                  for name in zeros.column_names})
            else:
                table = self._zeros(keys)
        else:  # private selection over the keys seen in the data
            table = value
            if table is None or not table.num_rows:
                return
            streams = RandomStreams.for_keys(self._s.release_key, SELECTION_PURPOSE, table.select(self._s.keys))
            keep = self._s.selector.keep(table.column("units").to_numpy(zero_copy_only=False), streams)
            Metrics.counter(NAMESPACE, "keys_selected").inc(int(keep.sum()))
            table = table.filter(pa.array(keep))
            if not table.num_rows:
                return
        yield from self._release(table)

    def _release(self, table: pa.Table):
        keys = table.select(self._s.keys)
        noisy = {}
        for m in self._s.measures:
            exact = m.exact(table)
            noisy[m.name] = exact if self._s.testing else m.noisy(exact, self._s.release_key, keys)
        out = {k: keys.column(k) for k in self._s.keys}
        suppress = np.zeros(table.num_rows, dtype=bool)
        all_below = np.ones(table.num_rows, dtype=bool) if self._s.threshold_mode == "value" else None
        masks = {}
        for column in self._s.outputs:
            values = column.values(noisy)
            if np.ndim(values) == 2:  # a vector per key (vector sum): a fixed-size list column
                array = pa.FixedSizeListArray.from_arrays(pa.array(np.ravel(values)), np.shape(values)[1])
            else:
                array = pa.array(values)
            if column.threshold is not None:
                below = ~(np.asarray(values, dtype=float) > column.threshold)
                if self._s.threshold_mode == "key":
                    suppress |= below
                else:
                    array = pa.array(values, mask=below)
                    all_below &= below
                    masks[column.name] = below
            elif column.follows is not None:
                if column.follows in masks:
                    array = pa.array(values, mask=masks[column.follows])
            elif all_below is not None:
                all_below[:] = False
            out[column.name] = array
        if all_below is not None:
            suppress |= all_below  # a key with every value suppressed is not released
        result = pa.table(out)
        if suppress.any():
            Metrics.counter(NAMESPACE, "keys_suppressed_by_threshold").inc(int(suppress.sum()))
            result = result.filter(pa.array(~suppress))
        result = sorted_by_keys(result, self._s.keys)  # public order (see the module docstring)
        Metrics.counter(NAMESPACE, "keys_released").inc(result.num_rows)
        if result.num_rows:
            yield result


class NoisyRelease(beam.PTransform):
    """Exact per-key partial tables -> released Arrow tables (see the module docstring).

    keys: key columns. measures / outputs: what to noise and what to release.
    partial_types: every partial column and its Arrow type (to zero-fill keyset keys without
    rows). keyset or selector: which keys. threshold_mode: "key" drops a key failing any
    threshold; "value" nulls the failing values and drops a key only if all are null.
    """

    def __init__(self, *, keys: Sequence[str], measures: Sequence[NoisedPartial],
                 outputs: Sequence[OutputColumn], partial_types: Mapping[str, pa.DataType],
                 release_key: ReleaseKey, keyset: PublicKeyset = None, selector=None,
                 testing: bool = False, num_shards: int = 32, threshold_mode: str = "key",
                 label: str = None):
        super().__init__(label)
        if (keyset is None) == (selector is None):
            raise ValueError("give exactly one of keyset and selector")
        if threshold_mode not in ("key", "value"):
            raise ValueError(f"threshold_mode must be 'key' or 'value', got {threshold_mode!r}")
        if not testing and any(m.spec is None for m in measures):
            raise ValueError("every measure needs a noise spec outside testing mode")
        names = [m.name for m in measures]
        if len(set(names)) != len(names) or SELECTION_PURPOSE in names:
            raise ValueError(f"measure names must be unique and not {SELECTION_PURPOSE!r} (they "
                             f"label the noise streams), got {names}")
        if selector is not None and "units" not in partial_types:
            raise ValueError("private key selection needs a 'units' partial column")
        self._keys = list(keys)
        self._keyset = keyset
        self._num_shards = num_shards
        worker_keyset = None if keyset is None else (keyset if keyset.in_memory else keyset.without_source())
        self._settings = _ReleaseSettings(
            keys=tuple(keys), keyset=worker_keyset, selector=selector, measures=tuple(measures),
            outputs=tuple(outputs), partial_types=dict(partial_types), release_key=release_key,
            testing=testing, threshold_mode=threshold_mode)

    def expand(self, partials):
        owner = f"{type(self).__name__} {self.label!r}"
        for m in self._settings.measures:
            self._settings.release_key.claim(noise_purpose(m.name), owner=owner)
        if self._settings.selector is not None:
            self._settings.release_key.claim(noise_purpose(SELECTION_PURPOSE), owner=owner)
        keyset = self._keyset
        worker_keyset = self._settings.keyset
        totals = (partials
                  | "RouteByKey" >> beam.FlatMap(_route_by_key, self._keys, self._num_shards)
                  .with_output_types(_SHARD_TABLE)
                  | "SumPerKeyShard" >> beam.CombinePerKey(_SumPartialsFn(self._keys)))
        release = _NoiseAndRelease(self._settings)
        if keyset is None:
            return totals | "SelectNoiseAndRelease" >> beam.ParDo(release).with_output_types(pa.Table)
        if keyset.in_memory:
            keys = (partials.pipeline
                    | "KeysetChunks" >> beam.Create(keyset.chunk_starts())
                    | "RouteKeyset" >> beam.ParDo(_RouteKeyset(worker_keyset, self._keys,
                                                               self._num_shards, False))
                    .with_output_types(_SHARD_TABLE))
        else:
            keys = keyset.pcollection | "RouteKeyset" >> beam.ParDo(
                _RouteKeyset(worker_keyset, self._keys, self._num_shards, True)) \
                .with_output_types(_SHARD_TABLE)
        # The keyset join: both sides tagged, one GroupByKey (typed, so tables use the Arrow coder).
        tagged = (keys | "TagKeyset" >> beam.FlatMap(_tagged, _KEYSET).with_output_types(_TAGGED),
                  totals | "TagTotals" >> beam.FlatMap(_tagged, _TOTALS).with_output_types(_TAGGED))
        return (tagged
                | "FlattenKeysetAndTotals" >> beam.Flatten()
                | "JoinKeyset" >> beam.GroupByKey()
                | "NoiseAndRelease" >> beam.ParDo(release).with_output_types(pa.Table))
