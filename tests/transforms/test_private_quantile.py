"""One quantile chosen among public candidates (transforms/private_quantile.py): the rank
distance, the exact exponents of each neighbouring relation, the stated error. Its privacy is
tested by the DP tester in tests/accounting/verification/test_dp_tester_quantile.py."""
import numpy as np
import pytest

from accounting.keys import ReleaseKey
from accounting.sensitivity import Neighbouring
from transforms.noise import RandomStreams
from transforms.private_quantile import (GRID_BITS, choose_candidate, grid_quantile,
                                         rank_distances, rank_error_bound, rank_exponents,
                                         rank_utility)

ONE = 1 << GRID_BITS


def test_rank_distance_is_zero_on_the_cell_holding_the_target():
    counts = np.array([1, 4, 4, 9, 10])  # cells hold 1, 3, 0, 5, 1 of 10 values
    d = rank_distances(counts, 10, grid_quantile(0.5)) / ONE
    assert d.tolist() == [4, 1, 1, 0, 4]
    assert np.allclose(-rank_utility(counts, 10, 0.5), d)


def test_exponents_are_exact_and_follow_the_neighbouring_relation():
    d = rank_distances(np.array([1, 4, 9, 10]), 10, grid_quantile(0.5))
    num, den = rank_exponents(d, 1.0, grid_quantile(0.5), Neighbouring.ADD_REMOVE)
    assert np.array_equal(num * 1.0 / den, d / ONE)  # median, add/remove: exp(-epsilon d)
    _, sub = rank_exponents(d, 1.0, grid_quantile(0.5), Neighbouring.SUBSTITUTE)
    assert sub == 2 * den  # substitution: exp(-epsilon d / 2)
    _, high = rank_exponents(d, 1.0, grid_quantile(0.9), Neighbouring.ADD_REMOVE)
    assert high * 1.0 / den == pytest.approx(1.8)  # 2 max(q, 1 - q)
    with pytest.raises(ValueError, match="grid"):
        rank_exponents(d, 2.0 ** -21, grid_quantile(0.5), Neighbouring.ADD_REMOVE)
    with pytest.raises(ValueError, match="quantile"):
        grid_quantile(1.0)


@pytest.mark.parametrize("epsilon", [0.1, 1.0])
def test_chosen_cells_are_within_the_stated_error(epsilon):
    """1,000 values on 200 cells: the 95% bound holds on >= 95% of 2,000 keyed choices, and the
    median's mean rank error is near the two-sided geometric's 1/epsilon-ish."""
    rng = np.random.default_rng(0)
    values = np.sort(rng.uniform(0, 200, 1000))
    candidates = np.arange(1, 201)
    counts = np.searchsorted(values, candidates, side="right")
    lanes = 2000
    streams = RandomStreams.for_range(ReleaseKey.for_testing(5), "quantile-error", lanes)
    chosen = choose_candidate(counts, values.size, 0.5, epsilon, Neighbouring.ADD_REMOVE, streams)
    d = rank_distances(counts, values.size, grid_quantile(0.5))[chosen] / ONE
    bound = rank_error_bound(epsilon, 0.5, candidates.size, Neighbouring.ADD_REMOVE)
    assert np.mean(d <= bound) >= 0.95
    assert np.mean(d) < 3 / epsilon
