"""Released files: gathered tables in their public order, encoded deterministically (no Beam).

The one encoder of every released file of the project: the library's sink
(:class:`transforms.tables.WriteReleasedParquet`) and the jobs' staged outputs
(:mod:`pipelines.release.outputs`) both write through :func:`conform` and :func:`encode`, so the
same released table gives the same bytes whichever wrote it.

Nothing but noisy values and public information may shape a released file (the rule is
:mod:`transforms.release`'s "Output order"): a release arrives as several tables in no fixed
order, so :func:`conform` gathers them into one table with the declared schema and sorts it by
its public order (the key columns), whatever order the runner, the shards or the data produced
them in. :func:`encode` then writes that table deterministically: Parquet with zstd by Arrow's
writer, CSV, or JSON lines with sorted keys, so a re-run with the same key reproduces the same
bytes.
"""
from __future__ import annotations

import io
import json
from typing import Sequence

import pyarrow as pa

#: The encodings of released files (a file's name ends with one of them).
FORMATS = ("parquet", "csv", "jsonl")


def conform(tables: Sequence[pa.Table], *, schema: pa.Schema, sort_by: Sequence[str] = (),
            name: str = "released file") -> pa.Table:
    """``tables`` (the released parts of one file, in any order) as one table with ``schema`` in
    public order: ascending by ``sort_by``. A field of ``schema`` typed null takes the type the
    data gives it (a key column whose type is the input's); other columns of the data are left
    out. Raises ValueError naming ``name`` when the data lacks a column of ``schema``."""
    parts = [t for t in tables if t is not None and t.num_rows]
    missing = [c for c in schema.names if parts and not any(c in t.column_names for t in parts)]
    if missing:
        raise ValueError(f"output {name!r}: the job released no column {missing}")
    parts = [t.select([c for c in schema.names if c in t.column_names]) for t in parts]
    empty = schema.empty_table()
    table = pa.concat_tables(parts + [empty], promote_options="permissive") if parts else empty
    resolved = pa.schema([table.schema.field(f.name).with_nullable(f.nullable)
                          if pa.types.is_null(f.type) else f for f in schema],
                         metadata=schema.metadata)
    table = table.select(resolved.names).cast(resolved)
    if sort_by and table.num_rows:
        table = table.sort_by([(c, "ascending") for c in sort_by])
    return table.combine_chunks()


def encode(table: pa.Table, file_format: str) -> bytes:
    """The bytes of released ``table`` as ``file_format`` (one of :data:`FORMATS`)."""
    sink = io.BytesIO()
    if file_format == "parquet":
        from transforms import parquet_files  # with page checksums

        parquet_files.write_table(table, sink, compression="zstd")
    elif file_format == "csv":
        from pyarrow import csv as pacsv

        pacsv.write_csv(table, sink)
    elif file_format == "jsonl":
        for row in table.to_pylist():
            sink.write((json.dumps(row, sort_keys=True, default=str) + "\n").encode("utf-8"))
    else:
        raise ValueError(f"a released file is one of {FORMATS}, got {file_format!r}")
    return sink.getvalue()
