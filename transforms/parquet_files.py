"""Parquet files with page checksums: every Parquet file the project writes carries a CRC-32 per
page, and every Parquet page the project reads is verified against its checksum.

Why. A Parquet footer and its page headers can be intact while the values inside a data page
are not (a bit flipped on a disk, a truncated copy patched up, a faulty transfer): a plain INT64
or dictionary-index page has no redundancy, so pyarrow decodes the damaged bytes into other
numbers, silently, and a job would release statistics of data nobody wrote. Parquet's page header
has a ``crc`` field for this; pyarrow writes it with ``write_page_checksum=True`` and checks it
with ``page_checksum_verification=True`` (an ``OSError`` "CRC checksum verification failed"),
both off by default. Verification applies to pages that carry a checksum: files from tools that
write none (pyarrow's default) are read as before -- write inputs with checksums (Spark/parquet-mr
does by default; pyarrow with ``write_page_checksum=True``) to have them checked.

Callers use these functions instead of ``pyarrow.parquet``'s directly (the readers of
:mod:`pipelines.release.inputs`, the released-file encoder, sample data, benchmarks).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

#: Keyword arguments of every Parquet write and every Parquet read of the project.
WRITE_OPTIONS = {"write_page_checksum": True}
READ_OPTIONS = {"page_checksum_verification": True}


def write_table(table: pa.Table, where, **kwargs) -> None:
    """``pq.write_table`` with page checksums."""
    pq.write_table(table, where, **WRITE_OPTIONS, **kwargs)


def writer(where, schema: pa.Schema, **kwargs) -> pq.ParquetWriter:
    """``pq.ParquetWriter`` with page checksums."""
    return pq.ParquetWriter(where, schema, **WRITE_OPTIONS, **kwargs)


def open_file(source, **kwargs) -> pq.ParquetFile:
    """``pq.ParquetFile`` whose page reads verify page checksums."""
    return pq.ParquetFile(source, **READ_OPTIONS, **kwargs)


def read_table(source, **kwargs) -> pa.Table:
    """``pq.read_table`` verifying page checksums."""
    return pq.read_table(source, **READ_OPTIONS, **kwargs)


def is_checksum_error(err: BaseException) -> bool:
    """Whether ``err`` is pyarrow's report of a page that failed its checksum."""
    return isinstance(err, OSError) and "checksum verification failed" in str(err).lower()
