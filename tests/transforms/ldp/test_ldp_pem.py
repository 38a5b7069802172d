"""PEM round logic on small known data, the F1/NCR/NDCG metrics, and the one-pipeline Beam PEM."""
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.ldp import KeyedRandomness, simulate
from transforms.ldp.beam import PEMHeavyHitters
from transforms.ldp.evaluation import score_top_k, true_top_k
from transforms.ldp.pem import (PEMPlan, assign_groups, client_reports, heavy_hitters,
                                next_candidates, round_estimates, top_k)
from transforms.ldp.estimators import SupportCounts


def test_plan_shape_follows_the_paper():
    plan = PEMPlan(oracle="grr", epsilon=2.0, value_bits=16, top_k=9)
    assert plan.start_bits == 4 and plan.bits_per_round == 4
    assert plan.rounds == 3 and [plan.prefix_bits(r) for r in range(3)] == [8, 12, 16]
    assert plan.initial_candidates().size == 256
    assert plan.prefixes(np.array([0xABCD]), 0).tolist() == [0xAB]
    assert plan.prefixes(np.array([0xABCD]), 1).tolist() == [0xABC]
    assert plan.extend(np.array([0xAB, 0x01]), 0).tolist() == \
        sorted([(0x01 << 4) | i for i in range(16)] + [(0xAB << 4) | i for i in range(16)])
    uneven = PEMPlan(oracle="olh", epsilon=2.0, value_bits=10, top_k=2, bits_per_round=4)
    assert [uneven.prefix_bits(r) for r in range(uneven.rounds)] == [5, 9, 10]
    assert uneven.extend(np.array([3]), 1).tolist() == [6, 7]
    olh = uneven.oracle_for_round(0)
    assert olh.domain_size == 32 and olh.digits == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(oracle="oue", epsilon=1, value_bits=16, top_k=9), "PEM supports the oracles"),
    (dict(oracle="grr", epsilon=1, value_bits=40, top_k=9), "value_bits must be in"),
    (dict(oracle="olh", epsilon=1, value_bits=16, top_k=0), "top_k"),
    (dict(oracle="olh", epsilon=99, value_bits=16, top_k=3), "local epsilon"),
    (dict(oracle="olh", epsilon=1, value_bits=32, top_k=3, start_bits=24), "round 0 would"),
    (dict(oracle="olh", epsilon=1, value_bits=16, top_k=3, start_bits=16), "start_bits"),
])
def test_bad_plans_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PEMPlan(**kwargs)


def test_groups_are_uniform_and_independent_of_values():
    source = KeyedRandomness.for_testing(1)
    groups = assign_groups(source, np.arange(90_000), 3)
    counts = np.bincount(groups, minlength=3)
    assert abs(counts - 30_000).max() < 4 * math.sqrt(20_000)
    # Same ids, same groups, whatever the values (they are not an input).
    assert np.array_equal(groups[:100], assign_groups(source, np.arange(100), 3))


def test_rounds_on_known_counts_pick_the_true_heavy_hitters():
    """Exact support counts (no noise) through the round logic."""
    plan = PEMPlan(oracle="grr", epsilon=4.0, value_bits=7, top_k=2, bits_per_round=3)
    # true 4-bit prefixes: 1011 x 50, 0110 x 30, 0001 x 20
    assert plan.rounds == 2 and [plan.prefix_bits(r) for r in range(2)] == [4, 7]
    candidates = plan.initial_candidates()
    oracle = plan.oracle_for_round(0)
    p, q = oracle.support_probabilities()
    n = 1000
    truth = np.zeros(16)
    truth[0b1011] = 50
    truth[0b0110] = 30
    truth[0b0001] = 20
    support = np.round(truth * p + (n - truth) * q).astype(np.int64)
    est = round_estimates(plan, 0, candidates, SupportCounts(n=n, support=support))
    assert top_k(est, 2).column("value").to_pylist() == [0b1011, 0b0110]
    nxt = next_candidates(plan, 0, est)
    assert nxt.tolist() == sorted([(0b0110 << 3) | i for i in range(8)]
                                  + [(0b1011 << 3) | i for i in range(8)])


def test_end_to_end_pem_finds_the_top_k_at_a_generous_epsilon():
    plan = PEMPlan(oracle="olh", epsilon=6.0, value_bits=16, top_k=5)
    sim = simulate.Simulation(distribution=simulate.zipf(1.3, 300), num_clients=40_000, seed=3)
    source = KeyedRandomness.for_testing(4, "clients")
    reports = [client_reports(plan, sim.values(ids), source=source, ids=ids)
               for ids in sim.id_batches()]
    top, rounds = heavy_hitters(plan, reports)
    truth = true_top_k(sim.true_counts(1 << 16), 5)
    scores = score_top_k(top.column("value").to_pylist(), truth, 5)
    assert scores.f1 == 1.0 and scores.ndcg > 0.95
    assert top.column("rank").to_pylist() == [1, 2, 3, 4, 5]
    assert len(rounds) == plan.rounds
    # Population estimates of the top value are close to its true count.
    top_value = int(top.column("value")[0].as_py())
    true_count = sim.true_counts(1 << 16)[top_value]
    assert abs(top.column("estimate")[0].as_py() - true_count) < 5 * top.column("estimate_std")[0].as_py() \
        + 0.05 * true_count


def test_reports_keep_client_order_and_one_schema_across_rounds():
    plan = PEMPlan(oracle="olh", epsilon=2.0, value_bits=20, top_k=3)
    source = KeyedRandomness.for_testing(5)
    values = np.arange(1000) * 997 % (1 << 20)
    table = client_reports(plan, values, source=source, ids=np.arange(1000))
    assert table.schema == plan.report_schema()
    assert table.num_rows == 1000
    part = client_reports(plan, values[:400], source=source, ids=np.arange(400))
    assert part.equals(table.slice(0, 400))
    with pytest.raises(ValueError, match="below 2\\^20"):
        client_reports(plan, [1 << 20], source=source, ids=[0])
    other = PEMPlan(oracle="olh", epsilon=3.0, value_bits=20, top_k=3)
    with pytest.raises(ValueError, match="made for PEM plan"):
        heavy_hitters(other, table)
    with pytest.raises(ValueError, match="'group' column"):
        heavy_hitters(plan, table.drop_columns(["group"]).replace_schema_metadata(None))


def test_metrics_on_hand_computed_rankings():
    truth = np.array([10, 20, 30])
    perfect = score_top_k([10, 20, 30], truth, 3)
    assert (perfect.f1, perfect.ncr, perfect.ndcg) == (1.0, 1.0, 1.0)
    swapped = score_top_k([20, 10, 30], truth, 3)
    assert swapped.f1 == 1.0 and swapped.ncr == 1.0
    idcg = 3 + 2 / math.log2(3) + 1 / 2
    assert swapped.ndcg == pytest.approx((2 + 3 / math.log2(3) + 1 / 2) / idcg)
    partial = score_top_k([10, 99, 98], truth, 3)
    assert partial.f1 == pytest.approx(2 * 1 / 6)
    assert partial.ncr == pytest.approx(3 / 6)
    assert partial.ndcg == pytest.approx(3 / idcg)
    assert true_top_k(np.array([5, 9, 9, 1]), 2).tolist() == [1, 2]  # ties: smaller value


def test_beam_pem_runs_all_rounds_in_one_pipeline_and_matches_the_in_memory_rounds():
    plan = PEMPlan(oracle="grr", epsilon=5.0, value_bits=8, top_k=4, bits_per_round=3)
    assert plan.rounds == 2
    sim = simulate.Simulation(distribution=simulate.poisson(5), num_clients=8000, seed=7,
                              batch_size=2000)
    source = KeyedRandomness.for_testing(8, "clients")
    reports = [client_reports(plan, sim.values(ids), source=source, ids=ids)
               for ids in sim.id_batches()]
    expected_top, expected_rounds = heavy_hitters(plan, reports)
    with TestPipeline() as p:
        out = p | beam.Create(reports) | PEMHeavyHitters(plan)
        assert_that(out["heavy_hitters"] | "TopRows" >> beam.FlatMap(lambda t: t.to_pylist()),
                    equal_to(expected_top.to_pylist()), label="top")
        assert_that(out["rounds"] | "RoundRows" >> beam.FlatMap(lambda t: t.to_pylist()),
                    equal_to(pa.concat_tables(expected_rounds).to_pylist()), label="rounds")
