"""ARA event-level reports: output states, randomized response, debiasing, Beam wiring."""
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that

from accounting.verification.dp_tester import assert_dp, run_dp_test
from accounting.keys import KeyReuseError, ReleaseKey
from transforms.ara.event_beam import (DebiasConversionCounts, SimulateEventReports,
                                       TriggerMapping)
from transforms.ara.event_debias import (debias, debias_groups, exact_variance,
                                         uniform_moments, variance_floor)
from transforms.ara.event_level import (EventLevelConfig, flip_probability, num_states,
                                        randomize_states, randomized_response)
from transforms.noise import RandomStreams


def _config(t=2, w=2, r=2, eps=1.0):
    return EventLevelConfig(trigger_data_cardinality=t, report_windows=w, max_reports=r,
                            epsilon=eps)


# --- states and flip probability ---------------------------------------------------------------

def test_states_and_flip_probability_match_the_apis_published_values():
    clicks = _config(8, 3, 3, 14.0)   # the API's navigation-source default
    views = _config(2, 1, 1, 14.0)    # its event-source default
    assert clicks.states == 2925 and views.states == 3
    assert clicks.flip_probability == pytest.approx(0.0024, abs=5e-5)    # "0.24%"
    assert views.flip_probability == pytest.approx(2.5e-6, rel=0.01)
    assert clicks.information_gain() == pytest.approx(11.46, abs=0.005)
    assert views.information_gain() == pytest.approx(1.58, abs=0.005)
    assert num_states(1, 1, 20) == 21
    k, eps = 15, 1.0
    p = flip_probability(k, eps)
    # the randomized response's worst likelihood ratio is exactly e^epsilon
    assert (1 - p + p / k) / (p / k) == pytest.approx(math.exp(eps))


def test_state_numbering_is_a_bijection_over_report_multisets():
    cfg = _config(2, 2, 3)            # N = 4 cells, k = C(7, 3) = 35
    ranks = np.arange(cfg.states)
    cells = cfg.decode(ranks)
    assert (cfg.encode(cells) == ranks).all()
    multisets = {tuple(sorted(c for c in row if c >= 0)) for row in cells.tolist()}
    assert len(multisets) == cfg.states == 35
    assert all(len(m) <= 3 for m in multisets)
    # order of a source's reports does not matter
    assert cfg.encode(np.array([[3, 0, -1]]))[0] == cfg.encode(np.array([[-1, 0, 3]]))[0]
    assert cfg.cell([1], [1]).tolist() == [3]


def test_bad_input_is_refused_naming_the_field_not_the_data():
    cfg = _config(2, 2, 2)
    with pytest.raises(ValueError, match="trigger_data must be in") as err:
        cfg.cell([7], [0])
    assert "7" not in str(err.value)
    with pytest.raises(ValueError, match="window must be in"):
        cfg.cell([0], [5])
    with pytest.raises(ValueError, match="report cells"):
        cfg.encode(np.array([[4, -1]]))
    with pytest.raises(ValueError, match="more reports than max_reports"):
        cfg.encode(np.array([[0, 1]]), counts=np.array([3]))
    with pytest.raises(ValueError, match="max_reports"):
        cfg.encode(np.array([[0, 1, 2]]))
    for field, kwargs in (("trigger_data_cardinality", dict(t=0)), ("report_windows", dict(w=6)),
                          ("max_reports", dict(r=21)), ("epsilon", dict(eps=14.5)),
                          ("epsilon", dict(eps=float("nan")))):
        with pytest.raises(ValueError, match=field):
            _config(**kwargs)
    with pytest.raises(ValueError, match="output states"):
        _config(32, 5, 20, 1.0)       # k far above the API's 2^32 - 1
    with pytest.raises(ValueError, match="value_edges"):
        TriggerMapping(value_edges=(5.0, 1.0), window_ends=(2.0,))
    with pytest.raises(ValueError, match="window_ends"):
        TriggerMapping(value_edges=(1.0,), window_ends=(2.0,)).check(cfg)


def test_flip_rate_and_uniform_draws():
    cfg = _config(2, 1, 1, 1.0)       # k = 3
    n = 120_000
    truth = np.zeros(n, dtype=np.int64)
    out = randomize_states(truth, cfg, RandomStreams.for_range(ReleaseKey.for_testing(1),
                                                               "flip", n))
    p, k = cfg.flip_probability, cfg.states
    changed = (out != truth).mean()
    expected = p * (k - 1) / k
    assert changed == pytest.approx(expected, abs=5 * math.sqrt(expected * (1 - expected) / n))
    counts = np.bincount(out[out != 0], minlength=k)[1:]
    assert abs(counts[0] - counts[1]) < 5 * math.sqrt(counts.sum())  # flips are uniform


# --- DP tester ---------------------------------------------------------------------------------

def _sampler(cfg, state, seed, flip=None):
    def sample(n):
        streams = RandomStreams.for_range(ReleaseKey.for_testing(seed), "dp-test", n)
        truth = np.full(n, state, dtype=np.int64)
        p = cfg.flip_probability if flip is None else flip
        return randomized_response(truth, cfg.states, p, streams).astype(np.float64)
    return sample


def test_dp_tester_accepts_the_randomizer_and_catches_a_broken_one():
    cfg = _config(2, 1, 2, 1.0)       # N = 2, R = 2: k = 6 states
    a, b = 0, cfg.states - 1          # no report vs two reports
    assert_dp(_sampler(cfg, a, 1), _sampler(cfg, b, 2), epsilon=cfg.epsilon, n_samples=200_000)
    # broken: half the specified flip probability (noise for epsilon ~ 2.3 claimed as 1)
    broken = run_dp_test(_sampler(cfg, a, 3, cfg.flip_probability / 2),
                         _sampler(cfg, b, 4, cfg.flip_probability / 2),
                         epsilon=cfg.epsilon, n_samples=200_000)
    assert not broken.passed and broken.epsilon_lower_bound > 1.5


def test_dp_tester_on_the_sources_own_report_multisets():
    """The states compared are encoded from real report multisets (no report; two reports in
    the last cell), not taken from the count of states: a wrong count leaves some outputs out
    of the uniform draw, and a source whose true state lies outside it is never hidden."""
    cfg = _config(2, 1, 2, 1.0)
    none, full = cfg.encode(np.array([[-1, -1], [cfg.cells - 1, cfg.cells - 1]]))
    assert len({int(none), int(full)}) == 2
    assert_dp(_sampler(cfg, int(none), 5), _sampler(cfg, int(full), 6), epsilon=cfg.epsilon,
              n_samples=200_000)


# --- debiasing ---------------------------------------------------------------------------------

def test_uniform_moments_match_enumeration():
    cfg = _config(2, 2, 3)
    cells = cfg.decode(np.arange(cfg.states))
    for size in (1, 2, 4):
        in_set = ((cells >= 0) & (cells < size)).sum(axis=1)
        mu, u2 = uniform_moments(cfg, size)
        assert mu == pytest.approx(in_set.mean()) and u2 == pytest.approx((in_set ** 2).mean())
        assert mu == pytest.approx(cfg.max_reports * size / (cfg.cells + 1))


def test_debiased_counts_are_unbiased_with_the_stated_variance():
    cfg = _config(2, 2, 3, 1.5)
    rng = np.random.default_rng(0)
    n = 400
    reports = rng.integers(0, 4, n)                      # 0..3 true reports per source
    cells = np.where(np.arange(3)[None, :] < reports[:, None], rng.integers(0, 4, (n, 3)), -1)
    true_states = cfg.encode(cells)
    in_set = ((cells == 0) | (cells == 2)).sum(axis=1)   # trigger_data 0, both windows
    truth = in_set.sum()
    key = ReleaseKey.for_testing(7)
    estimates, variances = [], []
    for rep in range(300):
        noisy = cfg.decode(randomize_states(true_states, cfg,
                                            RandomStreams.for_range(key, f"rep{rep}", n)))
        m = ((noisy == 0) | (noisy == 2)).sum(axis=1)
        est = debias(m.sum(), (m * m).sum(), n, cfg, cells_in_set=2)
        estimates.append(est.estimate)
        variances.append(est.variance)
    exact = exact_variance(in_set, cfg, 2)
    estimates = np.array(estimates)
    assert abs(estimates.mean() - truth) < 4 * math.sqrt(exact / estimates.size)
    assert estimates.var() == pytest.approx(exact, rel=0.2)
    assert np.mean(variances) == pytest.approx(exact, rel=0.05)
    with pytest.raises(ValueError):
        debias(5, 3, 10, cfg, 2)   # a sum of squares below the sum is impossible


@pytest.mark.parametrize("t,w,r,eps", [(2, 2, 3, 1.5), (2, 1, 1, 14.0), (8, 3, 3, 14.0),
                                       (3, 2, 2, 0.5)])
def test_the_variance_floor_is_below_every_groups_true_variance_and_positive(t, w, r, eps):
    """The public floor the released std is clamped at: at most the exact variance of every
    group of n sources (every true count per source in [0, R], by enumeration of single sources
    and random groups), attained by some group, and positive, so no group gets a zero-width
    interval."""
    cfg = _config(t, w, r, eps)
    rng = np.random.default_rng(5)
    for cells in (1, w, cfg.cells):
        one = float(variance_floor(np.array([1]), cfg, cells)[0])
        per_count = [exact_variance(np.array([a]), cfg, cells) for a in range(r + 1)]
        assert 0 < one == pytest.approx(min(per_count), rel=1e-12) and one <= min(per_count)
        for _ in range(20):
            n = int(rng.integers(1, 50))
            group = rng.integers(0, r + 1, n)
            assert float(variance_floor(np.array([n]), cfg, cells)[0]) <= \
                exact_variance(group, cfg, cells) * (1 + 1e-12)


def test_a_small_groups_std_is_clamped_at_the_floor_not_at_zero():
    """One source with one report in each of two cells of the set: the unbiased variance
    estimate is negative here; the standard error is the floor's square root, not 0."""
    cfg = _config(2, 2, 3, 1.5)
    est = debias(2, 2, 1, cfg, cells_in_set=2)
    assert est.variance < 0
    assert est.standard_error == pytest.approx(math.sqrt(variance_floor(np.array([1]), cfg, 2)[0]))
    assert est.standard_error > 0


# --- Beam ----------------------------------------------------------------------------------------

SOURCES = pa.table({"source_id": pa.array([str(i) for i in range(40)]),
                    "dim_0": pa.array([i % 2 for i in range(40)])})
CONVERSIONS = pa.table({
    "source_id": pa.array([1, 1, 1, 2.0, 3, 99, 4], pa.float64()),  # 2.0 is source "2"
    "trigger_data": pa.array([0, 1, 1, 1, 5, 0, 0]),                # 5: outside T = 2
    "window": pa.array([0, 1, 0, 0, 0, 0, 1]),
    "order": pa.array([2, 0, 1, 0, 0, 0, 0])})


def _run(transform_inputs, expand, check):
    """Run ``expand`` on one-table inputs; ``check(rows)`` runs on the output rows (in the
    pipeline, via assert_that); returns the counters."""
    p = beam.Pipeline(runner="FnApiRunner")
    pcolls = {name: p | name >> beam.Create([t], reshuffle=False)
              for name, t in transform_inputs.items()}
    rows = expand(pcolls) | beam.FlatMap(lambda t: t.to_pylist())
    assert_that(rows, check)
    result = p.run()
    result.wait_until_finish()
    return {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]}


def _pure_reports(cfg, key, purpose):
    """The pure-function reference: first R triggers by order, randomized per source lane."""
    triggers = {"1": [(2, 0), (0, 3), (1, 1)], "2": [(0, 1)], "4": [(0, 2)]}  # (order, cell)
    ids = [str(i) for i in range(40)]
    cells = np.full((40, cfg.max_reports), -1)
    for sid, items in triggers.items():
        kept = [c for _, c in sorted(items)][:cfg.max_reports]
        cells[int(sid), :len(kept)] = kept
    streams = RandomStreams.for_keys(key, purpose, pa.table({"source_id": pa.array(ids)}))
    noisy = cfg.decode(randomize_states(cfg.encode(cells), cfg, streams))
    return sorted((ids[i], int(c) // cfg.trigger_data_cardinality,
                   int(c) % cfg.trigger_data_cardinality)
                  for i, row in enumerate(noisy) for c in row if c >= 0)


def test_simulated_reports_match_the_pure_mechanism_and_count_faults():
    cfg = _config(2, 2, 2, 3.0)
    expected = _pure_reports(cfg, ReleaseKey.for_testing(5), "ara-event-level-randomized-response")
    assert expected and {r[0] for r in expected} <= {str(i) for i in range(40)}

    def check(rows):
        got = sorted((r["source_id"], r["window"], r["trigger_data"]) for r in rows)
        assert got == expected, (got, expected)

    counters = _run({"sources": SOURCES, "conversions": CONVERSIONS},
                    lambda pc: pc | SimulateEventReports(cfg, ReleaseKey.for_testing(5)), check)
    assert counters["conversion_rows_dropped_trigger_data_outside_cardinality"] == 1
    assert counters["conversion_rows_dropped_source_not_registered"] == 1
    assert counters["conversion_rows_not_reported_over_max_reports"] == 1
    assert counters["sources_randomized"] == 40


def test_trigger_mapping_derives_classes_and_windows():
    mapping = TriggerMapping(value_edges=(10.0,), window_ends=(2.0, 7.0))
    assert mapping.trigger_data(np.array([3.0, 10.0, 50.0])).tolist() == [0, 1, 1]
    assert mapping.window(np.array([0.5, 2.0, 6.0, 9.0])).tolist() == [0, 0, 1, 2]  # 2: late
    cfg = _config(2, 2, 2, 3.0)
    logs = pa.table({"source_id": pa.array(["1", "1", "2"]), "value": [3.0, 50.0, 1.0],
                     "delay": [1.0, 9.0, 3.0]})
    counters = _run({"sources": SOURCES, "conversions": logs},
                    lambda pc: pc | SimulateEventReports(cfg, ReleaseKey.for_testing(6),
                                                         mapping=mapping), lambda rows: None)
    assert counters["conversion_rows"] == 3
    assert counters["conversion_rows_dropped_window_outside_report_windows"] == 1


def test_debiased_estimates_in_beam_match_the_pure_estimator():
    cfg = _config(2, 2, 2, 2.0)
    reports = pa.table({"source_id": pa.array(["1", "1", "3", "4", "77"]),
                        "window": pa.array([0, 1, 0, 1, 0]),
                        "trigger_data": pa.array([0, 0, 1, 0, 0])})
    # dim_0 = 1 holds sources 1 and 3 (of 20): trigger data 0 -> M = 2 (source 1) and 0 else;
    # all trigger data -> M = 2 (source 1), 1 (source 3)
    est0, var0 = debias_groups(np.array([20]), np.array([2.0]), np.array([4.0]), cfg,
                               cfg.report_windows)
    est_all, _ = debias_groups(np.array([20]), np.array([3.0]), np.array([5.0]), cfg, cfg.cells)

    def check(rows):
        by = {(r["dim_0"], r["trigger_data"]): r for r in rows}
        assert len(by) == len(rows) == 2 * 3   # every group x (each trigger data, and all)
        assert by[(1, 0)]["sources"] == 20
        assert by[(1, 0)]["estimate"] == pytest.approx(est0[0])
        assert by[(1, 0)]["variance"] == pytest.approx(var0[0])
        floor = variance_floor(np.array([20]), cfg, cfg.report_windows)[0]
        assert by[(1, 0)]["estimate_std"] == pytest.approx(math.sqrt(max(var0[0], floor)))
        assert all(r["estimate_std"] > 0 for r in rows)   # every group has sources
        assert by[(1, None)]["estimate"] == pytest.approx(est_all[0])

    counters = _run({"sources": SOURCES, "reports": reports},
                    lambda pc: pc | DebiasConversionCounts(cfg, ["dim_0"]), check)
    assert counters["reports_dropped_source_not_registered"] == 1


def test_the_randomizer_refuses_a_second_application_of_its_key():
    cfg = _config()
    key = ReleaseKey.for_testing(8)
    transform = SimulateEventReports(cfg, key)
    with beam.Pipeline(runner="FnApiRunner") as p:
        inputs = {"sources": p | "S" >> beam.Create([SOURCES]),
                  "conversions": p | "C" >> beam.Create([CONVERSIONS])}
        inputs | "Once" >> transform
        with pytest.raises(KeyReuseError, match="SimulateEventReports"):
            inputs | "Twice" >> transform
