"""Budget scopes as the published releases show them: spent, remaining, and spend over time.

The public figure of a scope counts the **published** releases charged to it (their markers
list the scope and its budget), composed exactly as the ledger composes a scope
(:func:`accounting.guarantee.fits` with the releases' accountant, at the scope budget's delta).
It is therefore a function of public facts only. The ledger's own figure also counts
reservations that were never published -- an operator-only fact -- and is shown in the operator
view (:func:`ledger_spent`). For the ``basic`` and ``zcdp`` accountants the public figure equals
the ledger's when every charge was published; for ``pld`` the markers carry each measure's
(epsilon, delta) but not its noise curve, so the public figure composes those pairs, a valid
and possibly looser bound.

Charts plot the cumulative spend after each release in public order; long series are sampled
(at most :data:`MAX_POINTS` points, the last one exact) so pages stay small and a PLD scope is
composed a bounded number of times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Mapping, Optional, Sequence

from accounting import guarantee
from accounting.composition import EpsDelta
from accounting.ledger.records import Scope

#: Points of a budget-over-time chart (sampled evenly over the releases, the last one exact).
MAX_POINTS = 120
#: Compositions per chart for accountants that cannot add up incrementally (zcdp, pld).
MAX_COMPOSITIONS = 40


@dataclass(frozen=True, kw_only=True)
class ScopeUse:
    """One budget scope: its budget as the latest published release states it, the spend of the
    published releases, and the cumulative spend after each release (``series``: ((label,
    epsilon spent), ...), sampled)."""

    scope: Scope
    accountant: str
    spent: EpsDelta
    releases: tuple          # versioned ids charged, in public order
    series: tuple

    @property
    def remaining(self) -> EpsDelta:
        eps = self.scope.budget.epsilon - self.spent.epsilon
        delta = self.scope.budget.delta - self.spent.delta
        return EpsDelta(max(eps, 0.0) if math.isfinite(eps) else 0.0, max(delta, 0.0))

    @property
    def share_spent(self) -> float:
        """Spent epsilon over the budget's (1.0 = exhausted; inf if it cannot be stated)."""
        budget = self.scope.budget.epsilon
        return self.spent.epsilon / budget if budget > 0 else math.inf


@lru_cache(maxsize=4096)
def _spent(measures: tuple, accountant: str, epsilon: float, delta: float) -> EpsDelta:
    return guarantee.fits(list(measures), epsilon, delta, accountant)[1]


def spend(measures: Sequence, accountant: str, budget) -> EpsDelta:
    """What ``measures`` spend of ``budget`` (a PrivacyBudget), as the ledger counts a scope."""
    if not measures:
        return EpsDelta(0.0, 0.0)
    return _spent(tuple(measures), accountant, budget.epsilon, budget.delta)


def sample_indices(n: int, limit: int) -> list[int]:
    """At most ``limit`` indices of ``range(n)``, evenly spread, always including the last."""
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)} | {n - 1})


def scope_uses(releases: Iterable) -> dict[str, ScopeUse]:
    """{scope name: ScopeUse} over published releases (``PublishedRelease``; any order)."""
    charged: dict = {}
    for release in sorted(releases, key=lambda r: r.order_key):
        for scope in release.scopes:
            charged.setdefault(scope.name, []).append((release, scope))
    return {name: _use(pairs) for name, pairs in charged.items()}


def _label(release) -> str:
    if release.period:
        first, last = release.period
        return first if first == last else f"{first}..{last}"
    return release.versioned_id


def _use(pairs: list) -> ScopeUse:
    latest_release, scope = pairs[-1]
    accountant = latest_release.guarantee.accountant
    budget = scope.budget
    per_release = [tuple(m.measure for m in release.measures) for release, _ in pairs]
    flat = tuple(m for ms in per_release for m in ms)
    total = spend(flat, accountant, budget)
    n = len(pairs)
    series = []
    if accountant == "basic":
        running = 0.0
        cumulative = []
        for ms in per_release:
            running += math.fsum(m.epsilon for m in ms)
            cumulative.append(running)
        for i in sample_indices(n, MAX_POINTS):
            value = total.epsilon if i == n - 1 else cumulative[i]
            series.append((_label(pairs[i][0]), value))
    else:
        ends = []
        count = 0
        for ms in per_release:
            count += len(ms)
            ends.append(count)
        for i in sample_indices(n, MAX_COMPOSITIONS):
            value = total if i == n - 1 else spend(flat[:ends[i]], accountant, budget)
            series.append((_label(pairs[i][0]), value.epsilon))
    return ScopeUse(scope=scope, accountant=accountant, spent=total,
                    releases=tuple(r.versioned_id for r, _ in pairs), series=tuple(series))


def ledger_spent(ledger, scope: str, budget=None) -> Optional[EpsDelta]:
    """The ledger's own spend of ``scope`` (reserved records included): operator-only."""
    budget = budget or ledger.budgets.get(scope)
    if budget is None:
        return None
    return spend(ledger.measures_of_scope(scope), ledger.accountant, budget)


def family_summary(uses: Mapping[str, ScopeUse], names: Sequence[str]) -> dict:
    """A family of per-period scopes summarised: how many, budgets, the largest spend and the
    smallest remainder (the figures a reader checks: no period over its budget)."""
    members = [uses[n] for n in names]
    budgets = sorted({(u.scope.budget.epsilon, u.scope.budget.delta) for u in members})
    worst = max(members, key=lambda u: (u.share_spent, u.scope.name))
    return {"count": len(members), "budgets": budgets,
            "max_spent": max(u.spent.epsilon for u in members),
            "min_remaining": min(u.remaining.epsilon for u in members),
            "worst": worst.scope.name, "description": members[0].scope.description}
