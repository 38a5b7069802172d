"""Input tables: Arrow, pandas and Polars DataFrames, dict rows, Parquet files -- and their
schema before a run.

:func:`as_arrow_table` turns an element into an Arrow table without importing pandas or Polars
(a DataFrame's own module is loaded already when one is given). :func:`static_schema` reads the
schema of a PCollection whose contents are known at construction (``beam.Create`` of tables,
DataFrames or dicts; Beam schema'd rows), so a misspelt column fails when the pipeline is built,
naming the missing column and the columns present, instead of inside a worker.
:class:`ReadParquetTables` reads Parquet files as Arrow tables from a glob that may be relative
(:func:`transforms.file_patterns.normalize_glob`: Beam's file systems need an absolute local path) and states their schema
at construction.
"""
from __future__ import annotations

from typing import Optional

import apache_beam as beam
import pyarrow as pa

from transforms.file_patterns import normalize_glob


def _is_dataframe(element, module: str) -> bool:
    typ = type(element)
    return typ.__name__ == "DataFrame" and typ.__module__.split(".")[0] == module


def as_arrow_table(element) -> Optional[pa.Table]:
    """An Arrow table for an Arrow table / RecordBatch or a pandas / Polars DataFrame; None for
    anything else (dicts and Rows are batched by the caller)."""
    if isinstance(element, pa.Table):
        return element
    if isinstance(element, pa.RecordBatch):
        return pa.Table.from_batches([element])
    if _is_dataframe(element, "polars"):
        return element.to_arrow()
    if _is_dataframe(element, "pandas"):
        return pa.Table.from_pandas(element, preserve_index=False)
    return None


def static_schema(pcoll) -> Optional[pa.Schema]:
    """The schema of ``pcoll``'s rows if it is known before the run, else None."""
    element_type = getattr(pcoll, "element_type", None)
    fields = getattr(element_type, "_fields", None)
    if fields:  # a schema'd PCollection (beam.Row / NamedTuple with a schema)
        return pa.schema([pa.field(name, pa.null()) for name, _ in fields])
    # beam.Create (and ReadParquetTables) expand into inner transforms: the producer is their
    # last part, so look for the composite that outputs this very PCollection.
    node, transform = getattr(pcoll, "producer", None), None
    while node is not None:
        candidate = getattr(node, "transform", None)
        if isinstance(candidate, (beam.Create, ReadParquetTables)):
            transform = candidate
            break
        node = getattr(node, "parent", None)
    if transform is None or pcoll not in node.outputs.values():
        return None
    if isinstance(transform, ReadParquetTables):
        return transform.arrow_schema
    values = getattr(transform, "values", None)
    if not values:
        return None
    first = next(iter(values))
    table = as_arrow_table(first)
    if table is not None:
        return table.schema
    if isinstance(first, dict):
        return pa.schema([pa.field(name, pa.null()) for name in first])
    if hasattr(first, "_asdict"):
        return pa.schema([pa.field(name, pa.null()) for name in first._asdict()])
    return None


class ReadParquetTables(beam.PTransform):
    """Parquet files matching ``pattern`` (relative globs work) -> Arrow tables (batches).

    At construction the pattern must match at least one file, and the first file's schema is
    read (``arrow_schema``), so a DPAggregate applied to the output checks its columns before
    the pipeline runs. ``columns``: read only these.
    """

    def __init__(self, pattern: str, columns=None, label=None):
        super().__init__(label)
        from apache_beam.io.filesystems import FileSystems

        from transforms import parquet_files

        self.pattern = normalize_glob(pattern)
        matched = sorted(m.path for m in FileSystems.match([self.pattern])[0].metadata_list)
        if not matched:
            raise FileNotFoundError(f"no files match {pattern!r} (looked for {self.pattern})")
        # Only the footer is read (the handles of local and GCS files are seekable).
        with FileSystems.open(matched[0], compression_type="uncompressed") as handle:
            schema = parquet_files.open_file(handle).schema_arrow
        self.columns = list(columns) if columns is not None else None
        self.arrow_schema = schema if self.columns is None else pa.schema(
            [schema.field(c) for c in self.columns if c in schema.names])

    def expand(self, pbegin):
        # Not Beam's ReadFromParquetBatched: it cannot verify page checksums
        # (transforms/parquet_files.py). Work is split by row group, as Beam's source splits it.
        from apache_beam.io import fileio

        return (pbegin
                | "Match" >> fileio.MatchFiles(self.pattern)
                | "RowGroups" >> beam.FlatMap(_row_groups)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.FlatMap(_read_row_group, self.columns))


def _row_groups(metadata):
    """(path, index) of every row group of a matched Parquet file (its footer is read)."""
    from apache_beam.io.filesystems import FileSystems

    from transforms import parquet_files

    with FileSystems.open(metadata.path, compression_type="uncompressed") as handle:
        groups = parquet_files.open_file(handle).num_row_groups
    return [(metadata.path, group) for group in range(groups)]


def _read_row_group(place, columns):
    """One row group as an Arrow table, its pages' checksums verified."""
    from apache_beam.io.filesystems import FileSystems

    from transforms import parquet_files

    path, group = place
    with FileSystems.open(path, compression_type="uncompressed") as handle:
        yield parquet_files.open_file(handle).read_row_group(group, columns=columns,
                                                             use_threads=False)


class WriteReleasedParquet(beam.PTransform):
    """Released Arrow tables -> one Parquet file at ``path``, rows sorted by ``keys``.

    A release arrives as several tables (one per key shard) in no fixed order; written as they
    come, the file's row order would follow arrival order, which no release may show (see
    :mod:`transforms.release`, "Output order"). This sink gathers the tables (a release has one
    row per key) and writes them with the project's one released-file encoder
    (:mod:`transforms.released_files`: sorted by the key columns, zstd Parquet), so the same
    release gives the same bytes as a job's output. ``schema`` (e.g.
    ``aggregate.output_schema()``; key columns typed null there take the data's type; default:
    the data's own) is the file's.
    """

    def __init__(self, path: str, *, keys, schema: pa.Schema = None, label=None):
        super().__init__(label)
        self.path = normalize_glob(path)
        self.keys = [keys] if isinstance(keys, str) else list(keys)
        self.schema = schema

    def expand(self, released):
        return (released
                | "Gather" >> beam.combiners.ToList()
                | "SortAndWrite" >> beam.Map(_write_sorted, self.path, self.keys, self.schema))


def _write_sorted(tables, path, keys, schema):
    from apache_beam.io.filesystems import FileSystems

    from transforms.released_files import conform, encode

    if schema is None:
        present = [t.schema for t in tables if t.num_rows]
        schema = pa.unify_schemas(present, promote_options="permissive") if present else \
            pa.schema([(k, pa.null()) for k in keys])
    data = encode(conform(tables, schema=schema, sort_by=keys, name=path), "parquet")
    with FileSystems.create(path) as handle:
        handle.write(data)
    return path
