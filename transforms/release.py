"""The release stage: from exact per-key partials to noisy, thresholded released rows.

Input: a PCollection of Arrow tables of exact per-key partial aggregates (key columns plus
partial columns; a key may appear in many tables). The stage

1. routes partials to key shards and sums them (a CombineFn). With a public keyset the number
   of shards grows with the keyset's size (public) so that a shard holds at most
   :data:`KEYS_PER_SHARD` keyset keys: the release's working set is one shard's, whatever the
   keyset's size. An in-memory keyset (table, cross product) is sharded by position: shard
   ``i`` is the keyset's chunk ``i``, partials go to the chunk holding their key, and the
   worker builds its chunk itself, so the keyset never crosses the shuffle. A PCollection
   keyset (too large to hold anywhere) is sharded by a public hash of the key, its size stated
   or counted in the pipeline; its keys reach their shard through the shuffle, or staged as
   files (:mod:`transforms.keyset_staging`). Private selection uses a fixed ``num_shards`` (its
   keys are the data's);
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
one emitted table is decided by public information only (the key's position in an in-memory
keyset, else the public routing hash of the key). Noise is drawn per key (streams keyed by the
key, never by its shard), so the number of shards changes no released value. A PCollection has no order:
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

from accounting.calibration import NoiseSpec
from transforms import keyset_staging
from transforms.parallel import ThreadedDoFn, check_threads, threads_for
from transforms.partials import routing_hash, shard_of, split_by_shard, sum_partials
from transforms.arrow_coder import table_list_coder
from transforms.counting import Counted, Counters, CountingDoFn
from transforms.keyset import KEYSET_POSITION, PublicKeyset, rows_to_table
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

    def noise_free(self, exact: np.ndarray) -> np.ndarray:
        """The answers of testing mode: the exact ones."""
        return exact

    def noisy(self, exact: np.ndarray, release_key: ReleaseKey, keys: pa.Table) -> np.ndarray:
        if not self.columns:
            return add_noise(self.spec, exact, RandomStreams.for_keys(release_key, self.name, keys))
        width = len(self.columns)
        lanes = keys.take(pa.array(np.repeat(np.arange(keys.num_rows), width)))
        lanes = lanes.append_column("__coordinate", pa.array(np.tile(np.arange(width), keys.num_rows)))
        streams = RandomStreams.for_keys(release_key, self.name, lanes)
        return add_noise(self.spec, exact.reshape(-1), streams).reshape(exact.shape)



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


#: Keyset keys per key shard of the release stage. A shard's join, noise and sort work on at most
#: this many keyset keys (plus the keys of its partial sums), whatever the keyset's size: the
#: number of key shards grows with the keyset (its size is public), the working set does not.
KEYS_PER_SHARD = 1 << 17


#: Keyset keys per key shard of a PCollection keyset staged as files
#: (:mod:`transforms.keyset_staging`): every keyset element writes one piece per shard, and each
#: piece's marker is merged into its shard's before the shuffle; fewer, larger shards keep the
#: files' pieces few (at 125M keys and elements of 250k keys: 62k pieces instead of 477k); a
#: shard's working set stays bounded.
STAGED_KEYS_PER_SHARD = 1 << 20


def key_shards(keyset_size: int, minimum: int = 1, keys_per_shard: int = KEYS_PER_SHARD) -> int:
    """Key shards for a keyset of ``keyset_size`` keys: at least ``minimum``, and enough that
    none holds more than :data:`KEYS_PER_SHARD` keys on average (a public number: it depends on
    the keyset's size only, never on the data)."""
    return max(int(minimum), -(-int(keyset_size) // int(keys_per_shard)), 1)


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


def _route_by_position(table, keyset: PublicKeyset, keys_per_shard: int):
    """Partials of an in-memory keyset's keys, keyed by the key's position in the keyset (one
    int64 instead of the key columns: the shuffle and the sums carry 8 bytes per key), to the
    shard of the keyset chunk holding the key (chunk ``i``: positions ``[i, i + 1) *
    KEYS_PER_SHARD``). Keys outside the keyset are dropped here, as the left join would.
    Partials already keyed by position (bounded with the same keyset) are routed as they are."""
    if table is None or table.num_rows == 0:
        return
    table = keyset.keyed_by_position(table)
    position = table.column(KEYSET_POSITION).to_numpy(zero_copy_only=False)
    yield from split_by_shard(table, position // keys_per_shard)


def _keyset_marker(shard, schema):
    """The keyset side of an in-memory keyset's shard: an empty table (the worker builds the
    chunk's keys itself with :meth:`PublicKeyset.batch_at`; only the shard number travels)."""
    return shard, (_KEYSET, schema.empty_table())


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


class _MergeMarkersFn(beam.CombineFn):
    """Per key shard: a staged keyset's markers merged into one
    (:func:`~transforms.keyset_staging.merge_markers`; accumulator: a list of markers, merged
    when compacted before the shuffle)."""

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, marker):
        accumulator.append(marker)
        return accumulator

    def merge_accumulators(self, accumulators):
        return [keyset_staging.merge_markers([m for acc in accumulators for m in acc])]

    def compact(self, accumulator):
        return [keyset_staging.merge_markers(accumulator)] if len(accumulator) > 1 else accumulator

    def extract_output(self, accumulator):
        return keyset_staging.merge_markers(accumulator)

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


class _RouteKeyset(ThreadedDoFn, beam.DoFn):
    """A PCollection keyset's elements (dicts, tuples, Rows, RecordBatches or Tables) to key
    shards by the public routing hash, exclusions applied. With a staging directory (``run_dir``)
    each shard's piece is written there and only its marker is routed
    (:mod:`transforms.keyset_staging`)."""

    def __init__(self, keyset: PublicKeyset, keys, run_dir: Optional[str] = None, threads: int = 1):
        self._keyset = keyset
        self._keys = list(keys)
        self._run_dir = run_dir
        self._threads(threads, "dp-keyset")

    def process(self, element, num_shards, timestamp=beam.DoFn.TimestampParam,
                window=beam.DoFn.WindowParam):
        yield from self._submit(self._routed, (element, num_shards), timestamp, window)

    def _routed(self, element, num_shards):
        """One keyset element's (shard, piece) outputs (staged: (shard, marker)), and nothing to
        count; a function of the element alone (staged files are named by uuid)."""
        table = keyset_tables(element, self._keys)
        table = table.filter(pa.array(~self._keyset.excluded_mask(table)))
        if not table.num_rows:
            return [], ()
        pieces = _route_by_key(table, self._keys, num_shards)
        return list(pieces if self._run_dir is None else keyset_staging.write_pieces(self._run_dir, pieces)), ()


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
    keys_per_shard: int


class _NoiseAndRelease(CountingDoFn, ThreadedDoFn, beam.DoFn):
    """One key shard -> its released table: keys joined (keyset) or selected, noised, thresholded,
    sorted by key. With threads > 1 (:func:`transforms.parallel.threads_for`: the in-process
    engine's profile) shards are released on that many threads of the instance, in input order; the grouped values
    are materialised and staged keyset pieces read on the bundle's thread, and counters counted
    there. A shard's release is a function of the shard alone: threads change no output."""

    def __init__(self, settings: _ReleaseSettings, threads: int = 1):
        self._s = settings
        self._pieces = None  # a staged keyset's reader (transforms.keyset_staging)
        self._counts = Counters(NAMESPACE)
        self._threads(threads, "dp-release")

    def setup(self):
        if self._work.threaded and self._s.keyset is not None and self._s.keyset.in_memory:
            self._s.keyset.size()  # its distinct keys, built once here rather than by each thread
        super().setup()

    def teardown(self):
        super().teardown()
        if self._pieces is not None:
            self._pieces.close()

    def _zeros(self, keys: pa.Table) -> pa.Table:
        columns = {k: keys.column(k) for k in self._s.keys}
        for name, typ in self._s.partial_types.items():
            columns[name] = pa.array(np.zeros(keys.num_rows), pa.float64()).cast(typ)
        return pa.table(columns)

    def _zero_filled(self, joined: pa.Table) -> pa.Table:
        """The keys and partial columns of a left join, a key without partials given zeros."""
        zeros = self._zeros(joined)
        return pa.table({name: pc.coalesce(joined.column(name), zeros.column(name))
                         if name in joined.column_names else zeros.column(name)
                         for name in zeros.column_names})

    def process(self, element, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        shard, value = element
        if self._s.keyset is not None:
            value = self._read_staged(value)
        yield from self._submit(self._released, (shard, value), timestamp, window)

    def count(self, name, amount):
        self._counts.inc(name, amount)

    def _read_staged(self, tagged) -> list:
        """A keyset shard's grouped values as a list, staged keyset pieces read (on the bundle's
        thread: the reader keeps files open, and the grouped values may be read from the
        engine's state)."""
        values, staged = [], []
        for tag, table in tagged:
            (staged if tag == _KEYSET and keyset_staging.is_marker(table) else values).append((tag, table))
        if staged:
            if self._pieces is None:
                self._pieces = keyset_staging.PieceReader()
            values += [(_KEYSET, table) for table in self._pieces.read([t for _, t in staged])]
        return values

    def _released(self, shard, value):
        """(released tables, [(counter, amount)]) of one shard: a function of the shard alone."""
        counts = []
        if self._s.keyset is None:
            table = self._selected(value, counts)
        elif self._s.keyset.in_memory:
            table = self._chunk_joined(shard, value)
        else:
            table = self._keyset_joined(value, counts)
        outputs = list(self._release(table, counts)) if table is not None and table.num_rows else []
        return outputs, counts

    def _chunk_joined(self, shard, tagged):
        """An in-memory keyset's shard: its chunk of keys (built here, each key once) left-joined
        with the partials summed by key position."""
        totals, marked = [], False
        for tag, table in tagged:
            marked |= tag == _KEYSET
            if tag == _TOTALS and table.num_rows:
                totals.append(table)
        if not marked:
            return None
        keys = self._s.keyset.batch_at(shard * self._s.keys_per_shard, self._s.keys_per_shard)
        if not totals or not keys.num_rows:
            return self._zeros(keys)
        keyed = keys.append_column(KEYSET_POSITION, pa.array(self._s.keyset.positions(keys)))
        return self._zero_filled(keyed.join(sum_partials(totals, [KEYSET_POSITION]), keys=KEYSET_POSITION,
                                            join_type="left outer", use_threads=False))

    def _keyset_joined(self, tagged, counts):
        """A PCollection keyset's shard (staged pieces already read): its keys (distinct)
        left-joined with the summed partials."""
        keysets, totals = [], []
        for tag, table in tagged:
            if table.num_rows:
                (keysets if tag == _KEYSET else totals).append(table)
        if not keysets:
            return None
        keys = pa.concat_tables(keysets, promote_options="permissive").select(self._s.keys)
        del keysets
        keys = keys.group_by(list(self._s.keys), use_threads=False).aggregate([])  # distinct
        if not totals:
            return self._zeros(keys)
        total = self._s.keyset.cast_like(sum_partials(totals, self._s.keys))
        joined = keys.join(total, keys=self._s.keys, join_type="left outer", use_threads=False)
        # Keys outside the keyset that reached here (the bounding's keyset filter lets a few
        # through: transforms.membership) are the summed keys the left join left out (each key is
        # once on each side); the operator is told how many bounded rows they held (how many
        # keys, for partials without a count).
        if "count" in total.column_names:
            outside = pc.sum(total.column("count")).as_py() - (pc.sum(joined.column("count")).as_py() or 0)
        else:
            partial = [name for name in total.column_names if name not in self._s.keys][0]
            outside = total.num_rows - pc.count(joined.column(partial)).as_py()
        if outside:
            counts.append(("dropped_outside_keyset_after_bounding", int(outside)))
        return self._zero_filled(joined)

    def _selected(self, table, counts):
        """Private selection over the keys seen in the data (one shard's summed partials)."""
        if table is None or not table.num_rows:
            return None
        streams = RandomStreams.for_keys(self._s.release_key, SELECTION_PURPOSE, table.select(self._s.keys))
        keep = self._s.selector.keep(table.column("units").to_numpy(zero_copy_only=False), streams)
        counts.append(("keys_selected", int(keep.sum())))
        return table.filter(pa.array(keep))

    def _release(self, table: pa.Table, counts: list):
        keys = table.select(self._s.keys)
        noisy = {}
        for m in self._s.measures:
            exact = m.exact(table)
            noisy[m.name] = m.noise_free(exact) if self._s.testing else m.noisy(exact, self._s.release_key, keys)
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
                    array = _with_nulls(values, below)
                    all_below &= below
                    masks[column.name] = below
            elif column.follows is not None:
                if column.follows in masks:
                    array = _with_nulls(values, masks[column.follows])
            elif all_below is not None:
                all_below[:] = False
            out[column.name] = array
        if all_below is not None:
            suppress |= all_below  # a key with every value suppressed is not released
        result = pa.table(out)
        if suppress.any():
            counts.append(("keys_suppressed_by_threshold", int(suppress.sum())))
            result = result.filter(pa.array(~suppress))
        result = sorted_by_keys(result, self._s.keys)  # public order (see the module docstring)
        counts.append(("keys_released", result.num_rows))
        if result.num_rows:
            yield result


def _with_nulls(values, mask: np.ndarray) -> pa.Array:
    """``values`` with nulls where ``mask`` is set, beside the nulls they carry already (a
    derived value may be null by a public rule on noisy values: a numpy masked array)."""
    if np.ma.isMaskedArray(values):
        mask = mask | np.ma.getmaskarray(values)
        values = np.ma.getdata(values)
    return pa.array(values, mask=mask)


class NoisyRelease(beam.PTransform):
    """Exact per-key partial tables -> released Arrow tables (see the module docstring).

    keys: key columns. measures / outputs: what to noise and what to release.
    partial_types: every partial column and its Arrow type (to zero-fill keyset keys without
    rows). keyset or selector: which keys. threshold_mode: "key" drops a key failing any
    threshold; "value" nulls the failing values and drops a key only if all are null.
    num_shards: the key shards of private selection, and the least number of key shards of a
    PCollection keyset (more when its size needs them: :func:`key_shards`); an in-memory keyset
    has one shard per ``keys_per_shard`` keys (default :data:`KEYS_PER_SHARD`;
    :data:`STAGED_KEYS_PER_SHARD` for a staged PCollection keyset). Noise is keyed
    by the key, so neither changes a released value. threads: threads releasing shards in each
    DoFn instance (None: the pipeline's ``--dofn_threads``, which also caps it:
    :func:`transforms.parallel.threads_for`); no output depends on it.
    """

    def __init__(self, *, keys: Sequence[str], measures: Sequence[NoisedPartial],
                 outputs: Sequence[OutputColumn], partial_types: Mapping[str, pa.DataType],
                 release_key: ReleaseKey, keyset: PublicKeyset = None, selector=None,
                 testing: bool = False, num_shards: int = 32, threshold_mode: str = "key",
                 keys_per_shard: Optional[int] = None, threads: Optional[int] = None,
                 label: str = None):
        super().__init__(label)
        self._threads = check_threads(threads)
        if (keyset is None) == (selector is None):
            raise ValueError("give exactly one of keyset and selector")
        if threshold_mode not in ("key", "value"):
            raise ValueError(f"threshold_mode must be 'key' or 'value', got {threshold_mode!r}")
        if not testing and any(isinstance(m, NoisedPartial) and m.spec is None for m in measures):
            raise ValueError("every measure needs a noise spec outside testing mode")
        names = [m.name for m in measures]
        if len(set(names)) != len(names) or SELECTION_PURPOSE in names:
            raise ValueError(f"measure names must be unique and not {SELECTION_PURPOSE!r} (they "
                             f"label the noise streams), got {names}")
        if keys_per_shard is None:
            staged = keyset is not None and getattr(keyset, "staging_run", None) is not None
            keys_per_shard = STAGED_KEYS_PER_SHARD if staged else KEYS_PER_SHARD
        if keys_per_shard < 1:
            raise ValueError(f"keys_per_shard must be >= 1, got {keys_per_shard}")
        if selector is not None and "units" not in partial_types:
            raise ValueError("private key selection needs a 'units' partial column")
        self._keys = list(keys)
        self._keyset = keyset
        self._num_shards = num_shards
        worker_keyset = None if keyset is None else (keyset if keyset.in_memory else keyset.without_source())
        self._settings = _ReleaseSettings(
            keys=tuple(keys), keyset=worker_keyset, selector=selector, measures=tuple(measures),
            outputs=tuple(outputs), partial_types=dict(partial_types), release_key=release_key,
            testing=testing, threshold_mode=threshold_mode, keys_per_shard=int(keys_per_shard))

    def expand(self, partials):
        owner = f"{type(self).__name__} {self.label!r}"
        for m in self._settings.measures:
            self._settings.release_key.claim(noise_purpose(m.name), owner=owner)
        if self._settings.selector is not None:
            self._settings.release_key.claim(noise_purpose(SELECTION_PURPOSE), owner=owner)
        keyset = self._keyset
        worker_keyset = self._settings.keyset
        threads = threads_for(partials.pipeline, self._threads)
        release = _NoiseAndRelease(self._settings, threads)
        if keyset is None:  # private selection: a fixed number of shards (the data's keys are private)
            totals = self._summed(partials, beam.FlatMap(_route_by_key, self._keys, self._num_shards))
            return totals | "SelectNoiseAndRelease" >> Counted(release, output_type=pa.Table)
        if keyset.in_memory:
            # Shard i is the keyset's chunk i: partials go to the chunk holding their key, and the
            # worker of a shard builds that chunk itself; only chunk numbers cross the shuffle.
            totals = self._summed(partials, beam.FlatMap(_route_by_position, worker_keyset, self._settings.keys_per_shard), [KEYSET_POSITION])
            shards = -(-keyset.size() // self._settings.keys_per_shard)
            schema = worker_keyset.schema()
            keys = (partials.pipeline
                    | "KeysetShards" >> beam.Create(list(range(shards)))
                    | "KeysetMarkers" >> beam.Map(_keyset_marker, schema).with_output_types(_TAGGED))
        else:
            # A PCollection keyset: key shards by the public routing hash, as many as its size
            # needs (its stated size, else counted in the pipeline).
            if keyset.expected_size is not None:
                num_shards = key_shards(keyset.expected_size, self._num_shards, self._settings.keys_per_shard)
            else:
                num_shards = beam.pvalue.AsSingleton(
                    keyset.counted_size()
                    | "KeyShards" >> beam.Map(key_shards, self._num_shards, self._settings.keys_per_shard))
            totals = self._summed(partials, beam.FlatMap(_route_by_key, self._keys, num_shards))
            run_dir = keyset.staging_run
            keys = (keyset.pcollection
                    | "RouteKeyset" >> beam.ParDo(_RouteKeyset(worker_keyset, self._keys, run_dir, threads),
                                                  num_shards)
                    .with_output_types(_SHARD_TABLE))
            if run_dir is not None:  # one marker per shard and bundle crosses the shuffle
                keys = keys | "MergeMarkers" >> beam.CombinePerKey(_MergeMarkersFn()).with_output_types(_SHARD_TABLE)
            keys = keys | "TagKeyset" >> beam.FlatMap(_tagged, _KEYSET).with_output_types(_TAGGED)
        # The keyset join: both sides tagged, one GroupByKey (typed, so tables use the Arrow coder).
        tagged = (keys, totals | "TagTotals" >> beam.FlatMap(_tagged, _TOTALS).with_output_types(_TAGGED))
        return (tagged
                | "FlattenKeysetAndTotals" >> beam.Flatten()
                | "JoinKeyset" >> beam.GroupByKey()
                | "NoiseAndRelease" >> Counted(release, output_type=pa.Table))

    def _summed(self, partials, route, keys=None):
        """Partials routed to key shards by ``route`` and summed per shard (one table each)."""
        return (partials
                | "RouteByKey" >> route.with_output_types(_SHARD_TABLE)
                | "SumPerKeyShard" >> beam.CombinePerKey(_SumPartialsFn(keys or self._keys)))

