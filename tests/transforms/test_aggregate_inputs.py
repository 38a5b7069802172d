"""DataFrame input, schema errors at construction, error columns and output schemas (issue 16
point 4)."""
import glob
import json
import math
import os
import tempfile

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from transforms.aggregate import DPAggregate
from transforms.keyset import PublicKeyset
from transforms.metrics import Count, Mean, Quantiles, Sum, VectorSum
from aggregate_kit import aggregate_of

BOUNDS = ContributionBounds(max_partitions=2, max_contributions_per_partition=2, min_value=0, max_value=10)
KEYSET = PublicKeyset.from_keys(["DE", "FR", "JP"], ["country"])


def _table():
    rng = np.random.default_rng(0)
    return pa.table({"user": rng.integers(0, 50, 300), "country": rng.choice(["DE", "FR", "JP", "US"], 300),
                     "seconds": rng.uniform(0, 12, 300)})


def _aggregate(**kwargs):
    options = dict(privacy_unit="user", keys=["country"], value="seconds", bounds=BOUNDS,
                   metrics=[Count(), Sum(), Mean()], budget=PrivacyBudget(epsilon=1.0), keyset=KEYSET,
                   release_key=ReleaseKey.for_testing(8))
    options.update(kwargs)
    return aggregate_of(**options)


def _run(element, transform):
    directory = tempfile.mkdtemp()
    with beam.Pipeline(runner="FnApiRunner") as p:
        released = p | beam.Create([element]) | transform
        released | beam.Map(lambda t: json.dumps([[f.name, str(f.type)] for f in t.schema])) | "Schema" >> beam.io.WriteToText(
            os.path.join(directory, "schema"))
        (released | beam.FlatMap(lambda t: t.to_pylist()) | beam.Map(json.dumps)
         | beam.io.WriteToText(os.path.join(directory, "out")))
    rows = sorted((json.loads(line) for path in glob.glob(os.path.join(directory, "out*"))
                   for line in open(path)), key=lambda r: r["country"])
    schemas = {line for path in glob.glob(os.path.join(directory, "schema*")) for line in open(path)}
    return rows, schemas


def test_pandas_dataframes_release_what_arrow_releases():
    table = _table()
    arrow, _ = _run(table, _aggregate())
    assert _run(table.to_pandas(), _aggregate())[0] == arrow
    assert [r["country"] for r in arrow] == ["DE", "FR", "JP"]


@pytest.mark.slow  # Polars (180 MB) is installed by `make test-slow`, not by `make setup`
def test_polars_dataframes_release_what_arrow_releases_and_fail_on_a_misspelt_column():
    import polars as pl  # a missing Polars fails here: the slow suite installs it

    table = _table()
    assert _run(pl.from_arrow(table), _aggregate())[0] == _run(table, _aggregate())[0]
    misspelt = pl.from_arrow(_table().rename_columns(["user", "country", "secs"]))
    with pytest.raises(ValueError, match=r"no value column 'seconds' \(columns: \[.*'country'"):
        beam.Pipeline(runner="FnApiRunner") | beam.Create([misspelt]) | _aggregate()


def test_a_misspelt_column_fails_at_construction_naming_the_columns_present():
    misspelt = _table().rename_columns(["user", "country", "secs"])
    for element in (misspelt, misspelt.to_pandas(),
                    {"user": 1, "country": "DE", "secs": 1.0}):
        p = beam.Pipeline(runner="FnApiRunner")
        with pytest.raises(ValueError, match=r"no value column 'seconds' \(columns: \[.*'country'"):
            p | beam.Create([element]) | _aggregate()
    with pytest.raises(ValueError, match="no key column 'country'"):
        beam.Pipeline() | beam.Create([_table().rename_columns(["user", "land", "seconds"])]) | _aggregate()
    with pytest.raises(ValueError, match="value column 'seconds' must be numeric"):
        beam.Pipeline() | beam.Create([_table().set_column(2, "seconds", pa.array(["x"] * 300))]) | _aggregate()


def test_error_columns_state_std_and_interval_and_follow_suppression():
    transform = _aggregate(error_columns=True, threshold_mode="value",
                           metrics=[Count(threshold=45), Sum(), Mean()])
    rows, schemas = _run(_table(), transform)
    spec = transform.measures["count"].spec
    for r in rows:
        if r["count"] is None:  # suppressed: its interval would reveal it
            assert r["count_ci95_low"] is None and r["count_std"] is None
        else:
            assert r["count_std"] == pytest.approx(spec.std)
            assert r["count_ci95_high"] - r["count"] == pytest.approx(spec.ci_halfwidth(0.95))
        # the sum is S + midpoint N: a union bound of the two noises' 97.5% intervals
        mo = transform.moments
        s, n = transform.measures[mo.nsum].spec, transform.measures[mo.count].spec
        assert r["sum_ci95_high"] - r["sum_ci95_low"] == pytest.approx(
            2 * (s.ci_halfwidth(0.975) + abs(mo.midpoint) * n.ci_halfwidth(0.975)))
        assert r["sum_std"] == pytest.approx(math.hypot(s.std, mo.midpoint * n.std))
        assert r["mean_ci95_low"] <= r["mean"] <= r["mean_ci95_high"] and r["mean_std"] > 0
    assert {r["count"] is None for r in rows} == {True, False}  # the threshold bites on this data
    assert "mean: error columns derived from the noise of sum.normalized_sum, count" in \
        transform.explain()


@pytest.mark.parametrize("metrics", [[Count(), Sum(noise="discrete_laplace")], [Quantiles([0.5, 0.9])],
                                     [Count(), VectorSum(dimension=2, max_norm=1)]])
def test_output_schema_matches_the_release(metrics):
    table = _table()
    value = "seconds"
    if any(m.kind.value == "vector_sum" for m in metrics):
        table = table.append_column("vec", pa.array([[1.0, 2.0]] * table.num_rows))
        value = "vec"
    transform = _aggregate(metrics=metrics, value=value,
                           integer_values=any(m.kind.value == "sum" for m in metrics) or None)
    _, schemas = _run(table if value == "vec" else table.set_column(
        2, "seconds", pa.array(np.floor(table.column("seconds").to_numpy()))), transform)
    documented = [[f.name, str(f.type)] for f in transform.output_schema()]
    assert [json.loads(s) for s in schemas] == [documented]
