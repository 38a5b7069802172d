"""A Beam coder for pyarrow Tables and RecordBatches: Arrow IPC, only the referenced ranges.

Arrow's own pickle support writes every buffer a table refers to in full: a 1,000-row slice of
a 1M-row batch pickles as the whole batch, and a table whose chunks share buffers (e.g. a
multithreaded ``group_by`` result) repeats them once per chunk: one day's CentralNotice
impression partials pickled to many times their size, beyond gRPC's message limit
(benchmarks/RESULTS.md). The
Arrow IPC stream format writes only the ranges a table references, so this coder encodes
through IPC.

It is registered in Beam's coder registry for ``pa.Table`` and ``pa.RecordBatch`` (the Beam
idiom; nothing changes how Python pickles tables for other code), and the transforms that emit
tables declare it through their output types (``with_output_types(pa.Table)``, and
``Tuple[int, pa.Table]`` before a GroupByKey), so Beam picks it at pipeline construction and
ships it inside the pipeline: workers need no registration. Combiners whose accumulators hold
tables return :func:`table_list_coder` from ``get_accumulator_coder``.
"""
from __future__ import annotations

import pyarrow as pa
from apache_beam import coders


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


class ArrowTableCoder(coders.Coder):
    """pa.Table <-> Arrow IPC stream bytes (schema, then one message per chunk)."""

    def encode(self, value: pa.Table) -> bytes:
        return _to_ipc(value)

    def decode(self, encoded: bytes) -> pa.Table:
        return _from_ipc(encoded)

    def is_deterministic(self) -> bool:
        return False  # chunking is not canonical; tables are never grouping keys

    def to_type_hint(self):
        return pa.Table

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


class ArrowRecordBatchCoder(ArrowTableCoder):
    """pa.RecordBatch <-> Arrow IPC stream bytes."""

    def encode(self, value: pa.RecordBatch) -> bytes:
        return _to_ipc(pa.Table.from_batches([value]))

    def decode(self, encoded: bytes) -> pa.RecordBatch:
        table = _from_ipc(encoded).combine_chunks()
        batches = table.to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)

    def to_type_hint(self):
        return pa.RecordBatch


def table_list_coder() -> coders.Coder:
    """The coder of a list of tables (a CombineFn accumulator)."""
    return coders.ListCoder(ArrowTableCoder())


coders.registry.register_coder(pa.Table, ArrowTableCoder)
coders.registry.register_coder(pa.RecordBatch, ArrowRecordBatchCoder)
