"""Calibration of several measures to one target (epsilon, delta) (accounting.target)."""
import math

import pytest

from accounting import guarantee
from accounting.budget import PrivacyBudget, ReleasePlan
from accounting.sensitivity import Sensitivities
from accounting.target import MeasureRequest, calibrate_to_target

ONE = Sensitivities(l0=1, linf=1, l1=1, l2=1)


def _requests(*kinds):
    return [MeasureRequest(name=f"m{i}", kind=k, sensitivities=ONE) for i, k in enumerate(kinds)]


def test_two_gaussians_need_a_third_less_noise_than_the_basic_split():
    joint = calibrate_to_target(_requests("gaussian", "gaussian"), epsilon=1.0, delta=1e-6)
    basic = calibrate_to_target(_requests("gaussian", "gaussian"), epsilon=1.0, delta=1e-6,
                                accountant="basic")
    assert basic.multiplier == 1.0 and joint.multiplier > 1.3
    assert joint.stated.accountant == "pld"
    assert 0.99 <= joint.guarantee.epsilon <= 1.0 and joint.guarantee.delta == 1e-6
    for j, b in zip(joint.measures, basic.measures):
        assert j.noise.scale < 0.8 * b.noise.scale


def test_pure_measures_at_delta_zero_keep_the_basic_split():
    joint = calibrate_to_target(_requests("discrete_laplace", "laplace"), epsilon=0.5)
    assert joint.multiplier == 1.0
    assert joint.stated.accountant == "pure"
    assert math.fsum(m.epsilon for m in joint.measures) == pytest.approx(0.5)


def test_mixed_release_is_never_worse_than_the_split_and_its_plan_accepts_it():
    requests = _requests("discrete_laplace", "discrete_gaussian")
    joint = calibrate_to_target(requests, epsilon=1.0, delta=1e-6)
    assert joint.multiplier >= 1.0
    budget = PrivacyBudget(epsilon=1.0, delta=1e-6)
    plan = joint.plan(budget)
    assert plan.accountant == "pld"
    assert guarantee.within(plan.guarantee("pld"), 1.0, 1e-6)
    if joint.multiplier > 1:  # the basic check refuses measures calibrated jointly
        with pytest.raises(ValueError, match="spend epsilon"):
            ReleasePlan(budget=budget, measures=joint.measures)


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        calibrate_to_target([], epsilon=1.0)
    with pytest.raises(ValueError, match="distinct"):
        calibrate_to_target([MeasureRequest(name="a", kind="laplace", sensitivities=ONE)] * 2,
                            epsilon=1.0)
    with pytest.raises(ValueError, match="zCDP"):
        calibrate_to_target(_requests("gaussian"), epsilon=1.0, delta=1e-6, accountant="zcdp")
    with pytest.raises(ValueError, match="need delta > 0"):
        calibrate_to_target(_requests("gaussian"), epsilon=1.0)


def test_delta_weights_share_delta_among_the_gaussian_measures():
    """Gaussian measures share delta by their delta weights (here 1:3, against epsilon weights
    of 1:1), add up to the target's delta, and a pure measure gets none."""
    requests = [MeasureRequest(name="a", kind="gaussian", sensitivities=ONE, delta_weight=1e-8),
                MeasureRequest(name="b", kind="gaussian", sensitivities=ONE, delta_weight=3e-8),
                MeasureRequest(name="c", kind="laplace", sensitivities=ONE)]
    joint = calibrate_to_target(requests, epsilon=1.0, delta=1e-6)
    deltas = {m.name: m.share.delta for m in joint.measures}
    assert deltas["a"] == pytest.approx(0.25e-6) and deltas["b"] == pytest.approx(0.75e-6)
    assert deltas["c"] == 0 and math.fsum(deltas.values()) <= 1e-6 * (1 + 1e-12)
    assert guarantee.within(joint.guarantee, 1.0, 1e-6)
    with pytest.raises(ValueError, match="no delta_weight while others do"):
        calibrate_to_target([requests[0], MeasureRequest(name="d", kind="gaussian", sensitivities=ONE)],
                            epsilon=1.0, delta=1e-6)


def test_a_joint_calibration_spends_a_shared_budget_part_by_its_accountant():
    """A part spent by jointly calibrated measures: the part's own spend() (basic) refuses them,
    JointCalibration.spend accepts them, and the job's guarantee and explain state the target,
    the accountant and the multiplier."""
    from accounting.shared_budget import SharedBudget

    target = PrivacyBudget(epsilon=1.0, delta=1e-6)
    joint = calibrate_to_target(_requests("gaussian", "gaussian"), epsilon=1.0, delta=1e-6)
    assert joint.target == target and joint.multiplier > 1.3
    with pytest.raises(ValueError, match="spend epsilon"):
        SharedBudget(target, budgets={"both": target}, accountant="pld").part("both").spend(
            list(joint.measures))
    shared = SharedBudget(target, budgets={"both": target}, accountant="pld")
    plan = joint.spend(shared.part("both"))
    assert plan.accountant == "pld" and shared.measures() == list(joint.measures)
    assert guarantee.within(shared.guarantee(), 1.0, 1e-6)
    text = shared.explain()
    assert "Calibrated jointly to the target (epsilon=1, delta=1e-06)-DP by the 'pld' accountant" in text
    assert f"m={joint.multiplier:.4g}" in text
