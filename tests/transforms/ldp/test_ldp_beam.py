"""Beam wiring of frequency estimation and client simulation; simulated client distributions."""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from accounting.keys import KeyReuseError, ReleaseKey
from transforms.ldp import KeyedRandomness, make_oracle, simulate
from transforms.ldp.beam import NAMESPACE, EstimateFrequencies, RandomizeReports
from transforms.ldp.estimators import (SupportCounts, candidate_values, count_support, estimate_frequencies,
                                       estimate_table)
from transforms.ldp.randomizers import randomize


def _rows(pcoll, label):
    return pcoll | label >> beam.FlatMap(lambda t: t.to_pylist())


def test_estimate_frequencies_equals_the_in_memory_estimate():
    source = KeyedRandomness.for_testing(1)
    chosen = [3, 17, 40]
    with TestPipeline() as p:
        side = p | "Cands" >> beam.Create([pa.table({"value": [40, 3]}), pa.table({"value": [17]})])
        for name in ("grr", "oue", "olh"):
            oracle = make_oracle(name, epsilon=1.5, domain_size=50)
            reports = randomize(oracle, np.arange(4000) % 50, source=source, ids=np.arange(4000))
            batches = [reports.slice(i, 1000) for i in range(0, 4000, 1000)]
            pc = p | f"Create{name}" >> beam.Create(batches)
            assert_that(_rows(pc | f"All{name}" >> EstimateFrequencies(oracle), f"r1{name}"),
                        equal_to(estimate_frequencies(oracle, reports).to_pylist()),
                        label=f"all{name}")
        # A public candidate list read as tables reaches the OLH counting as a side input.
        some = pc | "Some" >> EstimateFrequencies(oracle, candidates=side)
        assert_that(_rows(some, "r2"),
                    equal_to(estimate_frequencies(oracle, reports, chosen).to_pylist()),
                    label="some")


def test_malformed_reports_are_dropped_and_counted_never_released():
    oracle = make_oracle("grr", epsilon=1.0, domain_size=10)
    good = randomize(oracle, np.arange(100) % 10, source=KeyedRandomness.for_testing(2),
                     ids=np.arange(100))
    bad = pa.table({"report": pa.array([3, 11, None, 99], pa.int64())})
    values = candidate_values(oracle)
    counts = count_support(oracle, good, values)
    one = np.zeros_like(counts.support)
    one[3] = 1  # the one valid report of the bad batch
    counts = counts.merge(SupportCounts(n=1, support=one))
    expected = estimate_table(oracle, values, counts)
    p = TestPipeline()
    out = p | beam.Create([good, bad]) | EstimateFrequencies(oracle)
    assert_that(_rows(out, "rows"), equal_to(expected.to_pylist()))
    result = p.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in
                result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]}
    assert counters["reports_read"] == 104
    assert counters["reports_dropped_out_of_domain"] == 2
    assert counters["reports_dropped_null"] == 1


def test_wrong_oracle_fails_the_pipeline():
    reports = randomize(make_oracle("oue", epsilon=1, domain_size=8), np.arange(8),
                        source=KeyedRandomness.for_testing(3), ids=np.arange(8))
    with pytest.raises(Exception, match="randomized as"):
        with TestPipeline() as p:
            _ = p | beam.Create([reports]) | EstimateFrequencies(make_oracle("sue", epsilon=1,
                                                                             domain_size=8))


def test_randomize_reports_is_keyed_by_client_id_and_applies_once():
    oracle = make_oracle("olh", epsilon=2, domain_size=1000)
    key = ReleaseKey.for_testing(4)
    values = pa.table({"client_id": np.arange(500, dtype=np.int64),
                       "value": np.arange(500) % 1000, "group": np.zeros(500, np.int16)})
    expected = randomize(oracle, values.column("value"), source=KeyedRandomness(key, "clients"),
                         ids=np.arange(500), extra={"group": values.column("group")})
    transform = RandomizeReports(oracle, release_key=key, carry=["group"])
    with TestPipeline() as p:
        out = p | beam.Create([values.slice(0, 200), values.slice(200)]) | transform
        assert_that(_rows(out, "rows"), equal_to(expected.to_pylist()))
    with pytest.raises(KeyReuseError):
        with TestPipeline() as p:
            _ = p | beam.Create([values]) | transform


def test_seed_distributions_and_simulated_values():
    dists = simulate.seed_distributions()
    assert sorted(dists) == ["poisson100", "poisson5", "uniform100", "uniform14"]
    for dist in dists.values():
        assert sum(dist.probabilities) == pytest.approx(1.0)
    assert dists["uniform14"].values == tuple(range(15))
    sim = simulate.Simulation(distribution=dists["poisson5"], num_clients=50_000, seed=1,
                              batch_size=7000)
    values = np.concatenate([sim.values(ids) for ids in sim.id_batches()])
    assert abs(values.mean() - 5) < 0.05 and abs(values.var() - 5) < 0.15
    assert np.array_equal(values[:100], sim.values(np.arange(100, dtype=np.uint64)))
    counts = sim.true_counts(64)
    assert counts.sum() == 50_000 and np.array_equal(counts, np.bincount(values, minlength=64))
    z = simulate.distribution_by_name("zipf1.5", 100)
    assert z.probabilities[0] / z.probabilities[1] == pytest.approx(2 ** 1.5)
    with pytest.raises(ValueError, match="unknown distribution"):
        simulate.distribution_by_name("gauss")
