"""Page checksums: every Parquet file the project writes carries them, every read verifies them
(transforms/parquet_files.py); a bit flipped inside a data page is an error, never other numbers."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from release_testkit import flip_value_byte, value_byte_offset

from pipelines.release import arrow_files, outputs
from pipelines.release.job import OutputSpec
from transforms import parquet_files
from transforms.released_files import encode
from transforms.tables import ReadParquetTables

TABLE = pa.table({"key": pa.array([f"k{i:04d}" for i in range(3000)]),
                  "count": pa.array(np.arange(3000, dtype=np.int64) * 7)})
PLAIN = dict(compression="none", use_dictionary=False, row_group_size=1000)


def test_without_checksums_a_flipped_bit_reads_as_other_numbers(tmp_path):
    """Why the checksums: pyarrow's defaults read the damaged page without a word."""
    path = tmp_path / "plain.parquet"
    pq.write_table(TABLE, path, **PLAIN)
    flip_value_byte(path, "count", row_group=1)
    damaged = parquet_files.read_table(str(path))  # no checksum in the file: nothing to verify
    assert damaged.num_rows == TABLE.num_rows and not damaged.equals(TABLE)


def test_with_checksums_a_flipped_bit_is_an_error(tmp_path):
    path = tmp_path / "checked.parquet"
    parquet_files.write_table(TABLE, str(path), **PLAIN)
    assert parquet_files.read_table(str(path)).equals(TABLE)
    flip_value_byte(path, "count", row_group=1)
    with pytest.raises(OSError) as info:
        parquet_files.open_file(str(path)).read_row_group(1)
    assert parquet_files.is_checksum_error(info.value)
    assert parquet_files.open_file(str(path)).read_row_group(0).num_rows == 1000  # page by page
    with pytest.raises(OSError, match="checksum"):
        pq.ParquetFile(str(path), page_checksum_verification=True).read()


def test_released_parquet_carries_checksums_and_is_verified_when_read_back():
    spec = OutputSpec(name="counts.parquet", sort_by=["key"], schema=TABLE.schema)
    data = encode(TABLE, spec.format)  # the one encoder of released files
    assert outputs.decode(data, spec).equals(TABLE)
    damaged = bytearray(data)
    damaged[value_byte_offset(data, "count")] ^= 0x10
    with pytest.raises(OSError, match="checksum"):
        arrow_files.table_from_buffer(arrow_files.arrow_owned(bytes(damaged)), "parquet")


def test_read_parquet_tables_reads_row_groups_verified(tmp_path):
    for i in range(2):
        parquet_files.write_table(TABLE.slice(i * 1500, 1500), str(tmp_path / f"p{i}.parquet"),
                                  **PLAIN)
    with TestPipeline() as p:
        tables = p | ReadParquetTables(str(tmp_path / "*.parquet"), columns=["count"])
        assert_that(tables | beam.FlatMap(lambda t: t.column("count").to_pylist()),
                    equal_to(TABLE.column("count").to_pylist()))
    flip_value_byte(tmp_path / "p1.parquet", "count", row_group=0)
    with pytest.raises(Exception, match="checksum"):
        with TestPipeline() as p:
            _ = p | ReadParquetTables(str(tmp_path / "*.parquet"))
