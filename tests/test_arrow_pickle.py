"""Arrow elements pickle to the size of what they reference (transforms.arrow_pickle)."""
import pickle

import numpy as np
import pyarrow as pa
from apache_beam.coders import coders

import transforms  # noqa: F401  (registers the reducers)


def _big():
    return pa.table({"k": np.arange(1_000_000) % 1000, "v": np.ones(1_000_000),
                     "s": pa.array(np.arange(1_000_000).astype(str))})


def test_a_slice_pickles_to_its_own_size_and_round_trips():
    table = _big()
    part = table.slice(1234, 1000)
    data = pickle.dumps(part)
    assert len(data) < len(pickle.dumps(table)) / 200
    assert pickle.loads(data).equals(part)
    batch = table.to_batches()[0].slice(7, 10)
    assert pickle.loads(pickle.dumps(batch)).equals(batch)
    assert pickle.loads(pickle.dumps(table.slice(0, 0))).schema == table.schema


def test_chunks_sharing_buffers_are_not_repeated():
    table = _big()
    chunked = pa.Table.from_batches([table.slice(i * 1000, 1000).to_batches()[0] for i in range(100)])
    assert chunked.column(0).num_chunks == 100
    data = coders.FastPrimitivesCoder().encode(chunked)  # what Beam does with our elements
    assert len(data) < 3 * len(pickle.dumps(table.slice(0, 100_000).combine_chunks()))
    assert coders.FastPrimitivesCoder().decode(data).equals(chunked)
