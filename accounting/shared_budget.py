"""One privacy budget shared by several aggregations of one pipeline.

A job that releases several tables (counts per country, a quantile per project, ...) declares
its total guarantee once -- ``(epsilon, delta)`` or zCDP ``rho`` -- and splits it among named
*parts*, by weights or explicitly (PipelineDP's ``BudgetAccountant`` and Tumult's ``Session``
play this role). Each aggregation takes one part as its ``budget``; the part carries

* its :class:`~accounting.budget.PrivacyBudget` (the aggregation's own measures split it
  further, see :func:`transforms.metrics.plan_measures`), and
* its own release key, ``release_key.derive("part:<name>")``, so every aggregation draws from
  independent keyed streams (two transforms never share a stream: :meth:`ReleaseKey.claim`).

Once the aggregations are built, :meth:`SharedBudget.explain` and :meth:`SharedBudget.guarantee`
describe the whole job: all measures of all parts composed by :func:`accounting.guarantee.compose`
(the one place (epsilon, delta) is composed), plus private key selections (approximate DP,
added by basic composition). A part can be issued once; an aggregation registers with its part
once, so the budget cannot be spent twice unnoticed.

    shared = SharedBudget(PrivacyBudget(epsilon=1.0, delta=1e-6),
                          weights={"per_country": 1, "per_project": 3},
                          release_key=ReleaseKey.generate())
    a = rows | "A" >> DPAggregate(..., budget=shared.part("per_country"))
    b = rows | "B" >> DPAggregate(..., budget=shared.part("per_project"))
    print(shared.explain()); shared.guarantee()
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

from accounting import composition, guarantee
from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.keys import ReleaseKey

__all__ = ["SharedBudget", "BudgetPart"]


@dataclass(frozen=True, kw_only=True)
class BudgetPart:
    """One aggregation's part of a :class:`SharedBudget`: its budget and its own release key."""

    name: str
    budget: PrivacyBudget
    release_key: Optional[ReleaseKey] = None
    shared: "SharedBudget" = field(repr=False, compare=False)

    def register(self, release) -> None:
        """Record the aggregation spending this part (it must offer ``plan``, ``guarantee()``
        and ``explain()``; ``selector`` if it selects keys privately)."""
        self.shared._register(self.name, release)


class SharedBudget:
    """A job's total budget, split among named aggregations (see the module docstring).

    total: the declared budget. weights: name -> relative weight (each part gets that fraction
    of epsilon and delta, or of rho). budgets: name -> explicit PrivacyBudget (same kind as the
    total; their epsilons and deltas, or rhos, must add up to at most the total's). Give exactly
    one of weights and budgets. release_key: parts derive their keys from it (optional: an
    aggregation may be given its own key instead).
    """

    def __init__(self, total: PrivacyBudget, *, weights: Optional[Mapping[str, float]] = None,
                 budgets: Optional[Mapping[str, PrivacyBudget]] = None,
                 release_key: Optional[ReleaseKey] = None):
        if not isinstance(total, PrivacyBudget):
            raise TypeError(f"total must be a PrivacyBudget, got {type(total).__name__}")
        if (weights is None) == (budgets is None):
            raise ValueError("give exactly one of weights (a split) and budgets (explicit parts)")
        if release_key is not None and not isinstance(release_key, ReleaseKey):
            raise TypeError("release_key must be a ReleaseKey")
        self.total = total
        self.release_key = release_key
        if weights is not None:
            self._budgets = self._split(total, weights)
        else:
            self._budgets = self._explicit(total, budgets)
        self._issued: set[str] = set()
        self._releases: dict[str, object] = {}

    @staticmethod
    def _split(total: PrivacyBudget, weights: Mapping[str, float]) -> dict[str, PrivacyBudget]:
        for name in weights:
            _check_name(name)
        needs_delta = list(weights) if (not total.is_zcdp and total.delta > 0) else []
        shares = total.split(weights, needs_delta=needs_delta)
        if total.is_zcdp:
            return {n: PrivacyBudget(rho=s.rho, delta=total.delta * s.fraction)
                    for n, s in shares.items()}
        return {n: PrivacyBudget(epsilon=s.epsilon, delta=s.delta) for n, s in shares.items()}

    @staticmethod
    def _explicit(total: PrivacyBudget, budgets: Mapping[str, PrivacyBudget]) -> dict[str, PrivacyBudget]:
        if not budgets:
            raise ValueError("budgets must name at least one part")
        for name, b in budgets.items():
            _check_name(name)
            if not isinstance(b, PrivacyBudget):
                raise TypeError(f"budgets[{name!r}] must be a PrivacyBudget, got {type(b).__name__}")
            if b.is_zcdp != total.is_zcdp:
                raise ValueError(f"budgets[{name!r}] is {b.describe()}: parts must be of the same "
                                 f"kind as the total {total.describe()}")
        slack = 1 + guarantee.TOLERANCE
        delta = math.fsum(b.delta for b in budgets.values())
        if total.is_zcdp:
            rho = math.fsum(b.rho for b in budgets.values())
            if rho > total.rho * slack:
                raise ValueError(f"the parts spend rho={rho:g} > total rho={total.rho:g}")
        else:
            epsilon = math.fsum(b.epsilon for b in budgets.values())
            if epsilon > total.epsilon * slack:
                raise ValueError(f"the parts spend epsilon={epsilon:g} > total epsilon={total.epsilon:g}")
        if delta > total.delta * slack + 1e-18:
            raise ValueError(f"the parts spend delta={delta:g} > total delta={total.delta:g}")
        return dict(budgets)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._budgets)

    def budget(self, name: str) -> PrivacyBudget:
        """The budget of part ``name`` (without issuing it)."""
        self._check_known(name)
        return self._budgets[name]

    def part(self, name: str) -> BudgetPart:
        """Issue part ``name`` (once) for one aggregation: its budget and derived release key."""
        self._check_known(name)
        if name in self._issued:
            raise ValueError(f"budget part {name!r} was already issued: one aggregation per part")
        self._issued.add(name)
        key = None if self.release_key is None else self.release_key.derive(f"part:{name}")
        return BudgetPart(name=name, budget=self._budgets[name], release_key=key, shared=self)

    def _check_known(self, name: str) -> None:
        if name not in self._budgets:
            raise KeyError(f"no budget part {name!r}; parts: {sorted(self._budgets)}")

    def _register(self, name: str, release) -> None:
        if name in self._releases:
            raise ValueError(f"budget part {name!r} is already spent by another aggregation")
        self._releases[name] = release

    # ------------------------------------------------------------------ the whole job

    def measures(self) -> list:
        """Every noisy measure of every registered aggregation."""
        return [m for r in self._releases.values() for m in r.plan.measures]

    def _selections(self) -> list[tuple[float, float]]:
        out = []
        for r in self._releases.values():
            s = getattr(r, "selector", None)
            if s is not None:
                out.append((s.epsilon, s.delta))
        return out

    def default_accountant(self) -> str:
        return "zcdp" if self.total.is_zcdp else "basic"

    def guarantee(self, accountant: Optional[str] = None) -> EpsDelta:
        """The whole job's (epsilon, delta): all parts' measures composed by ``accountant``
        (default: ``zcdp`` for a rho budget, else ``basic``) at the total's delta, plus
        private key selections by basic composition."""
        accountant = guarantee.check_accountant(accountant or self.default_accountant())
        if not self._releases:
            raise ValueError("no aggregation uses this budget yet")
        measures = self.measures()
        selections = self._selections()
        delta = None
        if accountant != "basic" and self.total.delta > 0:
            delta = self.total.delta - math.fsum(d for _, d in selections)
        composed = guarantee.compose(measures, accountant, delta)
        return composition.sequential([composed, *selections]) if selections else composed

    def explain(self) -> str:
        """The split, each aggregation's own plan, and the whole job's guarantee."""
        lines = [f"Shared privacy budget: {self.total.describe()}", "parts:"]
        for name, b in self._budgets.items():
            state = "used" if name in self._releases else ("issued, not used" if name in self._issued
                                                            else "not issued")
            lines.append(f"  {name}: {b.describe()} ({state})")
        for name, release in self._releases.items():
            lines += ["", f"== {name} ==", release.explain()]
        lines += ["", "Whole job (all parts):"]
        for accountant in guarantee.ACCOUNTANTS:
            try:
                g = self.guarantee(accountant)
                text = f"epsilon={g.epsilon:.4g}, delta={g.delta:.3g}"
            except ValueError as err:
                text = f"n/a ({err})"
            lines.append(f"  {accountant:<6} {text}")
        return "\n".join(lines)


def _check_name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a budget part name must be a non-empty string, got {name!r}")
    return name
