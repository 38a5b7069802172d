"""A pipeline's privacy budget and the plan of the measures that spend it.

A pipeline declares one :class:`PrivacyBudget` -- ``(epsilon, delta)`` or zCDP ``rho`` -- and
splits it into named :class:`BudgetShare` s by basic composition (zCDP shares compose additively
too). Each released measure becomes a :class:`Measure`: its noise (a calibrated
:class:`~accounting.calibration.NoiseSpec`), its neighbouring relation and sensitivities, and the
share it spends. A :class:`ReleasePlan` collects the measures, refuses any that would overspend
the budget, describes the release as ``dp_accounting`` DpEvents (what happened), counts it with a
chosen accountant (how it is counted), and explains it in a readable table.

The neighbouring relation is folded into the sensitivities (a substitution doubles them, see
:mod:`accounting.sensitivity`), so every noise event is accounted as one shift by its sensitivity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping, Optional

import dp_accounting

from accounting import composition
from accounting.calibration import NoiseKind, NoiseSpec, calibrate, calibrate_zcdp
from accounting.composition import EpsDelta
from accounting.sensitivity import Neighbouring, Sensitivities
from accounting.validation import check_delta, check_epsilon, check_rho

#: Relative slack when checking that measures stay within the budget (float rounding of splits).
_BUDGET_TOLERANCE = 1e-9
#: Accountants understood by :meth:`ReleasePlan.guarantee`.
ACCOUNTANTS = ("basic", "zcdp", "pld")


@dataclass(frozen=True)
class BudgetShare:
    """The part of a budget one measure may spend.

    ``fraction`` is the share's weight over all weights. Under an (epsilon, delta) budget
    ``rho`` is None. Under a zCDP budget ``rho`` is set, ``delta`` is 0 and ``epsilon`` is
    ``sqrt(2 rho)``: a pure-DP mechanism with that epsilon costs exactly ``rho`` (Bun & Steinke
    2016, Prop. 1.4), so Laplace measures can share a zCDP budget with Gaussian ones.
    """

    name: str
    fraction: float
    epsilon: float
    delta: float = 0.0
    rho: Optional[float] = None


@dataclass(frozen=True)
class PrivacyBudget:
    """The total guarantee a pipeline declares once: ``(epsilon, delta)``-DP or ``rho``-zCDP.

    Give exactly one of ``epsilon`` and ``rho``. With ``rho``, ``delta`` is the delta at which
    the guarantee is also reported as (epsilon, delta) (0: not reported).
    """

    epsilon: Optional[float] = None
    delta: float = 0.0
    rho: Optional[float] = None

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
                shares[name] = BudgetShare(name, fraction, math.sqrt(2 * rho), 0.0, rho)
            else:
                delta = self.delta * weight / delta_total if name in needs_delta else 0.0
                shares[name] = BudgetShare(name, fraction, self.epsilon * fraction, delta)
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


@dataclass(frozen=True)
class Measure:
    """One released measure: its noise, neighbouring relation, sensitivities and budget share."""

    name: str
    noise: NoiseSpec
    sensitivities: Sensitivities
    neighbouring: str = Neighbouring.ADD_REMOVE.value
    share: Optional[BudgetShare] = None
    description: str = ""

    @classmethod
    def calibrated(cls, name: str, kind, share: BudgetShare, sensitivities: Sensitivities, *,
                   neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
                   description: str = "", delta_for_reporting: float = 1e-9) -> "Measure":
        """Calibrate ``kind`` noise for ``share`` and ``sensitivities`` (L1 for Laplace kinds,
        L2 for Gaussian kinds; L0 for grid adjustments). The sensitivities must have been derived
        for ``neighbouring`` (see :mod:`accounting.sensitivity`).

        A zCDP share gives Gaussian kinds sigma = L2/sqrt(2 rho) and Laplace kinds epsilon =
        sqrt(2 rho); an (epsilon, delta) share gives Gaussian kinds the analytic Gaussian sigma.
        """
        kind = NoiseKind.parse(kind)
        relation = Neighbouring(neighbouring).value
        if share.rho is not None and kind.is_gaussian:
            noise = calibrate_zcdp(kind, rho=share.rho, l2_sensitivity=sensitivities.l2,
                                   l0=sensitivities.l0, delta_for_reporting=delta_for_reporting)
        elif kind.is_gaussian:
            if share.delta == 0:
                raise ValueError(f"measure {name!r}: {kind.value} noise needs a share with "
                                 f"delta > 0 (list it in needs_delta when splitting)")
            noise = calibrate(kind, epsilon=share.epsilon, delta=share.delta,
                              l2_sensitivity=sensitivities.l2, l0=sensitivities.l0)
        else:
            noise = calibrate(kind, epsilon=share.epsilon, l1_sensitivity=sensitivities.l1,
                              l0=sensitivities.l0)
        return cls(name, noise, sensitivities, relation, share, description)

    @property
    def mechanism(self) -> str:
        return self.noise.kind.value

    @property
    def is_pure(self) -> bool:
        """Pure epsilon-DP (Laplace kinds); Gaussian kinds are approximate / zCDP."""
        return not self.noise.kind.is_gaussian

    @property
    def rho(self) -> float:
        """The zCDP cost of this measure (epsilon^2/2 for pure DP, L2^2/(2 sigma^2) Gaussian)."""
        return self.noise.zcdp_rho()

    @property
    def sensitivity_used(self) -> tuple[str, float]:
        """The norm the noise is calibrated to: ("L2", l2) for Gaussian kinds, else ("L1", l1)."""
        if self.noise.kind.is_gaussian:
            return "L2", self.sensitivities.l2
        return "L1", self.sensitivities.l1

    def dp_event(self) -> dp_accounting.DpEvent:
        return self.noise.dp_event()

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "mechanism": self.mechanism,
            "neighbouring": self.neighbouring,
            "sensitivities": self.sensitivities.to_dict(),
            "noise_scale": self.noise.scale,
            "granularity": self.noise.granularity,
            "epsilon": self.noise.epsilon,
            "delta": self.noise.delta,
            "rho": self.rho,
            "budget_fraction": None if self.share is None else self.share.fraction,
            "std": self.noise.std,
            "ci95_halfwidth": self.noise.ci_halfwidth(0.95),
        }


@dataclass
class ReleasePlan:
    """The measures of one release, checked against the budget they share."""

    budget: PrivacyBudget
    measures: list[Measure] = field(default_factory=list)
    #: value_discretization_interval of the PLD accountant.
    pld_discretization: float = 1e-4

    def __post_init__(self):
        existing, self.measures = list(self.measures), []
        for measure in existing:
            self.add(measure)

    def add(self, measure: Measure) -> Measure:
        """Add a measure; refuse a duplicate name or one that would overspend the budget."""
        if any(m.name == measure.name for m in self.measures):
            raise ValueError(f"measure {measure.name!r} is already in the plan")
        self._check_within_budget(self.measures + [measure])
        self.measures.append(measure)
        return measure

    def add_calibrated(self, name: str, kind, share: BudgetShare, sensitivities: Sensitivities,
                       **kwargs) -> Measure:
        """``add(Measure.calibrated(...))``; zCDP Gaussian measures report at the budget's delta."""
        if self.budget.delta > 0:
            kwargs.setdefault("delta_for_reporting", self.budget.delta)
        return self.add(Measure.calibrated(name, kind, share, sensitivities, **kwargs))

    def _check_within_budget(self, measures: list[Measure]) -> None:
        slack = 1 + _BUDGET_TOLERANCE
        if self.budget.is_zcdp:
            spent = math.fsum(m.rho for m in measures)
            if spent > self.budget.rho * slack:
                raise ValueError(f"measures spend rho={spent:.6g} > budget rho={self.budget.rho:g}")
            return
        spent = composition.sequential([(m.noise.epsilon, m.noise.delta) for m in measures]) \
            if measures else EpsDelta(0.0, 0.0)
        if spent.epsilon > self.budget.epsilon * slack:
            raise ValueError(f"measures spend epsilon={spent.epsilon:.6g} > budget "
                             f"epsilon={self.budget.epsilon:g}")
        if spent.delta > self.budget.delta * slack:
            raise ValueError(f"measures spend delta={spent.delta:.6g} > budget "
                             f"delta={self.budget.delta:g}")

    def _require_measures(self) -> None:
        if not self.measures:
            raise ValueError("the release plan has no measures")

    def dp_event(self) -> dp_accounting.ComposedDpEvent:
        """What the release does, as a ``dp_accounting`` event (one per measure)."""
        self._require_measures()
        return dp_accounting.ComposedDpEvent([m.dp_event() for m in self.measures])

    def guarantee(self, accountant: str = "basic", delta: Optional[float] = None) -> EpsDelta:
        """The whole release's (epsilon, delta) counted by ``accountant``.

        * ``"basic"``: sum of each measure's (epsilon, delta) (``delta`` is ignored).
        * ``"zcdp"``: Gaussian measures' rhos added, combined with the pure-DP measures by
          :func:`~accounting.composition.combine_zcdp_and_pure`, at ``delta`` (default: the
          budget's delta).
        * ``"pld"``: tight numerical composition of the measures' privacy loss distributions
          (``dp_accounting``), epsilon at ``delta`` (default: the budget's delta).
        """
        self._require_measures()
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
        if accountant == "basic":
            return composition.sequential([(m.noise.epsilon, m.noise.delta) for m in self.measures])
        target = self.budget.delta if delta is None else check_delta(delta)
        if accountant == "zcdp":
            if all(m.is_pure for m in self.measures):
                return composition.sequential([(m.noise.epsilon, 0.0) for m in self.measures])
            if target == 0:
                raise ValueError("delta must be > 0 to convert zCDP to (epsilon, delta); "
                                 "pass delta= or declare it in the budget")
            gaussian_rho = math.fsum(m.rho for m in self.measures if not m.is_pure)
            pure = [m.noise.epsilon for m in self.measures if m.is_pure]
            return composition.combine_zcdp_and_pure(gaussian_rho, pure, target)
        plds = [m.noise.privacy_loss_distribution(self.pld_discretization) for m in self.measures]
        epsilon = float(composition.compose_plds(plds).get_epsilon_for_delta(target))
        return EpsDelta(epsilon, target)

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
                  "delta", "rho", "std", "95% interval")
        rows = []
        for m in self.measures:
            norm, value = m.sensitivity_used
            share = "-" if m.share is None else f"{100 * m.share.fraction:.1f}%"
            rows.append((m.name, m.mechanism, f"{norm}={value:.4g}", f"{m.noise.scale:.4g}",
                         share, f"{m.noise.epsilon:.4g}", f"{m.noise.delta:.3g}",
                         f"{m.rho:.4g}", f"{m.noise.std:.4g}",
                         f"±{m.noise.ci_halfwidth(0.95):.4g}"))
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
            out.append(f"{m.name}: neighbouring = {m.neighbouring}; L0={s.l0}, Linf={s.linf:g}, "
                       f"L1={s.l1:g}, L2={s.l2:.4g}{extra}")
        out.append("")
        out.append("Whole release:")
        for name in ACCOUNTANTS:
            try:
                g = self.guarantee(name)
                text = f"epsilon={g.epsilon:.4g}, delta={g.delta:.3g}"
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
