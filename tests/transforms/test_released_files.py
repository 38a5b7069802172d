"""One released-file encoder: the library's sink and the jobs' staged outputs write the same bytes
for the same release, whatever order its tables arrive in (transforms/released_files.py)."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from pipelines.release.job import OutputSpec
from pipelines.release.outputs import WriteStaged, decode
from transforms.aggregate import Compute, DPAggregate, Keys, Output
from transforms.keyset import PublicKeyset
from transforms.metrics import Count, Mean
from transforms.released_files import conform, encode
from transforms.tables import WriteReleasedParquet

KEYS = ["country", "day"]


def _release(p):
    rng = np.random.default_rng(3)
    rows = pa.table({"user": rng.integers(0, 300, 4000), "country": rng.choice(["DE", "FR", "US"], 4000),
                     "day": rng.integers(1, 4, 4000), "seconds": rng.uniform(0, 120, 4000)})
    aggregate = DPAggregate(
        compute=Compute(metrics=[Count(), Mean(name="mean_seconds")], value="seconds"),
        keys=Keys(privacy_unit="user", columns=KEYS, keyset=PublicKeyset.cross_product({"country": ["DE", "FR", "IT", "US"],
                                                               "day": [1, 2, 3]})),
        output=Output(num_shards=3),
        bounds=ContributionBounds(max_partitions=2, max_contributions_per_partition=3,
                                                      min_value=0, max_value=100),
        budget=PrivacyBudget(epsilon=1.0),
        release_key=ReleaseKey.for_testing(4))
    released = p | beam.Create([rows.slice(0, 1500), rows.slice(1500)]) | aggregate
    return released, aggregate.output_schema()


def test_the_library_sink_and_a_job_write_the_same_bytes(tmp_path):
    """DPAggregate's release through WriteReleasedParquet, and the same release staged as a
    job's output declared with the same schema and order: byte for byte the same file."""
    library, staged = tmp_path / "library.parquet", tmp_path / "staged"
    with beam.Pipeline() as p:
        released, schema = _release(p)
        key_types = {"country": pa.string(), "day": pa.int64()}
        declared = pa.schema([pa.field(f.name, key_types.get(f.name, f.type)) for f in schema])
        spec = OutputSpec(name="release.parquet", sort_by=KEYS, schema=declared)
        _ = released | "Library" >> WriteReleasedParquet(str(library), keys=KEYS, schema=schema)
        _ = released | "Job" >> WriteStaged(str(staged), spec)
    data = library.read_bytes()
    assert data == (staged / "release.parquet").read_bytes()
    table = decode(data, spec)
    assert table.num_rows == 12 and table.column_names[:2] == KEYS
    assert table.select(KEYS).to_pylist() == sorted(table.select(KEYS).to_pylist(),
                                                    key=lambda r: (r["country"], r["day"]))


@pytest.mark.parametrize("file_format", ["parquet", "csv", "jsonl"])
def test_arrival_order_never_shapes_the_bytes(file_format):
    rng = np.random.default_rng(1)
    keys = rng.permutation(200)
    table = pa.table({"k": pa.array(keys, pa.int32()), "v": pa.array(rng.normal(size=200))})
    schema = pa.schema([("k", pa.int64()), ("v", pa.float64())])
    pieces = [table.slice(i, 40) for i in range(0, 200, 40)]
    first = encode(conform(pieces, schema=schema, sort_by=["k"]), file_format)
    again = encode(conform(pieces[::-1] + [table.slice(0, 0)], schema=schema, sort_by=["k"]), file_format)
    assert first == again
    assert conform(pieces, schema=schema, sort_by=["k"]).column("k").to_pylist() == list(range(200))


def test_conform_types_null_fields_from_the_data_and_names_a_missing_column():
    schema = pa.schema([("k", pa.null()), ("v", pa.float64())])
    table = conform([pa.table({"v": [2.0, 1.0], "k": ["b", "a"], "extra": [1, 2]})], schema=schema,
                    sort_by=["k"])
    assert table.schema == pa.schema([("k", pa.string()), ("v", pa.float64())])
    assert table.to_pylist() == [{"k": "a", "v": 1.0}, {"k": "b", "v": 2.0}]
    assert conform([], schema=schema).schema == schema  # nothing released: the declared schema
    with pytest.raises(ValueError, match="counts.csv.*no column \\['v'\\]"):
        conform([pa.table({"k": [1]})], schema=schema, name="counts.csv")
    with pytest.raises(ValueError, match="one of"):
        encode(table, "xlsx")
