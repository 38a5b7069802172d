"""Released files: gathered, put in their public order, encoded deterministically, staged.

Nothing but noisy values and public information may shape a released file, so every output is
sorted by its declared public order (key columns) before it is written -- whatever order the
runner, the shards or the data produced its rows in -- and encoded deterministically (Parquet
with zstd and Arrow's fixed writer, CSV, or JSON lines with sorted keys), so that a re-run with
the same key reproduces the same bytes.
"""
from __future__ import annotations

import io
import json
from typing import Sequence

import apache_beam as beam
import pyarrow as pa

from pipelines.release import storage
from pipelines.release.job import OutputSpec


def conform(tables: Sequence[pa.Table], spec: OutputSpec) -> pa.Table:
    """All released tables of an output as one table with the declared schema, in public order."""
    empty = spec.schema.empty_table()
    parts = [t.select([c for c in spec.schema.names if c in t.column_names]) for t in tables
             if t is not None and t.num_rows]
    table = pa.concat_tables(parts + [empty], promote_options="permissive") if parts else empty
    missing = [c for c in spec.schema.names if c not in table.column_names]
    if missing:
        raise ValueError(f"output {spec.name!r}: the job released no column {missing}")
    table = table.select(spec.schema.names).cast(spec.schema)
    if spec.sort_by and table.num_rows:
        table = table.sort_by([(c, "ascending") for c in spec.sort_by])
    return table.combine_chunks()


def encode(table: pa.Table, spec: OutputSpec) -> bytes:
    sink = io.BytesIO()
    if spec.format == "parquet":
        from transforms import parquet_files

        parquet_files.write_table(table, sink, compression="zstd")
    elif spec.format == "csv":
        from pyarrow import csv as pacsv

        pacsv.write_csv(table, sink)
    else:
        for row in table.to_pylist():
            sink.write((json.dumps(row, sort_keys=True, default=str) + "\n").encode("utf-8"))
    return sink.getvalue()


def decode(data: bytes, spec: OutputSpec) -> pa.Table:
    """Read a released file back (for the public summary).

    Parsed from an Arrow-owned copy of ``data``, never from the Python bytes: this read is often
    a job's last act, and Arrow threads still holding a Python object at interpreter exit abort
    the process with rc 134 after a complete release (see :mod:`pipelines.release.arrow_files`)."""
    if spec.format in ("parquet", "csv"):
        from pipelines.release.arrow_files import arrow_owned, table_from_buffer

        if spec.format == "csv" and not data.strip():
            return spec.schema.empty_table()
        types = {f.name: f.type for f in spec.schema} if spec.format == "csv" else None
        return table_from_buffer(arrow_owned(data), spec.format, column_types=types)
    rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    return pa.Table.from_pylist(rows, schema=spec.schema) if rows else spec.schema.empty_table()


class _WriteStaged(beam.DoFn):
    def __init__(self, folder: str, spec: OutputSpec):
        self._folder, self._spec = folder, spec

    def process(self, tables):
        data = encode(conform(tables, self._spec), self._spec)
        storage.write_bytes(storage.join(self._folder, self._spec.name), data)
        yield self._spec.name


class WriteStaged(beam.PTransform):
    """PCollection of released Arrow tables -> one file in the release's private staging folder."""

    def __init__(self, folder: str, spec: OutputSpec):
        super().__init__()
        self._folder, self._spec = folder, spec

    def expand(self, tables):
        return (tables
                | "Gather" >> beam.combiners.ToList()
                | "Write" >> beam.ParDo(_WriteStaged(self._folder, self._spec)))
