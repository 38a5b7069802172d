"""Composition, conversion and transformation of privacy guarantees.

Closed-form rules (sources named in each docstring: Dwork & Roth 2014, Bun & Steinke 2016,
Canonne, Kamath & Steinke 2020; seed 000_015430204a1d6d17.txt):

* basic sequential composition, parallel composition, advanced (k-fold) composition;
* zCDP: pure DP -> zCDP, rho-zCDP -> (epsilon, delta) (simple Bun-Steinke bound and the tighter
  Canonne-Kamath-Steinke bound), and the combination of zCDP and pure-DP releases;
* group privacy, substitution vs add/remove, amplification by Poisson subsampling;

and numerical composition of ``dp_accounting`` DpEvents (privacy loss distributions, Renyi DP).
Following ``dp_accounting``, a release is described by what happened (DpEvents) and counted by an
accountant chosen separately.

A guarantee is an :class:`EpsDelta` named tuple ``(epsilon, delta)``; every input is validated and
a bad one raises ``ValueError`` naming the parameter.
"""
from __future__ import annotations

import math
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from accounting.validation import (check_delta, check_epsilon, check_positive_int,
                                   check_probability, check_rho)


class EpsDelta(NamedTuple):
    """An (epsilon, delta)-DP guarantee."""

    epsilon: float
    delta: float


#: Which accountant a stated figure comes from (a measure's epsilon, a release's guarantee):
#: ``"pure"`` the sum of pure-DP epsilons (no delta spent); ``"basic"`` basic composition of
#: (epsilon, delta) figures; ``"zcdp"`` a zCDP conversion (:func:`combine_zcdp_and_pure`);
#: ``"pld"`` a privacy loss distribution (the mechanism's exact privacy curve, or ``dp_accounting``'s
#: pessimistic numerical composition).
FIGURE_ACCOUNTANTS = ("pure", "basic", "zcdp", "pld")


def _as_guarantee(pair, index: int) -> EpsDelta:
    try:
        epsilon, delta = pair
    except (TypeError, ValueError):
        raise ValueError(f"guarantees[{index}] must be an (epsilon, delta) pair, got {pair!r}")
    return EpsDelta(check_epsilon(epsilon, f"guarantees[{index}].epsilon"),
                    check_delta(delta, f"guarantees[{index}].delta"))


def _checked_list(guarantees: Iterable) -> list[EpsDelta]:
    checked = [_as_guarantee(pair, i) for i, pair in enumerate(guarantees)]
    if not checked:
        raise ValueError("guarantees must not be empty")
    return checked


def _total_delta(delta: float) -> float:
    if delta >= 1:
        raise ValueError(f"composed delta is {delta!r} >= 1: the guarantee is vacuous")
    return delta


# ---------------------------------------------------------------- sequential and parallel

def sequential(guarantees: Iterable[tuple[float, float]]) -> EpsDelta:
    """Basic sequential composition: ``(sum epsilon_i, sum delta_i)``.

    Holds for any mechanisms run on the same data, even chosen adaptively
    (Dwork & Roth 2014, Theorem 3.16).
    """
    checked = _checked_list(guarantees)
    try:
        epsilon = math.fsum(g.epsilon for g in checked)
    except OverflowError:
        epsilon = math.inf
    if math.isinf(epsilon):
        raise ValueError("the composed epsilon overflows: the measures' epsilons add up past "
                         "the largest float")
    return EpsDelta(epsilon, _total_delta(math.fsum(g.delta for g in checked)))


def parallel(guarantees: Iterable[tuple[float, float]]) -> EpsDelta:
    """Parallel composition: ``(max epsilon_i, max delta_i)``.

    Valid only when the mechanisms read disjoint parts of the data and one privacy unit can touch
    at most one part (McSherry 2009, "Privacy integrated queries", parallel composition).
    """
    checked = _checked_list(guarantees)
    return EpsDelta(max(g.epsilon for g in checked), max(g.delta for g in checked))


def advanced(epsilon: float, delta: float, k: int, delta_slack: float) -> EpsDelta:
    """Advanced composition of ``k`` (epsilon, delta)-DP mechanisms (Dwork, Rothblum & Vadhan 2010).

    ``epsilon' = sqrt(2 k ln(1/delta_slack)) * epsilon + k * epsilon * (e^epsilon - 1)`` and
    ``delta' = k * delta + delta_slack`` (Dwork & Roth 2014, Theorem 3.20). It beats basic
    composition (k * epsilon) only for large k and small epsilon; :func:`k_fold` takes the better.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    k = check_positive_int(k, "k")
    delta_slack = check_delta(delta_slack, "delta_slack", allow_zero=False)
    eps = (math.sqrt(2 * k * math.log(1 / delta_slack)) * epsilon
           + k * epsilon * math.expm1(epsilon))
    return EpsDelta(eps, _total_delta(k * delta + delta_slack))


def k_fold(epsilon: float, delta: float, k: int, delta_slack: float = 0.0) -> EpsDelta:
    """The better of basic and advanced composition for ``k`` runs of one mechanism.

    With ``delta_slack == 0`` only basic composition ``(k epsilon, k delta)`` applies.
    """
    basic = sequential([(epsilon, delta)] * check_positive_int(k, "k"))
    if delta_slack == 0:
        return basic
    adv = advanced(epsilon, delta, k, delta_slack)
    return adv if adv.epsilon < basic.epsilon else basic


# ---------------------------------------------------------------- zCDP

def pure_dp_to_zcdp(epsilon: float) -> float:
    """An epsilon-DP mechanism is (epsilon^2 / 2)-zCDP (Bun & Steinke 2016, Proposition 1.4)."""
    return check_epsilon(epsilon) ** 2 / 2


def zcdp_to_pure_epsilon(rho: float) -> float:
    """The pure-DP epsilon whose zCDP cost is exactly ``rho``: ``sqrt(2 rho)``."""
    return math.sqrt(2 * check_rho(rho))


def gaussian_rho(sigma: float, l2_sensitivity: float) -> float:
    """Gaussian noise N(0, sigma^2) on an L2-sensitivity-D query is (D^2 / (2 sigma^2))-zCDP.

    Bun & Steinke 2016, Proposition 1.6; also the discrete Gaussian with integer sensitivity
    (Canonne, Kamath & Steinke 2020).
    """
    sigma = check_epsilon(sigma, "sigma")
    l2 = check_epsilon(l2_sensitivity, "l2_sensitivity")
    return l2 ** 2 / (2 * sigma ** 2)


def group_privacy_zcdp(rho: float, k: int) -> float:
    """rho-zCDP for one change is (k^2 rho)-zCDP for k changes (Bun & Steinke 2016)."""
    return check_positive_int(k, "k") ** 2 * check_rho(rho)


def zcdp_to_dp_simple(rho: float, delta: float) -> EpsDelta:
    """rho-zCDP implies ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP.

    Bun & Steinke 2016, Proposition 1.3. Simple but loose; :func:`zcdp_to_dp` is tighter.
    """
    rho = check_rho(rho)
    delta = check_delta(delta, allow_zero=False)
    return EpsDelta(rho + 2 * math.sqrt(rho * math.log(1 / delta)), delta)


# Orders alpha searched for the tight conversion: alpha - 1 log-spaced over many decades, then a
# local bounded Brent refinement between the neighbours of the best grid point.
_LOG_ALPHA_MINUS_ONE = np.linspace(math.log(1e-6), math.log(1e9), 1501)


def _minimise_over_alpha(objective) -> float:
    """Minimise ``objective(alpha)`` (vectorised over numpy arrays) over alpha in (1, 1e9]."""
    grid = _LOG_ALPHA_MINUS_ONE
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        values = objective(1.0 + np.exp(grid))
    values = np.where(np.isnan(values), np.inf, values)
    best = int(np.argmin(values))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]

    def scalar(t: float) -> float:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            v = float(objective(np.asarray(1.0 + math.exp(t))))
        return math.inf if math.isnan(v) else v

    from scipy import optimize

    refined = optimize.minimize_scalar(scalar, bounds=(lo, hi), method="bounded",
                                       options={"xatol": 1e-10})
    return min(float(values[best]), float(refined.fun))


def zcdp_to_dp(rho: float, delta: float) -> EpsDelta:
    """Tight conversion of rho-zCDP to (epsilon, delta)-DP.

    Canonne, Kamath & Steinke 2020 ("The discrete Gaussian for differential privacy",
    arXiv:2004.00010v4, Proposition 12 applied to the RDP curve alpha*rho): rho-zCDP implies
    (epsilon, delta)-DP for

        delta = inf_{a > 1} exp((a - 1)(a rho - epsilon)) / (a - 1) * (1 - 1/a)^a,

    solved here for epsilon given delta:

        epsilon = inf_{a > 1} a rho + ln(1 - 1/a) + (ln(1/delta) - ln(a)) / (a - 1).

    (The same bound as ``dp_accounting.rdp.compute_epsilon`` applied to the RDP curve alpha*rho,
    but minimised over continuous alpha.) Never larger than :func:`zcdp_to_dp_simple`.
    """
    rho = check_rho(rho)
    delta = check_delta(delta, allow_zero=False)
    log_inv_delta = -math.log(delta)

    def epsilon_at(alpha):
        return (alpha * rho + np.log1p(-1.0 / alpha)
                + (log_inv_delta - np.log(alpha)) / (alpha - 1.0))

    epsilon = _minimise_over_alpha(epsilon_at)
    simple = zcdp_to_dp_simple(rho, delta).epsilon
    return EpsDelta(max(0.0, min(epsilon, simple)), delta)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """The smallest delta with rho-zCDP => (epsilon, delta)-DP (CKS 2020, see zcdp_to_dp)."""
    rho = check_rho(rho)
    epsilon = check_epsilon(epsilon)

    def log_delta_at(alpha):
        return ((alpha - 1.0) * (alpha * rho - epsilon) + alpha * np.log1p(-1.0 / alpha)
                - np.log(alpha - 1.0))

    return min(1.0, math.exp(_minimise_over_alpha(log_delta_at)))


def combine_zcdp_and_pure(rho: float, pure_epsilons: Sequence[float], delta: float,
                          approximate: Iterable[tuple[float, float]] = ()) -> EpsDelta:
    """One (epsilon, delta) for rho-zCDP releases plus pure-DP releases (plus optional others).

    Two valid routes, the smaller epsilon is returned (both spend the same ``delta``):

    * convert every pure epsilon_i to epsilon_i^2/2-zCDP (Bun & Steinke 2016, Prop. 1.4), add the
      rhos (zCDP composes additively, Bun & Steinke 2016) and convert once with :func:`zcdp_to_dp`;
    * convert rho alone with :func:`zcdp_to_dp` and add the pure epsilons (basic composition).

    ``approximate`` (epsilon, delta) releases that have no zCDP form are added by basic
    composition afterwards. ``rho`` may be 0 when there is no zCDP release.
    """
    if rho != 0:
        rho = check_rho(rho)
    epsilons = [check_epsilon(e, f"pure_epsilons[{i}]") for i, e in enumerate(pure_epsilons)]
    delta = check_delta(delta, allow_zero=False)
    pure_sum = math.fsum(epsilons)
    total_rho = rho + math.fsum(e * e / 2 for e in epsilons)
    if total_rho == 0:
        raise ValueError("nothing to combine: rho is 0 and pure_epsilons is empty")
    all_zcdp = EpsDelta(zcdp_to_dp(total_rho, delta).epsilon, delta)
    if rho == 0:
        # Pure releases alone: plain basic composition spends no delta at all.
        split = EpsDelta(pure_sum, 0.0)
    else:
        split = EpsDelta(zcdp_to_dp(rho, delta).epsilon + pure_sum, delta)
    best = split if split.epsilon <= all_zcdp.epsilon else all_zcdp
    extra = list(approximate)
    if not extra:
        return best
    rest = sequential(extra)
    return EpsDelta(best.epsilon + rest.epsilon, _total_delta(best.delta + rest.delta))


# ---------------------------------------------------------------- transformations of one guarantee

def group_privacy(epsilon: float, delta: float, k: int) -> EpsDelta:
    """(epsilon, delta)-DP for one change gives (k eps, delta (e^{k eps} - 1)/(e^eps - 1)) for k.

    Dwork & Roth 2014, Theorem 2.2 for pure DP; for delta > 0, k steps through intermediate
    datasets give delta' = sum_{j<k} e^{j epsilon} delta (seed 000_015430204a1d6d17.txt, group privacy).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    k = check_positive_int(k, "k")
    group_delta = delta * math.expm1(k * epsilon) / math.expm1(epsilon)
    return EpsDelta(k * epsilon, _total_delta(group_delta))


def substitution_from_add_remove(epsilon: float, delta: float = 0.0) -> EpsDelta:
    """A guarantee under add/remove of one unit restated for substitution (replace one unit).

    Replacing a unit is removing it then adding another: group privacy with k = 2, so
    (2 epsilon, delta (1 + e^epsilon)); pure DP doubles epsilon (seed 000_015430204a1d6d17.txt).
    """
    return group_privacy(epsilon, delta, 2)


def poisson_subsampling(epsilon: float, delta: float, probability: float) -> EpsDelta:
    """Amplification by Poisson subsampling with rate p (each unit kept independently w.p. p).

    (epsilon, delta) becomes (ln(1 + p (e^epsilon - 1)), p delta) under add/remove
    (Li, Qardaji & Su 2012; Balle, Barthe & Gaboardi 2018, "Privacy amplification by
    subsampling").
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    p = check_probability(probability, "probability")
    return EpsDelta(math.log1p(p * math.expm1(epsilon)), p * delta)


# ---------------------------------------------------------------- numerical accountants
# dp_accounting takes about a second to import: it is imported when an accountant is used, so
# that a job importing this module for closed-form composition does not pay for it.

_LAZY = {"dp_accounting": ("dp_accounting", None),
         "dp_pld": ("dp_accounting.pld", None), "dp_rdp": ("dp_accounting.rdp", None),
         "NeighboringRelation": ("dp_accounting.privacy_accountant", "NeighboringRelation")}


def __getattr__(name: str):
    """``dp_accounting``, ``dp_pld``, ``dp_rdp`` and ``NeighboringRelation``, imported on use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


def _as_event(events) -> dp_accounting.DpEvent:
    import dp_accounting

    if isinstance(events, dp_accounting.DpEvent):
        return events
    events = list(events)
    for i, event in enumerate(events):
        if not isinstance(event, dp_accounting.DpEvent):
            raise ValueError(f"events[{i}] must be a dp_accounting DpEvent, got {event!r}")
    if not events:
        raise ValueError("events must not be empty")
    return dp_accounting.ComposedDpEvent(list(events))


def _composed(accountant: dp_accounting.PrivacyAccountant, events, name: str):
    event = _as_event(events)
    if not accountant.supports(event):
        raise ValueError(f"the {name} accountant does not support {event!r} under "
                         f"{accountant.neighboring_relation.name}")
    return accountant.compose(event)


def pld_accountant(events, *, neighboring_relation: NeighboringRelation = None,
                   value_discretization_interval: float = 1e-4) -> dp_pld.PLDAccountant:
    """A ``dp_accounting`` PLDAccountant with ``events`` (a DpEvent or a list of them) composed.

    Privacy loss distributions compose tightly up to discretisation (Meiser & Mohammadi 2018;
    Koskela et al. 2020; Doroshenko et al. 2022 for the connect-the-dots discretisation used by
    dp_accounting). The reported epsilon is a pessimistic (valid) estimate.
    """
    from dp_accounting import pld as dp_pld
    from dp_accounting.privacy_accountant import NeighboringRelation

    if neighboring_relation is None:
        neighboring_relation = NeighboringRelation.ADD_OR_REMOVE_ONE
    accountant = dp_pld.PLDAccountant(neighboring_relation,
                                      value_discretization_interval=value_discretization_interval)
    return _composed(accountant, events, "PLD")


def pld_epsilon(events, delta: float, **kwargs) -> float:
    """Epsilon at ``delta`` of the composition of ``events`` by privacy loss distributions."""
    delta = check_delta(delta)
    return float(pld_accountant(events, **kwargs).get_epsilon(delta))


def pld_delta(events, epsilon: float, **kwargs) -> float:
    """Delta at ``epsilon`` of the composition of ``events`` by privacy loss distributions."""
    epsilon = check_epsilon(epsilon)
    return float(pld_accountant(events, **kwargs).get_delta(epsilon))


def rdp_accountant(events, *, orders: Sequence[float] | None = None,
                   neighboring_relation: NeighboringRelation = None) -> dp_rdp.RdpAccountant:
    """A ``dp_accounting`` RdpAccountant (Renyi DP, Mironov 2017) with ``events`` composed.

    Unlike the PLD accountant it supports ``ZCDpEvent`` (rho-zCDP is (alpha, alpha rho)-RDP).
    """
    from dp_accounting import rdp as dp_rdp
    from dp_accounting.privacy_accountant import NeighboringRelation

    if neighboring_relation is None:
        neighboring_relation = NeighboringRelation.ADD_OR_REMOVE_ONE
    accountant = dp_rdp.RdpAccountant(orders, neighboring_relation)
    return _composed(accountant, events, "RDP")


def rdp_epsilon(events, delta: float, **kwargs) -> float:
    """Epsilon at ``delta`` of the composition of ``events`` by Renyi DP."""
    delta = check_delta(delta, allow_zero=False)
    return float(rdp_accountant(events, **kwargs).get_epsilon(delta))


def compose_plds(plds: Sequence) -> "dp_pld.privacy_loss_distribution.PrivacyLossDistribution":
    """Compose ``dp_accounting`` PrivacyLossDistribution objects (same discretisation interval).

    For mechanisms that have a PLD but no PLDAccountant event (e.g. the discrete Gaussian, whose
    DpEvent is a ZCDpEvent).
    """
    plds = list(plds)
    if not plds:
        raise ValueError("plds must not be empty")
    composed = plds[0]
    for other in plds[1:]:
        composed = composed.compose(other)
    return composed
