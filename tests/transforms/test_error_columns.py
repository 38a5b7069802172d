"""Error columns of derived metrics: a mean's, variance's and standard deviation's std and 95%
interval, from the noise of the sums and count they are computed from (issue 34, item 6).

The interval is a bound (a union bound over the noisy answers' own intervals): it must hold the
noise-free value in at least 95% of keys for every count, the empty key included; the std is
the delta method's, which must match the spread of the released values where counts are large.
The noise is the real engine's (keyed streams under public testing keys: reproducible)."""
from __future__ import annotations

import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from transforms.aggregate import Compute, DPAggregate, Keys, Output
from transforms.keyset import PublicKeyset
from transforms.metrics import (Count, Mean, Std, Variance, mean_error, mean_from_noisy,
                                plan_measures, variance_error, variance_from_noisy)
from transforms.noise import RandomStreams, add_noise

LOW, HIGH = 0.0, 10.0
BOUNDS = ContributionBounds(max_partitions=1, max_contributions_per_partition=1, min_value=LOW,
                            max_value=HIGH)
KEYS = 3000
#: Coverage below this fails: 95% less four binomial standard errors of KEYS keys.
FLOOR = 0.95 - 4 * math.sqrt(0.95 * 0.05 / KEYS)


def _exact(rows: int, seed: int):
    """Per key: the normalized sum, the normalized sum of squares and the count of ``rows``
    skewed values in [0, 10] (half range h = 5)."""
    values = np.random.default_rng(seed).beta(0.5, 2.0, size=(KEYS, rows)) * HIGH
    centred = values - (LOW + HIGH) / 2
    return centred.sum(1), (centred ** 2 - 12.5).sum(1), np.full(KEYS, rows)


def _noisy(measures, name, exact, seed):
    measure = measures[name]
    exact = np.asarray(exact, dtype=np.int64 if measure.integer else np.float64)
    return add_noise(measure.spec, exact, RandomStreams.for_range(ReleaseKey.for_testing(seed), name, KEYS))


def _covers(low, value, high):
    return np.mean((low <= value + 1e-9) & (value <= high + 1e-9))


@pytest.mark.parametrize("epsilon", [0.5, 4.0])
@pytest.mark.parametrize("rows", [0, 1, 3, 10, 100, 1000])
def test_intervals_hold_the_noise_free_value_for_every_count(rows, epsilon):
    planned = plan_measures([Mean(), Variance(), Std()], BOUNDS, PrivacyBudget(epsilon=epsilon))
    measures = planned.measures
    nsum, nsq, count = _exact(rows, seed=rows)
    spec = {name: m.spec for name, m in measures.items()}
    seed = 100 * rows + int(10 * epsilon)

    # mean: two noisy answers, each within its 97.5% interval
    s, n = _noisy(measures, "mean.normalized_sum", nsum, seed), _noisy(measures, "mean.count", count, seed)
    s_spec, n_spec = spec["mean.normalized_sum"], spec["mean.count"]
    std, low, high = mean_error(s, n, LOW, HIGH, sum_std=s_spec.std, count_std=n_spec.std,
                                sum_half=s_spec.ci_halfwidth(0.975), count_half=n_spec.ci_halfwidth(0.975))
    released, exact = mean_from_noisy(s, n, LOW, HIGH), mean_from_noisy(nsum, count, LOW, HIGH)
    assert _covers(low, exact, high) >= FLOOR
    assert _covers(low, released, high) == 1.0 and np.all((LOW <= low) & (high <= HIGH))
    assert np.all((0 < std) & (std <= (HIGH - LOW) / 2))

    # variance and std: three noisy answers, each within its 98.33% interval
    for kind in ("variance", "std"):
        # one shared normalised sum, sum of squares and count (transforms.moments)
        names = ["mean.normalized_sum", "variance.normalized_squares", "mean.count"]
        s, q, n = (_noisy(measures, name, exact_answer, seed + i)
                   for i, (name, exact_answer) in enumerate(zip(names, (nsum, nsq, count))))
        level = 1 - 0.05 / 3
        std, low, high = variance_error(
            s, q, n, LOW, HIGH, sum_std=spec[names[0]].std, squares_std=spec[names[1]].std,
            count_std=spec[names[2]].std, sum_half=spec[names[0]].ci_halfwidth(level),
            squares_half=spec[names[1]].ci_halfwidth(level), count_half=spec[names[2]].ci_halfwidth(level),
            std=kind == "std")
        released = variance_from_noisy(s, q, n, LOW, HIGH, std=kind == "std")
        exact = variance_from_noisy(nsum, nsq, count, LOW, HIGH, std=kind == "std")
        assert _covers(low, exact, high) >= FLOOR, kind
        assert _covers(low, released, high) == 1.0, kind
        assert np.all(std > 0), kind


def test_the_delta_method_std_matches_the_spread_of_released_values():
    """Where counts are large the ratio is nearly linear in the noise: the stated std is the
    spread of released minus noise-free values (within 10%)."""
    planned = plan_measures([Mean(), Std()], BOUNDS, PrivacyBudget(epsilon=1.0))
    measures = planned.measures
    nsum, nsq, count = _exact(2000, seed=7)
    s, n = _noisy(measures, "mean.normalized_sum", nsum, 1), _noisy(measures, "mean.count", count, 2)
    std, _, _ = mean_error(s, n, LOW, HIGH, sum_std=measures["mean.normalized_sum"].spec.std,
                           count_std=measures["mean.count"].spec.std, sum_half=1.0, count_half=1.0)
    spread = np.std(mean_from_noisy(s, n, LOW, HIGH) - mean_from_noisy(nsum, count, LOW, HIGH))
    assert np.mean(std) == pytest.approx(spread, rel=0.1)
    names = ["mean.normalized_sum", "std.normalized_squares", "mean.count"]
    s, q, n = (_noisy(measures, name, exact, 3 + i) for i, (name, exact) in enumerate(zip(names, (nsum, nsq, count))))
    std, _, _ = variance_error(s, q, n, LOW, HIGH, sum_std=measures[names[0]].spec.std,
                               squares_std=measures[names[1]].spec.std, count_std=measures[names[2]].spec.std,
                               sum_half=1.0, squares_half=1.0, count_half=1.0, std=True)
    spread = np.std(variance_from_noisy(s, q, n, LOW, HIGH, std=True)
                    - variance_from_noisy(nsum, nsq, count, LOW, HIGH, std=True))
    assert np.mean(std) == pytest.approx(spread, rel=0.1)


_RELEASED = {}


def _store(tables, tag):
    _RELEASED[tag] = pa.concat_tables(tables)  # in process: the FnApiRunner runs this here


def _release(testing: bool, seed: int, keys: int, rows: pa.Table):
    aggregate = DPAggregate(
        # every key's mean and std, whatever its noisy count (no min_count rule): their intervals
        compute=Compute(metrics=[Count(), Mean(min_count=-math.inf), Std(min_count=-math.inf)], value="v"),
        keys=Keys(privacy_unit="user", columns=["k"], keyset=PublicKeyset.from_keys(list(range(keys)), ["k"])),
        output=Output(error_columns=True),
        bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=3,
                                                      min_value=LOW, max_value=HIGH),
        budget=PrivacyBudget(epsilon=2.0),
        release_key=ReleaseKey.for_testing(seed),
        testing=testing)
    with beam.Pipeline("FnApiRunner") as p:  # in this process: the Map stores the table here
        _ = (p | beam.Create([rows]) | aggregate | beam.combiners.ToList()
             | beam.Map(_store, (testing, seed)))
    return _RELEASED.pop((testing, seed)), aggregate


def test_dp_aggregate_releases_mean_and_std_error_columns_that_cover():
    """End to end: DPAggregate's released mean and std error columns hold the noise-free
    (testing-mode) values in at least 95% of keys, counts 0 to 60 per key."""
    rng = np.random.default_rng(5)
    keys, users = 1200, 40_000
    key = rng.integers(0, keys, users) % (1 + rng.integers(0, keys, users))  # many small keys
    rows = pa.table({"user": np.arange(users), "k": key, "v": rng.beta(0.5, 2.0, users) * 10})
    exact, _ = _release(True, 1, keys, rows)
    coverage = {"mean": [], "std": []}
    for seed in (11, 12):
        noisy, aggregate = _release(False, seed, keys, rows)
        assert noisy.column("k").to_pylist() == exact.column("k").to_pylist()
        for name in coverage:
            low, high = noisy.column(f"{name}_ci95_low").to_numpy(), noisy.column(f"{name}_ci95_high").to_numpy()
            coverage[name].append(_covers(low, exact.column(name).to_numpy(), high))
            assert np.all(noisy.column(f"{name}_std").to_numpy() > 0)
            assert _covers(low, noisy.column(name).to_numpy(), high) == 1.0
    floor = 0.95 - 4 * math.sqrt(0.95 * 0.05 / (2 * keys))
    assert {name: np.mean(c) >= floor for name, c in coverage.items()} == {"mean": True, "std": True}
    assert aggregate.output_schema().names[-4:] == ["std", "std_ci95_low", "std_ci95_high", "std_std"]
    assert "union bound" in aggregate.explain() and "delta method" in aggregate.explain()


# --------------------------------------------------------------------------- the shared helper

def test_error_column_names_are_one_rule_for_every_job():
    from transforms import error_columns

    assert error_columns.names("clicks") == ("clicks_ci95_low", "clicks_ci95_high", "clicks_std")
    columns = ["clicks", "clicks_ci95_low", "clicks_std", "my_std"]
    assert [error_columns.base_column(c, columns) for c in columns] == [None, "clicks", "clicks", None]


@pytest.mark.parametrize("kind, epsilon", [("discrete_laplace", 0.5), ("laplace", 1.0),
                                           ("gaussian", 1.0)])
def test_one_noisy_answer_scaled_and_linear_combinations_cover_95_percent(kind, epsilon):
    """NoiseError.of / scaled is the spec's own std and half-width times |a|; a combination of
    k answers (an ARA padding count, the Masked LARk helpers' summed noise) has the L2 std and a
    union-bound half-width: the real engine's noise stays inside at least 95% of the time and
    its spread matches the stated std."""
    from accounting.calibration import calibrate
    from transforms import error_columns

    spec = calibrate(kind, epsilon=epsilon, delta=1e-6 if kind == "gaussian" else 0.0,
                     l1_sensitivity=4.0, l2_sensitivity=4.0)
    one = error_columns.NoiseError.of(spec, scale=-2.5)
    assert (one.std, one.halfwidth) == (2.5 * spec.std, 2.5 * spec.ci_halfwidth(0.95))
    coefficients = [0.5, 0.5, 2.0]
    error = error_columns.combination(spec, coefficients)
    draws = 20000
    streams = RandomStreams.for_keys(ReleaseKey.for_testing(7), "combination",
                                     pa.table({"i": np.arange(draws * 3)}))
    zeros = np.zeros(draws * 3, dtype=np.int64 if spec.kind.is_integer else np.float64)
    noise = add_noise(spec, zeros, streams).reshape(draws, 3) @ np.array(coefficients)
    assert np.mean(np.abs(noise) <= error.halfwidth) >= 0.95
    assert noise.std() == pytest.approx(error.std, rel=0.03)
    assert error.std == pytest.approx(spec.std * math.sqrt(4.5))
    assert error_columns.combination(spec, [3.0]) == error_columns.NoiseError.of(spec, 3.0)


def test_centred_binomial_noise_interval_and_std():
    """The shuffle model's summed Binomial noise: the stated std and a symmetric half-width whose
    exact coverage (scipy's binomial) is at least 95%, and not a quarter wider than needed."""
    from scipy import stats

    from transforms import error_columns

    for trials, p in [(30 * 40, 0.5), (1000 * 7, 0.25), (5, 0.5)]:
        error = error_columns.binomial(trials, p)
        mean = trials * p
        assert error.std == pytest.approx(math.sqrt(trials * p * (1 - p)))
        inside = stats.binom.cdf(math.floor(mean + error.halfwidth), trials, p) - \
            stats.binom.cdf(math.ceil(mean - error.halfwidth) - 1, trials, p)
        assert inside >= 0.95
        if trials > 100:
            assert error.halfwidth <= 1.25 * 1.96 * error.std


def test_error_arrays_are_null_where_the_value_is():
    from transforms import error_columns

    low, high, std = error_columns.arrays([1.0, np.nan, 5.0], 2.0, 3.0)
    assert low.tolist()[::2] == [-2.0, 2.0] and high.tolist()[::2] == [4.0, 8.0]
    assert std.tolist()[::2] == [2.0, 2.0]
    assert all(np.isnan(a[1]) for a in (low, high, std))
