"""The DP tester on the quantile mechanism (transforms/private_quantile.py): permute-and-flip
over the rank distance, whose add/remove calibration rests on the score being monotone up to a
constant (no factor 2). Neighbours are the ones that come closest to the stated epsilon (found by
exhaustive search over small data sets with the exact probabilities, see
``test_no_small_neighbour_pair_exceeds_the_stated_epsilon``); a calibration that halves the
score's scale (twice the exponent) is caught there."""
from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

from accounting.keys import ReleaseKey
from accounting.sensitivity import Neighbouring
from accounting.verification.dp_tester import DPTester
from transforms.noise import RandomStreams
from transforms.noise.exponential import permute_and_flip_probabilities
from transforms.private_quantile import (CellSelection, choose_candidate, grid_quantile, rank_distances,
                                         rank_exponents)
from transforms.quantiles import QuantileTree

ADD_REMOVE = Neighbouring.ADD_REMOVE

# (quantile, counts at or below each candidate and n on D, the same on D' = D + one unit)
WORST = {
    0.5: (([0, 1, 1, 2], 2), ([1, 2, 2, 3], 3)),
    0.9: (([7, 7, 7, 8, 8], 8), ([7, 7, 7, 8, 9], 9)),
}


def _sampler(counts, n, quantile, epsilon, seed):
    def sample(m):
        streams = RandomStreams.for_range(ReleaseKey.for_testing(seed), "dp-test-quantile", m)
        return choose_candidate(counts, n, quantile, epsilon, ADD_REMOVE, streams).astype(float)
    return sample


def _probabilities(counts, n, quantile, epsilon, neighbouring=ADD_REMOVE):
    units = grid_quantile(quantile)
    num, den = rank_exponents(rank_distances(counts, n, units), epsilon, units, neighbouring)
    return permute_and_flip_probabilities(num, den)


@pytest.mark.parametrize("quantile", sorted(WORST))
def test_dp_tester_passes_the_quantile_mechanism_at_its_stated_epsilon(quantile):
    (d, n), (d2, n2) = WORST[quantile]
    epsilon = 1.0
    result = DPTester(n_samples=60_000).run(_sampler(d, n, quantile, epsilon, 1),
                                            _sampler(d2, n2, quantile, epsilon, 2), epsilon=epsilon)
    assert result.passed, result


def test_dp_tester_catches_the_factor_the_monotone_bound_does_not_allow():
    """Twice the exponent (the score's scale halved: 2 max(q, 1 - q) taken as max(q, 1 - q)) is
    about 1.55 epsilon on the median's worst neighbours: the tester must see it."""
    (d, n), (d2, n2) = WORST[0.5]
    epsilon = 1.0
    result = DPTester(n_samples=60_000).run(_sampler(d, n, 0.5, 2 * epsilon, 3),
                                            _sampler(d2, n2, 0.5, 2 * epsilon, 4), epsilon=epsilon)
    assert not result.passed, result


@pytest.mark.parametrize("quantile", [0.5, 0.25, 0.9])
@pytest.mark.parametrize("neighbouring", [Neighbouring.ADD_REMOVE, Neighbouring.SUBSTITUTE])
def test_no_small_neighbour_pair_exceeds_the_stated_epsilon(quantile, neighbouring):
    """Exact privacy loss (permute_and_flip_probabilities) over every data set of up to 6 values
    on 4 candidates and each neighbour: at most epsilon, and above 0.7 epsilon somewhere (the
    calibration is not loose by the factor 2 it no longer pays)."""
    epsilon, worst = 1.0, 0.0
    k = 4
    for n in range(1, 7):
        for cuts in itertools.combinations_with_replacement(range(n + 1), k - 1):
            counts = np.array(list(cuts) + [n])
            p = _probabilities(counts, n, quantile, epsilon, neighbouring)
            cells = np.diff(np.concatenate([[0], counts]))
            for j in range(k):
                if neighbouring is Neighbouring.ADD_REMOVE:
                    others = [(counts + (np.arange(k) >= j), n + 1)]
                else:  # one value of cell j moved to cell i
                    others = [(counts - (np.arange(k) >= j) + (np.arange(k) >= i), n)
                              for i in range(k) if cells[j] > 0 and i != j]
                for other, m in others:
                    loss = np.abs(np.log(p / _probabilities(other, m, quantile, epsilon, neighbouring)))
                    worst = max(worst, float(loss.max()))
    assert 0.55 * epsilon < worst <= epsilon * (1 + 1e-9), worst


def test_the_shifted_score_is_monotone_with_the_stated_sensitivity():
    """The proof's lemma on random data: d + beta n never falls when a value is added and rises
    by at most 2 beta (beta = max(q, 1 - q))."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        q = float(rng.choice([0.1, 0.5, 0.75, 0.9, 0.37]))
        units = grid_quantile(q)
        beta = max(units, (1 << 20) - units)
        k, n = int(rng.integers(1, 8)), int(rng.integers(0, 30))
        counts = np.sort(rng.integers(0, n + 1, k))
        counts[-1] = n if rng.random() < 0.5 else counts[-1]
        j = int(rng.integers(0, k + 1))  # the new value's cell (k: above every candidate)
        other = counts + (np.arange(k) >= j)
        before = rank_distances(counts, n, units) + beta * n
        after = rank_distances(other, n + 1, units) + beta * (n + 1)
        assert np.all(after >= before) and np.all(after - before <= 2 * beta)


def _selection_sampler(selection, histogram, seed):
    def sample(m):
        keys = pa.table({"lane": np.arange(m)})
        return selection.noisy(np.tile(histogram, (m, 1)), ReleaseKey.for_testing(seed), keys)[:, 0].astype(float)
    return sample


@pytest.mark.parametrize("linf", [1, 2])
def test_dp_tester_passes_dpaggregate_selection_of_a_median(linf):
    """DPAggregate's wiring (CellSelection, keyed per key and quantile): the median's worst
    neighbours above as leaf counts, the unit adding ``linf`` rows to one leaf (``steps`` =
    L0 Linf values per change)."""
    tree = QuantileTree(low=0.0, high=4.0, branching=2, depth=2)
    selection = CellSelection(name="median", tree=tree, quantiles=(0.5,), epsilon=1.0, steps=linf)
    base = np.array([0, 1, 0, 1]) * linf
    other = base + np.array([linf, 0, 0, 0])
    result = DPTester(n_samples=60_000).run(_selection_sampler(selection, base, 5),
                                            _selection_sampler(selection, other, 6), epsilon=1.0)
    assert result.passed, result
