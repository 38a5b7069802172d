"""Masked LARk on Beam: browsers, each helper's pipeline and the ad server's combine step give
the same releases as the pure functions, and refuse bad input."""
import glob
import json
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from accounting.keys import KeyReuseError, ReleaseKey
from transforms.lark import helper as H
from transforms.lark.beam import CombineHelperOutputs, HelperAggregate, HelperGradient, ShareRecords
from transforms.lark.browser import aggregation_reports, gradient_reports
from transforms.lark.combine import combine_aggregation
from transforms.lark.data import classification_data, conversion_records, gradient_records
from transforms.lark.model import LogisticModel
from transforms.lark.params import AggregationParams, GradientParams
from transforms.lark.randomness import BrowserRandomness
from transforms.lark.reports import gradient_output_schema

PARAMS = AggregationParams(lower=0, upper=100, fraction_bits=8, epsilon=1.0, k=5)


def _write(pcoll, directory, label):
    return (pcoll | f"{label}Rows" >> beam.FlatMap(lambda t: t.to_pylist())
            | f"{label}Json" >> beam.Map(json.dumps, sort_keys=True)
            | f"{label}Write" >> beam.io.WriteToText(os.path.join(directory, label)))


def _read(directory, label):
    rows = []
    for path in glob.glob(os.path.join(directory, label + "*")):
        with open(path) as handle:
            rows.extend(json.loads(line) for line in handle)
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def _chunks(table, size):
    return [table.slice(i, size) for i in range(0, table.num_rows, size)]


def test_share_helpers_and_combine_pipelines_match_the_pure_functions(tmp_path):
    records = conversion_records(6000, num_campaigns=30, num_batches=2, seed=4)
    keys = [ReleaseKey.for_testing(21), ReleaseKey.for_testing(22)]
    randomness = BrowserRandomness.for_testing(5)
    # browsers (any bundling gives the same reports: randomness is keyed by record content)
    with TestPipeline(runner="FnApiRunner") as p:
        shared = (p | beam.Create(_chunks(records, 700)) | ShareRecords(randomness=randomness,
                                                                        aggregation=PARAMS))
        for h in range(2):
            _write(shared[h], str(tmp_path), f"reports{h}")
    pure_reports = aggregation_reports(records, PARAMS, randomness=randomness)
    for h in range(2):
        assert _read(str(tmp_path), f"reports{h}") == sorted(
            pure_reports[h].to_pylist(), key=lambda r: json.dumps(r, sort_keys=True))
    # each helper is its own pipeline run, reading only its own stream, in small tables
    for h in range(2):
        with TestPipeline(runner="FnApiRunner") as p:
            released = (p | beam.Create(_chunks(pure_reports[h], 450))
                        | HelperAggregate(PARAMS, helper=h, release_key=keys[h]))
            _write(released, str(tmp_path), f"helper{h}")
    pure_outputs = []
    for h in range(2):
        parts, _ = H.aggregation_partials(pure_reports[h], PARAMS, h)
        by_batch = {}
        for part in parts:
            by_batch.setdefault(part.batch_id, []).append(part)
        tables = [H.release_aggregation(H.merge_partials(ps), PARAMS, helper=h,
                                        release_key=ReleaseKey.for_testing(21 + h))[0]
                  for ps in by_batch.values()]
        pure_outputs.append(pa.concat_tables([t for t in tables if t is not None]))
        assert _read(str(tmp_path), f"helper{h}") == sorted(
            pure_outputs[h].to_pylist(), key=lambda r: json.dumps(r, sort_keys=True))
    # the ad server
    with TestPipeline(runner="FnApiRunner") as p:
        outputs = [p | f"H{h}" >> beam.Create([pa.Table.from_pylist(
            _read(str(tmp_path), f"helper{h}"), schema=pure_outputs[h].schema)]) for h in range(2)]
        _write(outputs | beam.Flatten() | CombineHelperOutputs(PARAMS), str(tmp_path),
               "combined")
    combined = _read(str(tmp_path), "combined")
    expected = combine_aggregation(pure_outputs, PARAMS).to_pylist()
    assert combined == sorted(expected, key=lambda r: json.dumps(r, sort_keys=True))
    clear = {(r["batch_id"], r["key"]): 0.0 for r in combined}
    for r in records.to_pylist():
        if (r["batch_id"], r["key"]) in clear:
            clear[(r["batch_id"], r["key"])] += r["value"]
    errors = [abs(r["value"] - clear[(r["batch_id"], r["key"])]) for r in combined]
    assert np.median(errors) < 1000  # two discrete Laplace draws of scale 100 each


def test_helper_transform_claims_its_key_once():
    key = ReleaseKey.for_testing(1)
    with pytest.raises(KeyReuseError):
        with TestPipeline(runner="FnApiRunner") as p:
            reports = p | beam.Create([], reshuffle=False)
            reports | "A" >> HelperAggregate(PARAMS, helper=0, release_key=key)
            reports | "B" >> HelperAggregate(PARAMS, helper=0, release_key=key)
    with pytest.raises(TypeError):
        HelperAggregate(PARAMS, helper=0, release_key=None).expand(None)
    with pytest.raises(ValueError):
        HelperAggregate(PARAMS, helper=2, release_key=key)


def test_combine_pipeline_refuses_a_missing_helper(tmp_path):
    records = conversion_records(500, num_campaigns=3, seed=1)
    reports = aggregation_reports(records, PARAMS, randomness=BrowserRandomness.for_testing(1))
    parts, _ = H.aggregation_partials(reports[0], PARAMS, 0)
    only, _ = H.release_aggregation(H.merge_partials(parts), PARAMS, helper=0,
                                    release_key=ReleaseKey.for_testing(1))
    with pytest.raises(Exception, match=r"no output from helper\(s\) \[1\]|missing"):
        with TestPipeline(runner="FnApiRunner") as p:
            _write(p | beam.Create([only]) | CombineHelperOutputs(PARAMS), str(tmp_path), "c")


def test_helper_gradient_pipeline_matches_pure_and_combines_to_the_clear_gradient(tmp_path):
    x, y, _ = classification_data(2400, num_features=6, seed=2)
    records = gradient_records(x, y).append_column(
        "batch_id", pa.array([f"step-{i % 3}" for i in range(2400)]))
    params = GradientParams(num_features=6, clip_norm=1.0, epsilon=None, k=100)
    model = LogisticModel(weights=(0.1, -0.2, 0.3, 0.0, 0.5, -0.1), bias=0.1,
                          feature_scale=1 / 32, feature_offset=128)
    reports = gradient_reports(records, num_features=6, randomness=BrowserRandomness.for_testing(3))
    outs = []
    for h in range(2):
        with TestPipeline(runner="FnApiRunner") as p:
            released = (p | beam.Create(_chunks(reports[h], 500))
                        | HelperGradient(params, model, helper=h, release_key=None))
            _write(released, str(tmp_path), f"g{h}")
        outs.append(pa.Table.from_pylist(_read(str(tmp_path), f"g{h}"),
                                         schema=gradient_output_schema()))
    with TestPipeline(runner="FnApiRunner") as p:
        combined = (p | beam.Create(outs) | CombineHelperOutputs(params, model=model))
        _write(combined, str(tmp_path), "gc")
    rows = _read(str(tmp_path), "gc")
    batch_of = np.array([i % 3 for i in range(2400)])
    for b in range(3):
        got = np.array([r["gradient"] for r in sorted(
            (r for r in rows if r["batch_id"] == f"step-{b}"), key=lambda r: r["coordinate"])])
        want = H.clear_gradient_units(model, params, x[batch_of == b], y[batch_of == b])
        assert np.array_equal(got * 2 ** 16, want)
