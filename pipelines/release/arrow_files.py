"""Whole-file Arrow reads that leave nothing behind: a job that reads a file last still exits 0.

A job that reads a file back after its pipeline (the release layer decodes the published tables
for the public summary; the tuning tool reads a downloaded file) uses :func:`read_table` or
:func:`arrow_owned` + :func:`table_from_buffer`, never ``pq.read_table`` or ``pacsv.read_csv`` on a
Python file object or on ``bytes``.

Why (issue 11, the rc 134 "terminate called without an active exception" after a complete
release). ``pq.read_table`` goes through Arrow's dataset scanner, which is asynchronous: it
returns the table once the last batch arrives, while callbacks on Arrow's CPU and I/O thread
pools are still unwinding the scan and dropping its last references to the source. When the
source is a Python object (a file object, wrapped as ``PyReadableFile``; ``bytes``, wrapped as
``PyBuffer``), dropping that reference needs the GIL (``PyGILState_Ensure``). If the job's main
thread has meanwhile returned and the interpreter is finalizing, Python before 3.14 ends any foreign
thread that asks for the GIL with ``pthread_exit``; the forced unwind runs into a ``noexcept`` C++
destructor (``~OwnedRefNoGIL``, ``~PyBuffer``) and the C++ runtime calls ``std::terminate``:
SIGABRT, exit code 134, after all output was written. The window is a few milliseconds of GC at
interpreter teardown, so it hits ~2% of runs, more on a loaded machine. Core dumps of the aborted
job show exactly this thread (``arrow::internal::ThreadPool`` worker -> ``~ParquetFileFragment``
-> ``~PyReadableFile`` -> ``PyGILState_Ensure`` -> ``pthread_exit`` -> ``std::terminate``) while the
main thread is in ``Py_FinalizeEx``. Upstream: apache/arrow issues 34314, 36389, 36980.

The fix removes the Python objects from Arrow's side, not the threads: the file is read through
Beam's ``FileSystems`` (any scheme) into memory that Arrow's own pool allocated, and parsed from
there synchronously. Whatever Arrow work remains when the call returns holds only Arrow-owned
memory, whose release never needs the GIL, so it cannot meet a finalizing interpreter; and the
Python file object and the bytes read from it are released before the call returns.
"""
from __future__ import annotations

from typing import BinaryIO, Optional, Sequence

import pyarrow as pa

CHUNK = 8 << 20  # bytes copied at a time from the Python file object into Arrow's memory


def format_of(path: str) -> str:
    """``parquet`` or ``csv``, from the file name (a released file is named by its format)."""
    name = path.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    raise ValueError(f"cannot tell the format of {path!r}: expected a .parquet or .csv file")


def arrow_owned(source: bytes | bytearray | memoryview | BinaryIO) -> pa.Buffer:
    """The bytes of ``source`` (bytes-like, or a binary file object read to its end) copied into
    a buffer allocated by Arrow's memory pool. Arrow keeps no reference to ``source``."""
    sink = pa.BufferOutputStream()
    if isinstance(source, (bytes, bytearray, memoryview)):
        sink.write(source)
    else:
        while chunk := source.read(CHUNK):
            sink.write(chunk)
    return sink.getvalue()


def table_from_buffer(buffer: pa.Buffer, fmt: str, columns: Optional[Sequence[str]] = None,
                      column_types: Optional[dict] = None) -> pa.Table:
    """A Parquet or CSV table parsed from an Arrow-owned buffer (see :func:`arrow_owned`);
    ``column_types`` fixes CSV column types (a released file's declared schema)."""
    if not isinstance(buffer, pa.Buffer):
        raise TypeError("table_from_buffer takes a pyarrow.Buffer from arrow_owned(), so that no Python "
                        "object is handed to Arrow's thread pools")
    if fmt == "parquet":
        from transforms import parquet_files

        # ParquetFile.read waits for its own decoding tasks: no dataset scanner, no work left running.
        return parquet_files.open_file(pa.BufferReader(buffer)).read(
            columns=list(columns) if columns else None)
    if fmt == "csv":
        from pyarrow import csv as pacsv

        convert = pacsv.ConvertOptions(include_columns=list(columns) if columns else [],
                                       column_types=column_types or {})
        return pacsv.read_csv(pa.BufferReader(buffer), convert_options=convert)
    raise ValueError(f"unknown table format {fmt!r} (parquet or csv)")


def read_table(path: str, fmt: Optional[str] = None, columns: Optional[Sequence[str]] = None) -> pa.Table:
    """A whole Parquet or CSV file at any Beam path (local, ``gs://``, ...), read so that no Arrow
    thread can outlive the call holding a Python object. ``fmt`` defaults to the file extension.
    For small files (released tables, reports, configuration); a large input is read by the
    pipeline, in blocks."""
    from apache_beam.io.filesystems import FileSystems

    fmt = fmt or format_of(path)
    with FileSystems.open(path) as handle:
        buffer = arrow_owned(handle)
    return table_from_buffer(buffer, fmt, columns)
