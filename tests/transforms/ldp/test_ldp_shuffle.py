"""Shuffle-model summation: split-and-mix shares, binomial accounting, amplification by shuffling."""
import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from scipy import stats

from transforms.ldp import KeyedRandomness
from transforms.ldp.beam import ShuffleSum, shuffle_result
from transforms.ldp.shuffle import (SplitAndMix, amplification_ceiling, amplified_epsilon,
                                    binomial_delta, binomial_trials_for, compare_models,
                                    ikos_messages, local_epsilon_for, shares_table)


def test_fmt21_closed_form_and_its_inverse():
    n, delta = 1_000_000, 1e-8
    e0 = 2.0
    inner = 8 * math.sqrt(math.exp(e0) * math.log(4 / delta)) / math.sqrt(n) + 8 * math.exp(e0) / n
    expected = math.log(1 + (math.exp(e0) - 1) / (math.exp(e0) + 1) * inner)
    assert amplified_epsilon(e0, n, delta) == pytest.approx(expected)
    assert amplified_epsilon(1.0, n, delta) < amplified_epsilon(2.0, n, delta) < 2.0
    assert amplified_epsilon(2.0, 10 * n, delta) < amplified_epsilon(2.0, n, delta)
    e0_for_one = local_epsilon_for(1.0, n, delta)
    assert amplified_epsilon(e0_for_one, n, delta) <= 1.0
    assert amplified_epsilon(e0_for_one + 1e-3, n, delta) > 1.0 or \
        e0_for_one == pytest.approx(amplification_ceiling(n, delta))
    with pytest.raises(ValueError, match="needs epsilon0 <="):
        amplified_epsilon(12.0, 1000, delta)
    assert local_epsilon_for(1.0, 100, delta) is None


def test_binomial_delta_matches_brute_force_and_trials_are_minimal():
    for trials, shift, epsilon in ((40, 1, 0.5), (200, 3, 1.0), (1000, 2, 0.3)):
        y = np.arange(-shift, trials + shift + 1)
        p = stats.binom.pmf(y, trials, 0.5)
        q = stats.binom.pmf(y - shift, trials, 0.5)
        brute = np.sum(np.maximum(0.0, p - math.exp(epsilon) * q))
        y = np.arange(-shift, trials + shift + 1)
        brute_down = np.sum(np.maximum(0.0, p - math.exp(epsilon) * stats.binom.pmf(
            y + shift, trials, 0.5)))
        assert binomial_delta(trials, shift, epsilon) == pytest.approx(max(brute, brute_down),
                                                                      rel=1e-9, abs=1e-300)
    # A skewed binomial (rho < 1/2): the two directions differ; the larger one counts.
    trials, rho, shift, epsilon = 300, 0.05, 1, 0.7
    y = np.arange(-1, trials + 2)
    p = stats.binom.pmf(y, trials, rho)
    up = np.sum(np.maximum(0, p - math.exp(epsilon) * stats.binom.pmf(y - 1, trials, rho)))
    down = np.sum(np.maximum(0, p - math.exp(epsilon) * stats.binom.pmf(y + 1, trials, rho)))
    assert up != pytest.approx(down, rel=1e-3)
    assert binomial_delta(trials, shift, epsilon, rho) == pytest.approx(max(up, down), rel=1e-9)
    n = binomial_trials_for(1.0, 1e-6, 1)
    assert binomial_delta(n, 1, 1.0) <= 1e-6
    assert binomial_delta(int(n * 0.999) - 1, 1, 1.0) > 1e-6


def test_message_count_reproduces_the_papers_example():
    # Balle, Bell, Gascon & Nissim 2019: n = 10^4, 32-bit values, 2^-40 security, 12 messages.
    assert ikos_messages(10_000, 32, 40) == 12
    assert ikos_messages(10 ** 6, 32, 40) < 12
    with pytest.raises(ValueError):
        ikos_messages(10, 32, 40)


def test_shares_sum_to_the_noisy_value_and_the_estimate_is_unbiased():
    spec = SplitAndMix(num_clients=500, value_bound=20, epsilon=1.0, delta=1e-7)
    assert spec.total_delta <= 1e-7
    values = np.arange(500) % 21
    errors = []
    for run in range(200):
        source = KeyedRandomness.for_testing(run, "split-and-mix")
        shares = spec.encode(values, source=source, ids=np.arange(500))
        assert shares.shape == (500, spec.messages) and int(shares.max()) < spec.modulus
        noisy = (shares.sum(axis=1, dtype=np.uint64) & np.uint64(spec.modulus - 1)).astype(np.int64)
        noise = noisy - values
        assert noise.min() >= 0 and noise.max() <= spec.noise_trials_per_client
        errors.append(spec.estimate(spec.sum_shares(shares), 500) - values.sum())
    errors = np.array(errors)
    assert abs(errors.mean()) < 4 * math.sqrt(spec.variance / 200)
    assert 0.75 < errors.var() / spec.variance < 1.3
    # A single share carries nothing about the value: uniform over Z_q.
    first = spec.encode(np.full(20000, 20), source=KeyedRandomness.for_testing(1), ids=np.arange(20000))[:, 0]
    assert abs(first.mean() / spec.modulus - 0.5) < 0.02


def test_bad_parameters_and_values_are_refused():
    with pytest.raises(ValueError, match="raise sigma"):
        SplitAndMix(num_clients=100, value_bound=1, epsilon=1.0, delta=1e-13, sigma=40)
    with pytest.raises(ValueError, match="delta"):
        SplitAndMix(num_clients=100, value_bound=1, epsilon=1.0, delta=0.0)
    spec = SplitAndMix(num_clients=100, value_bound=5, epsilon=1.0, delta=1e-6)
    with pytest.raises(ValueError, match=r"integers in \[0, 5\]"):
        spec.encode(np.array([6]), source=KeyedRandomness.for_testing(1), ids=[0])


def test_beam_shuffle_sum_and_its_refusals():
    spec = SplitAndMix(num_clients=300, value_bound=10, epsilon=1.0, delta=1e-6)
    values = np.arange(300) % 11
    shares = spec.encode(values, source=KeyedRandomness.for_testing(2), ids=np.arange(300))
    table = shares_table(shares)
    expected = shuffle_result((table.num_rows, int(shares.sum(dtype=np.uint64))), spec)
    assert abs(expected.column("estimate")[0].as_py() - values.sum()) < 6 * math.sqrt(spec.variance)
    halves = [table.slice(0, 1000), table.slice(1000)]
    with TestPipeline() as p:
        out = p | beam.Create(halves) | ShuffleSum(spec)
        assert_that(out | beam.FlatMap(lambda t: t.to_pylist()), equal_to(expected.to_pylist()))
    with pytest.raises(ValueError, match="less noise than planned"):
        shuffle_result((spec.messages * 200, 0), spec)
    with pytest.raises(ValueError, match="incomplete input"):
        shuffle_result((spec.messages * 300 - 1, 0), spec)


def test_models_compare_as_the_literature_says():
    rows = {r["model"] + "/" + r["mechanism"].split(",")[0]: r
            for r in compare_models(1_000_000, 1, 1.0, 1e-8)}
    central = rows["central/discrete Laplace"]["mse"]
    split = next(r for k, r in rows.items() if k.startswith("shuffle, split-and-mix"))["mse"]
    single = next(r for k, r in rows.items() if k.startswith("shuffle, single"))["mse"]
    local = rows["local/local discrete Laplace"]["mse"]
    rr = rows["local/binary randomized response"]["mse"]
    assert central < split < single < local
    assert rr == pytest.approx(1_000_000 * math.e / (math.e - 1) ** 2)
