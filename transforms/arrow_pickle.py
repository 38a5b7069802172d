"""Compact pickling of Arrow tables and record batches, for everything Beam moves between stages.

Beam encodes our Arrow elements with pickle. Arrow's own pickle support writes every buffer a
table refers to in full: a 1,000-row slice of a 1M-row batch pickles as the whole batch, and a
table whose chunks share buffers (e.g. a multithreaded ``group_by`` result) repeats them once per
chunk -- measured 2.4 GB instead of 77 MB for one day's impression partials, which broke gRPC's
message limit. The Arrow IPC stream format writes only the referenced ranges, so these reducers,
registered with :mod:`copyreg` (which pickle, cloudpickle and Beam's coders consult first),
serialize through IPC instead. Importing :mod:`transforms` registers them, on the launcher and on
every worker that unpickles our transforms.
"""
from __future__ import annotations

import copyreg

import pyarrow as pa


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def table_from_ipc(data) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def batch_from_ipc(data) -> pa.RecordBatch:
    table = table_from_ipc(data)
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def _reduce_table(table: pa.Table):
    return table_from_ipc, (_to_ipc(table),)


def _reduce_batch(batch: pa.RecordBatch):
    return batch_from_ipc, (_to_ipc(pa.Table.from_batches([batch])),)


def register() -> None:
    copyreg.pickle(pa.Table, _reduce_table)
    copyreg.pickle(pa.RecordBatch, _reduce_batch)


register()
