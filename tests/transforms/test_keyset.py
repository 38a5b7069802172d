"""PublicKeyset: the one cross product, materialised in keyset order."""
import itertools

import pyarrow as pa

from transforms.keyset import PublicKeyset


def test_cross_product_table_is_row_major_with_exclusions():
    dims = {"campaign": ["c2", "c1"], "country": ["FR", "DE", "XX"], "day": [3, 1]}
    keyset = PublicKeyset.cross_product(dims).exclude("country", ["XX"])
    table = keyset.to_table()
    expected = [k for k in itertools.product(*dims.values()) if k[1] != "XX"]
    assert [tuple(r.values()) for r in table.to_pylist()] == expected
    assert list(keyset.batches(max_rows=5))[0].num_rows <= 5
    assert pa.concat_tables(keyset.batches(max_rows=5)).equals(table)


def test_empty_keyset_table_keeps_the_schema():
    keyset = PublicKeyset.cross_product({"day": pa.array([1], pa.int32())}).exclude("day", [1])
    assert keyset.to_table().schema == pa.schema([("day", pa.int32())])
