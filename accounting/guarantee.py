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
* ``"pld"``: the measures' privacy loss distributions composed numerically (``dp_accounting``;
  Koskela et al. 2020 / Doroshenko et al. 2022), epsilon read at ``delta``.

``delta`` defaults to the sum of the measures' own deltas (for zCDP measures, the delta at which
their calibration reported them), so a single release states its guarantee at the delta its
configuration declared; a ledger scope states it at its budget's delta.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

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


def compose(measures: Iterable[Measure], accountant: str = "basic",
            delta: Optional[float] = None) -> EpsDelta:
    """The (epsilon, delta) of all ``measures`` together, counted by ``accountant``.

    ``delta`` is the total delta of the stated guarantee (ignored by ``"basic"``, which states
    the sum of the measures' deltas). Raises ValueError when the accountant cannot state a
    guarantee at that delta (e.g. zCDP measures and ``delta`` 0).
    """
    measures = list(measures)
    check_accountant(accountant)
    if not measures:
        return EpsDelta(0.0, 0.0)
    if accountant == "basic":
        return composition.sequential([(m.epsilon, m.delta) for m in measures])
    target = default_delta(measures) if delta is None else check_delta(delta)
    if accountant == "zcdp":
        rho = math.fsum(m.rho for m in measures if m.rho is not None)
        if rho == 0:
            return composition.sequential([(m.epsilon, m.delta) for m in measures])
        pure = [m.epsilon for m in measures if m.is_pure]
        approximate = [(m.epsilon, m.delta) for m in measures if m.rho is None and m.delta > 0]
        conversion = target - math.fsum(d for _, d in approximate)
        if conversion <= 0:
            raise ValueError(f"delta={target:g} leaves nothing to convert rho={rho:g} into "
                             f"(epsilon, delta) after the approximate-DP measures' deltas")
        best = composition.combine_zcdp_and_pure(rho, pure, conversion)
        if not approximate:
            return EpsDelta(best.epsilon, target)
        rest = composition.sequential(approximate)
        return EpsDelta(best.epsilon + rest.epsilon, target)
    if target == 0 and all(m.is_pure for m in measures):
        # At delta 0 the tight composition of pure measures is the sum of their epsilons. A PLD
        # of a continuous Laplace measure truncates its tails into mass at infinity (a
        # pessimistic discretisation), so asking it for delta 0 would state epsilon = inf.
        return composition.sequential([(m.epsilon, m.delta) for m in measures])
    plds = [m.privacy_loss_distribution(PLD_DISCRETIZATION) for m in measures]
    epsilon = float(composition.compose_plds(plds).get_epsilon_for_delta(target))
    return EpsDelta(epsilon, target)


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
