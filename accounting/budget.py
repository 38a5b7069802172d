"""A pipeline's privacy budget and the plan of the measures that spend it.

A pipeline declares one :class:`PrivacyBudget` -- ``(epsilon, delta)`` or zCDP ``rho`` -- and
splits it into named :class:`~accounting.measures.BudgetShare` s by basic composition (zCDP
shares compose additively too). Each released measure becomes a
:class:`~accounting.measures.Measure` (the one measure type: mechanism, neighbouring relation,
sensitivities, noise, cost). A :class:`ReleasePlan` collects the measures, refuses any that would
overspend the budget, describes the release as ``dp_accounting`` DpEvents (what happened), counts
it with :mod:`accounting.guarantee` (how it is counted), and explains it in a readable table.

The neighbouring relation is folded into the sensitivities (a substitution doubles them, see
:mod:`accounting.sensitivity`), so every noise event is accounted as one shift by its sensitivity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping, Optional

from accounting import composition, guarantee
from accounting.composition import EpsDelta
from accounting.guarantee import ACCOUNTANTS
from accounting.measures import BudgetShare, Measure
from accounting.validation import check_delta, check_epsilon, check_rho

__all__ = ["PrivacyBudget", "BudgetShare", "Measure", "ReleasePlan", "ACCOUNTANTS",
           "check_spendable"]


@dataclass(frozen=True, kw_only=True)
class PrivacyBudget:
    """The total guarantee a pipeline declares once: ``(epsilon, delta)``-DP or ``rho``-zCDP.

    Give exactly one of ``epsilon`` and ``rho``. With ``rho``, ``delta`` is the delta at which
    the guarantee is also reported as (epsilon, delta) (0: not reported).

    ``part`` is set by a :class:`~accounting.shared_budget.SharedBudget` only, on the budget of
    one of its parts as ``BudgetPart.budget`` and ``SharedBudget.budget(name)`` show it: readable
    (it compares equal to the same numbers), never spendable on its own -- a
    :class:`ReleasePlan` (every aggregation's) and every other budget consumer refuse it
    (:func:`check_spendable`), so what a part spends goes through the part and the
    SharedBudget's guarantee composes it.
    """

    epsilon: Optional[float] = None
    delta: float = 0.0
    rho: Optional[float] = None
    part: Optional[str] = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if (self.epsilon is None) == (self.rho is None):
            raise ValueError("give exactly one of epsilon (approximate DP) and rho (zCDP)")
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        else:
            object.__setattr__(self, "rho", check_rho(self.rho))
        object.__setattr__(self, "delta", check_delta(self.delta))

    @classmethod
    def zcdp(cls, rho: float, delta: float = 0.0) -> "PrivacyBudget":
        return cls(rho=rho, delta=delta)

    @property
    def is_zcdp(self) -> bool:
        return self.rho is not None

    def as_epsilon_delta(self) -> EpsDelta:
        """The budget as (epsilon, delta); a zCDP budget by the tight conversion (CKS 2020)."""
        if not self.is_zcdp:
            return EpsDelta(self.epsilon, self.delta)
        if self.delta == 0:
            raise ValueError("delta must be > 0 to state a zCDP budget as (epsilon, delta)")
        return composition.zcdp_to_dp(self.rho, self.delta)

    def split(self, weights: Mapping[str, float], *,
              needs_delta: Collection[str] = ()) -> dict[str, BudgetShare]:
        """Split the budget among named measures in proportion to ``weights``.

        Basic composition: the shares' epsilons (or rhos) add up to the budget's. Under an
        (epsilon, delta) budget, delta goes only to the names in ``needs_delta`` (Gaussian
        measures), in proportion to their weights; pure-DP measures get delta 0.
        """
        if not weights:
            raise ValueError("weights must name at least one measure")
        checked = {name: check_epsilon(w, f"weights[{name!r}]") for name, w in weights.items()}
        unknown = set(needs_delta) - set(checked)
        if unknown:
            raise ValueError(f"needs_delta names measures without a weight: {sorted(unknown)}")
        if needs_delta and not self.is_zcdp and self.delta == 0:
            raise ValueError(f"delta is 0 but measures {sorted(needs_delta)} need delta > 0")
        total = math.fsum(checked.values())
        delta_total = math.fsum(checked[name] for name in needs_delta)
        shares = {}
        for name, weight in checked.items():
            fraction = weight / total
            if self.is_zcdp:
                rho = self.rho * fraction
                shares[name] = BudgetShare(name=name, fraction=fraction, epsilon=math.sqrt(2 * rho),
                                           delta=0.0, rho=rho)
            else:
                delta = self.delta * weight / delta_total if name in needs_delta else 0.0
                shares[name] = BudgetShare(name=name, fraction=fraction,
                                           epsilon=self.epsilon * fraction, delta=delta)
        return shares

    def describe(self) -> str:
        if self.is_zcdp:
            text = f"rho={self.rho:g}-zCDP"
            if self.delta > 0:
                text += f" (= epsilon {self.as_epsilon_delta().epsilon:.4g}, delta {self.delta:g})"
            return text
        return f"(epsilon={self.epsilon:g}, delta={self.delta:g})-DP"

    def to_dict(self) -> dict:
        out = {"epsilon": self.epsilon, "delta": self.delta, "rho": self.rho}
        if self.is_zcdp and self.delta > 0:
            out["epsilon_equivalent"] = self.as_epsilon_delta().epsilon
        return out


def check_spendable(budget, where: str = "a release plan") -> None:
    """Refuse a SharedBudget part's budget (``budget.part`` set) spent outside its part."""
    if isinstance(budget, PrivacyBudget) and budget.part is not None:
        raise ValueError(
            f"{where}: this budget is part {budget.part!r} of a SharedBudget and is spendable only "
            f"through it: pass the part itself (shared.part({budget.part!r})) to the aggregation, "
            "or spend it with part.spend(measures), so the job's guarantee composes it")


@dataclass(frozen=True, kw_only=True)
class ReleasePlan:
    """The measures of one release, checked against the budget they share.

    A value: :meth:`with_measures` returns a new plan, so a plan handed to a transform or kept
    in a report cannot change afterwards.
    """

    budget: PrivacyBudget
    measures: tuple[Measure, ...] = ()
    #: how the measures are checked against an (epsilon, delta) budget: ``basic`` (they split
    #: it) or, for measures calibrated jointly to the budget
    #: (:func:`accounting.target.calibrate_to_target`), the accountant they were calibrated by.
    accountant: str = "basic"

    def __post_init__(self):
        check_spendable(self.budget)
        guarantee.check_accountant(self.accountant)
        measures = tuple(self.measures)
        names = set()
        for measure in measures:
            if measure.name in names:
                raise ValueError(f"measure {measure.name!r} is already in the plan")
            names.add(measure.name)
        self._check_within_budget(measures)
        object.__setattr__(self, "measures", measures)

    def with_measures(self, *measures: Measure) -> "ReleasePlan":
        """This plan plus ``measures``; refuses a duplicate name or a measure that would
        overspend the budget."""
        return ReleasePlan(budget=self.budget, measures=self.measures + measures,
                           accountant=self.accountant)

    def calibrated(self, name: str, kind, share: BudgetShare, sensitivities, **kwargs) -> Measure:
        """``Measure.calibrated(...)`` for this plan; zCDP Gaussian measures report at the
        budget's delta. (The measure is not added: pass it to :meth:`with_measures`.)"""
        if self.budget.delta > 0:
            kwargs.setdefault("delta_for_reporting", self.budget.delta)
        return Measure.calibrated(name, kind, share, sensitivities, **kwargs)

    def _check_within_budget(self, measures: tuple[Measure, ...]) -> None:
        if self.budget.is_zcdp:
            spent = math.fsum(m.zcdp_rho for m in measures)
            if spent > self.budget.rho * (1 + guarantee.TOLERANCE):
                raise ValueError(f"measures spend rho={spent:.6g} > budget rho={self.budget.rho:g}")
            return
        if not measures:
            return
        spent = guarantee.compose(measures, self.accountant,
                                  None if self.accountant == "basic" else self.budget.delta)
        if spent.epsilon > self.budget.epsilon * (1 + guarantee.TOLERANCE):
            raise ValueError(f"measures spend epsilon={spent.epsilon:.6g} > budget "
                             f"epsilon={self.budget.epsilon:g}")
        if spent.delta > self.budget.delta * (1 + guarantee.TOLERANCE):
            raise ValueError(f"measures spend delta={spent.delta:.6g} > budget "
                             f"delta={self.budget.delta:g}")

    def _require_measures(self) -> None:
        if not self.measures:
            raise ValueError("the release plan has no measures")

    def dp_event(self):
        """What the release does, as a ``dp_accounting`` event (one per measure)."""
        import dp_accounting

        self._require_measures()
        return dp_accounting.ComposedDpEvent([m.dp_event() for m in self.measures])

    def guarantee(self, accountant: str = "basic", delta: Optional[float] = None) -> EpsDelta:
        """The whole release's (epsilon, delta) counted by ``accountant`` (see
        :func:`accounting.guarantee.compose`), at ``delta`` (default: the budget's delta).
        """
        return self.stated(accountant, delta).guarantee

    def stated(self, accountant: str = "basic", delta: Optional[float] = None) -> guarantee.Stated:
        """:meth:`guarantee` with the accountant its figure comes from (accounting.guarantee.stated)."""
        self._require_measures()
        guarantee.check_accountant(accountant)
        if accountant == "zcdp" and all(m.is_pure for m in self.measures):
            return guarantee.stated(self.measures, "basic")
        target = self.budget.delta if delta is None else check_delta(delta)
        if accountant == "zcdp" and target == 0:
            raise ValueError("delta must be > 0 to convert zCDP to (epsilon, delta); "
                             "pass delta= or declare it in the budget")
        return guarantee.stated(self.measures, accountant, target)

    def guarantees(self) -> dict[str, Optional[EpsDelta]]:
        """Every accountant's guarantee; None where it does not apply (e.g. zCDP without delta)."""
        out = {}
        for name in ACCOUNTANTS:
            try:
                out[name] = self.guarantee(name)
            except ValueError:
                out[name] = None
        return out

    def explain(self) -> str:
        """A readable table: per measure its mechanism, sensitivity, noise, budget and error."""
        self._require_measures()
        header = ("measure", "mechanism", "sensitivity", "noise scale", "share", "epsilon",
                  "delta", "rho", "epsilon by", "std", "95% interval")
        rows = []
        for m in self.measures:
            norm, value = m.sensitivity_used
            share = "-" if m.share is None else f"{100 * m.share.fraction:.1f}%"
            noise = m.noise
            rows.append((m.name, m.mechanism, f"{norm}={value:.4g}",
                         "-" if noise is None else f"{noise.scale:.4g}", share,
                         f"{m.epsilon:.4g}", f"{m.delta:.3g}", _rho_text(m), m.accountant,
                         "-" if noise is None else f"{noise.std:.4g}",
                         "-" if noise is None else f"±{noise.ci_halfwidth(0.95):.4g}"))
        widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

        def line(cells):
            return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

        out = [f"Privacy budget: {self.budget.describe()}",
               line(header), line("-" * w for w in widths)]
        out += [line(r) for r in rows]
        out.append("")
        for m in self.measures:
            s = m.sensitivities
            extra = f" -- {m.description}" if m.description else ""
            sens = "" if s is None else f"; L0={s.l0}, Linf={s.linf:g}, L1={s.l1:g}, L2={s.l2:.4g}"
            out.append(f"{m.name}: neighbouring = {m.neighbouring}{sens}{extra}")
        out.append("")
        out.append("Whole release (the figure's accountant in brackets):")
        for name in ACCOUNTANTS:
            try:
                g = self.stated(name)
                text = f"epsilon={g.epsilon:.4g}, delta={g.delta:.3g} [{g.accountant}]"
            except ValueError as err:
                text = f"n/a ({err})"
            out.append(f"  {name:<6} {text}")
        return "\n".join(out)

    def to_dict(self) -> dict:
        """JSON-ready description of the plan, for release reports."""
        return {
            "budget": self.budget.to_dict(),
            "measures": [m.to_dict() for m in self.measures],
            # A non-finite epsilon (e.g. PLD at a delta below the measures' own) becomes None.
            "guarantees": {name: (None if g is None or not math.isfinite(g.epsilon)
                                  else {"epsilon": g.epsilon, "delta": g.delta})
                           for name, g in self.guarantees().items()},
        }


def _rho_text(measure: Measure) -> str:
    """A measure's zCDP cost for the explain table; "-" when it has none (approximate DP without
    a zCDP form, e.g. Laplace noise whose distributed sampling adds a delta)."""
    try:
        return f"{measure.zcdp_rho:.4g}"
    except ValueError:
        return "-"
