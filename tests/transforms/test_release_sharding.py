"""The release stage's key shards: bounded in size, and never a cause of a different release.

The number of key shards (derived from the keyset's size) and how keys are routed to them (by
keyset position for an in-memory keyset, by the public routing hash for a PCollection keyset)
must change no released byte: noise streams are keyed by the key, and every released table is
sorted by its keys.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline

from accounting.calibration import NoiseKind, calibrate
from accounting.keys import ReleaseKey
from transforms.keyset import KEYSET_POSITION, PublicKeyset
from transforms.release import (KEYS_PER_SHARD, STAGED_KEYS_PER_SHARD, NoisedPartial, NoisyRelease,
                                OutputColumn, key_shards)

SPEC = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=1.0, l1_sensitivity=1)
COUNTRIES = ["BR", "DE", "FR", "IN", "JP", "US", "ZA"]
DAYS = ["d1", "d2", "d3"]


def test_key_shards_grow_with_the_keyset_only():
    assert key_shards(0) == 1
    assert key_shards(10, minimum=32) == 32
    assert key_shards(KEYS_PER_SHARD) == 1
    assert key_shards(KEYS_PER_SHARD + 1) == 2
    assert key_shards(125_000_000) == -(-125_000_000 // KEYS_PER_SHARD)
    assert 125_000_000 / key_shards(125_000_000) <= KEYS_PER_SHARD
    assert key_shards(100, keys_per_shard=7) == 15


def _partials():
    # Partials of some keys (one outside the keyset), split over several tables (a key in two).
    return [pa.table({"country": ["DE", "FR", "XX"], "day": ["d1", "d2", "d1"], "count": [5, 3, 9]}),
            pa.table({"country": ["DE", "US"], "day": ["d1", "d3"], "count": [2, 7]})]


def _release(keyset_of, keys_per_shard, key=31):
    """Released rows (sorted) of one NoisyRelease, the keyset made by ``keyset_of(pipeline)``."""
    measure = NoisedPartial(name="count", partial="count", spec=SPEC)
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        tables = (p | beam.Create(_partials(), reshuffle=False).with_output_types(pa.Table)
                  | NoisyRelease(keys=["country", "day"], measures=[measure],
                                 outputs=[OutputColumn(name="count", measure="count")],
                                 partial_types={"count": pa.int64()}, release_key=ReleaseKey.for_testing(key),
                                 keyset=keyset_of(p), num_shards=1, keys_per_shard=keys_per_shard))
        # Each emitted table is in key order; gather their (sorted) rows and table sizes.
        tables | beam.Map(lambda t: t.to_pylist()) | beam.combiners.ToList() | beam.Map(_collect)
    return _RESULTS.pop()


_RESULTS = []


def _collect(lists):
    for rows in lists:
        assert rows == sorted(rows, key=lambda r: (r["country"], r["day"])), "a released table is sorted"
    _RESULTS.append((sorted((r["country"], r["day"], r["count"]) for rows in lists for r in rows),
                     sorted(len(rows) for rows in lists)))


def _cross(p):
    return PublicKeyset.cross_product({"country": COUNTRIES, "day": DAYS}).exclude("country", ["ZA"])


def _pcollection(stated, staging_dir=None):
    def make(p):
        keys = p | "Keys" >> beam.Create([{"country": c, "day": d} for c in COUNTRIES for d in DAYS]
                                         + [{"country": "DE", "day": "d1"}])  # a duplicate
        return PublicKeyset.from_pcollection(keys, ["country", "day"], expected_size=21 if stated else None,
                                             staging_dir=staging_dir).exclude("country", ["ZA"])
    return make


def test_shard_count_and_routing_change_no_released_value():
    one, sizes_one = _release(_cross, keys_per_shard=KEYS_PER_SHARD)
    many, sizes_many = _release(_cross, keys_per_shard=4)
    assert sizes_one == [18] and len(sizes_many) == 5  # 18 keys in chunks of at most 4
    assert one == many
    assert len(one) == 18 and ("XX", "d1") not in {(c, d) for c, d, _ in one}
    for stated in (True, False):
        hashed, sizes = _release(_pcollection(stated), keys_per_shard=4)
        assert hashed == one and len(sizes) > 1
    # The noise is there (a real key, not the exact mode), and it is the key's, not the shard's.
    exact = {("DE", "d1"): 7, ("FR", "d2"): 3, ("US", "d3"): 7}
    assert any(count != exact.get((c, d), 0) for c, d, count in one)
    assert _release(_cross, keys_per_shard=4, key=32)[0] != one


def test_staged_keyset_releases_the_same_rows(tmp_path):
    """Key shards staged as files (transforms.keyset_staging) instead of crossing the shuffle."""
    shuffled = _release(_pcollection(True), keys_per_shard=4)
    for stated in (True, False):
        staged = _release(_pcollection(stated, staging_dir=str(tmp_path)), keys_per_shard=4)
        assert staged == shuffled
    runs = sorted(tmp_path.iterdir())
    assert len(runs) == 2 and all(run.name.startswith("keyset-") for run in runs)
    assert all(list(run.glob("keys-*.arrow")) for run in runs)  # the keys went through files


def test_staged_pieces_and_filter_read_back(tmp_path):
    from transforms import keyset_staging
    from transforms.membership import KeyFilter

    pieces = [(3, pa.table({"country": ["DE", "FR"], "day": ["d1", "d2"]})),
              (5, pa.table({"country": ["US"], "day": ["d3"]}))]
    markers = keyset_staging.write_pieces(str(tmp_path), pieces)
    assert [shard for shard, _ in markers] == [3, 5] and all(m.num_rows == 1 for _, m in markers)
    assert markers[0][1].column("path")[0].as_py().startswith(str(tmp_path))
    assert keyset_staging.is_marker(markers[0][1]) and not keyset_staging.is_marker(pieces[0][1])
    reader = keyset_staging.PieceReader()
    read = reader.read([markers[1][1], markers[0][1]])
    assert read[0].equals(pieces[1][1]) and read[1].equals(pieces[0][1])
    # markers of several elements merge into one, in file and offset order, and read the same
    italy = pa.table({"country": ["IT"], "day": ["d4"]})
    more = keyset_staging.write_pieces(str(tmp_path), [(3, italy)])
    merged = keyset_staging.merge_markers([more[0][1], markers[1][1], markers[0][1]])
    assert keyset_staging.is_marker(merged) and merged.num_rows == 3
    rows = merged.to_pylist()
    assert rows == sorted(rows, key=lambda r: (r["path"], r["offset"]))
    expected = sorted([pieces[0][1], pieces[1][1], italy], key=lambda t: t.column("day")[0].as_py())
    assert sorted(reader.read([merged]), key=lambda t: t.column("day")[0].as_py()) == expected
    reader.close()
    filt = KeyFilter.of(np.arange(1, 1000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15), 40)
    loaded = keyset_staging.load_filter(keyset_staging.stage_filter(filt.to_bytes(), str(tmp_path)))
    assert np.array_equal(np.asarray(loaded.words), filt.words)
    for path in tmp_path.iterdir():
        path.unlink()
    with pytest.raises(FileNotFoundError, match="staged keyset file .*keys-.*kept until"):
        keyset_staging.PieceReader().read([markers[0][1]])


def test_staged_markers_are_merged_per_shard_before_the_shuffle(tmp_path):
    """Each keyset element writes one piece per shard; one marker per shard, not one per element
    and shard, reaches the release."""
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from transforms import keyset_staging
    from transforms.release import _MergeMarkersFn

    elements = [[(shard, pa.table({"k": [10 * e + shard]})) for shard in range(3)] for e in range(5)]
    markers = [m for pieces in elements for m in keyset_staging.write_pieces(str(tmp_path), pieces)]
    assert len(markers) == 15

    def check(merged):
        assert sorted(shard for shard, _ in merged) == [0, 1, 2], merged
        reader = keyset_staging.PieceReader()
        for shard, marker in merged:
            assert keyset_staging.is_marker(marker) and marker.num_rows == 5
            keys = sorted(k for table in reader.read([marker]) for k in table.column("k").to_pylist())
            assert keys == [10 * e + shard for e in range(5)]
        reader.close()

    with TestPipeline() as p:
        merged = p | beam.Create(markers, reshuffle=False) | beam.CombinePerKey(_MergeMarkersFn())
        assert_that(merged, check)


def test_positions_and_keyed_by_position():
    keyset = PublicKeyset.cross_product({"country": COUNTRIES, "day": DAYS}).exclude("country", ["FR"])
    table = pa.table({"country": ["DE", "FR", "US", "XX", None], "day": ["d2", "d1", "d3", "d1", "d1"],
                      "v": [1, 2, 3, 4, 5]})
    assert keyset.positions(table).tolist() == [1 * 3 + 1, -1, 5 * 3 + 2, -1, -1]
    keyed = keyset.keyed_by_position(table)
    assert keyed.column_names == ["v", KEYSET_POSITION]
    assert keyed.column(KEYSET_POSITION).to_pylist() == [4, 17] and keyed.column("v").to_pylist() == [1, 3]
    assert keyset.keyed_by_position(keyed) is keyed
    # A chunk of the keyset and the positions of its keys agree (exclusions leave gaps).
    chunk = keyset.batch_at(3, 7)
    assert keyset.positions(chunk).tolist() == [3, 4, 5, 9] and chunk.num_rows == 4


def test_table_keyset_counts_each_key_once():
    keyset = PublicKeyset.from_table(pa.table({"k": ["a", "b", "a", "c", "b"]}))
    assert keyset.size() == 3
    assert keyset.to_table().column("k").to_pylist() == ["a", "b", "c"]
    assert keyset.positions(pa.table({"k": ["c", "a", "z"]})).tolist() == [2, 0, -1]


def test_a_staged_keyset_has_larger_key_shards_unless_told(tmp_path):
    def settings(keyset, **kwargs):
        return NoisyRelease(keys=["k"], measures=[NoisedPartial(name="c", partial="count", spec=SPEC)],
                            outputs=[OutputColumn(name="c", measure="c")], partial_types={"count": pa.int64()},
                            release_key=ReleaseKey.for_testing(1), keyset=keyset, **kwargs)._settings

    pcollection = object()  # construction only: no pipeline runs
    staged = PublicKeyset.from_pcollection(pcollection, ["k"], staging_dir=str(tmp_path))
    assert settings(staged).keys_per_shard == STAGED_KEYS_PER_SHARD > KEYS_PER_SHARD
    assert settings(staged, keys_per_shard=4).keys_per_shard == 4
    assert settings(PublicKeyset.from_pcollection(pcollection, ["k"])).keys_per_shard == KEYS_PER_SHARD
    assert staged.exclude("k", ["a"]).staging_run == staged.staging_run  # one directory per keyset
    assert staged.staging_run.startswith(str(tmp_path)) and not list(tmp_path.iterdir())  # nothing written yet


def test_keys_per_shard_must_be_positive():
    with pytest.raises(ValueError, match="keys_per_shard"):
        NoisyRelease(keys=["k"], measures=[NoisedPartial(name="c", partial="count", spec=SPEC)],
                     outputs=[OutputColumn(name="c", measure="c")], partial_types={"count": pa.int64()},
                     release_key=ReleaseKey.for_testing(1), keyset=PublicKeyset.from_keys(["a"], ["k"]),
                     keys_per_shard=0)


# --------------------------------------------------------------------------- the routing hash

def _hash(**columns):
    from transforms.partials import routing_hash
    return routing_hash(pa.table(columns))


def test_routing_hash_depends_on_the_canonical_key_only():
    # Equal keys hash alike whatever their Arrow types, chunking, dictionary encoding or the
    # other values of their batch (a null elsewhere in the column must not change a value's hash).
    ints = [3, -1, 0, 2 ** 40]
    expected = _hash(k=pa.array(ints, pa.int64()))
    assert np.array_equal(_hash(k=pa.array(ints[:2] + [0, 2 ** 40], pa.int64())), expected)
    assert np.array_equal(_hash(k=pa.array([3, -1, 0], pa.int32()))[:3], expected[:3])
    assert np.array_equal(_hash(k=pa.chunked_array([[3, -1], [0, 2 ** 40]]))[:4], expected)
    with_null = _hash(k=pa.array([3, None, -1, 0, 2 ** 40], pa.int64()))
    assert np.array_equal(with_null[[0, 2, 3, 4]], expected)
    nulls = {int(_hash(k=pa.array([None], t))[0]) for t in (pa.int64(), pa.float64(), pa.bool_(),
                                                             pa.string(), pa.null())}
    assert len(nulls) == 1  # a null is one key whatever its column's type
    text = ["DE", "FR", "US"]
    plain = _hash(country=pa.array(text), day=pa.array(["d1", "d2", "d3"]))
    assert np.array_equal(_hash(country=pa.array(text).dictionary_encode(),
                                day=pa.array(["d1", "d2", "d3"]).dictionary_encode()), plain)
    assert np.array_equal(_hash(country=pa.array(text + [None]), day=pa.array(["d1", "d2", "d3", None]))[:3],
                          plain)
    assert np.array_equal(_hash(k=pa.array([1.5, -0.0]))[1:], _hash(k=pa.array([0.0])))
    with pytest.raises(ValueError, match="NaN"):
        _hash(k=pa.array([1.0, float("nan")]))


def test_routing_hash_separates_keys_and_column_order():
    # Different keys (1, True, 1.0 and "1" are four keys) and swapped columns get different
    # hashes; hashes of a million distinct keys spread evenly over shards.
    singles = [_hash(k=pa.array(v))[0] for v in ([1], [True], [1.0], ["1"])]
    assert len(set(int(h) for h in singles)) == 4
    assert _hash(a=pa.array([1]), b=pa.array([2]))[0] != _hash(a=pa.array([2]), b=pa.array([1]))[0]
    hashes = _hash(k=np.arange(1_000_000))
    assert np.unique(hashes).size == hashes.size
    for shards in (7, 64, 1000):
        counts = np.bincount((hashes % np.uint64(shards)).astype(np.int64), minlength=shards)
        expected = hashes.size / shards
        assert counts.min() > expected - 6 * expected ** 0.5
        assert counts.max() < expected + 6 * expected ** 0.5
