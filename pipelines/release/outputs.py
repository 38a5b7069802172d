"""A job's released files, staged: gathered, put in their public order, encoded, written.

Nothing but noisy values and public information may shape a released file, so every output is
sorted by its declared public order (key columns) before it is written -- whatever order the
runner, the shards or the data produced its rows in -- and encoded deterministically, so that a
re-run with the same key reproduces the same bytes. Both steps are the project's one
released-file encoder (:mod:`transforms.released_files`), which the library's sink uses too.
"""
from __future__ import annotations

import json

import apache_beam as beam
import pyarrow as pa

from pipelines.release import storage
from pipelines.release.job import OutputSpec
from transforms.released_files import conform, encode


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
        spec = self._spec
        data = encode(conform(tables, schema=spec.schema, sort_by=spec.sort_by, name=spec.name),
                      spec.format)
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
