"""Private key selection strategies (pure) and the release plan of metrics."""
import math

import numpy as np
import pytest

from accounting.budget import PrivacyBudget
from accounting.sensitivity import ContributionBounds
from transforms.metrics import Count, Mean, PrivacyUnitCount, Sum, plan_measures
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams
from transforms.selection import (PrivateSelection, SelectionStrategy, Selector,
                                  truncated_geometric_probabilities)


@pytest.mark.parametrize("epsilon,delta,l0", [(1.0, 1e-6, 1), (0.5, 1e-5, 3), (2.0, 1e-8, 2)])
def test_truncated_geometric_is_dp_per_partition(epsilon, delta, l0):
    pi = truncated_geometric_probabilities(epsilon, delta, l0)
    eps, dlt = epsilon / l0, delta / l0
    assert pi[0] == 0 and pi[-1] == 1
    assert np.all(np.diff(pi) >= 0)
    # (eps', delta')-DP between n-1 and n units, for both "keep" and "drop" events.
    assert np.all(pi[1:] <= math.exp(eps) * pi[:-1] + dlt + 1e-15)
    assert np.all(1 - pi[:-1] <= math.exp(eps) * (1 - pi[1:]) + dlt + 1e-15)


@pytest.mark.parametrize("strategy", list(SelectionStrategy))
def test_single_unit_key_is_rarely_released(strategy):
    selector = Selector(PrivateSelection(strategy=strategy), epsilon=1.0, delta=1e-5, max_partitions=2)
    assert selector.keep_probability(1) <= 1e-5 / 2 * (1 + 1e-9)
    assert selector.keep_probability(0) <= selector.keep_probability(1)
    assert selector.keep_probability(500) > 0.99
    # Empirical keep rate at a middle count agrees with the stated probability.
    n = next(m for m in range(1, 1000) if 0.2 < selector.keep_probability(m) < 0.8)
    lanes = 20_000
    keep = selector.keep(np.full(lanes, n), RandomStreams.for_range(ReleaseKey.for_testing(3), "sel", lanes))
    p = selector.keep_probability(n)
    assert abs(keep.mean() - p) < 5 * math.sqrt(p * (1 - p) / lanes)


def test_plan_mean_reuses_count_and_splits_budget():
    bounds = ContributionBounds(max_partitions=2, max_contributions_per_partition=3, min_value=0, max_value=10)
    planned = plan_measures([Count(), Mean()], bounds, PrivacyBudget(epsilon=1.0))
    plan = planned.plan
    measures = planned.measures
    assert set(measures) == {"count", "mean.normalized_sum"}
    assert measures["mean.normalized_sum"].partial == "nsum" and not measures["mean.normalized_sum"].integer
    assert measures["count"].spec == plan.measures[0].noise  # one measure type, calibrated
    assert sum(m.noise.epsilon for m in plan.measures) == pytest.approx(1.0)
    planned = plan_measures([Mean(), PrivacyUnitCount()], bounds, PrivacyBudget(epsilon=1.0))
    plan = planned.plan
    measures = planned.measures
    assert set(measures) == {"mean.normalized_sum", "mean.count", "privacy_unit_count"}
    nsum = next(m for m in plan.measures if m.name == "mean.normalized_sum")
    assert nsum.sensitivities.l1 == 2 * 3 * 5  # L0 * Linf * half-range
    with pytest.raises(ValueError, match="integer values"):
        plan_measures([Sum(noise="discrete_laplace")], bounds, PrivacyBudget(epsilon=1.0))
    with pytest.raises(ValueError, match="delta"):
        plan_measures([Count(noise="gaussian")], bounds, PrivacyBudget(epsilon=1.0))


def test_plan_with_selection_and_gaussian():
    bounds = ContributionBounds(max_partitions=4, max_contributions_per_partition=1)
    planned = plan_measures([Count(noise="discrete_gaussian")], bounds,
                                      PrivacyBudget(epsilon=1.0, delta=1e-6),
                                      selection_weight=1.0, selection_needs_delta=True)
    plan = planned.plan
    measures = planned.measures
    share = planned.selection_share
    assert share.epsilon == pytest.approx(0.5) and share.delta > 0
    spec = plan.measures[0].noise
    assert spec.l2_sensitivity == pytest.approx(2.0)  # sqrt(L0) * Linf


def test_per_key_budget_is_the_basic_split_for_few_keys_and_better_for_many():
    from transforms.selection import keep_curve, per_key_budget

    assert per_key_budget(1.0, 1e-5, 1) == (1.0, 1e-5)
    assert per_key_budget(1.0, 1e-5, 4) == (0.25, 2.5e-6)
    eps_key, delta_key = per_key_budget(1.0, 1e-5, 40)
    assert eps_key > 1.0 / 40
    half = lambda pi: int(np.argmax(pi >= 0.5))  # noqa: E731
    # A key is kept with probability 1/2 at a clearly smaller count than under the basic split.
    assert half(keep_curve(eps_key, delta_key)) < 0.9 * half(keep_curve(1.0 / 40, 1e-5 / 40))
    selector = Selector(PrivateSelection(), epsilon=1.0, delta=1e-5, max_partitions=40)
    assert selector.per_key == (eps_key, delta_key)


# ---- L0 > 1 (issue 40.7): one unit moves L0 keys at once --------------------------------------
#
# At L0 = 1 a selector calibrated for the wrong number of changed keys changes nothing. Here one
# unit adds itself to L0 = 9 keys: the number of those keys released (a post-processing of the
# keys' indicators) must meet the selection's (epsilon, delta) claim under the DP tester -- a
# selector calibrated as if one key moved loses up to L0 x epsilon on it (and its Gaussian
# noise is sqrt(L0) = 3 times too small).

L0 = 9
SELECTION_EPSILON, SELECTION_DELTA = 1.0, 1e-5
JOINT_SAMPLES = 200_000


def _kept_keys(selector, n, seed, purpose):
    """A sampler: per sample, how many of L0 keys with ``n`` units each are released."""
    def sample(samples):
        lanes = samples * L0
        keep = selector.keep(np.full(lanes, n), RandomStreams.for_range(
            ReleaseKey.for_testing(seed), purpose, lanes))
        return keep.reshape(samples, L0).sum(axis=1).astype(np.float64)
    return sample


@pytest.mark.parametrize("strategy", ["truncated_geometric", "laplace_thresholding",
                                      "gaussian_thresholding"])
def test_selection_at_l0_above_one_meets_its_claim_on_the_joint_keys(strategy):
    from accounting.verification.dp_tester import DPTester

    bounds = ContributionBounds(max_partitions=L0, max_contributions_per_partition=2)
    selector = Selector.for_bounds(PrivateSelection(strategy=strategy), SELECTION_EPSILON,
                                   SELECTION_DELTA, bounds)
    # the edge where the keep probability turns: a calibration for fewer keys shows there
    n = next(m for m in range(1, 100_000) if selector.keep_probability(m + 1) >= 0.5)
    DPTester(n_samples=JOINT_SAMPLES).assert_dp(
        _kept_keys(selector, n, seed=41, purpose="D"),
        _kept_keys(selector, n + 1, seed=41, purpose="D'"),
        epsilon=SELECTION_EPSILON, delta=SELECTION_DELTA)
