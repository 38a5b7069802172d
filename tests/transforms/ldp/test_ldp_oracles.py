"""Local frequency oracles: parameters, realised epsilon, unbiased estimator and exact variance."""
import math

import numpy as np
import pytest

from transforms.ldp import make_oracle
from transforms.ldp.oracles import (EPSILON_MAX, OLH, UnaryEncoding, oracle_from_metadata)
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import KeyedRandomness
from transforms.ldp.estimators import estimate_frequencies

ALL = ["binary_rr", "grr", "sue", "oue", "rappor", "olh"]


def _oracle(name, epsilon=1.0, d=8):
    return make_oracle(name, epsilon=epsilon, domain_size=2 if name == "binary_rr" else d)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0, 10.0])
def test_realised_epsilon_never_exceeds_the_nominal_one(name, epsilon):
    oracle = _oracle(name, epsilon, d=1000)
    assert oracle.realised_epsilon <= epsilon
    assert oracle.realised_epsilon == pytest.approx(epsilon, abs=1e-5)
    p, q = oracle.support_probabilities()
    assert 0 < q < p < 1


def test_probabilities_match_the_papers_at_nominal_values():
    e = math.exp(1.0)
    grr = _oracle("grr", 1.0, d=10)
    assert grr.support_probabilities()[0] == pytest.approx(e / (e + 9), abs=2 ** -32)
    oue = _oracle("oue", 1.0)
    assert oue.support_probabilities() == pytest.approx((0.5, 1 / (e + 1)), abs=2 ** -32)
    sue = _oracle("sue", 1.0)
    h = math.exp(0.5)
    assert sue.support_probabilities() == pytest.approx((h / (1 + h), 1 / (1 + h)), abs=2 ** -32)
    rappor = _oracle("rappor", 1.0)
    assert rappor.f == pytest.approx(2 / (1 + h), abs=2 ** -31)
    assert rappor.support_probabilities() == sue.support_probabilities()


def test_olh_buckets_and_the_papers_denominator():
    for epsilon in (0.5, 1.0, 2.0, 4.0):
        olh = _oracle("olh", epsilon, d=1 << 16)
        e = math.exp(epsilon)
        assert olh.buckets == round(e) + 1
        g = olh.buckets
        p, other = olh.bucket_probabilities()
        # The paper's denominator e^eps + g - 1: p and the g - 1 others sum to one.
        assert p + (g - 1) * other == pytest.approx(1.0, abs=1e-12)
        assert p == pytest.approx(e / (e + g - 1), abs=2 ** -32)
        # The seed's printed denominator e^eps + g + 1 does not give a distribution.
        assert (e + (g - 1)) / (e + g + 1) < 1 - 1e-3
        # Support probability of a non-holder is (almost exactly) 1/g.
        assert olh.support_probabilities()[1] == pytest.approx(1 / g, rel=1e-3)


def test_exact_variance_reduces_to_the_published_closed_forms():
    n = 10_000
    for epsilon in (0.5, 1.0, 4.0):
        e = math.exp(epsilon)
        binary = _oracle("binary_rr", epsilon)
        # Binary RR: e^eps/(e^eps-1)^2 per user, whatever the true count (the seed's
        # e^eps/(e^{2eps}-1)^2 is garbled).
        for c in (0, 1234, n):
            assert binary.variance(n, c) == pytest.approx(n * e / (e - 1) ** 2, rel=1e-6)
        assert binary.variance(1, 0) != pytest.approx(e / (e ** 2 - 1) ** 2, rel=1e-2)
        for name in ("grr", "oue", "sue", "rappor"):
            oracle = _oracle(name, epsilon, d=64)
            assert oracle.variance(n, 0) == pytest.approx(oracle.paper_variance(n), rel=1e-6)
        olh = _oracle("olh", epsilon, d=1 << 12)
        assert olh.variance(n, 0) == pytest.approx(olh.paper_variance(n), rel=2e-3)


@pytest.mark.parametrize("name", ALL)
def test_estimates_are_unbiased_with_the_stated_variance(name):
    """Seeded runs of 2,000 clients; z-scores pooled over values and runs (about 1,000
    independent ones: binary RR's two estimates are one)."""
    oracle = _oracle(name, 1.0, d=8)
    d = oracle.domain_size
    n, runs = 2000, 1000 // (d - 1)
    values = np.arange(n) % d
    values[: n // 2] = 0  # a heavy value next to light ones: the variance's c-term matters
    truth = np.bincount(values, minlength=d)
    z = []
    for run in range(runs):
        source = KeyedRandomness.for_testing(run, purpose="variance")
        reports = randomize(oracle, values, source=source, ids=np.arange(n))
        estimate = estimate_frequencies(oracle, reports).column("estimate").to_numpy()
        z.append((estimate - truth) / np.sqrt(oracle.variance(n, truth)))
    z = np.concatenate(z)
    assert abs(z.mean()) < 0.1
    assert 0.85 < z.var() < 1.15


def test_metadata_round_trip_and_factory_errors():
    for name in ALL:
        oracle = _oracle(name)
        assert oracle_from_metadata(oracle.metadata()) == oracle
    assert oracle_from_metadata(make_oracle("olh", epsilon=1, domain_size=9, buckets=5,
                                            hash_digits=2).metadata()).buckets == 5
    with pytest.raises(ValueError, match="unknown oracle 'hadamard'"):
        make_oracle("hadamard", epsilon=1, domain_size=4)
    with pytest.raises(ValueError, match="local epsilon must be in"):
        make_oracle("grr", epsilon=0, domain_size=4)
    with pytest.raises(ValueError, match="local epsilon must be in"):
        make_oracle("oue", epsilon=EPSILON_MAX * 2, domain_size=4)
    with pytest.raises(ValueError, match="epsilon must be a number"):
        make_oracle("olh", epsilon="1", domain_size=4)
    with pytest.raises(ValueError, match="domain_size must be in"):
        make_oracle("grr", epsilon=1, domain_size=1)
    with pytest.raises(ValueError, match="domain_size must be in"):
        make_oracle("oue", epsilon=1, domain_size=1 << 21)
    with pytest.raises(ValueError, match="binary_rr: domain_size is 2"):
        make_oracle("binary_rr", epsilon=1, domain_size=3)
    with pytest.raises(ValueError, match="hash_digits"):
        OLH(epsilon=1, domain_size=1 << 20, hash_digits=1)
    with pytest.raises(ValueError, match="variant"):
        UnaryEncoding(epsilon=1, domain_size=8, variant="xue")
    with pytest.raises(ValueError, match="does not describe an oracle"):
        oracle_from_metadata("{}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0])
def test_empirical_variance_is_within_five_percent_of_the_formula(name, epsilon):
    """About 40,000 standardized errors per case: the variance ratio's sampling error is ~0.7%."""
    oracle = _oracle(name, epsilon, d=64)
    d = oracle.domain_size
    n = 5000
    values = np.minimum(np.random.default_rng(0).zipf(1.5, n) - 1, d - 1)
    truth = np.bincount(values, minlength=d)
    runs = -(-40_000 // (d - 1))
    sq = []
    for run in range(runs):
        source = KeyedRandomness.for_testing(1000 + run, purpose="variance-slow")
        reports = randomize(oracle, values, source=source, ids=np.arange(n))
        estimate = estimate_frequencies(oracle, reports).column("estimate").to_numpy()
        sq.append((estimate - truth) ** 2 / oracle.variance(n, truth))
    ratio = np.concatenate(sq).mean()
    assert abs(ratio - 1) < 0.05
