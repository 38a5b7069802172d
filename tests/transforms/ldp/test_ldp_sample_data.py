"""Sample inputs of the local/shuffle DP release kinds, read back from files by the transforms a
job's build() will apply (the Beam ones in one pipeline)."""
import apache_beam as beam
import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from apache_beam.io.parquetio import ReadFromParquetBatched
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from accounting.keys import ReleaseKey
from transforms.ldp import make_oracle, sample_data
from transforms.ldp import KeyedRandomness
from transforms.ldp.beam import EstimateFrequencies, ShuffleSum
from transforms.ldp.labels import LabelRandomizer, randomize_label_table
from transforms.ldp.pem import PEMPlan, heavy_hitters
from transforms.ldp.shuffle import SplitAndMix


def test_sample_files_feed_the_transforms(tmp_path):
    reports = sample_data.frequency_reports(str(tmp_path / "reports.parquet"), clients=3000)
    plan = PEMPlan(oracle="olh", epsilon=4.0, value_bits=16, top_k=9)
    sample_data.pem_reports(str(tmp_path / "pem.parquet"), plan=plan, clients=20_000)
    top, _ = heavy_hitters(plan, pq.read_table(str(tmp_path / "pem.parquet")))
    assert max(top.column("value").to_pylist()) < 20  # Poisson(5): small integers on top
    spec = SplitAndMix(num_clients=500, value_bound=10, epsilon=1.0, delta=1e-6)
    sample_data.shuffle_shares(str(tmp_path / "shares.parquet"), spec=spec, clients=500)
    rows = sample_data.training_rows(str(tmp_path / "train.csv"), rows=300)
    assert reports.num_rows == 3000 and set(rows.column("label").to_pylist()) == {"no", "yes"}
    oracle = make_oracle("oue", epsilon=2.0, domain_size=32)
    with TestPipeline() as p:
        est = (p | "R1" >> ReadFromParquetBatched(str(tmp_path / "reports.parquet"))
               | EstimateFrequencies(oracle))
        assert_that(est | "N1" >> beam.Map(lambda t: (t.num_rows, t.column("estimate")[0].as_py() > 0)),
                    equal_to([(32, True)]), label="frequencies")
        total = (p | "R3" >> ReadFromParquetBatched(str(tmp_path / "shares.parquet"))
                 | ShuffleSum(spec))
        assert_that(total | "N3" >> beam.Map(lambda t: t.column("clients")[0].as_py()),
                    equal_to([500]), label="shuffle")
    back = pacsv.read_csv(str(tmp_path / "train.csv"))
    out, undeclared = randomize_label_table(
        LabelRandomizer(epsilon=1.0, labels=("no", "yes")), back, label_column="label",
        id_column="example_id", source=KeyedRandomness(ReleaseKey.for_testing(1), "labels"))
    assert out.num_rows == 300 and undeclared == 0


def test_formats_without_flat_columns_need_parquet(tmp_path):
    with pytest.raises(ValueError, match="use .parquet"):
        sample_data.frequency_reports(str(tmp_path / "reports.csv"), oracle="oue")
    table = sample_data.frequency_reports(str(tmp_path / "grr.csv"), oracle="grr",
                                          domain_size=10, clients=50)
    assert pacsv.read_csv(str(tmp_path / "grr.csv")).num_rows == 50
    with pytest.raises(ValueError, match="use .parquet, .csv or .jsonl"):
        sample_data.write_table(table, str(tmp_path / "x.txt"))
    assert np.all(np.asarray(table.column("report")) < 10)
