"""Arrow tables cross stages through a registered Beam coder that encodes only what they reference."""
import copyreg
import pickle

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import coders

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from transforms.aggregate import Compute, DPAggregate, Keys
from transforms.arrow_coder import ArrowRecordBatchCoder, ArrowTableCoder
from transforms.keyset import PublicKeyset
from transforms.metrics import Count


def _big():
    return pa.table({"k": np.arange(1_000_000) % 1000, "v": np.ones(1_000_000),
                     "s": pa.array(np.arange(1_000_000).astype(str))})


def test_a_slice_encodes_to_its_own_size_and_round_trips():
    table = _big()
    coder = coders.registry.get_coder(pa.Table)
    assert isinstance(coder, ArrowTableCoder)
    part = table.slice(1234, 1000)
    data = coder.encode(part)
    assert len(data) < len(coder.encode(table)) / 200
    assert coder.decode(data).equals(part)
    batch = table.to_batches()[0].slice(7, 10)
    batch_coder = coders.registry.get_coder(pa.RecordBatch)
    assert isinstance(batch_coder, ArrowRecordBatchCoder)
    assert batch_coder.decode(batch_coder.encode(batch)).equals(batch)
    assert coder.decode(coder.encode(table.slice(0, 0))).schema == table.schema


def test_chunks_sharing_buffers_are_not_repeated():
    table = _big()
    chunked = pa.Table.from_batches([table.slice(i * 1000, 1000).to_batches()[0] for i in range(100)])
    assert chunked.column(0).num_chunks == 100
    coder = ArrowTableCoder()
    data = coder.encode(chunked)
    assert len(data) < 3 * len(coder.encode(table.slice(0, 100_000).combine_chunks()))
    assert coder.decode(data).equals(chunked)


def test_no_process_wide_pickling_hook():
    assert pa.Table not in copyreg.dispatch_table and pa.RecordBatch not in copyreg.dispatch_table
    assert pickle.loads(pickle.dumps(pa.table({"a": [1]}))).equals(pa.table({"a": [1]}))


def _coder_of(pcoll):
    return coders.registry.get_coder(pcoll.element_type)


def _has_arrow(coder) -> bool:
    if isinstance(coder, ArrowTableCoder):
        return True
    return any(_has_arrow(c) for c in coder._get_component_coders())


def test_shuffled_tables_use_the_arrow_coder():
    """Every GroupByKey / combine that moves tables in DPAggregate is typed for the coder."""
    p = beam.Pipeline()
    rows = p | beam.Create([pa.table({"u": [1, 2], "k": ["a", "b"]})])
    assert _has_arrow(_coder_of(rows))
    _ = rows | DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(["a", "b"], ["k"])),
        bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
        budget=PrivacyBudget(epsilon=1.0),
        release_key=ReleaseKey.for_testing(1))
    shuffles = {}

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            name = node.full_label.rsplit("/", 1)[-1]
            if name in ("BoundPerUnitShard", "JoinKeyset", "SumPerKeyShard"):
                shuffles[name] = node

        enter_composite_transform = visit_transform

    p.visit(Visitor())
    assert set(shuffles) == {"BoundPerUnitShard", "JoinKeyset", "SumPerKeyShard"}
    assert _has_arrow(_coder_of(shuffles["JoinKeyset"].inputs[0]))
    for name in ("BoundPerUnitShard", "SumPerKeyShard"):
        assert _has_arrow(_coder_of(shuffles[name].inputs[0])), name
        assert _has_arrow(shuffles[name].transform.fn.get_accumulator_coder()), name
