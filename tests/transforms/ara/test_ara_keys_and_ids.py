"""ARA source ids have one canonical form on every path, and ARA transforms claim their keys.

Regression (issue 10, point 2): one source reaching the job as ``7`` (int64), ``7.0`` (float64,
what pandas writes for an integer column with a null) and ``"7"`` was bounded as three sources and
kept 3 x 65,536 against its 65,536 budget.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from accounting.keys import KeyReuseError, ReleaseKey
from pipelines.ara.synthetic import ConversionData
from transforms.ara.beam import (BoundSourceContributions, EncodeConversions, ParseReports,
                                 SummaryReport)
from transforms.ara.contribution import CONTRIBUTION_BUDGET, ContributionConfig, bound_contributions
from transforms.ara.reports import ReportFault, parse_report
from transforms.ara.summary import key_bytes

# One query (the whole campaign's value) with the whole budget: every report spends 65,536.
FULL = ContributionConfig(measures=("value",), clip_thresholds=(10.0,), slice_dimensions=(),
                          prefixes=(0,), budgets=((CONTRIBUTION_BUDGET,),))


def _batch(ids, typ):
    n = len(ids)
    return pa.record_batch({"source_id": pa.array(ids, typ), "order": pa.array(range(n)),
                            "value": pa.array([50.0] * n)})


def _kept_total(batches_or_lines, from_lines=False):
    with BeamTestPipeline(runner="FnApiRunner") as p:
        if from_lines:
            reports = p | beam.Create(batches_or_lines) | ParseReports()
        else:
            reports = (p | beam.Create(batches_or_lines, reshuffle=False)
                       | EncodeConversions(FULL, ReleaseKey.for_testing(1)))
        total = (reports | BoundSourceContributions()
                 | beam.Map(lambda kv: kv[1]) | beam.CombineGlobally(sum))
        assert_that(total, equal_to([CONTRIBUTION_BUDGET]))


def test_one_source_as_int_float_and_text_keeps_one_budget_in_conversions():
    _kept_total([_batch([7], pa.int64()), _batch([7.0], pa.float64()),
                 _batch(["7"], pa.string()), _batch([" 007 "], pa.string())])


def test_one_source_as_int_float_and_text_keeps_one_budget_in_json_reports():
    line = '{{"source_id": {}, "order": {}, "contributions": [{{"bucket": 1, "value": 65536}}]}}'
    _kept_total([line.format(s, i) for i, s in enumerate(['7', '7.0', '"7"', '" +007"'])],
                from_lines=True)


def test_pure_bounding_and_training_data_merge_the_forms():
    ids = np.array([7, 7.0, "7"], dtype=object)
    assert bound_contributions(ids, np.full(3, CONTRIBUTION_BUDGET)).tolist() == [True, False,
                                                                                  False]
    table = pa.table({"source_id": pa.array(["7", "7.0", "8"]), "value": [1.0, 2.0, 3.0],
                      "dim_0": [0, 0, 0]})
    data = ConversionData.from_arrow(table, (1,))
    assert len(set(data.source_id.tolist())) == 2


def test_uncanonicalisable_source_ids_are_refused_by_column_name():
    with pytest.raises(ReportFault) as err:
        parse_report('{"source_id": 7.5, "contributions": []}')
    assert err.value.reason == "bad_source_id" and "7.5" not in str(err.value)
    with pytest.raises(ReportFault) as err:
        parse_report('{"source_id": true, "contributions": []}')
    assert err.value.reason == "bad_source_id"
    from transforms.ara.beam import check_conversion_schema
    schema = pa.schema([("source_id", pa.bool_()), ("value", pa.float64())])
    with pytest.raises(ValueError, match="'source_id'"):
        check_conversion_schema(schema, FULL)
    table = pa.table({"source_id": pa.array([7.5]), "value": [1.0], "dim_0": [0]})
    with pytest.raises(ValueError, match="'source_id'") as err:
        ConversionData.from_arrow(table, (1,))
    assert "7.5" not in str(err.value)


def test_a_key_drives_each_ara_transform_once():
    key = ReleaseKey.for_testing(2)
    encode = EncodeConversions(FULL, key)
    summary = SummaryReport(1.0, key)
    with beam.Pipeline(runner="FnApiRunner") as p:
        batches = p | "B" >> beam.Create([_batch([1], pa.int64())], reshuffle=False)
        batches | "Once" >> encode
        with pytest.raises(KeyReuseError, match="EncodeConversions"):
            batches | "Twice" >> encode
        inputs = {"contributions": p | "C" >> beam.Create([(key_bytes(1), 1)]),
                  "domain": p | "D" >> beam.Create([key_bytes(1)])}
        inputs | "S1" >> summary
        with pytest.raises(KeyReuseError, match="SummaryReport"):
            inputs | "S2" >> SummaryReport(1.0, key)  # another instance, same key and purpose
