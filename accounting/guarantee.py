"""From a release's measures to its guarantee: the one place where (epsilon, delta) is composed.

The release plan, a shared budget (:mod:`accounting.shared_budget`: a job's split and its
whole guarantee), the budget ledger's scope checks, a job's configuration check and every
report call :func:`compose` (or :func:`fits`), so the number a report states is the number the
ledger charged and the configuration was checked against -- for the same measures, accountant and
delta. Accountants:

* ``"basic"``: epsilons add and deltas add (Dwork & Roth 2014, Theorem 3.16).
* ``"zcdp"``: measures with a zCDP cost (``rho``) add their rhos (Bun & Steinke 2016, Lemma 2.3)
  and are converted once, together with the pure-DP measures, by
  :func:`~accounting.composition.combine_zcdp_and_pure` (the better of converting the pure
  epsilons to zCDP or adding them afterwards; tight conversion of Canonne, Kamath & Steinke
  2020); approximate-DP measures without a zCDP form are added by basic composition. The stated
  ``delta`` is the total: the conversion gets what the approximate measures leave.
* ``"pld"``: the tightest valid statement: the measures' privacy loss distributions composed
  numerically (``dp_accounting``; Koskela et al. 2020 / Doroshenko et al. 2022; pessimistic
  discretisation, so never below the true curve), epsilon read at ``delta`` -- or the zCDP or
  basic figure where that is smaller. A multi-key discrete Gaussian enters by one PLD dominating
  every shift its unit can make (:func:`~accounting.calibration.multi_key_dominating_pld`:
  connect-the-dots of the maximum of the shift patterns' privacy profiles), so a release mixing
  it with Laplace or Gaussian measures is composed on its curve, not on its (epsilon, delta)
  pair; only where its patterns do not apply does it enter by that pair.

Every figure names the accountant it comes from (:func:`stated`; ``pure``, ``basic``, ``zcdp`` or
``pld``, :data:`~accounting.composition.FIGURE_ACCOUNTANTS`): the ledger's and catalog's
``accountant`` is the rule a job chose, a figure's ``figure_accountant`` what produced it.

``delta`` defaults to the sum of the measures' own deltas (for zCDP measures, the delta at which
their calibration reported them), so a single release states its guarantee at the delta its
configuration declared; a ledger scope states it at its budget's delta.
"""
from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict
from typing import Iterable, NamedTuple, Optional, Sequence

from accounting import composition
from accounting.composition import EpsDelta
from accounting.measures import Measure
from accounting.validation import check_delta

ACCOUNTANTS = ("basic", "zcdp", "pld")
#: Relative slack when comparing a composed guarantee with a budget (float rounding only).
TOLERANCE = 1e-9
#: value_discretization_interval of the PLD accountant.
PLD_DISCRETIZATION = 1e-4


def check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def default_delta(measures: Sequence[Measure]) -> float:
    """The delta a set of measures declares: the sum of their deltas."""
    return math.fsum(m.delta for m in measures)


class Stated(NamedTuple):
    """A composed guarantee and the accountant its epsilon comes from
    (:data:`~accounting.composition.FIGURE_ACCOUNTANTS`)."""

    epsilon: float
    delta: float
    accountant: str

    @property
    def guarantee(self) -> EpsDelta:
        return EpsDelta(self.epsilon, self.delta)


def compose(measures: Iterable[Measure], accountant: str = "basic",
            delta: Optional[float] = None) -> EpsDelta:
    """The (epsilon, delta) of all ``measures`` together, counted by ``accountant``.

    ``delta`` is the total delta of the stated guarantee (ignored by ``"basic"``, which states
    the sum of the measures' deltas). Raises ValueError when the accountant cannot state a
    guarantee at that delta (e.g. zCDP measures and ``delta`` 0). :func:`stated` also names the
    accountant the figure comes from.
    """
    return stated(measures, accountant, delta).guarantee


def stated(measures: Iterable[Measure], accountant: str = "basic",
           delta: Optional[float] = None) -> Stated:
    """:func:`compose`, with the accountant the figure comes from.

    ``"pld"`` is the tightest valid statement: the smallest of the privacy loss distributions'
    composition (pessimistic discretisation, so never below the true curve; a multi-key
    discrete Gaussian by the PLD dominating its shift patterns), the zCDP conversion and basic
    composition -- each a valid upper bound on the same composition, so their minimum is one too.
    """
    measures = list(measures)
    check_accountant(accountant)
    if not measures:
        return Stated(0.0, 0.0, "pure")
    if accountant == "basic":
        return _basic(measures)
    target = default_delta(measures) if delta is None else check_delta(delta)
    if accountant == "zcdp":
        return _zcdp(measures, target)
    if target == 0 and all(m.is_pure for m in measures):
        # At delta 0 the tight composition of pure measures is the sum of their epsilons. A PLD
        # of a continuous Laplace measure truncates its tails into mass at infinity (a
        # pessimistic discretisation), so asking it for delta 0 would state epsilon = inf.
        return _basic(measures)
    candidates = [Stated(pld_epsilon(measures, target), target, "pld")]
    try:
        candidates.append(_zcdp(measures, target))
    except ValueError:
        pass  # no delta left for a zCDP conversion: PLD and basic only
    basic = _basic(measures)
    if basic.delta <= target:
        candidates.append(Stated(basic.epsilon, target, basic.accountant))
    return min(candidates, key=lambda c: c.epsilon)


def _basic(measures: Sequence[Measure]) -> Stated:
    g = composition.sequential([(m.epsilon, m.delta) for m in measures])
    pure = all(m.is_pure for m in measures)
    return Stated(g.epsilon, g.delta, "pure" if pure else "basic")


def _zcdp(measures: Sequence[Measure], target: float) -> Stated:
    rho = math.fsum(m.rho for m in measures if m.rho is not None)
    if rho == 0:
        return _basic(measures)
    pure = [m.epsilon for m in measures if m.is_pure]
    approximate = [(m.epsilon, m.delta) for m in measures if m.rho is None and m.delta > 0]
    conversion = target - math.fsum(d for _, d in approximate)
    if conversion <= 0:
        raise ValueError(f"delta={target:g} leaves nothing to convert rho={rho:g} into "
                         f"(epsilon, delta) after the approximate-DP measures' deltas")
    best = composition.combine_zcdp_and_pure(rho, pure, conversion)
    if not approximate:
        return Stated(best.epsilon, target, "zcdp")
    rest = composition.sequential(approximate)
    return Stated(best.epsilon + rest.epsilon, target, "zcdp")


# ---------------------------------------------------------------- PLD composition, cached
# A ledger scope re-composes the same measures at every check and a calibration to a target
# composes the same PLDs many times: PLDs are cached per measure (by what determines their
# curve) and compositions per multiset of measures and delta. Identical measures are composed
# by self_compose (one FFT instead of k - 1).

_PLD_CACHE: "OrderedDict[tuple, object]" = OrderedDict()
_EPSILON_CACHE: "OrderedDict[tuple, float]" = OrderedDict()
_CACHE_SIZE = 512


_CACHE_LOCK = threading.Lock()


def _cached(cache: OrderedDict, key, compute):
    with _CACHE_LOCK:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    value = compute()  # outside the lock: a PLD composition may take a second
    with _CACHE_LOCK:
        cache[key] = value
        if len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
    return value


def pld_key(measure: Measure) -> tuple:
    """What determines a measure's PLD (its noise's kind, unit scale and unit sensitivity, its
    L0 and L1 -- a multi-key discrete Gaussian's shift patterns -- and the (epsilon, delta) used
    where no exact curve applies); equal keys, equal PLDs."""
    n = measure.noise
    if n is None:
        return ("eps-delta", measure.epsilon, measure.delta)
    return (n.kind.value, n.unit_scale, n.unit_sensitivity, n.l0, n.l1_sensitivity, n.epsilon,
            n.delta)


def pld_epsilon(measures: Sequence[Measure], delta: float) -> float:
    """Epsilon at ``delta`` of the measures' PLDs composed (``dp_accounting``, pessimistic)."""
    counts = Counter(pld_key(m) for m in measures)
    by_key = {pld_key(m): m for m in measures}
    key = (tuple(sorted(counts.items(), key=repr)), delta)

    def compute() -> float:
        plds = []
        for k, count in sorted(counts.items(), key=lambda item: repr(item[0])):
            one = _cached(_PLD_CACHE, k,
                          lambda m=by_key[k]: m.privacy_loss_distribution(PLD_DISCRETIZATION))
            plds.append(one if count == 1 else one.self_compose(count))
        return float(composition.compose_plds(plds).get_epsilon_for_delta(delta))

    return _cached(_EPSILON_CACHE, key, compute)


def within(spent: EpsDelta, epsilon: float, delta: float) -> bool:
    """``spent`` fits (epsilon, delta), up to float rounding."""
    return (spent.epsilon <= epsilon * (1 + TOLERANCE)
            and spent.delta <= delta * (1 + TOLERANCE) + 1e-18)


def fits(measures: Iterable[Measure], epsilon: float, delta: float,
         accountant: str = "basic") -> tuple[bool, EpsDelta]:
    """Whether ``measures`` together fit (epsilon, delta) under ``accountant``; and what they spend.

    An accountant that cannot state the measures at ``delta`` (no delta left for a zCDP
    conversion) counts as spending infinity.
    """
    measures = list(measures)
    try:
        spent = compose(measures, accountant, delta)
    except ValueError:
        spent = EpsDelta(math.inf, default_delta(measures))
    return within(spent, epsilon, delta), spent


def describe(guarantee: EpsDelta, accountant: str) -> str:
    return f"(epsilon={guarantee.epsilon:.4g}, delta={guarantee.delta:.3g}) by {accountant} composition"
