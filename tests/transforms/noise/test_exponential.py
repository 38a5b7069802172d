"""Permute-and-flip sampled exactly (transforms/noise/exponential.py): frequencies against the
exact distribution, per-lane exponents, blocks of lanes that change no choice."""
import numpy as np
import pytest

from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams
from transforms.noise import exponential
from transforms.noise.exponential import (bernoulli_exp_rational, permute_and_flip,
                                          permute_and_flip_probabilities)


def test_exact_bernoulli_exp_of_large_and_fractional_exponents():
    n = 100_000
    streams = RandomStreams.for_range(ReleaseKey.for_testing(13), "bexp", n)
    lanes = np.arange(n)
    for num, den in ((0, 7), (3, 4), (9, 4), (10 ** 12, 10 ** 11 + 1)):
        hits = bernoulli_exp_rational(streams, np.full(n, num), den, lanes).mean()
        expected = np.exp(-num / den)
        assert abs(hits - expected) < 5 * np.sqrt(expected * (1 - expected) / n) + 1e-9, (num, den)


def test_permute_and_flip_frequencies_match_its_exact_distribution(monkeypatch):
    """A candidate of probability ~3e-3 included; no floating-point uniform is drawn."""
    def no_floats(self, lanes=None):
        raise AssertionError("a floating-point uniform was drawn")

    monkeypatch.setattr(RandomStreams, "uniform_float", no_floats)
    num, den = np.array([7, 0, 2, 3, 12]), 2
    p = permute_and_flip_probabilities(num, den)
    assert p.min() < 5e-3 and abs(p.sum() - 1) < 1e-12
    n = 200_000
    streams = RandomStreams.for_range(ReleaseKey.for_testing(12), "exact-pf", n)
    observed = np.bincount(permute_and_flip(streams, num, den), minlength=num.size)
    chi2 = float((((observed - n * p) ** 2) / (n * p)).sum())
    assert chi2 < 25, (observed, n * p)  # 4 degrees of freedom: P(chi2 > 25) < 1e-4
    assert observed[np.argmin(p)] > 0


def test_permute_and_flip_is_never_worse_than_the_exponential_mechanism():
    """McKenna & Sheldon's dominance, on the exact distributions: a lower expected gap."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        num = rng.integers(0, 40, int(rng.integers(2, 9)))
        den = 8
        gamma = (num - num.min()) / den
        em = np.exp(-gamma) / np.exp(-gamma).sum()
        assert permute_and_flip_probabilities(num, den) @ gamma <= em @ gamma + 1e-12


def test_per_lane_exponents_and_blocks_change_no_choice(monkeypatch):
    rows = np.array([[0, 5, 9], [9, 5, 0], [3, 3, 3], [0, 40, 40]])
    lanes = np.arange(rows.shape[0])

    def choose():
        return permute_and_flip(RandomStreams.for_range(ReleaseKey.for_testing(4), "pf-rows", 4),
                                rows, 4, lanes)

    whole = choose()
    monkeypatch.setattr(exponential, "_BLOCK_CELLS", 3)  # one lane per block
    assert np.array_equal(choose(), whole)
    assert whole[3] == 0  # exp(-10) per other candidate: the best wins (this key's draw)
    with pytest.raises(ValueError, match="rows for"):
        permute_and_flip(RandomStreams.for_range(ReleaseKey.for_testing(4), "pf-rows", 4),
                         rows[:2], 4, lanes)
