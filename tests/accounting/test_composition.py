"""Composition rules, checked against their formulas and against dp_accounting's accountants."""
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.privacy_accountant import NeighboringRelation

from accounting import composition as c


# ---------------------------------------------------------------- sequential / parallel / advanced

def test_sequential_adds_epsilons_and_deltas():
    assert c.sequential([(0.5, 1e-7), (0.25, 0.0), (1.0, 2e-7)]) == pytest.approx((1.75, 3e-7))


def test_parallel_takes_the_maximum():
    assert c.parallel([(0.5, 1e-7), (1.5, 0.0), (1.0, 3e-7)]) == (1.5, 3e-7)


def test_sequential_refuses_a_vacuous_delta():
    with pytest.raises(ValueError, match="delta"):
        c.sequential([(1.0, 0.6), (1.0, 0.6)])


def test_laplace_pld_composition_matches_basic_at_delta_zero_and_beats_it_otherwise():
    epsilon, k = 0.1, 30
    events = [dp_accounting.LaplaceDpEvent(noise_multiplier=1 / epsilon)] * k
    basic = c.sequential([(epsilon, 0.0)] * k)
    # Pure DP composes additively in the worst case: PLD at a negligible delta gives k * epsilon.
    # (dp_accounting truncates tails of mass ~1e-15 into delta, so delta = 0 itself gives inf.)
    assert c.pld_epsilon(events, 1e-12) == pytest.approx(basic.epsilon, rel=1e-3)
    # Allowing a small delta, the tight PLD composition is far below basic composition.
    tight = c.pld_epsilon(events, 1e-6)
    assert tight < 0.8 * basic.epsilon
    assert c.pld_delta(events, tight) <= 1e-6 * (1 + 1e-6)


def test_advanced_composition_formula_and_validity_against_pld():
    epsilon, delta, k, slack = 0.01, 1e-9, 1000, 1e-6
    got = c.advanced(epsilon, delta, k, slack)
    expected = math.sqrt(2 * k * math.log(1 / slack)) * epsilon + k * epsilon * math.expm1(epsilon)
    assert got.epsilon == pytest.approx(expected)
    assert got.delta == pytest.approx(k * delta + slack)
    assert got.epsilon < k * epsilon  # beats basic composition here
    # The tight (PLD) composition of k Laplace mechanisms is below the advanced bound.
    pld = c.pld_epsilon(dp_accounting.SelfComposedDpEvent(
        dp_accounting.LaplaceDpEvent(1 / epsilon), k), slack)
    assert pld <= got.epsilon


def test_k_fold_takes_the_better_bound():
    assert c.k_fold(1.0, 0.0, 3, 1e-6) == c.sequential([(1.0, 0.0)] * 3)  # basic wins
    assert c.k_fold(0.01, 0.0, 1000, 1e-6) == c.advanced(0.01, 0.0, 1000, 1e-6)
    assert c.k_fold(0.01, 0.0, 1000) == pytest.approx((10.0, 0.0))


# ---------------------------------------------------------------- zCDP

#: Dense Renyi orders for dp_accounting's RdpAccountant (its default grid stops at 1024 and is
#: sparse above 64, where the optimum lies for small rho).
DENSE_ORDERS = np.exp(np.linspace(math.log(1.01), math.log(1e6), 4000))

def test_pure_dp_and_gaussian_rho():
    assert c.pure_dp_to_zcdp(0.5) == pytest.approx(0.125)
    assert c.zcdp_to_pure_epsilon(0.125) == pytest.approx(0.5)
    assert c.gaussian_rho(sigma=10.0, l2_sensitivity=2.0) == pytest.approx(4 / 200)
    assert c.group_privacy_zcdp(0.01, 3) == pytest.approx(0.09)


def test_simple_zcdp_conversion_formula_and_wikimedia_parameters():
    rho, delta = 0.015, 1e-7
    got = c.zcdp_to_dp_simple(rho, delta)
    assert got.epsilon == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))
    # Seed 001 (CentralNotice report): Wikimedia's rho = 0.015 is "about epsilon 1, delta 1e-7".
    assert got.epsilon == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("rho", [1e-4, 0.015, 0.5, 5.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-7, 1e-3])
def test_tight_zcdp_conversion_agrees_with_rdp_accountant(rho, delta):
    tight = c.zcdp_to_dp(rho, delta)
    assert tight.delta == delta
    assert tight.epsilon <= c.zcdp_to_dp_simple(rho, delta).epsilon
    # dp_accounting minimises the same bound over a fixed grid of orders (ours: continuous).
    rdp = c.rdp_epsilon([dp_accounting.ZCDpEvent(rho)], delta, orders=DENSE_ORDERS)
    assert tight.epsilon <= rdp + 1e-9
    assert tight.epsilon == pytest.approx(rdp, rel=1e-3)
    # zcdp_delta inverts it.
    assert c.zcdp_delta(rho, tight.epsilon) == pytest.approx(delta, rel=1e-4)


def test_tight_conversion_beats_rdp_grid_for_tiny_rho():
    # The optimal order (~ sqrt(ln(1/delta)/rho) ~ 4500) lies beyond dp_accounting's default grid.
    rho, delta = 1e-6, 1e-9
    assert c.zcdp_to_dp(rho, delta).epsilon < 0.6 * c.rdp_epsilon([dp_accounting.ZCDpEvent(rho)],
                                                                   delta)


@pytest.mark.parametrize("sigma", [0.8, 3.0, 20.0])
def test_gaussian_zcdp_rdp_analytic_and_pld_agree(sigma):
    delta = 1e-6
    via_zcdp = c.zcdp_to_dp(c.gaussian_rho(sigma, 1.0), delta).epsilon
    via_rdp = c.rdp_epsilon([dp_accounting.GaussianDpEvent(sigma)], delta,
                            orders=DENSE_ORDERS)
    assert via_zcdp == pytest.approx(via_rdp, rel=2e-3)
    # The exact (analytic) Gaussian epsilon is smaller; the PLD accountant reproduces it.
    analytic = dp_accounting.get_epsilon_gaussian(sigma, delta)
    assert analytic < via_zcdp
    assert c.pld_epsilon([dp_accounting.GaussianDpEvent(sigma)], delta) == pytest.approx(
        analytic, rel=1e-3, abs=1e-3)


def test_combination_of_zcdp_and_pure_dp():
    rho, pure, delta = 0.01, [0.3, 0.2], 1e-7
    got = c.combine_zcdp_and_pure(rho, pure, delta)
    all_zcdp = c.zcdp_to_dp(rho + 0.3 ** 2 / 2 + 0.2 ** 2 / 2, delta).epsilon
    split = c.zcdp_to_dp(rho, delta).epsilon + 0.5
    assert got == pytest.approx((min(all_zcdp, split), delta))
    # RDP accounting of the same events (Laplace's exact RDP curve) can only be tighter.
    events = [dp_accounting.ZCDpEvent(rho)] + [dp_accounting.LaplaceDpEvent(1 / e) for e in pure]
    assert c.rdp_epsilon(events, delta) <= got.epsilon * (1 + 2e-3)
    # Many small pure releases: converting them to zCDP wins over adding their epsilons.
    many = c.combine_zcdp_and_pure(rho, [0.05] * 40, delta)
    assert many.epsilon < c.zcdp_to_dp(rho, delta).epsilon + 2.0
    assert many.epsilon == pytest.approx(c.zcdp_to_dp(rho + 40 * 0.05 ** 2 / 2, delta).epsilon)


def test_combination_with_pure_only_spends_no_delta_and_adds_approximate_releases():
    assert c.combine_zcdp_and_pure(0, [0.5, 0.5], 1e-7) == (1.0, 0.0)
    got = c.combine_zcdp_and_pure(0.01, [0.1], 1e-7, approximate=[(0.2, 1e-8)])
    base = c.combine_zcdp_and_pure(0.01, [0.1], 1e-7)
    assert got == pytest.approx((base.epsilon + 0.2, 1e-7 + 1e-8))
    with pytest.raises(ValueError, match="nothing"):
        c.combine_zcdp_and_pure(0, [], 1e-7)


# ---------------------------------------------------------------- group, substitution, subsampling

def test_group_privacy():
    eps, delta = 0.5, 1e-6
    assert c.group_privacy(eps, delta, 1) == pytest.approx((eps, delta))
    got = c.group_privacy(eps, delta, 3)
    assert got.epsilon == pytest.approx(1.5)
    assert got.delta == pytest.approx(delta * (1 + math.exp(eps) + math.exp(2 * eps)))


def test_group_privacy_of_laplace_matches_pld_with_k_fold_sensitivity():
    # Laplace with scale b is (1/b)-DP; k changes shift the query by k: PLD of scale b/k.
    b, k = 4.0, 3
    pld = c.pld_epsilon([dp_accounting.LaplaceDpEvent(noise_multiplier=b / k)], 1e-12)
    assert pld == pytest.approx(c.group_privacy(1 / b, 0.0, k).epsilon, rel=1e-3)


def test_substitution_doubles_epsilon():
    eps, delta = 0.7, 1e-8
    assert c.substitution_from_add_remove(eps) == pytest.approx((1.4, 0.0))
    assert c.substitution_from_add_remove(eps, delta) == pytest.approx(
        (1.4, delta * (1 + math.exp(eps))))
    # dp_accounting: replacing one record is a shift by twice the sensitivity for the Gaussian.
    sigma = 2.0
    replace = c.pld_epsilon([dp_accounting.GaussianDpEvent(sigma)], 1e-6,
                            neighboring_relation=NeighboringRelation.REPLACE_ONE)
    add_remove_double = c.pld_epsilon([dp_accounting.GaussianDpEvent(sigma / 2)], 1e-6)
    assert replace == pytest.approx(add_remove_double, rel=1e-3)


def test_poisson_subsampling_formula_and_pld():
    eps, p = 1.0, 0.1
    got = c.poisson_subsampling(eps, 1e-6, p)
    assert got.epsilon == pytest.approx(math.log(1 + p * (math.e - 1)))
    assert got.delta == pytest.approx(1e-7)
    # The bound is tight for the Laplace mechanism (worst-case privacy loss of the subsample).
    event = dp_accounting.PoissonSampledDpEvent(p, dp_accounting.LaplaceDpEvent(1 / eps))
    assert c.pld_epsilon([event], 1e-12) == pytest.approx(got.epsilon, rel=2e-3)
    assert c.poisson_subsampling(eps, 0.0, 1.0).epsilon == pytest.approx(eps)


# ---------------------------------------------------------------- numerical accountants: errors

def test_accountants_name_unsupported_events():
    with pytest.raises(ValueError, match="PLD accountant does not support"):
        c.pld_epsilon([dp_accounting.ZCDpEvent(0.1)], 1e-6)
    with pytest.raises(ValueError, match=r"events\[1\]"):
        c.pld_epsilon([dp_accounting.LaplaceDpEvent(1.0), (1.0, 0.0)], 1e-6)
    with pytest.raises(ValueError, match="empty"):
        c.rdp_epsilon([], 1e-6)
    plds = [dp_accounting.pld.privacy_loss_distribution.from_laplace_mechanism(1.0)] * 2
    assert c.compose_plds(plds).get_epsilon_for_delta(1e-12) == pytest.approx(2.0, rel=1e-3)


# ---------------------------------------------------------------- bad parameters

BAD = [
    (lambda v: c.sequential([(v, 0.0)]), [0.0, -1.0, math.nan, math.inf],
     r"guarantees\[0\]\.epsilon"),
    (lambda v: c.sequential([(1.0, v)]), [-0.1, 1.0, math.nan], r"guarantees\[0\]\.delta"),
    (lambda v: c.parallel([(1.0, 0.0), (v, 0.0)]), [0.0, math.nan], r"guarantees\[1\]\.epsilon"),
    (lambda v: c.advanced(v, 0.0, 10, 1e-6), [0.0, -1.0, math.nan], "epsilon"),
    (lambda v: c.advanced(1.0, 0.0, v, 1e-6), [0, -3, 1.5], "k"),
    (lambda v: c.advanced(1.0, 0.0, 10, v), [0.0, 1.0, math.nan], "delta_slack"),
    (lambda v: c.zcdp_to_dp(v, 1e-6), [0.0, -1.0, math.nan, math.inf], "rho"),
    (lambda v: c.zcdp_to_dp(0.1, v), [0.0, 1.0, -1e-9, math.nan], "delta"),
    (lambda v: c.zcdp_to_dp_simple(0.1, v), [0.0, 1.5], "delta"),
    (lambda v: c.zcdp_delta(0.1, v), [0.0, math.nan], "epsilon"),
    (lambda v: c.pure_dp_to_zcdp(v), [0.0, -2.0], "epsilon"),
    (lambda v: c.gaussian_rho(v, 1.0), [0.0, math.nan], "sigma"),
    (lambda v: c.combine_zcdp_and_pure(0.1, [v], 1e-6), [0.0, math.nan], r"pure_epsilons\[0\]"),
    (lambda v: c.group_privacy(1.0, 0.0, v), [0, 2.5, True], "k"),
    (lambda v: c.group_privacy(1.0, v, 2), [1.0, -0.5], "delta"),
    (lambda v: c.poisson_subsampling(1.0, 0.0, v), [0.0, 1.5, math.nan], "probability"),
    (lambda v: c.pld_epsilon([dp_accounting.LaplaceDpEvent(1.0)], v), [1.0, -0.1], "delta"),
    (lambda v: c.pld_delta([dp_accounting.LaplaceDpEvent(1.0)], v), [0.0, -1.0], "epsilon"),
]


@pytest.mark.parametrize("call,values,name", BAD)
def test_bad_parameters_raise_naming_the_parameter(call, values, name):
    for value in values:
        with pytest.raises(ValueError, match=name):
            call(value)


def test_pld_states_pure_laplace_measures_at_delta_zero_as_their_sum():
    """A continuous Laplace PLD puts its truncated tails at infinity; at delta 0 the tight
    answer for pure measures is the sum of their epsilons, not infinity (explain() once showed
    ``pld epsilon=inf`` for a Laplace mean)."""
    from accounting.calibration import calibrate
    from accounting.guarantee import compose
    from accounting.measures import Measure
    from accounting.sensitivity import Sensitivities

    sens = Sensitivities(l0=2, linf=1500, l1=3000, l2=2121.3)
    pure = [Measure.of_noise("sum", calibrate("laplace", epsilon=0.5, l1_sensitivity=3000), sens),
            Measure.of_noise("count", calibrate("discrete_laplace", epsilon=0.25,
                                                l1_sensitivity=10), sens)]
    assert compose(pure, "pld", 0.0).epsilon == pytest.approx(0.75)
    assert compose(pure, "pld", 1e-9).epsilon <= 0.75
