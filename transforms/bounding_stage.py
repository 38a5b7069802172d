"""The bounding stage: rows -> exact per-key partials of the bounded contributions (Beam).

Steps 1 and 2 of :class:`~transforms.aggregate.DPAggregate`, usable alone through
:class:`BoundedKeyPartials` by pipelines that release through
:class:`~transforms.release.NoisyRelease` with measures of their own (CentralNotice's user-DP
clicks). The maths is :mod:`transforms.bounding` (priorities and bounding on Arrow tables) and
:mod:`transforms.partials` (per-key partial sums); this module is their Beam wiring:

1. Prepare (per batch, :class:`_PrepareAndBound`): check columns, apply the row rules below,
   drop keys outside a public keyset, give rows their secret priorities and bound the batch (L0
   keys per unit, Linf rows per unit and key), then route the survivors to a shard by a hash of
   the privacy unit.
2. Per unit shard (:class:`_BoundRowsFn`, :class:`_ShardPartials`), the partial batches are
   re-bounded as they meet (bounding by global priorities is mergeable; a CombineFn, so engines
   that lift it re-bound a bundle's batches before the shuffle) and the bounded rows become
   exact per-key partials: count, units, sum, nsum, and what the metrics' :class:`PartialsSpec`
   asks for (sums of squares, quantile-tree nodes, vector coordinates).

Privacy units: every id is first mapped to its one canonical form (:mod:`transforms.privacy_units`:
a number and its numeric text are one unit; text is folded as NFKC_Casefold does, format
characters removed and decimal digits of every script made ASCII), before any hashing, for Arrow
and dict / Row input alike; a unit column whose type cannot hold ids is refused by
:func:`check_schema` before the pipeline runs, and a value without a canonical form fails the job
with :class:`~transforms.privacy_units.UnitIdError`.

Row rules (each counted under namespace ``dp_aggregate``, :mod:`transforms.counting`: pipeline
output and Beam metrics, for the operator and never the release): a null (or NaN) privacy unit,
a null key component or a null / NaN / infinite value drops the row; values outside the clamping
range are clamped (counted as ``clamped_below_min`` / ``clamped_above_max``); rows whose key is
outside the public keyset, or excluded from it, are dropped (``dropped_outside_keyset``,
``dropped_excluded_key``).
A PCollection keyset is tested through a compact filter of its key hashes
(:mod:`transforms.membership`, built by :class:`_KeyFilterFn` or, staged as a file,
:class:`_StagedKeyFilterFn`: no false negatives, about 0.4% false positives); a row that passes it
wrongly is bounded with its unit's rows, then dropped by the exact keyset join of the release
stage (``dropped_outside_keyset_after_bounding``, in namespace ``dp_release``).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from transforms import arrow_coder  # noqa: F401  (registers the Arrow table coder)
from transforms import bounding, keyset_staging
from transforms.arrow_coder import table_list_coder
from transforms.counting import Counted, Counters, CountingDoFn
from transforms.keyset import KEYSET_POSITION, PublicKeyset
from transforms.membership import KeyFilter, filter_words
from transforms.parallel import BATCH_ROWS, ThreadedDoFn, batch_rows, check_threads, threads_for
from transforms.partials import PartialsSpec, key_partials, routing_hash, shard_of, split_by_shard
from transforms.privacy_units import canonical_unit_column, canonical_unit_dictionary, check_unit_type
from transforms.release import keyset_tables
from transforms.tables import as_arrow_table
from transforms.vectors import clip, row_words, vectors_of

#: The namespace of the row rules' counters (module docstring).
NAMESPACE = "dp_aggregate"
#: What bounding claims of its release key (ReleaseKey.claim): the priorities' sub-keys.
BOUNDING_PURPOSE = "bounding"
#: Rows held by a bounding accumulator before it re-bounds them.
COMPACT_ROWS = 200_000


# --------------------------------------------------------------------------- configuration

@dataclass(frozen=True, kw_only=True)
class BoundingConfig:
    """What contribution bounding needs (picklable; shared by the DoFns of one transform).

    unit / keys / value: column names (value None for counts only); bounds: the contribution
    bounds; release_key: derives the secret priorities; keyset: rows outside it are dropped
    before bounding (a PCollection keyset is kept as its columns and exclusions only);
    num_shards: unit and key shards; integer_values: integer sums; midpoint: centre of the
    clamping range (for normalized sums); partials: the partial columns the metrics need beyond
    count, units, sum and nsum (:class:`~transforms.partials.PartialsSpec`; with a vector sum,
    ``value`` is a list column).
    """

    unit: str
    keys: tuple
    value: Optional[str]
    bounds: ContributionBounds
    release_key: ReleaseKey
    keyset: Optional[PublicKeyset] = None
    num_shards: int = 32
    integer_values: bool = False
    midpoint: float = 0.0
    partials: PartialsSpec = PartialsSpec()

    def __post_init__(self):
        keys = (self.keys,) if isinstance(self.keys, str) else tuple(self.keys)
        object.__setattr__(self, "keys", keys)
        if self.keyset is not None and not self.keyset.in_memory:
            object.__setattr__(self, "keyset", self.keyset.without_source())
        if not isinstance(self.release_key, ReleaseKey):
            raise TypeError("release_key must be a ReleaseKey")
        if not isinstance(self.partials, PartialsSpec):
            raise TypeError("partials must be a PartialsSpec")

    @property
    def vector(self):
        """The vector sum's shape (:class:`~transforms.vectors.VectorSpec`), or None."""
        return self.partials.vector

    @property
    def scalar_value(self) -> bool:
        """Whether ``value`` holds numbers (sums, means...), not vectors."""
        return self.value is not None and self.partials.vector is None


def _is_numeric(typ: pa.DataType) -> bool:
    return pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)


def check_schema(schema: pa.Schema, unit: str, keys: Sequence[str], value: Optional[str],
                 vector: bool = False) -> None:
    """Raise ValueError naming the first missing or mistyped column (a privacy-unit column that
    cannot hold ids raises :class:`~transforms.privacy_units.UnitIdError`, a ValueError).
    ``vector``: the value column holds lists of numbers (vector sums)."""
    names = set(schema.names)
    for role, column in [("privacy unit", unit)] + [("key", k) for k in keys] + \
            ([("value", value)] if value else []):
        if column not in names:
            raise ValueError(f"input has no {role} column {column!r} (columns: {sorted(names)})")
        typ = schema.field(column).type
        if vector and column == value:
            if not ((pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ))
                    and _is_numeric(typ.value_type)):
                raise ValueError(f"value column {column!r} must hold lists of numbers for a vector "
                                 f"sum, got {typ}")
            continue
        if pa.types.is_nested(typ) or pa.types.is_map(typ):
            raise ValueError(f"{role} column {column!r} has unsupported type {typ}")
    check_unit_type(schema.field(unit).type, unit)
    if vector:
        return
    if value and not (_is_numeric(schema.field(value).type) or pa.types.is_null(schema.field(value).type)):
        raise ValueError(f"value column {value!r} must be numeric, got {schema.field(value).type}")


# --------------------------------------------------------------------------- DoFns

class _ToArrowTables(beam.DoFn):
    """Pass Arrow batches through, convert pandas / Polars DataFrames; buffer dicts / Rows into
    Arrow tables.

    The privacy-unit column of dict rows may mix types (7, 7.0, "7"): it is built with
    :func:`~transforms.privacy_units.canonical_unit_column`, one canonical id per row.
    """

    def __init__(self, columns: Sequence[str], unit: str, batch_rows: int = BATCH_ROWS):
        self._columns = list(columns)
        self._unit = unit
        self._batch_rows = batch_rows

    def start_bundle(self):
        self._rows = []

    def process(self, element):
        table = as_arrow_table(element)
        if table is not None:
            yield table
        else:
            if not isinstance(element, dict):
                element = element._asdict() if hasattr(element, "_asdict") else dict(element.__dict__)
            self._rows.append(element)
            if len(self._rows) >= self._batch_rows:
                yield self._flush()

    def _flush(self):
        rows, self._rows = self._rows, []
        columns = {}
        for name in self._columns:
            if name not in rows[0]:
                raise ValueError(f"input rows have no column {name!r} (keys: {sorted(rows[0])})")
            values = [r.get(name) for r in rows]
            columns[name] = canonical_unit_column(values, name) if name == self._unit else \
                pa.array(values, from_pandas=True)
        return pa.table(columns)

    def finish_bundle(self):
        if self._rows:
            yield WindowedValue(self._flush(), MIN_TIMESTAMP, [GlobalWindow()])


class _PrepareAndBound(CountingDoFn, ThreadedDoFn, beam.DoFn):
    """Row rules, keyset filter, priorities and per-batch bounding; routes rows by unit shard.

    threads > 1 (:func:`~transforms.parallel.threads_for`: the in-process engine's profile):
    batches are prepared on that many threads of this DoFn instance
    (:class:`~transforms.parallel.OrderedThreads`: outputs in input order, with their input's
    timestamp and window, counters counted on the bundle's thread). Each batch's result is a
    function of the batch alone: threads change no output."""

    def __init__(self, config: BoundingConfig, by_position: bool = False, threads: int = 1):
        self._c = config
        self._by_position = by_position
        self._threads(threads, "dp-prepare")
        self._counts = Counters(NAMESPACE)
        self._staged_filter = (None, None)  # (path, KeyFilter) of a staged keyset filter

    def setup(self):
        if self._work.threaded and self._c.keyset is not None and self._c.keyset.in_memory:
            self._c.keyset.size()  # its distinct keys, built once here rather than by each thread
        super().setup()

    def process(self, table: pa.Table, keyset_filter, timestamp=beam.DoFn.TimestampParam,
                window=beam.DoFn.WindowParam):
        key_filter = self._filter(keyset_filter) if keyset_filter is not None else None
        yield from self._submit(self._prepare, (table, key_filter), timestamp, window)

    def count(self, name, amount):
        self._counts.inc(name, amount)

    def _filter(self, side) -> KeyFilter:
        """The keyset filter from its side input: its bytes, or the path of its staged file
        (loaded once per DoFn instance; transforms.keyset_staging)."""
        if not isinstance(side, str):
            return KeyFilter.from_bytes(side)
        if self._staged_filter[0] != side:
            self._staged_filter = (side, keyset_staging.load_filter(side))
        return self._staged_filter[1]

    def _prepare(self, table: pa.Table, key_filter: Optional[KeyFilter]):
        """One batch -> ([(unit shard, bounded rows)], {counter: amount}): a pure function of
        the batch (and the filter), so batches may be prepared on several threads at once."""
        c = self._c
        counts = {}

        def count(name, amount):
            if amount:
                counts[name] = counts.get(name, 0) + int(amount)
        check_schema(table.schema, c.unit, c.keys, c.value, vector=c.vector is not None)
        count("rows_read", table.num_rows)
        columns = [c.unit, *c.keys] + ([c.value] if c.value else [])
        table = table.select(columns)
        # One canonical id per privacy unit before any hashing (7, 7.0 and "7" are one unit);
        # NaN is no id. Raises UnitIdError (naming the column) for a value without a canonical form.
        # As a dictionary of distinct canonical ids: each distinct raw id is canonicalised once.
        table = table.set_column(0, c.unit, canonical_unit_dictionary(table.column(c.unit), c.unit))
        valid = pc.is_valid(table.column(c.unit)).to_numpy(zero_copy_only=False)
        count("dropped_null_privacy_unit", (~valid).sum())
        key_valid = np.ones(table.num_rows, dtype=bool)
        for k in c.keys:
            key_valid &= pc.is_valid(table.column(k)).to_numpy(zero_copy_only=False)
        count("dropped_null_key", (valid & ~key_valid).sum())
        valid &= key_valid
        if c.vector is not None:
            _, ok = vectors_of(table.column(c.value), c.vector.dimension)
            count("dropped_invalid_vector", (valid & ~ok).sum())
            valid &= ok
        elif c.value:
            raw = table.column(c.value)
            values = pc.cast(raw, pa.float64()).to_numpy(zero_copy_only=False) \
                if not pa.types.is_null(raw.type) else np.full(table.num_rows, np.nan)
            finite = np.isfinite(values)
            count("dropped_invalid_value", (valid & ~finite).sum())
            valid &= finite
        table = table.filter(pa.array(valid))
        if c.keyset is not None and table.num_rows:
            table = c.keyset.cast_like(table)
            excluded = c.keyset.excluded_mask(table)
            count("dropped_excluded_key", excluded.sum())
            if c.keyset.in_memory:
                # Rows keep their key's position in the keyset: after bounding it replaces the
                # key columns (8 bytes per row through the shuffle; NoisyRelease joins on it).
                position = c.keyset.positions(table)
                inside = position >= 0
                count("dropped_outside_keyset", (~inside & ~excluded).sum())
                table = table.filter(pa.array(inside))
                if self._by_position:
                    table = table.append_column(KEYSET_POSITION, pa.array(position[inside]))
            else:
                # A PCollection keyset is too large to hold: a compact filter of its key hashes
                # (a side input; no false negatives) drops rows before bounding, and the exact
                # join before release removes the filter's rare false positives (counted there).
                inside = key_filter.contains(routing_hash(table.select(c.keys)))
                count("dropped_outside_keyset", (~inside & ~excluded).sum())
                table = table.filter(pa.array(inside & ~excluded))
        if not table.num_rows:
            return [], list(counts.items())
        extra_words = None
        if c.vector is not None:
            matrix, _ = vectors_of(table.column(c.value), c.vector.dimension)
            clipped = clip(matrix, c.vector.max_norm, c.vector.norm)
            count("clipped_vector_norm", (np.any(clipped != matrix, axis=1)).sum())
            table = table.drop_columns([c.value])
            for j, name in enumerate(c.vector.columns):
                table = table.append_column(name, pa.array(clipped[:, j]))
            extra_words = row_words(clipped)
        elif c.value:
            values = pc.cast(table.column(c.value), pa.float64()).to_numpy(zero_copy_only=False)
            low, high = c.bounds.value_range()
            count("clamped_below_min", (values < low).sum())
            count("clamped_above_max", (values > high).sum())
            table = table.drop_columns([c.value]).append_column(
                bounding.VALUE, pa.array(np.clip(values, low, high)))
        table = bounding.prioritize(table, c.unit, c.keys, c.release_key,
                                   bounding.VALUE if c.scalar_value else None,
                                   extra_words).drop_columns([c.unit])
        table = bounding.bound(table, c.bounds.max_partitions, c.bounds.max_contributions_per_partition)
        if not c.value and c.bounds.max_contributions is None:  # rows are (unit, key) only
            table = bounding.without_row_priority(table)
        if KEYSET_POSITION in table.column_names:
            table = table.drop_columns(list(c.keys))
        shards = shard_of(table.column(bounding.UNIT).to_numpy(), c.num_shards)
        return list(split_by_shard(table, shards)), list(counts.items())


class _BoundRowsFn(beam.CombineFn):
    """Per unit shard: bounded batches -> the shard's bounded rows, re-bounded as they meet.

    Bounding by row-content priorities is mergeable (``bound(bound(A) + bound(B)) ==
    bound(A + B)``, :mod:`transforms.bounding`), so any grouping of the batches gives the same
    rows. As a CombineFn it is lifted by engines that can (the in-process engine, Dataflow): a
    bundle's batches are re-bounded before the shuffle (``compact``), so a unit with rows in many
    batches (a heavy reader is in every one) crosses the shuffle about once per bundle, not once
    per batch. The accumulator is a list of tables (:func:`transforms.bounding.accumulate`:
    re-bounded when it doubles, so it holds at most about twice its bounded rows).
    """

    def __init__(self, max_partitions: int, max_per_partition: int, min_rows: int = COMPACT_ROWS):
        self._l0, self._linf, self._min_rows = max_partitions, max_per_partition, min_rows

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, table):
        return bounding.accumulate(accumulator, table, self._l0, self._linf, self._min_rows)

    def merge_accumulators(self, accumulators):
        return self.compact([t for accumulator in accumulators for t in accumulator])

    def compact(self, accumulator):
        return bounding.rebound(accumulator, self._l0, self._linf)

    def extract_output(self, accumulator):
        return self.compact(accumulator)[0] if accumulator else None

    def get_accumulator_coder(self):
        return table_list_coder()


class _ShardPartials(beam.DoFn):
    """One unit shard's bounded rows -> exact per-key partials (the total bound L1 applied)."""

    def __init__(self, config: BoundingConfig):
        self._c = config

    def process(self, element):
        _, bounded = element
        c = self._c
        if bounded is None or not bounded.num_rows:
            return
        if c.bounds.max_contributions is not None:
            bounded = bounding.bound_total(bounded, c.bounds.max_contributions)
        keys = [KEYSET_POSITION] if KEYSET_POSITION in bounded.column_names else c.keys
        yield key_partials(bounded, keys, has_value=c.scalar_value, midpoint=c.midpoint,
                           integer_sum=c.integer_values, spec=c.partials)


class _KeyFilterFn(beam.CombineFn):
    """A PCollection keyset's key hashes -> one :class:`~transforms.membership.KeyFilter`, as bytes
    (a side input read in place with ``KeyFilter.from_bytes``: never pickled, never copied per
    bundle).

    Inputs are ``(num_words, hashes)``: the filter's size travels with the hashes (from the
    keyset's stated size, or its count in the pipeline). The accumulator is the filter's words
    (None before any input); filters merge by OR, so the result does not depend on how the
    keyset was split into elements, bundles or partitions."""

    def create_accumulator(self):
        return None

    def add_input(self, accumulator, element):
        num_words, hashes = element
        accumulator = self._writable(accumulator, num_words)
        KeyFilter(accumulator).add(hashes)
        return accumulator

    @staticmethod
    def _writable(words, num_words) -> np.ndarray:
        """Words to add to: new zero words for no accumulator, a copy of read-only ones (decoded
        from the coder's bytes)."""
        if words is None:
            return np.zeros(int(num_words), dtype=np.uint64)
        return words if words.flags.writeable else words.copy()

    def merge_accumulators(self, accumulators):
        merged = None
        for words in accumulators:
            if words is None:
                continue
            if merged is None:
                merged = words if words.flags.writeable else words.copy()
            else:
                KeyFilter(merged).union(KeyFilter(words))
        return merged

    def extract_output(self, accumulator) -> bytes:
        """The filter's bytes; an empty keyset gives a one-word filter holding no key."""
        return (KeyFilter.empty(1) if accumulator is None else KeyFilter(accumulator)).to_bytes()

    def get_accumulator_coder(self):
        return _FilterWordsCoder()


class _FilterWordsCoder(beam.coders.Coder):
    """A filter's words (or None: no bytes) as raw little-endian bytes."""

    def encode(self, words) -> bytes:
        return b"" if words is None else KeyFilter(words).to_bytes()

    def decode(self, encoded: bytes):
        return KeyFilter.from_bytes(encoded).words if encoded else None

    def is_deterministic(self) -> bool:
        return True


class _AddingFilter:
    """A staged filter's words with at most one add running on a background thread."""

    __slots__ = ("words", "adding")

    def __init__(self, words: np.ndarray):
        self.words, self.adding = words, None

    def settled(self) -> np.ndarray:
        """The words once the add in flight (if any) is done; raises what it raised."""
        if self.adding is not None:
            adding, self.adding = self.adding, None
            adding.result()
        return self.words


def _settled(accumulator):
    return accumulator.settled() if isinstance(accumulator, _AddingFilter) else accumulator


class _StagedKeyFilterFn(_KeyFilterFn):
    """:class:`_KeyFilterFn` for a staged keyset (:mod:`transforms.keyset_staging`): the result
    is the path of the filter's file under the staging run, and an accumulator leaves its worker
    as such a file too (``compact``, called by engines that lift the combine before the shuffle),
    so the filter (2 bytes per key) never crosses a shuffle or a side input as bytes (copies
    through the engine's data plane: one file write instead). Accumulators merge by OR whether they are words or staged files; the filter's
    bytes are those :class:`_KeyFilterFn` gives.

    background (the in-process engine's threads, :func:`~transforms.parallel.threads_for`): each
    add runs on one background thread while the engine prepares the next input (reading and
    hashing the keyset, routing it); one add at a time, and every use of an accumulator other
    than adding to it (merge, compact, extract, the coder) waits for its add first. Adding a
    large keyset is random reads and writes all over a large array, which would otherwise hold
    up the stage."""

    def __init__(self, run_dir: str, background: bool = False):
        self._run_dir = run_dir
        self._background = background
        self._pool = None

    def __getstate__(self):
        return {"_run_dir": self._run_dir, "_background": self._background, "_pool": None}

    def teardown(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def add_input(self, accumulator, element):
        if isinstance(accumulator, str):  # a staged accumulator given more input: its words
            accumulator = keyset_staging.load_filter(accumulator).words  # (read-only: _writable copies)
        if not self._background:
            return super().add_input(accumulator, element)
        num_words, hashes = element
        if not isinstance(accumulator, _AddingFilter):
            accumulator = _AddingFilter(self._writable(accumulator, num_words))
        accumulator.settled()  # one add at a time: no two threads write the words
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="dp-filter")
        accumulator.adding = self._pool.submit(KeyFilter(accumulator.words).add, hashes)
        return accumulator

    def merge_accumulators(self, accumulators):
        present = [_settled(a) for a in accumulators if a is not None]
        if len(present) <= 1:  # one staged file stays a file
            return present[0] if present else None
        return super().merge_accumulators(
            [keyset_staging.load_filter(a).words if isinstance(a, str) else a for a in present])

    def compact(self, accumulator):
        accumulator = _settled(accumulator)
        if isinstance(accumulator, np.ndarray):
            return keyset_staging.stage_filter(KeyFilter(accumulator).to_bytes(), self._run_dir)
        return accumulator

    def extract_output(self, accumulator) -> str:
        """The staged filter's path (an empty keyset: a one-word filter holding no key)."""
        if accumulator is None:
            accumulator = KeyFilter.empty(1).words
        return self.compact(accumulator)

    def get_accumulator_coder(self):
        return _StagedFilterCoder()


class _StagedFilterCoder(beam.coders.Coder):
    """A staged filter's accumulator: None (no bytes), a staged file's path (b"P" + UTF-8) or
    words not yet staged (b"W" + little-endian words; an add in flight is waited for)."""

    def encode(self, accumulator) -> bytes:
        accumulator = _settled(accumulator)
        if accumulator is None:
            return b""
        if isinstance(accumulator, str):
            return b"P" + accumulator.encode("utf-8")
        return b"W" + _FilterWordsCoder().encode(accumulator)

    def decode(self, encoded: bytes):
        if not encoded:
            return None
        if encoded[:1] == b"P":
            return encoded[1:].decode("utf-8")
        return _FilterWordsCoder().decode(encoded[1:])

    def is_deterministic(self) -> bool:
        return True


def _sized_hashes(table: pa.Table, num_words: int):
    return int(num_words), routing_hash(table)


class BoundedKeyPartials(beam.PTransform):
    """Rows -> exact per-key partials (count, units, sum, nsum) of the bounded contributions.

    Steps 1 and 2 of DPAggregate, usable alone by pipelines that release through
    :class:`~transforms.release.NoisyRelease` with measures of their own (CentralNotice's
    user-DP clicks). Not to be confused with ARA's on-device contribution bounding
    (:mod:`transforms.ara`), which drops reports beyond an L1 budget.

    pcollection_keyset: the PCollection keyset (a :class:`~transforms.keyset.PublicKeyset`
    with its PCollection) whose membership filter drops rows before bounding, if any.

    threads: threads preparing and bounding batches in each DoFn instance (None: the
    pipeline's ``--dofn_threads``, which also caps it: :func:`~transforms.parallel.threads_for`).
    No output depends on it.

    by_position (with an in-memory keyset in the config): bounded rows and partials carry the
    key's keyset position (:data:`~transforms.keyset.KEYSET_POSITION`, what NoisyRelease joins
    an in-memory keyset on) in place of the key columns; priorities are still of the key's
    values, so the same rows are kept.
    """

    def __init__(self, config: "BoundingConfig", pcollection_keyset: PublicKeyset = None,
                 label=None, *, by_position: bool = False, threads: Optional[int] = None):
        super().__init__(label)
        if by_position and (config.keyset is None or not config.keyset.in_memory):
            raise ValueError("by_position needs an in-memory keyset in the bounding config")
        check_threads(threads)
        self._by_position = by_position
        self._c = config
        self._pcollection_keyset = pcollection_keyset
        self._threads = threads

    def expand(self, pcoll):
        c = self._c
        # One application per key object: the same priorities on other input would keep rows
        # chosen by the same secret, and two transforms must not share a stream.
        c.release_key.claim(BOUNDING_PURPOSE, owner=f"{type(self).__name__} {self.label!r}")
        columns = [c.unit, *c.keys] + ([c.value] if c.value else [])
        threads = threads_for(pcoll.pipeline, self._threads)
        side = None  # the keyset filter (a side input), passed positionally: process() also
        # takes the element's timestamp and window, which Beam cannot mix with side-input kwargs
        if self._pcollection_keyset is not None:
            keyset = self._pcollection_keyset
            if keyset.expected_size is not None:  # stated (public): the filter is sized now
                num_words = filter_words(keyset.expected_size)
            else:  # counted in the pipeline first (once per keyset: the release shares it)
                num_words = beam.pvalue.AsSingleton(
                    keyset.counted_size() | "FilterWords" >> beam.Map(filter_words))
            hashes = (keyset.pcollection
                      | "KeysetTables" >> beam.Map(keyset_tables, list(c.keys)).with_output_types(pa.Table)
                      | "KeysetHashes" >> beam.Map(_sized_hashes, num_words))
            if c.keyset.staging_run is not None:  # a staged file's path instead of the bytes
                keyset_filter = hashes | "KeysetFilter" >> beam.CombineGlobally(
                    _StagedKeyFilterFn(c.keyset.staging_run, background=threads > 1)).with_output_types(str)
            else:
                keyset_filter = hashes | "KeysetFilter" >> beam.CombineGlobally(
                    _KeyFilterFn()).with_output_types(bytes)
            side = beam.pvalue.AsSingleton(keyset_filter)
        # Dict rows are gathered into tables of --dofn_batch_rows rows (the last one emitted by
        # finish_bundle; Arrow batches are faster). Bounding never depends on batching.
        return (pcoll
                | "ToArrow" >> beam.ParDo(_ToArrowTables(columns, c.unit, batch_rows(pcoll.pipeline)))
                .with_output_types(pa.Table)
                | "PrepareAndBound" >> Counted(_PrepareAndBound(c, self._by_position, threads), side,
                                               output_type=Tuple[int, pa.Table])
                | "BoundPerUnitShard" >> beam.CombinePerKey(
                    _BoundRowsFn(c.bounds.max_partitions, c.bounds.max_contributions_per_partition))
                .with_output_types(Tuple[int, pa.Table])
                | "ShardPartials" >> beam.ParDo(_ShardPartials(c)).with_output_types(pa.Table))

