"""One privacy budget shared by several aggregations of one pipeline.

A job that releases several tables (counts per country, a quantile per project, ...) declares
its total guarantee once -- ``(epsilon, delta)`` or zCDP ``rho`` -- and splits it among named
*parts*, by weights or explicitly (PipelineDP's ``BudgetAccountant`` and Tumult's ``Session``
play this role). Each aggregation takes one part as its ``budget``; the part carries

* its :class:`~accounting.budget.PrivacyBudget` (the aggregation's own measures split it
  further, see :func:`transforms.metrics.plan_measures`), and
* its own release key, ``release_key.derive("part:<name>")``, so every aggregation draws from
  independent keyed streams (two transforms never share a stream: :meth:`ReleaseKey.claim`).
  One key drives one SharedBudget: a second SharedBudget over the same key (another day's
  release built with the same key, in any key object) is refused, and each part's key is
  derived once (:mod:`accounting.keys`, "One secret, one use"). A daily release takes a fresh
  key per day from the key store or the ledger.
  A SharedBudget without a release key (a job whose release layer holds the keys) issues
  parts without keys: the job's measures then draw from streams of the release key labelled by
  their own names (e.g. ``centralnotice/<campaign>/clicks``), claimed once each.

A part is spent once, and only through its SharedBudget: either by an aggregation that
registers with it (``DPAggregate``, ``choose_bounds``: pass them the part) or directly by a job's
own measures (:meth:`BudgetPart.spend`). ``part.budget`` is a
budget marked as the part's (``budget.part``): readable, refused by every aggregation given it
directly (it would spend the part outside the job's guarantee). Measures spent directly (e.g. the
CentralNotice impressions and clicks, each calibrated by the job's configuration and drawn from
its own named noise stream). Once the parts are spent, :meth:`SharedBudget.explain` and
:meth:`SharedBudget.guarantee` describe the whole job: every measure of every part -- private
key selections included, as measures of their own (approximate DP, no additive noise) --
composed by :func:`accounting.guarantee.compose`, the one place (epsilon, delta) is composed.
A job's :class:`~pipelines.release.job.PlannedRelease` built from a SharedBudget states exactly
this guarantee (one explain/guarantee path for library users and jobs alike).

Explicit parts may mix kinds under an (epsilon, delta) total -- a zCDP part (rho, delta > 0)
beside pure or approximate ones -- and must fit the total as the job's ``accountant`` composes
them (basic, zcdp or pld), by :func:`accounting.guarantee.fits` as the ledger checks a scope
(each part counted as a measure spending all of it).

    shared = SharedBudget(PrivacyBudget(epsilon=1.0, delta=1e-6),
                          weights={"per_country": 1, "per_project": 3},
                          needs_delta=["per_project"],   # Gaussian noise; per_country is pure
                          release_key=ReleaseKey.generate())
    a = rows | "A" >> DPAggregate(..., budget=shared.part("per_country"))
    b = rows | "B" >> DPAggregate(..., budget=shared.part("per_project"))
    print(shared.explain()); shared.guarantee()
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping, Optional, Sequence

from accounting import guarantee
from accounting.budget import PrivacyBudget, ReleasePlan
from accounting.composition import EpsDelta
from accounting.keys import ReleaseKey
from accounting.measures import Measure

__all__ = ["SharedBudget", "BudgetPart"]


@dataclass(frozen=True, kw_only=True)
class BudgetPart:
    """One aggregation's part of a :class:`SharedBudget`: its budget (marked ``budget.part``:
    spendable only through this part) and its own release key."""

    name: str
    release_key: Optional[ReleaseKey] = None
    shared: "SharedBudget" = field(repr=False, compare=False)

    @property
    def budget(self) -> PrivacyBudget:
        """The part's budget (marked ``budget.part``). Before the part is drawn under a split
        that allocates delta at draw time, its delta is what it would get if it used delta."""
        return self.shared.budget(self.name)

    def spendable_budget(self, uses_delta: Optional[bool] = None) -> PrivacyBudget:
        """The part's budget as a plain PrivacyBudget, for the aggregation that registers with
        this part (:meth:`register`: DPAggregate, choose_bounds). Spent by anything that does
        not register, it would escape the job's guarantee.

        ``uses_delta``: whether the aggregation's mechanisms use delta (Gaussian noise, private
        key selection). Under a weighted split without ``needs_delta`` the part's delta is
        allocated now: none if False (pure mechanisms), else its weight's share of what is
        left (see :class:`SharedBudget`). None counts as True (an aggregation that does not
        say is given delta, and explain() flags it if its measures turn out pure)."""
        b = self.shared._draw(self.name, True if uses_delta is None else bool(uses_delta))
        return PrivacyBudget(epsilon=b.epsilon, delta=b.delta, rho=b.rho)

    def register(self, release) -> None:
        """Record the aggregation spending this part (it must offer ``plan`` and ``explain()``;
        ``selector`` if it selects keys privately)."""
        self.shared._register(self.name, release)

    def spend(self, measures: Sequence[Measure], *, accountant: str = "basic",
              header: str = "") -> ReleasePlan:
        """Spend this part on ``measures`` directly (a job's own calibrated measures): they
        must fit the part's budget by ``accountant`` (:class:`~accounting.budget.ReleasePlan`
        refuses otherwise; jointly calibrated measures by the accountant that calibrated them,
        :meth:`accounting.target.JointCalibration.spend`). Returns their plan (``header``, then
        its ``explain()``, is the part's entry in the job's explain)."""
        measures = list(measures)
        if not measures or not all(isinstance(m, Measure) for m in measures):
            raise TypeError("spend() takes one or more accounting.measures.Measure")
        uses_delta = any(not m.is_pure for m in measures)
        plan = ReleasePlan(budget=self.spendable_budget(uses_delta=uses_delta), measures=measures,
                           accountant=accountant)
        self.shared._register(self.name, _SpentMeasures(plan, header))
        return plan


class _SpentMeasures:
    """A part spent directly by measures: what the SharedBudget reads of an aggregation."""

    selector = None

    def __init__(self, plan: ReleasePlan, header: str = ""):
        self.plan, self.header = plan, header

    def explain(self) -> str:
        return self.header + self.plan.explain()


def selection_measure(name: str, selector) -> Measure:
    """Private key selection as a measure of its own: (epsilon, delta)-DP, no additive noise
    (:mod:`transforms.selection`); composed with the noisy measures by accounting.guarantee."""
    per_key = getattr(selector, "per_key", None)
    each = "" if per_key is None else \
        f"; each key's decision (epsilon={per_key[0]:.4g}, delta={per_key[1]:.3g})"
    return Measure(name=name, mechanism=f"private key selection ({selector.selection.strategy.value})",
                   epsilon=selector.epsilon, delta=selector.delta,
                   description=f"keys moved by one neighbouring change: {selector.max_partitions}{each}")


class SharedBudget:
    """A job's total budget, split among named aggregations (see the module docstring).

    total: the declared budget. weights: name -> relative weight (each part gets that fraction
    of epsilon, or of rho). budgets: name -> explicit PrivacyBudget (under a zCDP
    total: zCDP parts whose rhos add up to at most the total's; under an (epsilon, delta)
    total: parts of either kind that fit it as ``accountant`` composes them). Give exactly one
    of weights and budgets. needs_delta (with weights): the parts whose mechanisms use delta
    (Gaussian noise, private key selection); the total's delta is split by weight among them
    only, and the others get none.

    Without needs_delta, an (epsilon, delta) total's delta goes only to the parts whose
    mechanisms use it, as the aggregations declare when they draw their part (DPAggregate:
    Gaussian noise or private key selection; choose_bounds: never; :meth:`BudgetPart.spend`:
    measures that are not pure). A pure part gets none. A part that uses delta gets its
    weight's share of the delta not yet drawn among itself and the parts not drawn yet
    (``left * w / (w + undrawn weights)``): the parts still to come keep their weight's share,
    since they may use delta too, and a share kept for a part that then turns out pure goes
    to the parts drawn after it. So the last part to use delta takes all that is left, and
    delta stays unused only when a pure part is drawn after every part that uses delta (then
    explain() says how much and for whom; pass needs_delta, or draw the pure parts first, to
    avoid it). Under a zCDP total each part's delta is the one its rho is *reported* at, split
    by weight among the needs_delta parts (default: all). release_key: parts derive their keys
    from it (optional: an aggregation may be given its own key instead). accountant: how the
    job's guarantee is composed (default ``zcdp`` for a rho total, else ``basic``; see
    accounting.guarantee).
    """

    def __init__(self, total: PrivacyBudget, *, weights: Optional[Mapping[str, float]] = None,
                 budgets: Optional[Mapping[str, PrivacyBudget]] = None,
                 needs_delta: Optional[Collection[str]] = None,
                 release_key: Optional[ReleaseKey] = None, accountant: Optional[str] = None):
        if not isinstance(total, PrivacyBudget):
            raise TypeError(f"total must be a PrivacyBudget, got {type(total).__name__}")
        if (weights is None) == (budgets is None):
            raise ValueError("give exactly one of weights (a split) and budgets (explicit parts)")
        if release_key is not None and not isinstance(release_key, ReleaseKey):
            raise TypeError("release_key must be a ReleaseKey")
        self.total = total
        self.release_key = release_key
        self.accountant = guarantee.check_accountant(
            accountant or ("zcdp" if total.is_zcdp else "basic"))
        if needs_delta is not None and weights is None:
            raise ValueError("needs_delta goes with weights (explicit budgets state their deltas)")
        #: Delta allocated when parts are drawn (a weighted (epsilon, delta) split without
        #: needs_delta): part -> weight, and part -> whether its mechanisms use delta, once drawn.
        self._deferred = (weights is not None and needs_delta is None and not total.is_zcdp
                          and total.delta > 0)
        self._weights = dict(weights) if weights is not None else {}
        self._needs_delta = None if needs_delta is None else list(needs_delta)
        self._drawn: dict[str, bool] = {}
        if weights is not None:
            self._budgets = self._split(total, weights, [] if self._deferred else needs_delta)
        else:
            self._budgets = self._explicit(total, budgets, self.accountant)
        self._issued: set[str] = set()
        self._releases: dict[str, object] = {}
        if release_key is not None:  # last: a refused SharedBudget claims nothing
            release_key.claim("shared-budget", owner="SharedBudget")

    @staticmethod
    def _split(total: PrivacyBudget, weights: Mapping[str, float],
               needs_delta: Optional[Collection[str]]) -> dict[str, PrivacyBudget]:
        """Epsilon (or rho) by weight; delta by weight among the parts in ``needs_delta`` only
        (every part when it is None: a zCDP total's reporting delta), so a part whose mechanisms
        are pure gets none it cannot use. (Under a zCDP total the delta is the one each part's
        rho is *reported* at.) A split whose delta is allocated at draw time passes []."""
        for name in weights:
            _check_name(name)
        if needs_delta is not None:
            needs_delta = list(needs_delta)
            unknown = sorted(set(needs_delta) - set(weights))
            if unknown:
                raise ValueError(f"needs_delta names parts without a weight: {unknown}")
            if needs_delta and total.delta == 0:
                raise ValueError(f"the total's delta is 0 but parts {sorted(needs_delta)} need delta > 0")
        delta_parts = list(weights) if needs_delta is None else needs_delta
        if total.is_zcdp:
            shares = total.split(weights)
            delta_weight = math.fsum(weights[n] for n in delta_parts)
            return {n: PrivacyBudget(rho=s.rho, delta=total.delta * weights[n] / delta_weight
                                     if n in delta_parts else 0.0)
                    for n, s in shares.items()}
        shares = total.split(weights, needs_delta=delta_parts if total.delta > 0 else [])
        return {n: PrivacyBudget(epsilon=s.epsilon, delta=s.delta) for n, s in shares.items()}

    @staticmethod
    def _explicit(total: PrivacyBudget, budgets: Mapping[str, PrivacyBudget],
                  accountant: str) -> dict[str, PrivacyBudget]:
        if not budgets:
            raise ValueError("budgets must name at least one part")
        for name, b in budgets.items():
            _check_name(name)
            if not isinstance(b, PrivacyBudget):
                raise TypeError(f"budgets[{name!r}] must be a PrivacyBudget, got {type(b).__name__}")
            if total.is_zcdp and not b.is_zcdp:
                raise ValueError(f"budgets[{name!r}] is {b.describe()}: parts of a zCDP total must "
                                 f"be zCDP (same kind as the total {total.describe()})")
            if b.is_zcdp and not total.is_zcdp and b.delta == 0:
                raise ValueError(f"budgets[{name!r}] is {b.describe()} without a delta: a zCDP part "
                                 f"of the (epsilon, delta) total {total.describe()} needs delta > 0 "
                                 "(not the same kind otherwise)")
        slack = 1 + guarantee.TOLERANCE
        delta = math.fsum(b.delta for b in budgets.values())
        if total.is_zcdp:
            rho = math.fsum(b.rho for b in budgets.values())
            if rho > total.rho * slack:
                raise ValueError(f"the parts spend rho={rho:g} > total rho={total.rho:g}")
            if delta > total.delta * slack + 1e-18:
                raise ValueError(f"the parts spend delta={delta:g} > total delta={total.delta:g}")
            return dict(budgets)
        ok, spent = guarantee.fits([_budget_measure(n, b) for n, b in budgets.items()],
                                   total.epsilon, total.delta, accountant)
        if not ok:
            raise ValueError(f"the parts spend epsilon={spent.epsilon:.6g}, delta={spent.delta:.3g} "
                             f"({accountant}) > total epsilon={total.epsilon:g}, delta={total.delta:g}")
        return dict(budgets)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._budgets)

    def budget(self, name: str) -> PrivacyBudget:
        """The budget of part ``name`` (without issuing it; readable, spendable only through
        the part). A part whose delta is allocated at draw time and that is not drawn yet shows
        the delta it would get if it used delta (:meth:`_delta_if_drawn`)."""
        self._check_known(name)
        b = self._budgets[name]
        delta = b.delta
        if self._deferred and name not in self._drawn:
            delta = self._delta_if_drawn(name)
        return PrivacyBudget(epsilon=b.epsilon, delta=delta, rho=b.rho, part=name)

    def _undrawn_weight(self, besides: str) -> float:
        return math.fsum(w for n, w in self._weights.items() if n != besides and n not in self._drawn)

    def _delta_left(self) -> float:
        return max(0.0, self.total.delta - math.fsum(self._budgets[n].delta for n in self._drawn))

    def _delta_if_drawn(self, name: str) -> float:
        """Delta part ``name`` gets if drawn now using delta: its weight's share of the delta
        left among itself and the parts not drawn yet (class docstring)."""
        w = self._weights[name]
        return self._delta_left() * w / (w + self._undrawn_weight(name))

    def _draw(self, name: str, uses_delta: bool) -> PrivacyBudget:
        """Part ``name``'s budget for the aggregation spending it, its delta allocated now when
        the split defers it (once: a second draw must declare the same)."""
        self._check_known(name)
        if name in self._drawn:
            if self._drawn[name] != uses_delta:
                raise ValueError(f"budget part {name!r} was drawn as "
                                 f"{'using' if self._drawn[name] else 'not using'} delta")
            return self._budgets[name]
        if self._deferred:
            b = self._budgets[name]
            delta = self._delta_if_drawn(name) if uses_delta else 0.0
            self._budgets[name] = PrivacyBudget(epsilon=b.epsilon, delta=delta)
        self._drawn[name] = uses_delta
        return self._budgets[name]

    def part(self, name: str) -> BudgetPart:
        """Issue part ``name`` (once) for one aggregation: its budget and derived release key."""
        self._check_known(name)
        if name in self._issued:
            raise ValueError(f"budget part {name!r} was already issued: one aggregation per part")
        self._issued.add(name)
        key = None if self.release_key is None else \
            self.release_key.derive(f"part:{name}", owner=f"SharedBudget part {name!r}")
        return BudgetPart(name=name, release_key=key, shared=self)

    def _check_known(self, name: str) -> None:
        if name not in self._budgets:
            raise KeyError(f"no budget part {name!r}; parts: {sorted(self._budgets)}")

    def _register(self, name: str, release) -> None:
        if name in self._releases:
            raise ValueError(f"budget part {name!r} is already spent by another aggregation")
        self._releases[name] = release

    # ------------------------------------------------------------------ the whole job

    def measures(self) -> list[Measure]:
        """Every measure of every spent part, in part order: noisy measures and private key
        selections (one measure each, named ``<part>/key_selection``)."""
        out = []
        for name, release in self._releases.items():
            out += _part_measures(name, release)
        return out

    def default_accountant(self) -> str:
        return self.accountant

    def guarantee(self, accountant: Optional[str] = None, delta: Optional[float] = None) -> EpsDelta:
        """The whole job's (epsilon, delta): all parts' measures composed by
        :func:`accounting.guarantee.compose` with ``accountant`` (default: this budget's) at
        ``delta`` (default: the total's delta when it has one, else the measures' own)."""
        return self.stated(accountant, delta).guarantee

    def stated(self, accountant: Optional[str] = None,
               delta: Optional[float] = None) -> guarantee.Stated:
        """:meth:`guarantee` with the accountant its figure comes from."""
        accountant = guarantee.check_accountant(accountant or self.accountant)
        if not self._releases:
            raise ValueError("no aggregation uses this budget yet")
        if delta is None and accountant != "basic" and self.total.delta > 0:
            delta = self.total.delta
        return guarantee.stated(self.measures(), accountant, delta)

    def delta_allocation(self) -> dict[str, dict]:
        """Where the total's delta went: per part the delta it was given (``None`` while a
        draw-time allocation is pending) and, once spent, the delta its measures use (``None``
        before) -- for explain() and release records. Under a draw-time split, also
        ``"(unallocated)"``: the delta no part was given (``delta``) and whether any part not
        drawn yet could still take it (``pending``)."""
        out = {}
        for name, b in self._budgets.items():
            release = self._releases.get(name)
            used = None
            if release is not None:
                used = math.fsum(m.delta for m in _part_measures(name, release))
            given = None if self._deferred and name not in self._drawn else b.delta
            out[name] = {"delta": given, "used": used}
        if self._deferred:
            pending = [n for n in self._budgets if n not in self._drawn]
            out["(unallocated)"] = {"delta": self._delta_left(), "pending": pending}
        return out

    def explain(self) -> str:
        """The split, where delta went, each aggregation's own plan, and the whole job's
        guarantee."""
        lines = [f"Shared privacy budget: {self.total.describe()}", "parts:"]
        for name, b in self._budgets.items():
            state = "used" if name in self._releases else ("issued, not used" if name in self._issued
                                                            else "not issued")
            lines.append(f"  {name}: {b.describe()} ({state})")
        if self.total.delta > 0:
            how = ("allocated as the parts are drawn, to those whose mechanisms use it"
                   if self._deferred else "by weight among the parts named in needs_delta"
                   if self._needs_delta is not None else "as given")
            lines.append(f"delta ({how}):")
            for name, d in self.delta_allocation().items():
                if name == "(unallocated)":
                    if d["pending"]:
                        use = f"kept for the parts not drawn yet: {', '.join(d['pending'])}"
                    elif d["delta"] > 0:
                        use = ("unused: kept for parts that were then drawn as pure (pass "
                               "needs_delta=[...] or draw the pure parts first)")
                    else:
                        continue
                    lines.append(f"  not allocated: {d['delta']:.3g} ({use})")
                    continue
                if d["delta"] is None:
                    lines.append(f"  {name}: not drawn yet (would get "
                                 f"{self._delta_if_drawn(name):.3g} if it uses delta, none if pure)")
                    continue
                if self._deferred and not self._drawn.get(name, True):
                    use = "pure: its mechanisms use no delta"
                    if d["used"]:
                        use = f"drawn as pure but its measures use {d['used']:.3g}"
                    lines.append(f"  {name}: 0 ({use})")
                    continue
                if d["used"] is None:
                    use = "not spent yet"
                elif d["delta"] > 0 and d["used"] == 0:
                    use = ("unused: its measures are pure (give delta to the parts that use it: "
                           "SharedBudget(..., needs_delta=[...]))")
                else:
                    use = f"its measures use {d['used']:.3g}"
                lines.append(f"  {name}: {d['delta']:.3g} ({use})")
        for name, release in self._releases.items():
            lines += ["", f"== {name} ==", release.explain()]
        lines += ["", f"Whole job (all parts; this job composes by {self.accountant}; the "
                      "figure's accountant in brackets):"]
        for accountant in guarantee.ACCOUNTANTS:
            try:
                g = self.stated(accountant)
                text = f"epsilon={g.epsilon:.4g}, delta={g.delta:.3g} [{g.accountant}]"
            except ValueError as err:
                text = f"n/a ({err})"
            lines.append(f"  {accountant:<6} {text}")
        return "\n".join(lines)


def _part_measures(name: str, release) -> list[Measure]:
    """One spent part's measures: its plan's, plus its private key selection if it has one."""
    out = list(release.plan.measures)
    selector = getattr(release, "selector", None)
    if selector is not None:
        out.append(selection_measure(f"{name}/key_selection", selector))
    return out


def _budget_measure(name: str, budget: PrivacyBudget) -> Measure:
    """A part's budget as the measure that would spend all of it (for the fit check)."""
    if budget.is_zcdp:
        return Measure(name=name, mechanism="budget part (zCDP)", rho=budget.rho,
                       epsilon=budget.as_epsilon_delta().epsilon, delta=budget.delta)
    return Measure(name=name, mechanism="budget part", epsilon=budget.epsilon, delta=budget.delta)


def _check_name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a budget part name must be a non-empty string, got {name!r}")
    return name
