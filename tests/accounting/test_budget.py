"""PrivacyBudget, its split, and ReleasePlan accounting/explain, checked against dp_accounting."""
import dataclasses
import json
import math

import dp_accounting
import pytest

from accounting import composition
from accounting.budget import BudgetShare, Measure, PrivacyBudget, ReleasePlan
from accounting.calibration import NoiseKind, calibrate
from accounting.sensitivity import (ContributionBounds, Neighbouring, count_sensitivity,
                                    sum_sensitivity)

IMPRESSIONS = sum_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1, min_value=0, max_value=10))  # k = 10
CLICKS = count_sensitivity(ContributionBounds(max_partitions=2, max_contributions_per_partition=3))  # user-DP clicks, L2 = 3 sqrt(2)


# ---------------------------------------------------------------- budget and split

def test_split_of_an_approximate_budget():
    budget = PrivacyBudget(epsilon=1.0, delta=1e-7)
    shares = budget.split({"impressions": 1, "clicks": 3}, needs_delta=["clicks"])
    assert shares["impressions"] == BudgetShare(name="impressions", fraction=0.25, epsilon=0.25, delta=0.0)
    assert shares["clicks"] == BudgetShare(name="clicks", fraction=0.75, epsilon=0.75, delta=1e-7)
    assert composition.sequential([(s.epsilon, s.delta) for s in shares.values()]) == \
        pytest.approx((1.0, 1e-7))


def test_delta_is_split_among_the_measures_that_need_it_by_weight():
    shares = PrivacyBudget(epsilon=2.0, delta=1e-6).split({"a": 1, "b": 1, "c": 2},
                                                           needs_delta=["b", "c"])
    assert [shares[n].delta for n in "abc"] == pytest.approx([0.0, 1e-6 / 3, 2e-6 / 3])
    assert math.fsum(s.epsilon for s in shares.values()) == pytest.approx(2.0)


def test_split_of_a_zcdp_budget_gives_rho_and_its_pure_epsilon():
    budget = PrivacyBudget.zcdp(rho=0.015, delta=1e-7)
    shares = budget.split({"impressions": 1, "clicks": 2})
    assert shares["clicks"].rho == pytest.approx(0.01)
    assert shares["impressions"].rho == pytest.approx(0.005)
    assert shares["impressions"].epsilon == pytest.approx(math.sqrt(2 * 0.005))
    assert budget.as_epsilon_delta() == composition.zcdp_to_dp(0.015, 1e-7)


@pytest.mark.parametrize("kwargs,name", [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"),
    (dict(epsilon=math.nan), "epsilon"), (dict(epsilon=math.inf), "epsilon"),
    (dict(epsilon=1.0, delta=1.0), "delta"), (dict(epsilon=1.0, delta=-1e-9), "delta"),
    (dict(epsilon=1.0, delta=math.nan), "delta"),
    (dict(rho=0.0), "rho"), (dict(rho=-0.1), "rho"), (dict(rho=math.nan), "rho"),
    (dict(), "epsilon"), (dict(epsilon=1.0, rho=0.1), "rho"),
])
def test_bad_budgets_raise_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PrivacyBudget(**kwargs)


def test_bad_splits_raise():
    budget = PrivacyBudget(epsilon=1.0)
    with pytest.raises(ValueError, match=r"weights\['a'\]"):
        budget.split({"a": 0})
    with pytest.raises(ValueError, match=r"weights\['a'\]"):
        budget.split({"a": math.nan})
    with pytest.raises(ValueError, match="needs_delta"):
        PrivacyBudget(epsilon=1.0, delta=1e-6).split({"a": 1}, needs_delta=["b"])
    with pytest.raises(ValueError, match="delta is 0"):
        budget.split({"a": 1}, needs_delta=["a"])
    with pytest.raises(ValueError, match="weights"):
        budget.split({})


# ---------------------------------------------------------------- plans

def _approximate_plan():
    budget = PrivacyBudget(epsilon=1.0, delta=1e-7)
    shares = budget.split({"impressions": 1, "clicks": 1}, needs_delta=["clicks"])
    plan = ReleasePlan(budget=budget)
    return plan.with_measures(
        plan.calibrated("impressions", NoiseKind.LAPLACE, shares["impressions"], IMPRESSIONS,
                        description="noisy sum of k-blocks, k = 10"),
        plan.calibrated("clicks", NoiseKind.GAUSSIAN, shares["clicks"], CLICKS))


def test_calibrated_measures_use_the_share_and_sensitivity():
    plan = _approximate_plan()
    impressions, clicks = plan.measures
    assert impressions.noise.epsilon == pytest.approx(0.5)
    assert impressions.noise.scale == pytest.approx(10 / 0.5, rel=1e-4)  # b = L1 / epsilon
    assert clicks.noise.delta == pytest.approx(1e-7)
    # The Gaussian measure's noise, as a dp_accounting event, meets its share exactly
    # (analytic Gaussian, Balle & Wang 2018, as computed by dp_accounting).
    event = clicks.dp_event()
    assert isinstance(event, dp_accounting.GaussianDpEvent)
    eps = dp_accounting.get_epsilon_gaussian(event.noise_multiplier, 1e-7)
    assert eps <= 0.5 + 1e-6
    assert eps == pytest.approx(0.5, rel=1e-3)


def test_guarantees_of_an_approximate_plan():
    plan = _approximate_plan()
    basic = plan.guarantee("basic")
    assert basic == pytest.approx((1.0, 1e-7))
    assert plan.guarantee("zcdp").delta == 1e-7
    # PLD composition is tight: no worse than basic composition at the same delta.
    pld = plan.guarantee("pld")
    assert pld.delta == 1e-7
    assert pld.epsilon <= basic.epsilon + 1e-3


def test_plan_events_match_pld_accountant_on_the_plan_dp_event():
    plan = _approximate_plan()
    event = plan.dp_event()
    assert isinstance(event, dp_accounting.ComposedDpEvent)
    assert [type(e) for e in event.events] == [dp_accounting.LaplaceDpEvent,
                                               dp_accounting.GaussianDpEvent]
    via_events = composition.pld_epsilon(event, 1e-7)
    assert plan.guarantee("pld").epsilon == pytest.approx(via_events, rel=1e-3)
    # For larger delta the PLD beats basic composition outright.
    assert plan.guarantee("pld", delta=1e-3).epsilon < 0.95 * plan.guarantee("basic").epsilon


def test_zcdp_plan_combines_gaussian_and_laplace_measures():
    # Seed 001 (CentralNotice report): Gaussian clicks under zCDP with a pure-DP impressions release.
    budget = PrivacyBudget.zcdp(rho=0.015, delta=1e-7)
    shares = budget.split({"impressions": 1, "clicks": 2})
    plan = ReleasePlan(budget=budget)
    imp = plan.calibrated("impressions", "discrete_laplace", shares["impressions"], IMPRESSIONS)
    clk = plan.calibrated("clicks", "discrete_gaussian", shares["clicks"],
                          count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1)))
    plan = plan.with_measures(imp, clk)
    assert imp.noise.epsilon == pytest.approx(math.sqrt(2 * 0.005))
    assert imp.rho is None and imp.zcdp_rho == pytest.approx(0.005)  # pure: epsilon^2/2
    assert clk.rho == pytest.approx(0.01)
    assert clk.noise.scale == pytest.approx(1 / math.sqrt(0.02))
    zcdp = plan.guarantee("zcdp")
    # The whole budget is spent: converting it all at once gives the budget's own conversion,
    # which dp_accounting's RDP accountant (dense orders) reproduces from the measures' rhos.
    whole = budget.as_epsilon_delta().epsilon
    orders = [1 + 10 ** (x / 100) for x in range(-200, 500)]
    rdp = composition.rdp_epsilon([dp_accounting.ZCDpEvent(imp.zcdp_rho), clk.dp_event()], 1e-7,
                                  orders=orders)
    assert rdp == pytest.approx(whole, rel=1e-3)
    # Converting only the Gaussian part and adding the small pure epsilon is better here.
    split = composition.zcdp_to_dp(clk.rho, 1e-7).epsilon + imp.noise.epsilon
    assert split < whole
    assert zcdp == pytest.approx((split, 1e-7))
    assert plan.guarantee("pld").epsilon <= zcdp.epsilon + 1e-3


def test_plan_refuses_overspending_and_duplicates():
    budget = PrivacyBudget(epsilon=1.0)
    plan = ReleasePlan(budget=budget).with_measures(Measure.of_noise("a", calibrate("laplace", epsilon=0.6, l1_sensitivity=1.0),
                     count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1))))
    with pytest.raises(ValueError, match="epsilon"):
        plan.with_measures(Measure.of_noise("b", calibrate("laplace", epsilon=0.6, l1_sensitivity=1.0),
                         count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1))))
    with pytest.raises(ValueError, match="already"):
        plan.with_measures(Measure.of_noise("a", calibrate("laplace", epsilon=0.1, l1_sensitivity=1.0),
                         count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1))))
    with pytest.raises(ValueError, match="delta"):
        plan.with_measures(Measure.of_noise("g", calibrate("gaussian", epsilon=0.1, delta=1e-9, l2_sensitivity=1.0),
                         count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1))))
    zplan = ReleasePlan(budget=PrivacyBudget.zcdp(0.01))
    with pytest.raises(ValueError, match="rho"):
        zplan.with_measures(Measure.of_noise("a", calibrate("laplace", epsilon=0.5, l1_sensitivity=1.0),
                          count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1))))


def test_a_plan_is_a_value_adding_measures_makes_a_new_plan():
    one = count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1))
    empty = ReleasePlan(budget=PrivacyBudget(epsilon=1.0))
    a = Measure.of_noise("a", calibrate("laplace", epsilon=0.5, l1_sensitivity=1.0), one)
    plan = empty.with_measures(a)
    assert empty.measures == () and plan.measures == (a,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.measures = ()
    with pytest.raises(ValueError, match="already"):
        ReleasePlan(budget=PrivacyBudget(epsilon=1.0), measures=[a, a])
    assert plan.with_measures(Measure.of_noise("b", a.noise, one)).guarantee() == pytest.approx((1.0, 0.0))
    assert plan.measures == (a,)


def test_gaussian_share_without_delta_is_refused():
    share = PrivacyBudget(epsilon=1.0).split({"a": 1})["a"]
    with pytest.raises(ValueError, match="needs_delta"):
        Measure.calibrated("a", "gaussian", share, count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1)))


def test_guarantee_arguments_are_checked():
    plan = _approximate_plan()
    with pytest.raises(ValueError, match="accountant"):
        plan.guarantee("moments")
    with pytest.raises(ValueError, match="delta"):
        plan.guarantee("pld", delta=1.5)
    with pytest.raises(ValueError, match="no measures"):
        ReleasePlan(budget=PrivacyBudget(epsilon=1.0)).guarantee()
    pure = ReleasePlan(budget=PrivacyBudget(epsilon=1.0)).with_measures(Measure.of_noise("a", calibrate("laplace", epsilon=0.5, l1_sensitivity=1.0),
                     count_sensitivity(ContributionBounds(max_partitions=1, max_contributions_per_partition=1))))
    assert pure.guarantee("zcdp") == pytest.approx((0.5, 0.0))


def test_explain_lists_every_measure_with_noise_budget_and_error():
    plan = _approximate_plan()
    text = plan.explain()
    impressions, clicks = plan.measures
    assert "(epsilon=1, delta=1e-07)-DP" in text
    for m in plan.measures:
        row = next(line for line in text.splitlines() if line.startswith(m.name + " "))
        assert m.mechanism in row
        assert f"{m.noise.scale:.4g}" in row
        assert f"{m.noise.std:.4g}" in row
        assert f"±{m.noise.ci_halfwidth(0.95):.4g}" in row
        assert "50.0%" in row
    assert "L1=10" in text and f"L2={CLICKS.l2:.4g}" in text
    assert "neighbouring = add/remove one privacy unit" in text
    assert "noisy sum of k-blocks" in text
    for name in ("basic", "zcdp", "pld"):
        assert any(line.strip().startswith(name + " ") for line in text.splitlines())
    # Laplace std = sqrt(2) b; its 95% interval is b ln 20 (up to the grid).
    assert impressions.noise.std == pytest.approx(math.sqrt(2) * 20, rel=1e-4)
    assert impressions.noise.ci_halfwidth(0.95) == pytest.approx(20 * math.log(20), rel=1e-4)


def test_to_dict_is_json_ready():
    plan = _approximate_plan()
    data = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
    assert data["budget"] == {"epsilon": 1.0, "delta": 1e-7, "rho": None}
    assert [m["name"] for m in data["measures"]] == ["impressions", "clicks"]
    clicks = data["measures"][1]
    assert clicks["mechanism"] == "gaussian"
    assert clicks["neighbouring"] == Neighbouring.ADD_REMOVE.value
    assert clicks["sensitivities"]["l2"] == pytest.approx(3 * math.sqrt(2))
    assert clicks["budget_fraction"] == 0.5
    assert data["guarantees"]["basic"]["epsilon"] == pytest.approx(1.0)
