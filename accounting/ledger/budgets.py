"""Budgets per scope: what a scope has spent, and whether a release still fits.

A scope's budget is recorded on first use; a lower budget later is accepted (more
conservative), a higher one refused unless raised deliberately
(:meth:`~accounting.ledger.machine.BudgetLedger.set_budget` with ``allow_increase``). A reserved
record counts against its scopes like a published one (it may publish any time). Composition of
a scope's measures is :func:`accounting.guarantee.compose` with the ledger's accountant (fixed
when the ledger is created), at the scope budget's delta.
"""
from __future__ import annotations

from typing import Optional

from accounting import guarantee
from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.ledger.records import BudgetExceededError, LedgerError, ReleaseRequest, Scope
from accounting.measures import Measure


def scope_names(record: dict) -> list:
    return list(record.get("scopes", []))


def measures_of(state: dict, scope: str, exclude: Optional[str] = None) -> list[Measure]:
    """Every measure charged to ``scope`` (records of every state), ``exclude`` left out."""
    out = []
    for vid, record in state["releases"].items():
        if vid != exclude and scope in scope_names(record):
            out.extend(Measure.from_json(m) for m in record["measures"])
    return out


def spent(state: dict, scope: str, accountant: str) -> EpsDelta:
    """Composed spend of ``scope`` (reserved, publishing and committed records alike)."""
    measures = measures_of(state, scope)
    budget = state["scopes"].get(scope)
    delta = budget["delta"] if budget else None
    if not measures:
        return EpsDelta(0.0, 0.0)
    return guarantee.fits(measures, budget["epsilon"] if budget else float("inf"),
                          delta if delta is not None else guarantee.default_delta(measures),
                          accountant)[1]


def apply_budget(state: dict, scope: Scope, allow_increase: bool) -> None:
    """Record ``scope``'s budget in ``state``; raising a recorded one needs ``allow_increase``."""
    old = state["scopes"].get(scope.name)
    new = {"epsilon": scope.budget.epsilon, "delta": scope.budget.delta}
    if old is not None and not allow_increase and \
            (new["epsilon"] > old["epsilon"] or new["delta"] > old["delta"]):
        raise LedgerError(
            f"scope {scope.name!r} has a recorded budget (epsilon={old['epsilon']:g}, "
            f"delta={old['delta']:g}); the requested (epsilon={new['epsilon']:g}, "
            f"delta={new['delta']:g}) is larger. Raise it deliberately with "
            "BudgetLedger.set_budget(scope, allow_increase=True)")
    state["scopes"][scope.name] = new


def check_budgets(state: dict, request: ReleaseRequest, exclude: Optional[str],
                  accountant: str) -> None:
    """Refuse ``request`` if a scope would exceed its budget. ``state`` already holds the
    records accepted earlier in the same transaction (all-or-nothing reservations)."""
    for scope in request.scopes:
        apply_budget(state, scope, allow_increase=False)
        limit = state["scopes"][scope.name]
        before = measures_of(state, scope.name, exclude)
        ok, total = guarantee.fits(before + list(request.measures), limit["epsilon"],
                                   limit["delta"], accountant)
        if ok:
            continue
        used = guarantee.fits(before, limit["epsilon"], limit["delta"], accountant)[1]
        raise BudgetExceededError(
            f"scope {scope.name!r}: spent (epsilon={used.epsilon:g}, delta={used.delta:g}); "
            f"release {request.release_id!r} would bring it to (epsilon={total.epsilon:g}, "
            f"delta={total.delta:g}), over its budget (epsilon={limit['epsilon']:g}, "
            f"delta={limit['delta']:g}). Nothing was charged.",
            scope=scope.name, spent=used, requested=total,
            budget=PrivacyBudget(epsilon=limit["epsilon"], delta=limit["delta"]))
