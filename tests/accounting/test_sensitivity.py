"""Sensitivities derived from contribution bounds: formulas, brute force, and empirical changes."""
import itertools
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.privacy_accountant import NeighboringRelation

from accounting import composition
from accounting.sensitivity import (ContributionBounds, Neighbouring, Sensitivities,
                                    count_sensitivity, mean_sensitivity,
                                    privacy_unit_count_sensitivity, sum_sensitivity)


def test_count_without_total_bound():
    s = count_sensitivity(ContributionBounds(max_partitions=3, max_contributions_per_partition=2))
    assert s == Sensitivities(l0=3, linf=2.0, l1=6.0, l2=pytest.approx(2 * math.sqrt(3)))


def test_count_with_a_loose_total_bound_is_unchanged():
    loose = ContributionBounds(max_partitions=3, max_contributions_per_partition=2, max_contributions=10)
    assert count_sensitivity(loose) == count_sensitivity(ContributionBounds(max_partitions=3, max_contributions_per_partition=2))


@pytest.mark.parametrize("l0,linf,total", [(3, 2, 3), (4, 3, 5), (2, 5, 3), (5, 1, 2), (3, 3, 7)])
def test_count_with_total_bound_matches_brute_force(l0, linf, total):
    s = count_sensitivity(ContributionBounds(max_partitions=l0, max_contributions_per_partition=linf, max_contributions=total))
    # Every contribution vector allowed by the bounds: per partition <= linf, total <= L1.
    vectors = [np.array(v) for v in itertools.product(range(linf + 1), repeat=l0)
               if sum(v) <= total]
    assert s.l1 == max(v.sum() for v in vectors)
    assert s.l2 == pytest.approx(max(math.sqrt((v ** 2).sum()) for v in vectors))
    assert s.linf == max(v.max() for v in vectors)
    assert s.l0 == max((v > 0).sum() for v in vectors)


def test_privacy_unit_count():
    s = privacy_unit_count_sensitivity(ContributionBounds(max_partitions=4, max_contributions_per_partition=7))
    assert s == Sensitivities(l0=4, linf=1.0, l1=4.0, l2=2.0)
    capped = privacy_unit_count_sensitivity(ContributionBounds(max_partitions=4, max_contributions_per_partition=7, max_contributions=2))
    assert capped == Sensitivities(l0=2, linf=1.0, l1=2.0, l2=pytest.approx(math.sqrt(2)))


@pytest.mark.parametrize("low,high,magnitude", [(0, 10, 10), (-5, 3, 5), (-2, 8, 8),
                                                (2, 6, 6), (-9, -4, 9)])
def test_sum_uses_largest_magnitude_even_when_range_crosses_zero(low, high, magnitude):
    bounds = ContributionBounds(max_partitions=2, max_contributions_per_partition=3, min_value=low, max_value=high)
    s = sum_sensitivity(bounds)
    count = count_sensitivity(bounds)
    assert s == Sensitivities(l0=2, linf=3.0 * magnitude, l1=6.0 * magnitude,
                              l2=pytest.approx(count.l2 * magnitude))


def test_mean_uses_the_centred_half_range():
    m = mean_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=2, min_value=10, max_value=20))
    assert m.midpoint == 15
    assert m.count == Sensitivities(l0=1, linf=2.0, l1=2.0, l2=2.0)
    assert m.normalized_sum == Sensitivities(l0=1, linf=10.0, l1=10.0, l2=10.0)  # 2 rows x half-range 5
    # Half the plain sum's per-row magnitude of 20 -> far less noise for the same budget.
    assert sum_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=2, min_value=10, max_value=20)).l1 == 40.0


def test_substitution_doubles_every_norm():
    bounds = ContributionBounds(max_partitions=3, max_contributions_per_partition=2, min_value=-1, max_value=4)
    for fn in (count_sensitivity, sum_sensitivity, privacy_unit_count_sensitivity):
        add = fn(bounds)
        sub = fn(bounds, Neighbouring.SUBSTITUTE)
        assert sub == Sensitivities(l0=2 * add.l0, linf=2 * add.linf, l1=2 * add.l1, l2=pytest.approx(2 * add.l2))
    assert fn(bounds, "replace one privacy unit") == fn(bounds, Neighbouring.SUBSTITUTE)
    assert Neighbouring.SUBSTITUTE.dp_accounting is NeighboringRelation.REPLACE_ONE
    assert Neighbouring.ADD_REMOVE.dp_accounting is NeighboringRelation.ADD_OR_REMOVE_ONE


def test_doubled_sensitivity_matches_dp_accounting_replace_one_for_a_count():
    # A count under substitution: dp_accounting's REPLACE_ONE Gaussian PLD equals the add/remove
    # PLD of a query with our doubled sensitivity.
    sigma = 3.0
    s = count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1), Neighbouring.SUBSTITUTE)
    ours = composition.pld_epsilon([dp_accounting.GaussianDpEvent(sigma / s.l2)], 1e-6)
    theirs = composition.pld_epsilon([dp_accounting.GaussianDpEvent(sigma)], 1e-6,
                                     neighboring_relation=NeighboringRelation.REPLACE_ONE)
    assert ours == pytest.approx(theirs, rel=1e-3)


def _aggregate(units, n_partitions, values=False):
    """Per-partition counts (or sums) of rows given as a list of (partition, value) per unit."""
    out = np.zeros(n_partitions)
    for rows in units:
        for partition, value in rows:
            out[partition] += value if values else 1
    return out


def test_removing_any_bounded_unit_changes_outputs_within_the_sensitivities():
    rng = np.random.default_rng(7)
    bounds = ContributionBounds(max_partitions=3, max_contributions_per_partition=2, max_contributions=5, min_value=-3.0, max_value=2.0)
    n_partitions = 6
    counts_s, sums_s = count_sensitivity(bounds), sum_sensitivity(bounds)
    for _ in range(300):
        # One unit whose rows respect the bounds (as contribution bounding would enforce).
        partitions = rng.choice(n_partitions, size=rng.integers(1, 4), replace=False)
        per = rng.integers(1, 3, size=len(partitions))
        while per.sum() > 5:
            per[rng.integers(len(per))] -= 1
        unit = [(p, rng.uniform(-3, 2)) for p, k in zip(partitions, per) for _ in range(k)]
        others = [[(int(rng.integers(n_partitions)), rng.uniform(-3, 2))] for _ in range(10)]
        for values, s in ((False, counts_s), (True, sums_s)):
            diff = (_aggregate(others + [unit], n_partitions, values)
                    - _aggregate(others, n_partitions, values))
            assert np.count_nonzero(diff) <= s.l0
            assert np.abs(diff).max() <= s.linf + 1e-12
            assert np.abs(diff).sum() <= s.l1 + 1e-12
            assert np.sqrt((diff ** 2).sum()) <= s.l2 + 1e-12


@pytest.mark.parametrize("kwargs,name", [
    (dict(max_partitions=0, max_contributions_per_partition=1), "max_partitions"),
    (dict(max_partitions=-2, max_contributions_per_partition=1), "max_partitions"),
    (dict(max_partitions=1.5, max_contributions_per_partition=1), "max_partitions"),
    (dict(max_partitions=1, max_contributions_per_partition=0), "max_contributions_per_partition"),
    (dict(max_partitions=1, max_contributions_per_partition=1, max_contributions=-1),
     "max_contributions"),
    (dict(max_partitions=1, max_contributions_per_partition=1, min_value=0.0), "max_value"),
    (dict(max_partitions=1, max_contributions_per_partition=1, min_value=math.nan, max_value=1.0),
     "min_value"),
    (dict(max_partitions=1, max_contributions_per_partition=1, min_value=0.0, max_value=math.inf),
     "max_value"),
    (dict(max_partitions=1, max_contributions_per_partition=1, min_value=5.0, max_value=1.0),
     "min_value"),
])
def test_bad_bounds_raise_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ContributionBounds(**kwargs)


def test_sum_without_a_value_range_is_refused():
    with pytest.raises(ValueError, match="min_value and max_value"):
        sum_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1))
    with pytest.raises(ValueError):
        count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1), "swap two units")
