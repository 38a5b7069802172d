"""Every stated guarantee is at least an independent ``dp_accounting`` computation of the same
mechanism, and within 1% of the PLD accountant's where a PLD applies (issue 39, item 2).

"Independent": the reference is built from the noise's unit scale and unit sensitivity with
``dp_accounting``'s own privacy losses, events and accountants (optimistic discretisation where a
lower bound on the true curve is needed), never through this project's calibration, composition
or caches. A stated figure below the reference would claim more privacy than the mechanism has.
"""
from __future__ import annotations

import math

import pytest

from accounting import guarantee
from accounting.budget import PrivacyBudget
from accounting.calibration import calibrate, calibrate_zcdp
from accounting.measures import Measure
from accounting.sensitivity import Sensitivities
from accounting.shared_budget import SharedBudget
from accounting.target import MeasureRequest, calibrate_to_target
from transforms.selection import (PrivateSelection, SelectionStrategy, Selector,
                                  per_key_budget)

#: Relative slack for float rounding of an exact curve (far below any leak).
ROUNDING = 1e-6


def _sens(l2: float, l0: int = 1) -> Sensitivities:
    return Sensitivities(l0=l0, linf=l2, l1=l2 * math.sqrt(l0), l2=l2)


def _true_delta(spec, epsilon: float) -> float:
    """delta(epsilon) of one application of ``spec``'s noise from dp_accounting's privacy loss."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    if spec.kind.value == "gaussian":
        loss = plm.GaussianPrivacyLoss(spec.unit_scale, sensitivity=spec.unit_sensitivity)
    else:
        loss = plm.DiscreteGaussianPrivacyLoss(spec.unit_scale, sensitivity=int(spec.unit_sensitivity))
    return loss.get_delta_for_epsilon(epsilon)


def _reference_epsilon(spec, delta: float, pessimistic: bool) -> float:
    from dp_accounting.pld import privacy_loss_distribution as pld

    if spec.kind.value == "gaussian":
        dist = pld.from_gaussian_mechanism(spec.unit_scale, sensitivity=spec.unit_sensitivity,
                                           pessimistic_estimate=pessimistic,
                                           value_discretization_interval=1e-4)
    else:
        dist = pld.from_discrete_gaussian_mechanism(spec.unit_scale, sensitivity=int(spec.unit_sensitivity),
                                                    pessimistic_estimate=pessimistic,
                                                    value_discretization_interval=1e-4)
    return dist.get_epsilon_for_delta(delta)


@pytest.mark.parametrize("kind", ["gaussian", "discrete_gaussian"])
@pytest.mark.parametrize("rho,delta", [(0.005, 1e-9), (0.05, 1e-6), (0.5, 1e-9)])
def test_rho_calibrated_gaussian_states_its_exact_curve(kind, rho, delta):
    spec = calibrate_zcdp(kind, rho=rho, l2_sensitivity=1, delta_for_reporting=delta)
    assert spec.accountant == "pld"
    assert _true_delta(spec, spec.epsilon) <= delta * (1 + ROUNDING)
    assert spec.epsilon <= 1.01 * _reference_epsilon(spec, delta, pessimistic=True)


@pytest.mark.parametrize("kind", ["gaussian", "discrete_gaussian"])
@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (2.0, 1e-9)])
def test_epsilon_delta_calibrated_gaussian_meets_its_exact_curve(kind, epsilon, delta):
    spec = calibrate(kind, epsilon=epsilon, delta=delta, l2_sensitivity=1)
    assert spec.accountant == "pld"
    assert _true_delta(spec, spec.epsilon) <= delta * (1 + ROUNDING)


def _splits(n, largest=None):
    """Every split of n (clicks over keys) as positive parts, largest first."""
    largest = n if largest is None else largest
    if n == 0:
        yield ()
        return
    for part in range(min(n, largest), 0, -1):
        for rest in _splits(n - part, part):
            yield (part,) + rest


def _independent_split_epsilon(sigma: float, split, delta: float, pessimistic: bool) -> float:
    """The pair whose counts differ by ``split``: one-key discrete Gaussians composed by
    dp_accounting from scratch (no project code)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    out = None
    for c in split:
        one = pld.from_discrete_gaussian_mechanism(sigma, sensitivity=int(c),
                                                   pessimistic_estimate=pessimistic,
                                                   value_discretization_interval=1e-4)
        out = one if out is None else out.compose(one)
    return out.get_epsilon_for_delta(delta)


def _check_multi_key(spec, m: int, every_n: bool):
    """The stated (epsilon, delta) of a discrete Gaussian over m keys holds for every split of
    every n <= m (exact curve, and at least dp_accounting's optimistic figure), and is within 1%
    of the pessimistic PLD of the worst split."""
    from accounting.distributions import discrete_gaussian_shift_delta

    splits = [s for n in (range(1, m + 1) if every_n else [m]) for s in _splits(n)]
    worst_exact = max(discrete_gaussian_shift_delta(spec.scale, s, spec.epsilon) for s in splits)
    assert worst_exact <= spec.delta * (1 + ROUNDING), (spec, worst_exact)
    lower = max(_independent_split_epsilon(spec.scale, s, spec.delta, False) for s in splits)
    upper = max(_independent_split_epsilon(spec.scale, s, spec.delta, True) for s in splits)
    assert spec.epsilon >= lower * (1 - ROUNDING)
    assert spec.epsilon <= 1.01 * upper


@pytest.mark.parametrize("m,rho,delta", [(2, 0.01, 1e-9), (2, 0.005, 1e-9), (3, 0.05, 1e-6),
                                         (5, 0.02, 1e-7)])
def test_rho_calibrated_multi_key_discrete_gaussian_states_its_worst_split(m, rho, delta):
    """User-DP clicks (CentralNotice): one user moves up to m clicks over up to m keys. The
    figure is the PLD of the worst split, below the zCDP conversion, never below any split."""
    from accounting.calibration import zcdp_to_epsilon

    spec = calibrate_zcdp("discrete_gaussian", rho=rho, l2_sensitivity=m, l0=m, l1_sensitivity=m,
                          delta_for_reporting=delta)
    assert spec.accountant == "pld"
    assert spec.epsilon < zcdp_to_epsilon(rho, delta)
    _check_multi_key(spec, m, every_n=True)


@pytest.mark.parametrize("m,epsilon,delta", [(2, 0.5, 1e-7), (3, 1.0, 1e-6), (4, 0.3, 1e-9)])
def test_epsilon_delta_calibrated_multi_key_discrete_gaussian_meets_every_split(m, epsilon, delta):
    """Calibrated to a target (epsilon, delta) on the multi-key PLD: less sigma than the zCDP
    route, the target met by the exact curve of every split of every n <= m clicks, and no
    noise left on the table (within 1% of the worst split's PLD)."""
    from accounting.calibration import discrete_gaussian_sigma

    spec = calibrate("discrete_gaussian", epsilon=epsilon, delta=delta, l1_sensitivity=m,
                     l2_sensitivity=m, l0=m)
    assert spec.accountant == "pld"
    assert spec.scale < discrete_gaussian_sigma(epsilon, delta, m, m)  # the zCDP route's sigma
    _check_multi_key(spec, m, every_n=True)
    # No more noise than needed: 1% less sigma no longer meets the target on some split.
    from accounting.distributions import discrete_gaussian_shift_delta

    assert max(discrete_gaussian_shift_delta(spec.scale * 0.99, s, epsilon)
               for s in _splits(m)) > delta


def test_multi_key_discrete_gaussian_states_no_less_than_a_split_shift():
    """L0 = 3 keys each shifted by at most one (L2 = sqrt 3): the one pattern is (1, 1, 1); the
    figure is at least that pair's exact curve (three one-key discrete Gaussians composed)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    spec = calibrate_zcdp("discrete_gaussian", rho=0.05, l2_sensitivity=math.sqrt(3), l0=3,
                          delta_for_reporting=1e-6)
    one = pld.from_discrete_gaussian_mechanism(spec.unit_scale, sensitivity=1,
                                               pessimistic_estimate=False)
    assert spec.epsilon >= one.self_compose(3).get_epsilon_for_delta(1e-6)
    pessimistic = pld.from_discrete_gaussian_mechanism(spec.unit_scale, sensitivity=1)
    assert spec.epsilon <= 1.01 * pessimistic.self_compose(3).get_epsilon_for_delta(1e-6)


def _measures():
    lap = calibrate("laplace", epsilon=0.3, l1_sensitivity=2.0)
    dlap = calibrate("discrete_laplace", epsilon=0.2, l1_sensitivity=1.0)
    gauss = calibrate("gaussian", epsilon=0.5, delta=1e-7, l2_sensitivity=3.0)
    dgauss = calibrate_zcdp("discrete_gaussian", rho=0.02, l2_sensitivity=2, delta_for_reporting=1e-7)
    return [Measure.of_noise("lap", lap, Sensitivities(l0=1, linf=2, l1=2, l2=2)),
            Measure.of_noise("dlap", dlap, Sensitivities(l0=1, linf=1, l1=1, l2=1)),
            Measure.of_noise("gauss", gauss, _sens(3.0)),
            Measure.of_noise("dgauss", dgauss, _sens(2.0))]


def _independent_pld_epsilon(measures, delta: float, pessimistic: bool) -> float:
    """The measures composed by dp_accounting from their unit scales alone."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    out = None
    for m in measures:
        n = m.noise
        kind = n.kind.value
        kwargs = dict(pessimistic_estimate=pessimistic, value_discretization_interval=1e-4)
        if kind == "laplace":
            one = pld.from_laplace_mechanism(n.unit_scale, sensitivity=n.unit_sensitivity, **kwargs)
        elif kind == "discrete_laplace":
            one = pld.from_discrete_laplace_mechanism(1 / n.unit_scale, sensitivity=n.unit_sensitivity,
                                                      **kwargs)
        elif kind == "gaussian":
            one = pld.from_gaussian_mechanism(n.unit_scale, sensitivity=n.unit_sensitivity, **kwargs)
        else:
            one = pld.from_discrete_gaussian_mechanism(n.unit_scale, sensitivity=int(n.unit_sensitivity),
                                                       **kwargs)
        out = one if out is None else out.compose(one)
    return out.get_epsilon_for_delta(delta)


@pytest.mark.parametrize("subset", [(0, 2), (1, 3), (0, 1, 2, 3), (2, 3)])
@pytest.mark.parametrize("accountant", ["basic", "zcdp", "pld"])
def test_composed_guarantee_is_at_least_the_independent_pld(subset, accountant):
    measures = [_measures()[i] for i in subset]
    delta = 1e-6
    stated = guarantee.stated(measures, accountant, None if accountant == "basic" else delta)
    lower = _independent_pld_epsilon(measures, stated.delta, pessimistic=False)
    assert stated.epsilon >= lower * (1 - ROUNDING), (stated, lower)
    if accountant == "pld":
        assert stated.epsilon <= 1.01 * _independent_pld_epsilon(measures, delta, pessimistic=True)
        assert stated.accountant in ("pld", "zcdp", "basic", "pure")


def test_joint_calibration_fits_its_target_by_an_independent_accountant():
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    requests = [MeasureRequest(name="count", kind="gaussian", sensitivities=_sens(1.0)),
                MeasureRequest(name="sum", kind="gaussian", sensitivities=_sens(4.0), weight=2),
                MeasureRequest(name="n", kind="laplace",
                               sensitivities=Sensitivities(l0=1, linf=1, l1=1, l2=1))]
    joint = calibrate_to_target(requests, epsilon=1.0, delta=1e-6)
    basic = calibrate_to_target(requests, epsilon=1.0, delta=1e-6, accountant="basic")
    assert joint.multiplier > 1.1 and joint.accountant == "pld"
    events = []
    for m in joint.measures:
        n = m.noise
        if n.kind.value == "gaussian":
            events.append(dp_accounting.GaussianDpEvent(noise_multiplier=n.unit_scale / n.unit_sensitivity))
        else:
            events.append(dp_accounting.LaplaceDpEvent(noise_multiplier=n.unit_scale / n.unit_sensitivity))
    acc = PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.ComposedDpEvent(events))
    spent = acc.get_epsilon(1e-6)
    assert spent <= 1.0 * (1 + ROUNDING)
    assert spent >= 0.99  # within 1% of the target: no budget left on the table
    # Less noise than the basic split on every measure.
    for j, b in zip(joint.measures, basic.measures):
        assert j.noise.scale < b.noise.scale
    joint.plan(PrivacyBudget(epsilon=1.0, delta=1e-6))  # the plan accepts them by the same accountant


def test_shared_budget_gives_delta_only_where_it_is_used_and_never_more_than_the_total():
    total = PrivacyBudget(epsilon=1.0, delta=1e-6)
    shared = SharedBudget(total, weights={"counts": 1, "sums": 2, "quantiles": 1},
                          needs_delta=["sums"])
    deltas = {n: shared.budget(n).delta for n in shared.names}
    assert deltas["counts"] == 0 and deltas["quantiles"] == 0
    assert math.fsum(deltas.values()) <= total.delta * (1 + 1e-12)
    assert deltas["sums"] == pytest.approx(total.delta)
    epsilons = math.fsum(shared.budget(n).epsilon for n in shared.names)
    assert epsilons <= total.epsilon * (1 + 1e-12)
    default = SharedBudget(total, weights={"a": 1, "b": 3})
    assert math.fsum(default.budget(n).delta for n in default.names) <= total.delta * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_shared_budget_draw_time_delta_never_exceeds_the_total_in_any_order(seed):
    """Without needs_delta, delta is allocated as parts are drawn: in every order, pure parts get
    none, the parts' deltas add up to at most the total, and the last part that uses delta
    leaves none unused unless a pure part is drawn after it."""
    import itertools
    import random

    rng = random.Random(seed)
    names = [f"p{i}" for i in range(4)]
    weights = {n: rng.choice([0.5, 1, 2, 3]) for n in names}
    uses = {n: rng.random() < 0.5 for n in names}
    total = PrivacyBudget(epsilon=1.0, delta=1e-6)
    for order in itertools.permutations(names):
        shared = SharedBudget(total, weights=weights)
        drawn = {n: shared.part(n).spendable_budget(uses_delta=uses[n]) for n in order}
        deltas = {n: b.delta for n, b in drawn.items()}
        assert math.fsum(deltas.values()) <= total.delta * (1 + 1e-12)
        assert all(deltas[n] == 0 for n in names if not uses[n])
        assert all(deltas[n] > 0 for n in names if uses[n])
        last_user = max((i for i, n in enumerate(order) if uses[n]), default=None)
        if last_user is not None and all(uses[n] for n in order[last_user:]):
            assert math.fsum(deltas.values()) == pytest.approx(total.delta)
        epsilons = math.fsum(b.epsilon for b in drawn.values())
        assert epsilons <= total.epsilon * (1 + 1e-12)


@pytest.mark.parametrize("epsilon,delta,keys", [(1.0, 1e-5, 1), (1.0, 1e-5, 4), (1.0, 1e-5, 30),
                                                 (0.3, 1e-7, 12)])
def test_selection_per_key_budget_composes_within_the_budget(epsilon, delta, keys):
    """Each key's keep curve is (eps', delta')-DP and ``keys`` of them composed optimally (an
    independent dp_accounting PLD of the canonical (eps', delta') pair) are (epsilon, delta)-DP."""
    import numpy as np
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    selector = Selector(PrivateSelection(strategy=SelectionStrategy.TRUNCATED_GEOMETRIC),
                        epsilon=epsilon, delta=delta, max_partitions=keys)
    eps_key, delta_key = per_key_budget(epsilon, delta, keys)
    pi = selector.probabilities
    assert np.all(pi[1:] <= math.exp(eps_key) * pi[:-1] + delta_key * (1 + 1e-9) + 1e-15)
    assert np.all(1 - pi[:-1] <= math.exp(eps_key) * (1 - pi[1:]) + delta_key * (1 + 1e-9) + 1e-15)
    one = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(eps_key, delta_key),
                                      value_discretization_interval=1e-5)
    composed = one.self_compose(keys).get_delta_for_epsilon(epsilon)
    basic_fits = eps_key * keys <= epsilon * (1 + 1e-12) and delta_key * keys <= delta * (1 + 1e-12)
    assert basic_fits or composed <= delta * (1 + 1e-3)


@pytest.mark.parametrize("epsilon,delta,keys", [(1.0, 1e-5, 1), (1.0, 1e-5, 4), (0.5, 1e-6, 9)])
def test_gaussian_selection_noise_and_threshold_deltas_fit_the_budget_together(epsilon, delta, keys):
    """Gaussian thresholding spends delta twice: the noise's own delta at epsilon (``keys``
    one-key discrete Gaussians of the selector's sigma, each shifted by one unit, composed by an
    independent dp_accounting PLD) and, for each of the ``keys`` keys a new unit creates, the
    probability that a key with one unit passes the threshold (the discrete Gaussian's tail
    summed here from its pmf). Together they must fit the selection's delta."""
    import numpy as np
    from dp_accounting.pld import privacy_loss_distribution as pld

    selector = Selector(PrivateSelection(strategy=SelectionStrategy.GAUSSIAN_THRESHOLDING),
                        epsilon=epsilon, delta=delta, max_partitions=keys)
    sigma = selector.noise.scale
    noise_delta = pld.from_discrete_gaussian_mechanism(
        sigma, sensitivity=1, value_discretization_interval=1e-4).self_compose(keys) \
        .get_delta_for_epsilon(epsilon)
    support = np.arange(-int(60 * sigma) - 60, int(60 * sigma) + 61)
    weights = np.exp(-support.astype(float) ** 2 / (2 * sigma * sigma))
    # one unit in a key: released iff 1 + Z > threshold, i.e. Z >= threshold
    lone_kept = float(weights[support >= selector.threshold].sum() / weights.sum())
    assert noise_delta + keys * lone_kept <= delta * (1 + 1e-2), (noise_delta, keys * lone_kept)


# ---------------------------------------------------------------- the multi-key dominating PLD
# A multi-key discrete Gaussian composes with a release's other measures by one PLD dominating
# every shift its unit can make (accounting.calibration.multi_key_dominating_pld). The references
# below enumerate every feasible shift by brute force (not only the maximal patterns) and build
# each shift's PLD with dp_accounting alone.

def _feasible_shifts(l0: int, l1: float, l2: float):
    """Every multiset of at most l0 positive integer shifts with sum <= l1 and sum of squares
    <= l2^2 (non-increasing tuples), by brute force."""
    out = []

    def grow(shift, largest):
        if shift:
            out.append(shift)
        if len(shift) == l0:
            return
        for c in range(1, largest + 1):
            if sum(shift) + c <= l1 + 1e-9 and sum(x * x for x in shift) + c * c <= l2 * l2 + 1e-9:
                grow(shift + (c,), c)

    grow((), int(math.floor(l2 + 1e-9)))
    return out


def _shift_pld(sigma: float, shift):
    """dp_accounting's PLD of the pair whose counts differ by ``shift`` (pessimistic): one-key
    discrete Gaussians composed."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    out = None
    for c in shift:
        one = pld.from_discrete_gaussian_mechanism(sigma, sensitivity=int(c),
                                                   value_discretization_interval=1e-4)
        out = one if out is None else out.compose(one)
    return out


def _multi_key_spec(case):
    l0, l1, l2, rho, delta = case
    return calibrate_zcdp("discrete_gaussian", rho=rho, l2_sensitivity=l2, l0=l0, l1_sensitivity=l1,
                          delta_for_reporting=delta)


#: (l0, l1, l2, rho, delta): a user's m clicks (L0 = L1 = L2 = m), a unit moving up to 4 keys
#: by at most 5 in L1 and 3 in L2, and a small sigma whose losses span past MAX_PROFILE_POINTS
#: (the coarser lattice).
MULTI_KEY_CASES = [(2, 2, 2, 0.01, 1e-9), (3, 3, 3, 0.05, 1e-6), (5, 5, 5, 0.02, 1e-7),
                   (4, 5, 3, 0.03, 1e-8), (3, 3, 3, 2.0, 1e-7)]


@pytest.mark.parametrize("case", MULTI_KEY_CASES)
def test_multi_key_dominating_pld_is_never_below_any_shift(case):
    """The measure's PLD has delta(eps) at least every feasible shift's dp_accounting PLD plus
    its truncation mass, at every eps from far below zero to far past the stated epsilon --
    and is no looser than needed: its epsilon within 1% of the worst shift's at the deltas jobs
    use."""
    import numpy as np

    from accounting.calibration import TAIL_MASS

    spec = _multi_key_spec(case)
    dominating = spec.privacy_loss_distribution()
    shifts = _feasible_shifts(*case[:3])
    plds = [_shift_pld(spec.unit_scale, s) for s in shifts]
    epsilons = np.concatenate([np.linspace(-4.0, 0.0, 41), np.linspace(0.0, 4 * spec.epsilon, 161)])
    for eps in epsilons:
        worst = max(float(d.get_delta_for_epsilon(float(eps))) + len(s) * TAIL_MASS
                    for s, d in zip(shifts, plds))
        stated = float(dominating.get_delta_for_epsilon(float(eps)))
        assert stated >= worst, (eps, stated, worst)
    for delta in (1e-3, 1e-6, 1e-9):
        worst = max(d.get_epsilon_for_delta(delta) for d in plds)
        assert dominating.get_epsilon_for_delta(delta) <= 1.01 * worst, delta


@pytest.mark.parametrize("case", MULTI_KEY_CASES)
def test_multi_key_dominating_pld_states_the_measures_epsilon(case):
    """Alone, the dominating PLD states the measure's epsilon at its delta (no less than the
    worst pattern's, within 1%), so the measure's own figure and its part in a composition agree;
    a spec read from a ledger without its accountant is labelled pld on that ground."""
    import dataclasses

    from accounting.calibration import (NoiseSpec, multi_key_discrete_gaussian_epsilon,
                                        shift_patterns)

    spec = _multi_key_spec(case)
    assert spec.accountant == "pld"
    patterns = shift_patterns(*case[:1], case[2], case[1])
    reference = multi_key_discrete_gaussian_epsilon(spec.unit_scale, spec.delta, patterns)
    stated = spec.privacy_loss_distribution().get_epsilon_for_delta(spec.delta)
    assert reference * (1 - ROUNDING) <= stated <= 1.01 * reference
    worst = max(_shift_pld(spec.unit_scale, s).get_epsilon_for_delta(spec.delta)
                for s in _feasible_shifts(*case[:3]))
    assert stated >= worst * (1 - ROUNDING)
    legacy = NoiseSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
                          if f.name != "accountant"})
    assert legacy.accountant == "pld"


def _mixed_release(case):
    m = case[0]
    dgauss = _multi_key_spec(case)
    lap = calibrate("laplace", epsilon=0.3, l1_sensitivity=2.0)
    gauss = calibrate("gaussian", epsilon=0.5, delta=1e-7, l2_sensitivity=3.0)
    return [Measure.of_noise("clicks", dgauss, Sensitivities(l0=m, linf=case[2], l1=case[1],
                                                              l2=case[2])),
            Measure.of_noise("impressions", lap, Sensitivities(l0=1, linf=2, l1=2, l2=2)),
            Measure.of_noise("sum", gauss, _sens(3.0))]


@pytest.mark.parametrize("case", MULTI_KEY_CASES[1:])
def test_mixed_release_with_a_multi_key_count_composes_on_its_curve(case):
    """A multi-key discrete Gaussian count with a Laplace and a Gaussian measure: the pld
    accountant's figure is at least the worst shift's pair composed with the others by
    dp_accounting alone (pessimistic), within 1% of it, and below what was stated when the count
    entered by its (epsilon, delta) pair (the zCDP, basic or pair-PLD figure)."""
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    measures = _mixed_release(case)
    delta = 1e-6
    stated = guarantee.stated(measures, "pld", delta)
    assert stated.accountant == "pld"
    lap, gauss = measures[1].noise, measures[2].noise
    others = pld.from_laplace_mechanism(lap.unit_scale, sensitivity=lap.unit_sensitivity,
                                        value_discretization_interval=1e-4).compose(
        pld.from_gaussian_mechanism(gauss.unit_scale, sensitivity=gauss.unit_sensitivity,
                                    value_discretization_interval=1e-4))
    sigma = measures[0].noise.unit_scale
    worst = max(_shift_pld(sigma, s).compose(others).get_epsilon_for_delta(delta)
                for s in _feasible_shifts(*case[:3]))
    assert worst * (1 - ROUNDING) <= stated.epsilon <= 1.01 * worst
    clicks = measures[0]
    pair = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(clicks.epsilon,
                                                                            clicks.delta),
                                       value_discretization_interval=1e-4)
    before = min(pair.compose(others).get_epsilon_for_delta(delta),
                 guarantee.stated(measures, "zcdp", delta).epsilon,
                 guarantee.stated(measures, "basic").epsilon)
    assert stated.epsilon < before


@pytest.mark.parametrize("impressions", [
    {"noise": "discrete_laplace", "epsilon": 0.5},
    {"noise": "discrete_gaussian", "epsilon": 0.5, "delta": 1e-8},
])
def test_a_centralnotice_release_calibrated_to_a_target_composes_within_it(impressions):
    """A CentralNotice release with ``privacy.target`` (issue 39.2): the noise its measures draw
    (impressions; row-DP discrete Gaussian clicks), composed by dp_accounting from the unit scales
    alone, is within the *configured* target at the configured delta, and the release states that
    target. The campaign's budgets have a larger delta than the target, so a target whose delta
    is taken from anywhere else is caught here."""
    from release_testkit import LOW, cn_config

    from pipelines.centralnotice.config import parse_config

    target = {"epsilon": 1.0, "delta": 2e-8 if impressions["noise"] == "discrete_gaussian" else 1e-8}
    data = cn_config(impressions={"k": 10, **impressions},
                     clicks={"noise": "discrete_gaussian", "epsilon": 0.5, "delta": 1e-8,
                             "neighbouring": "row", "release_threshold": LOW},
                     budget={"campaign_total": {"epsilon": 8.0, "delta": 1e-5},
                             "per_period": {"epsilon": 4.0, "delta": 1e-5}})
    data["accountant"] = "pld"
    data["campaigns"][0]["privacy"]["target"] = dict(target)
    campaign = parse_config(data).campaigns[0]
    measures = campaign.measures()
    assert [m.name for m in measures] == ["impressions", "clicks"]
    assert [m.noise for m in measures] == [campaign.noise_specs()[m.name] for m in measures]
    spent = _independent_pld_epsilon(measures, target["delta"], pessimistic=True)
    assert spent <= target["epsilon"] * (1 + 1e-3), (spent, target)
    assert spent >= 0.98 * target["epsilon"]  # the target is spent, not left on the table
    stated = campaign.shared_budget().stated()
    assert stated.delta == target["delta"] and stated.epsilon <= target["epsilon"] * (1 + 1e-9)
    assert campaign.joint_calibration().multiplier > 1.0


# ------------------------------------------------ the multi-key calibration's fast exact route
# multi_key_discrete_gaussian_delta / _epsilon (what calibrates and states a multi-key discrete
# Gaussian) convolve each pattern's one-key PLDs by one FFT. The reference composes the same
# one-key PLDs with dp_accounting's compose / self_compose, the route they replaced.

def _composed_pattern_pld(sigma: float, pattern):
    """dp_accounting's PLD of one shift pattern: its one-key discrete Gaussians (pessimistic),
    self-composed per shift size and composed across sizes."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    out = None
    for c in sorted(set(pattern)):
        one = pld.from_discrete_gaussian_mechanism(sigma, sensitivity=int(c),
                                                   value_discretization_interval=1e-4)
        part = one if pattern.count(c) == 1 else one.self_compose(pattern.count(c))
        out = part if out is None else out.compose(part)
    return out


#: (l0, l1, l2, sigma): a user's 2, 5 and 10 clicks at the sigmas of epsilon near 0.2-1, a
#: unit of 4 keys moved by at most 5 in L1 and 3 in L2, 3 keys by one each, small sigmas (large
#: losses, epsilons up to about 15) and a quantile tree's 16 nodes (L1 = 16, L2 = 4 sqrt 2;
#: slow: the reference composes 31 patterns).
FAST_ROUTE_CASES = [(2, 2, 2, 3.0), (2, 2, 2, 40.0), (5, 5, 5, 10.0),
                    pytest.param((10, 10, 10, 40.0), marks=pytest.mark.slow),
                    (4, 5, 3, 6.0), (3, 3, math.sqrt(3), 2.0), (3, 3, 3, 1.5),
                    pytest.param((16, 16, 4 * math.sqrt(2), 14.5), marks=pytest.mark.slow)]


@pytest.mark.parametrize("case", FAST_ROUTE_CASES)
def test_multi_key_fast_route_is_never_below_dp_accountings_composition_and_within_1pct(case):
    """Valid: delta(eps) at least the reference's (the worst pattern's dp_accounting PLD plus
    its truncation mass), with no tolerance, at every eps from 0 to past the epsilon of
    delta = 1e-12 -- the FFT rounding mass it adds is above the tails dp_accounting's
    compositions move to +inf (at most 1e-15 each). Tight: no more than 3 FFT rounding masses
    above it, and its epsilon at the deltas jobs use within 1% of the reference's (no less)."""
    from accounting.calibration import (FFT_ROUNDING_MASS, TAIL_MASS,
                                        multi_key_discrete_gaussian_delta,
                                        multi_key_discrete_gaussian_epsilon, shift_patterns)

    l0, l1, l2, sigma = case
    patterns = shift_patterns(l0, l2, l1)
    reference = [(p, _composed_pattern_pld(sigma, p)) for p in patterns]

    def reference_delta(eps):
        return max(float(d.get_delta_for_epsilon(eps)) + len(p) * TAIL_MASS for p, d in reference)

    def reference_epsilon(delta):
        return max(float(d.get_epsilon_for_delta(delta - len(p) * TAIL_MASS)) for p, d in reference)

    top = reference_epsilon(1e-12)
    for eps in [0.0] + [top * k / 12 for k in range(1, 16)]:
        fast, slow = multi_key_discrete_gaussian_delta(sigma, eps, patterns), reference_delta(eps)
        assert slow <= fast <= slow + 3 * FFT_ROUNDING_MASS, (eps, fast, slow)
    for delta in (1e-2, 1e-4, 1e-6, 1e-9, 1e-10):
        fast, slow = multi_key_discrete_gaussian_epsilon(sigma, delta, patterns), reference_epsilon(delta)
        assert slow * (1 - ROUNDING) <= fast <= 1.01 * slow, (delta, fast, slow)
        # the inverse of the fast delta: exactly on its curve, between lattice points
        assert multi_key_discrete_gaussian_delta(sigma, fast, patterns) <= delta * (1 + ROUNDING)
        assert multi_key_discrete_gaussian_delta(sigma, fast * (1 - 1e-4), patterns) > delta


@pytest.mark.parametrize("l0,l1,l2,epsilon,delta", [
    (2, 2, 2, 1.0, 1e-6), (5, 5, 5, 0.3, 1e-3), (10, 10, 10, 1.0, 1e-9), (4, 5, 3, 0.5, 1e-7),
    pytest.param(16, 16, 4 * math.sqrt(2), 1.0, 1e-3, marks=pytest.mark.slow),  # a quantile tree
    (2, 2, 2, 20.0, 1e-6), (3, 3, 3, 8.0, 1e-3)])   # small sigmas: the search bisects
def test_multi_key_calibration_is_the_smallest_sigma_meeting_dp_accountings_composition(
        l0, l1, l2, epsilon, delta):
    """The calibrated sigma meets (epsilon, delta) on the reference composition of every pattern
    and is within 2e-4 of the smallest that does: 2e-4 less sigma misses the target there."""
    from accounting.calibration import TAIL_MASS, shift_patterns

    spec = calibrate("discrete_gaussian", epsilon=epsilon, delta=delta, l1_sensitivity=l1,
                     l2_sensitivity=l2, l0=l0)
    assert spec.accountant == "pld"
    patterns = shift_patterns(l0, l2, l1)

    def reference_delta(sigma):
        return max(float(_composed_pattern_pld(sigma, p).get_delta_for_epsilon(epsilon))
                   + len(p) * TAIL_MASS for p in patterns)

    assert reference_delta(spec.scale) <= delta
    assert reference_delta(spec.scale * (1 - 2e-4)) > delta
