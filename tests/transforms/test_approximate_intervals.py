"""Coverage of the approximate 95% intervals of randomized response's debiased estimates (issue
39.6; transforms.error_columns.plug_in_interval): local-DP frequency estimates, label-DP class
counts and ARA event-level conversion counts.

Each test randomizes the same synthetic data of known truth many times, each run in the seeded
testing mode (its own public testing key), computes the released table with the code the jobs
use, and counts how often ``[<c>_ci95_low, <c>_ci95_high]`` holds the true value: over at least
2,000 (run, value) pairs the coverage must lie in [0.93, 0.97] (the binomial standard error at
95% is under 0.005 there, so a correct interval fails by chance with probability far below 1e-4,
and an interval of the wrong width -- +/-1 std covers about 68% -- fails for certain; each test
checks that too). The columns must also be what the statements say: estimate -/+ 1.96 std,
clipped to the quantity's range.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from accounting.keys import ReleaseKey
from transforms.error_columns import Z95
from transforms.ldp import make_oracle
from transforms.ldp.estimators import estimate_frequencies
from transforms.ldp.labels import LabelRandomizer, debias_table, label_counts, randomize_label_table
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import KeyedRandomness

LOW, HIGH = 0.93, 0.97
TRIALS = 2400


def _covered(low, high, truth) -> np.ndarray:
    return (np.asarray(low) <= truth) & (truth <= np.asarray(high))


def _check_columns(estimate, low, high, std, upper):
    assert np.allclose(low, np.clip(estimate - Z95 * std, 0.0, upper), rtol=1e-12, atol=1e-9)
    assert np.allclose(high, np.clip(estimate + Z95 * std, 0.0, upper), rtol=1e-12, atol=1e-9)


def _assert_coverage(covered, narrow):
    coverage, narrow_coverage = float(np.mean(covered)), float(np.mean(narrow))
    assert len(covered) >= 2000
    assert LOW <= coverage <= HIGH, coverage
    assert narrow_coverage < 0.8, narrow_coverage   # the test can fail: +/-1 std does


@pytest.mark.parametrize("name", ["grr", "oue", "olh", "binary_rr"])
def test_local_dp_frequency_intervals_cover_the_true_counts(name):
    """Zipf-distributed values (counts from a few to thousands) over 16 values (2 for binary
    RR), 4,000 clients, epsilon 1."""
    d = 2 if name == "binary_rr" else 16
    oracle = make_oracle(name, epsilon=1.0, domain_size=d)
    n = 4000
    values = np.minimum(np.random.default_rng(11).zipf(1.6, n) - 1, d - 1)
    truth = np.bincount(values, minlength=d)
    covered, narrow = [], []
    for run in range(math.ceil(TRIALS / d)):
        source = KeyedRandomness.for_testing(7000 + run, purpose="coverage")
        table = estimate_frequencies(oracle, randomize(oracle, values, source=source, ids=np.arange(n)))
        estimate, std = (table.column(c).to_numpy() for c in ("estimate", "estimate_std"))
        low, high = (table.column(c).to_numpy() for c in ("estimate_ci95_low", "estimate_ci95_high"))
        _check_columns(estimate, low, high, std, n)
        covered.append(_covered(low, high, truth))
        narrow.append(_covered(estimate - std, estimate + std, truth))
    _assert_coverage(np.concatenate(covered), np.concatenate(narrow))


@pytest.mark.parametrize("labels, shares", [(("no", "yes"), (0.8, 0.2)),
                                            (("a", "b", "c"), (0.6, 0.3, 0.1))])
def test_label_dp_class_count_intervals_cover_the_true_counts(labels, shares):
    """3,000 examples of known labels, epsilon 1, randomized per run under a testing key."""
    rr = LabelRandomizer(epsilon=1.0, labels=labels)
    n = 3000
    true_index = np.repeat(np.arange(len(labels)), np.round(np.asarray(shares) * n).astype(int))
    table = pa.table({"id": np.arange(true_index.size),
                      "label": pa.array([labels[i] for i in true_index])})
    truth = np.bincount(true_index, minlength=len(labels))
    covered, narrow = [], []
    for run in range(math.ceil(TRIALS / len(labels))):
        out, _ = randomize_label_table(rr, table, label_column="label", id_column="id",
                                       source=KeyedRandomness.for_testing(9000 + run, "coverage"))
        debias = debias_table(rr, label_counts(rr, out, "label"))
        estimate, low, high, std = (debias.column(c).to_numpy() for c in (
            "estimated_count", "estimated_count_ci95_low", "estimated_count_ci95_high",
            "estimated_count_std"))
        _check_columns(estimate, low, high, std, true_index.size)
        covered.append(_covered(low, high, truth))
        narrow.append(_covered(estimate - std, estimate + std, truth))
    _assert_coverage(np.concatenate(covered), np.concatenate(narrow))


def test_ara_event_level_intervals_cover_the_true_conversions():
    """1,500 sources with 0 to 3 attributed triggers each (T = 2 trigger-data values, w = 2
    windows, R = 3), epsilon 4; per run the browser's randomized response under a testing key,
    then the job's own debiasing and interval (pipelines.ara.event_level_reports.with_intervals)
    for each trigger-data value and for all values."""
    from pipelines.ara.event_level_reports import with_intervals
    from transforms.ara.event_debias import debias_groups
    from transforms.ara.event_level import EventLevelConfig, randomize_states
    from transforms.noise import RandomStreams

    cfg = EventLevelConfig(trigger_data_cardinality=2, report_windows=2, max_reports=3, epsilon=4.0)
    rng = np.random.default_rng(3)
    n = 1500
    reports = rng.integers(0, 4, n)
    cells = np.where(np.arange(3)[None, :] < reports[:, None], rng.integers(0, cfg.cells, (n, 3)), -1)
    true_states = cfg.encode(cells)
    trigger = lambda c: np.where(c >= 0, c % cfg.trigger_data_cardinality, -1)  # cell = w T + t
    sets = [(trigger(cells) == t, cfg.report_windows) for t in range(2)] + [(cells >= 0, cfg.cells)]
    truth = np.array([s.sum() for s, _ in sets], dtype=np.float64)
    key = ReleaseKey.for_testing(21)
    covered, narrow = [], []
    for run in range(math.ceil(TRIALS / 3)):
        noisy = cfg.decode(randomize_states(true_states, cfg, RandomStreams.for_range(key, f"run{run}", n)))
        rows = []
        for t, (_, size) in enumerate(sets):
            inside = (trigger(noisy) == t) if t < 2 else (noisy >= 0)
            m = inside.sum(axis=1).astype(np.float64)
            est, var = debias_groups(np.array([n]), np.array([m.sum()]), np.array([(m * m).sum()]),
                                     cfg, size)
            rows.append((float(est[0]), float(var[0])))
        estimate = np.array([r[0] for r in rows])
        variance = np.array([r[1] for r in rows])
        table = with_intervals(pa.table({
            "trigger_data": pa.array([0, 1, None], pa.int64()),
            "sources": pa.array([n] * 3, pa.int64()), "estimate": estimate, "variance": variance,
            "estimate_std": np.sqrt(np.maximum(variance, 0.0))}), cfg.max_reports)
        assert table.column_names == ["trigger_data", "sources", "estimate", "variance",
                                      "estimate_ci95_low", "estimate_ci95_high", "estimate_std"]
        std = table.column("estimate_std").to_numpy()
        low, high = (table.column(c).to_numpy() for c in ("estimate_ci95_low", "estimate_ci95_high"))
        _check_columns(estimate, low, high, std, cfg.max_reports * n)
        covered.append(_covered(low, high, truth))
        narrow.append(_covered(estimate - std, estimate + std, truth))
    _assert_coverage(np.concatenate(covered), np.concatenate(narrow))


def test_the_catalog_describes_an_approximate_interval_as_one():
    """A value whose errors statement says its interval is approximate: the catalog describes its
    error columns as an approximate interval and a plug-in std, not as the stated noise's."""
    from pipelines.catalog.about import _with_errors
    from pipelines.catalog.model import OutputTable
    from transforms.ldp.estimators import APPROXIMATE_INTERVAL

    names = ["value", "estimate", "estimate_ci95_low", "estimate_ci95_high", "estimate_std",
             "clicks", "clicks_ci95_low", "clicks_ci95_high", "clicks_std"]
    table = OutputTable(name="estimates.csv", columns=tuple((n, "double") for n in names),
                        sorted_by=("value",), noisy_columns=tuple(names[1:]), description="",
                        rows=None, errors=(("estimate", APPROXIMATE_INTERVAL),))
    about = _with_errors({}, [table])
    assert about["estimate_ci95_low"].description.startswith(
        "lower end of the approximate 95% interval around estimate (computed from released "
        "values only, plug-in variance and normal approximation")
    assert about["estimate_std"].description.startswith("plug-in standard deviation of estimate")
    assert "stated noise distribution" not in about["estimate_ci95_high"].description
    assert about["clicks_ci95_low"].description.startswith("lower end of the 95% noise interval")
    assert "APPROXIMATE 95% interval" in about["estimate"].description
