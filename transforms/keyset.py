"""Public keysets: the keys a release reports, fixed before looking at the data.

A :class:`PublicKeyset` comes from a list of keys, an Arrow table, a file (CSV, Parquet, or text
with one value per line), the cross product of per-dimension values, or a PCollection (for
millions of keys). Exclusions (e.g. a country protection list) remove keys by column value.

Semantics used by :class:`~transforms.aggregate.DPAggregate`: rows whose key is outside the
keyset are dropped before aggregation (counted in the operator's metrics); every key of the
keyset is released, with noise, even when no row has it; no key outside it can appear.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.noise.encoding import encode_keys

#: Keys per batch when an in-memory keyset is materialised (:meth:`PublicKeyset.batches`,
#: :meth:`PublicKeyset.to_table`; the release stage slices its own chunks of ``KEYS_PER_SHARD``).
KEYSET_BATCH_ROWS = 50_000
#: The column that may stand for the key columns in per-key data of an in-memory keyset: the
#: key's position in the keyset order (:meth:`PublicKeyset.positions`), one int64 instead of the
#: key's values (what bounded rows and partials carry through a shuffle).
KEYSET_POSITION = "__keyset_position"


class PublicKeyset:
    """A public set of keys over named columns, with optional exclusions."""

    def __init__(self, columns: Sequence[str], *, table: pa.Table = None,
                 dimensions: Mapping[str, pa.Array] = None, pcollection=None,
                 exclusions: Mapping[str, Sequence] = None, expected_size: Optional[int] = None,
                 staging_dir: Optional[str] = None, staging_run: Optional[str] = None):
        self.columns = list(columns)
        #: A PCollection keyset's number of keys as stated by its owner (public; an estimate
        #: is enough): it sizes the release's key shards up front (else they are counted).
        self.expected_size = None if expected_size is None else int(expected_size)
        #: Where a PCollection keyset's key shards (and its membership filter) are staged as
        #: files instead of crossing the shuffle (:mod:`transforms.keyset_staging`): this
        #: keyset's own directory under ``staging_dir``; None: the shuffle.
        if staging_dir is not None and staging_run is None:
            from transforms.keyset_staging import run_directory
            staging_run = run_directory(staging_dir)
        self.staging_run = staging_run
        if not self.columns:
            raise ValueError("a keyset needs at least one key column")
        self._table = table
        self._dimensions = dimensions
        self.pcollection = pcollection
        self.exclusions = {c: list(v) for c, v in (exclusions or {}).items()}
        unknown = set(self.exclusions) - set(self.columns)
        if unknown:
            raise ValueError(f"exclusions name columns that are not key columns: {sorted(unknown)}")

    # ----------------------------------------------------------------- constructors
    @classmethod
    def from_keys(cls, keys: Iterable, columns: Sequence[str]) -> "PublicKeyset":
        keys = [k if isinstance(k, tuple) else (k,) for k in keys]
        if any(len(k) != len(columns) for k in keys):
            raise ValueError(f"every key must have {len(columns)} values ({list(columns)})")
        table = pa.table({c: pa.array([k[i] for k in keys]) for i, c in enumerate(columns)}) \
            if keys else pa.table({c: pa.array([], pa.string()) for c in columns})
        return cls(columns, table=table)

    @classmethod
    def from_table(cls, table: pa.Table, columns: Sequence[str] = None) -> "PublicKeyset":
        columns = list(columns or table.column_names)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(f"keyset table has no column {missing[0]!r}")
        return cls(columns, table=table.select(columns))

    @classmethod
    def from_file(cls, path: str, columns: Sequence[str]) -> "PublicKeyset":
        """CSV (with a header), Parquet, or a text file of one value per line (one column)."""
        if path.endswith(".parquet"):
            from transforms import parquet_files
            table = parquet_files.read_table(path, columns=list(columns))
        elif path.endswith(".csv"):
            from pyarrow import csv
            table = csv.read_csv(path, convert_options=csv.ConvertOptions(include_columns=list(columns)))
        else:
            if len(columns) != 1:
                raise ValueError("a text keyset file holds one column; use CSV or Parquet for more")
            with open(path) as handle:
                values = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
            table = pa.table({columns[0]: pa.array(values, pa.string())})
        return cls.from_table(table, columns)

    @classmethod
    def cross_product(cls, dimensions: Mapping[str, Sequence]) -> "PublicKeyset":
        """Every combination of per-dimension values (never materialised as a whole).

        The one way to build a cross-product keyset in this project (jobs included): workers
        build each batch from offsets (:meth:`batch_at`); :meth:`to_table` materialises it.
        """
        if not dimensions:
            raise ValueError("cross_product needs at least one dimension")
        dims = {c: pc.unique(pa.array(list(v))) for c, v in dimensions.items()}
        return cls(list(dims), dimensions=dims)

    @classmethod
    def from_pcollection(cls, pcollection, columns: Sequence[str],
                         expected_size: Optional[int] = None,
                         staging_dir: Optional[str] = None) -> "PublicKeyset":
        """Keys as a PCollection of dicts, tuples, or Arrow RecordBatches/Tables.

        ``expected_size``: about how many keys it holds (public, like the keys; e.g. the row
        count of the keyset files). It sizes the release's key shards before the keyset is read
        (:func:`transforms.release.key_shards`); without it the pipeline counts the keys first,
        and some runners (the in-process one) then hold the whole keyset once more. It also
        sizes the keyset's membership filter (:mod:`transforms.membership`).

        ``staging_dir``: a directory every worker reads and writes (Beam ``FileSystems``) where
        the keyset's key shards and membership filter are staged as files instead of crossing
        the shuffle or a side input, so that engines holding a shuffle in memory (the in-process
        engine, a cluster's workers) never hold the keyset. The files go to this keyset's own directory,
        :attr:`staging_run`, which the pipeline never deletes: remove it when the pipeline has
        finished. See :mod:`transforms.keyset_staging`."""
        if expected_size is not None and expected_size < 0:
            raise ValueError(f"expected_size must be >= 0, got {expected_size}")
        return cls(columns, pcollection=pcollection, expected_size=expected_size,
                   staging_dir=staging_dir)

    def counted_size(self):
        """A PCollection keyset's key count (before exclusions and de-duplication) as a
        one-element PCollection, counted in the pipeline once per keyset object: the release's
        key shards and the bounding's membership filter are both sized from it when no
        ``expected_size`` is stated."""
        if self.pcollection is None:
            raise TypeError("counted_size needs a PCollection keyset")
        if getattr(self, "_counted", None) is None:
            import apache_beam as beam
            self._counted = (self.pcollection
                             | "KeysetSize" >> beam.Map(keyset_rows)
                             | "SumKeysetSize" >> beam.CombineGlobally(sum))
        return self._counted

    def exclude(self, column: str, values: Sequence) -> "PublicKeyset":
        """A keyset without the keys whose ``column`` is in ``values``."""
        exclusions = {**self.exclusions}
        exclusions[column] = list(exclusions.get(column, [])) + list(values)
        return PublicKeyset(self.columns, table=self._table, dimensions=self._dimensions,
                            pcollection=self.pcollection, exclusions=exclusions,
                            expected_size=self.expected_size, staging_run=self.staging_run)

    def without_source(self) -> "PublicKeyset":
        """The keyset's columns and exclusions only (what workers need of a PCollection keyset)."""
        stripped = PublicKeyset(self.columns, exclusions=self.exclusions, expected_size=self.expected_size,
                                staging_run=self.staging_run)
        stripped._external = True
        return stripped

    # ----------------------------------------------------------------- queries
    @property
    def in_memory(self) -> bool:
        return self.pcollection is None and not getattr(self, "_external", False)

    def size(self) -> Optional[int]:
        """Number of distinct keys before exclusions (None for a PCollection keyset)."""
        if self._table is not None:
            return self._distinct_table().num_rows
        if self._dimensions is not None:
            return int(np.prod([len(v) for v in self._dimensions.values()], dtype=np.int64))
        return None

    def excluded_mask(self, table: pa.Table) -> np.ndarray:
        mask = np.zeros(table.num_rows, dtype=bool)
        for column, values in self.exclusions.items():
            col = table.column(column)
            mask |= pc.fill_null(pc.is_in(col, value_set=pa.array(values).cast(col.type)), False) \
                .to_numpy(zero_copy_only=False)
        return mask

    def cast_like(self, table: pa.Table) -> pa.Table:
        """Cast ``table``'s key columns to the keyset's types (so encodings can match)."""
        schema = self.schema()
        if schema is None:
            return table
        for name in self.columns:
            want = schema.field(name).type
            index = table.column_names.index(name)
            if table.column(index).type != want:
                try:
                    table = table.set_column(index, name, pc.cast(table.column(index), want))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                    raise ValueError(f"key column {name!r} ({table.column(index).type}) cannot be "
                                     f"matched with the keyset's type {want}: {err}")
        return table

    def schema(self) -> Optional[pa.Schema]:
        if self._table is not None:
            return self._table.schema
        if self._dimensions is not None:
            return pa.schema([(c, v.type) for c, v in self._dimensions.items()])
        return None

    def member_mask(self, table: pa.Table) -> np.ndarray:
        """Rows of ``table`` whose key is in the keyset (in-memory keysets; exclusions apply)."""
        return self.positions(table) >= 0

    def _distinct_table(self) -> pa.Table:
        """The table keyset with each key once (its first occurrence), in keyset order."""
        if not hasattr(self, "_distinct"):
            encoded = encode_keys(self._table)
            first = pc.index_in(encoded, value_set=encoded).to_numpy(zero_copy_only=False)
            keep = first == np.arange(len(first))
            # _encoded_keys first: a thread that sees _distinct (DoFns may run on threads,
            # transforms.parallel) finds both; two threads building it at once build the same.
            self._encoded_keys = encoded if keep.all() else encoded.filter(pa.array(keep))
            self._distinct = self._table if keep.all() else self._table.filter(pa.array(keep))
        return self._distinct

    def positions(self, table: pa.Table) -> np.ndarray:
        """The position of each row's key in the keyset order (the order :meth:`batch_at` slices;
        each key once), or -1 where the key is not in the keyset or is excluded (in-memory
        keysets). Vectorised: one ``index_in`` per dimension of a cross product, or one over the
        encoded keys of a table keyset."""
        keys = self.cast_like(table.select(self.columns))
        if self._dimensions is not None:
            position = np.zeros(keys.num_rows, dtype=np.int64)
            inside = np.ones(keys.num_rows, dtype=bool)
            for column, values in self._dimensions.items():
                index = pc.index_in(keys.column(column), value_set=values)
                inside &= pc.is_valid(index).to_numpy(zero_copy_only=False)
                position = position * len(values) + \
                    pc.fill_null(index, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        elif self._table is not None:
            self._distinct_table()
            index = pc.index_in(encode_keys(keys), value_set=self._encoded_keys)
            inside = pc.is_valid(index).to_numpy(zero_copy_only=False)
            position = pc.fill_null(index, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            raise TypeError("positions needs an in-memory keyset")
        inside &= ~self.excluded_mask(keys)
        return np.where(inside, position, -1)

    def keyed_by_position(self, table: pa.Table) -> pa.Table:
        """``table`` (per-key data) with its key columns replaced by :data:`KEYSET_POSITION`,
        rows of keys outside the keyset (or excluded) dropped; a table already keyed by position
        is returned as it is. In-memory keysets."""
        if KEYSET_POSITION in table.column_names:
            return table
        position = self.positions(table)
        inside = position >= 0
        if not inside.all():
            table = table.filter(pa.array(inside))
            position = position[inside]
        return table.drop_columns(self.columns).append_column(KEYSET_POSITION, pa.array(position))

    def chunk_starts(self, max_rows: int = KEYSET_BATCH_ROWS) -> list:
        """Start offsets of the keyset's batches of ``max_rows`` keys (for :meth:`batch_at`)."""
        if not self.in_memory:
            raise TypeError("a PCollection keyset has no in-memory batches")
        return list(range(0, self.size(), max_rows))

    def batch_at(self, start: int, max_rows: int = KEYSET_BATCH_ROWS) -> pa.Table:
        """The keys at positions [start, start + max_rows), exclusions applied."""
        if self._table is not None:
            chunk = self._distinct_table().slice(start, max_rows)
        else:
            names = list(self._dimensions)
            values = [self._dimensions[c] for c in names]
            sizes = [len(v) for v in values]
            flat = np.arange(start, min(start + max_rows, self.size()), dtype=np.int64)
            columns = {}
            for i, name in enumerate(names):
                stride = int(np.prod(sizes[i + 1:], dtype=np.int64))
                columns[name] = values[i].take(pa.array((flat // stride) % sizes[i]))
            chunk = pa.table(columns)
        return chunk.filter(pa.array(~self.excluded_mask(chunk)))

    def to_table(self) -> pa.Table:
        """The whole in-memory keyset (exclusions applied) as one table, in keyset order.

        A cross product's order is row-major over its dimensions in the order given (the last
        dimension varies fastest), each dimension's values in first-occurrence order.
        """
        tables = list(self.batches())
        if not tables:
            schema = self.schema()
            return schema.empty_table() if schema is not None else \
                pa.table({c: pa.array([], pa.string()) for c in self.columns})
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def batches(self, max_rows: int = KEYSET_BATCH_ROWS) -> Iterable[pa.Table]:
        """The whole keyset (exclusions applied) as tables of at most ``max_rows`` keys."""
        for start in self.chunk_starts(max_rows):
            yield self.batch_at(start, max_rows)


def keyset_rows(element) -> int:
    """Keys in one element of a PCollection keyset (before exclusions and de-duplication)."""
    return element.num_rows if isinstance(element, (pa.RecordBatch, pa.Table)) else 1


def rows_to_table(rows: Sequence, columns: Sequence[str]) -> pa.Table:
    """Keys given as dicts or tuples -> an Arrow table."""
    if not rows:
        return pa.table({c: pa.array([], pa.string()) for c in columns})
    if isinstance(rows[0], dict):
        return pa.table({c: pa.array([r[c] for r in rows]) for c in columns})
    rows = [r if isinstance(r, tuple) else (r,) for r in rows]
    return pa.table({c: pa.array([r[i] for r in rows]) for i, c in enumerate(columns)})
