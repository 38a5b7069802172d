"""Calibrating several measures together to one target (epsilon, delta), by the tightest accountant.

A release that splits an (epsilon, delta) budget among its measures by basic composition
(:meth:`~accounting.budget.PrivacyBudget.split`) spends more noise than it needs as soon as one
measure is Gaussian or delta > 0: the measures' privacy loss distributions compose to less than
the sum of their epsilons (two Gaussians compose exactly to one Gaussian of the combined
sensitivity; Laplace and Gaussian noise compose below the sum at any delta > 0). This module keeps
the split's *proportions* -- each measure's share of epsilon, each Gaussian measure's share of
delta, as the weights say -- and scales every share's epsilon by one common multiplier ``m >= 1``,
the largest for which the measures, calibrated as usual (:meth:`Measure.calibrated`: grids, rounding
and exact curves included), compose to at most the target under the chosen accountant
(:func:`accounting.guarantee.stated`; ``pld`` is the tightest valid one). ``m = 1`` is the
basic split, which always fits, so the result is never worse than it. Gaussian measures share
``delta`` by their ``weight``, or by a ``delta_weight`` of their own where the split's deltas
were stated apart from its epsilons (a job whose per-measure budgets become the weights of one
target keeps both proportions).

The search is a bisection on ``m`` to a relative precision of 1e-3, keeping the largest *checked*
multiplier: the returned measures are exactly those whose composition was checked. PLD
compositions are cached (:mod:`accounting.guarantee`), so a re-plan of the same release costs
nothing. The measures carry their (scaled) shares; the plan that holds them checks them with the
same accountant (``ReleasePlan(accountant=...)``), not by basic composition, which they exceed by
design. A job that states its guarantee through a :class:`~accounting.shared_budget.SharedBudget`
spends one part on them with :meth:`JointCalibration.spend` (the part's plan checked by that
accountant; :meth:`JointCalibration.explain` is the part's entry in the job's explain).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from accounting import guarantee
from accounting.budget import PrivacyBudget, ReleasePlan
from accounting.calibration import NoiseKind
from accounting.composition import EpsDelta
from accounting.measures import BudgetShare, Measure
from accounting.sensitivity import Neighbouring, Sensitivities
from accounting.validation import check_delta, check_epsilon

__all__ = ["MeasureRequest", "JointCalibration", "calibrate_to_target"]

#: Relative precision of the multiplier search.
PRECISION = 1e-3
#: The largest multiplier searched (no composition of k measures beats basic by more than k).
MAX_MULTIPLIER = 64.0


@dataclass(frozen=True, kw_only=True)
class MeasureRequest:
    """One measure to calibrate: its noise kind, the query's sensitivities (derived for
    ``neighbouring``) and its relative ``weight`` in the split; ``delta_weight`` (Gaussian
    kinds): its relative share of delta among the Gaussian measures, if not ``weight``."""

    name: str
    kind: NoiseKind
    sensitivities: Sensitivities
    weight: float = 1.0
    neighbouring: str = Neighbouring.ADD_REMOVE.value
    description: str = ""
    delta_weight: Optional[float] = None

    def __post_init__(self):
        object.__setattr__(self, "kind", NoiseKind.parse(self.kind))
        object.__setattr__(self, "weight", check_epsilon(self.weight, f"weight of {self.name!r}"))
        if self.delta_weight is not None:
            object.__setattr__(self, "delta_weight", check_epsilon(
                self.delta_weight, f"delta_weight of {self.name!r}"))


@dataclass(frozen=True, kw_only=True)
class JointCalibration:
    """The measures calibrated together, what they compose to and which accountant says so.

    ``multiplier``: how much more epsilon each share got than the basic split (1: none);
    ``stated``: the composed guarantee and the accountant its figure comes from.
    """

    measures: tuple[Measure, ...]
    stated: guarantee.Stated
    accountant: str
    multiplier: float
    #: The target the measures were calibrated to.
    target: Optional[PrivacyBudget] = None

    @property
    def guarantee(self) -> EpsDelta:
        return self.stated.guarantee

    def plan(self, budget: PrivacyBudget) -> ReleasePlan:
        """A release plan holding these measures, checked by the accountant they were
        calibrated by (it refuses them if they do not fit ``budget``)."""
        return ReleasePlan(budget=budget, measures=self.measures, accountant=self.accountant)

    def spend(self, part) -> ReleasePlan:
        """Spend ``part`` (a :class:`~accounting.shared_budget.BudgetPart`) on these measures:
        their plan over the part's budget, checked by this calibration's accountant, not by
        basic composition, which jointly calibrated measures exceed by design. Returns the plan;
        the part's entry in the job's explain is :meth:`explain`'s header and the plan's table."""
        return part.spend(self.measures, accountant=self.accountant, header=self._header())

    def explain(self) -> str:
        """How the measures were calibrated (target, accountant, multiplier, what they compose
        to), then their plan's table."""
        budget = self.target if self.target is not None else PrivacyBudget(
            epsilon=self.stated.epsilon, delta=self.stated.delta)
        return self._header() + self.plan(budget).explain()

    def _header(self) -> str:
        target = "" if self.target is None else f" to the target {self.target.describe()}"
        names = ", ".join(m.name for m in self.measures)
        lines = [f"Calibrated jointly{target} by the {self.accountant!r} accountant "
                 f"(accounting.target.calibrate_to_target): {names}",
                 f"  each measure's share of the split times m={self.multiplier:.4g}, the largest "
                 "multiplier whose composition fits (m=1: the basic split)",
                 f"  together: epsilon={self.stated.epsilon:.4g}, delta={self.stated.delta:.3g} "
                 f"[{self.stated.accountant}]"]
        return "\n".join(lines + ["", ""])


def _calibrated(requests: Sequence[MeasureRequest], shares: dict, multiplier: float,
                delta_for_reporting: float) -> tuple[Measure, ...]:
    out = []
    for r in requests:
        s = shares[r.name]
        share = BudgetShare(name=s.name, fraction=s.fraction, epsilon=s.epsilon * multiplier,
                            delta=s.delta)
        out.append(Measure.calibrated(r.name, r.kind, share, r.sensitivities,
                                      neighbouring=r.neighbouring, description=r.description,
                                      delta_for_reporting=delta_for_reporting))
    return tuple(out)


def _delta_by_delta_weight(shares: dict, gaussian: Sequence[MeasureRequest], delta: float) -> dict:
    """The split's shares with delta shared among the Gaussian measures by their delta weights
    (every Gaussian measure gives one: an epsilon weight is no delta weight)."""
    missing = [r.name for r in gaussian if r.delta_weight is None]
    if missing:
        raise ValueError(f"Gaussian measures {missing} have no delta_weight while others do: "
                         "give every Gaussian measure one, or none")
    weights = {r.name: r.delta_weight for r in gaussian}
    total = math.fsum(weights.values())
    out = dict(shares)
    for name, w in weights.items():
        s = shares[name]
        out[name] = BudgetShare(name=s.name, fraction=s.fraction, epsilon=s.epsilon,
                                delta=delta * w / total)
    return out


def calibrate_to_target(requests: Sequence[MeasureRequest], *, epsilon: float, delta: float = 0.0,
                        accountant: str = "pld") -> JointCalibration:
    """Calibrate ``requests`` so that together they are (epsilon, delta)-DP under ``accountant``
    with the least noise at the weights' proportions (see the module docstring).

    Gaussian kinds share ``delta`` by weight, or by delta weight where given (``delta`` must
    then be > 0); pure kinds get none.
    With ``accountant="basic"`` (or pure kinds at delta 0) the result is the basic split.
    """
    requests = list(requests)
    if not requests:
        raise ValueError("requests must name at least one measure")
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError(f"request names must be distinct, got {names}")
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    guarantee.check_accountant(accountant)
    if accountant == "zcdp":
        raise ValueError("calibrate_to_target states (epsilon, delta): use 'pld' (tightest) or "
                         "'basic'; a zCDP budget splits its rho additively already")
    budget = PrivacyBudget(epsilon=epsilon, delta=delta)
    gaussian = [r.name for r in requests if r.kind.is_gaussian]
    shares = budget.split({r.name: r.weight for r in requests}, needs_delta=gaussian)
    if any(r.delta_weight is not None for r in requests if r.kind.is_gaussian):
        shares = _delta_by_delta_weight(shares, [r for r in requests if r.kind.is_gaussian], delta)
    reporting = delta if delta > 0 else 1e-9

    def attempt(multiplier: float):
        measures = _calibrated(requests, shares, multiplier, reporting)
        try:
            spent = guarantee.stated(measures, accountant, None if accountant == "basic" else delta)
        except ValueError:
            return None
        if not guarantee.within(spent.guarantee, epsilon, delta):
            return None
        return measures, spent

    best = attempt(1.0)
    if best is None:  # cannot happen: the basic split fits by construction
        raise AssertionError("the basic split does not fit its own budget")
    best_m = 1.0
    if accountant == "basic" or (delta == 0 and not gaussian):
        return JointCalibration(measures=best[0], stated=best[1], accountant=accountant,
                                multiplier=1.0, target=budget)
    lo, hi = 1.0, None
    m = 2.0
    while hi is None:  # bracket: double until a multiplier fails
        found = attempt(m)
        if found is None:
            hi = m
        else:
            lo, best, best_m = m, found, m
            m *= 2
            if m > MAX_MULTIPLIER:
                hi = m
    while hi / lo > 1 + PRECISION:
        mid = math.sqrt(lo * hi)
        found = attempt(mid)
        if found is None:
            hi = mid
        else:
            lo, best, best_m = mid, found, mid
    return JointCalibration(measures=best[0], stated=best[1], accountant=accountant,
                            multiplier=best_m, target=budget)
