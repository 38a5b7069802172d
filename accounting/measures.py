"""What one released measure is and what it costs: the one measure type every job shares.

A :class:`Measure` records *what happened* (the mechanism, the neighbouring relation it protects,
the query's sensitivities and, for additive noise, the calibrated
:class:`~accounting.calibration.NoiseSpec`) and *what it costs*: ``epsilon`` and ``delta``, plus
``rho`` when the mechanism is accounted as rho-zCDP. How a set of measures is *counted* (basic,
zCDP or PLD composition) is :mod:`accounting.guarantee`'s job -- the split that ``dp_accounting``
makes between events and accountants.

Measures without additive noise (randomized response, private key selection) carry no NoiseSpec,
only their cost. Every measure serialises to JSON and back (the budget ledger stores them), keeping
enough of the noise to rebuild its privacy loss distribution.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Optional

from accounting.calibration import NoiseKind, NoiseSpec, calibrate, calibrate_zcdp
from accounting.sensitivity import Neighbouring, Sensitivities
from accounting.validation import check_delta, check_epsilon, check_rho


@dataclass(frozen=True, kw_only=True)
class BudgetShare:
    """The part of a budget one measure may spend.

    ``fraction`` is the share's weight over all weights. Under an (epsilon, delta) budget ``rho``
    is None. Under a zCDP budget ``rho`` is set, ``delta`` is 0 and ``epsilon`` is
    ``sqrt(2 rho)``: a pure-DP mechanism with that epsilon costs exactly ``rho`` (Bun & Steinke
    2016, Prop. 1.4), so Laplace measures can share a zCDP budget with Gaussian ones.
    """

    name: str
    fraction: float
    epsilon: float
    delta: float = 0.0
    rho: Optional[float] = None


def _relation(value) -> str:
    if isinstance(value, Neighbouring):
        return value.value
    if isinstance(value, str) and value:
        try:
            return Neighbouring(value).value
        except ValueError:
            return value  # a job-specific relation, stated in words (e.g. "(Geo, Project, k)-DP")
    raise ValueError(f"neighbouring must be a Neighbouring or a description, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Measure:
    """One released measure (see the module docstring)."""

    name: str
    mechanism: str
    epsilon: float
    delta: float = 0.0
    rho: Optional[float] = None
    neighbouring: str = Neighbouring.ADD_REMOVE.value
    sensitivities: Optional[Sensitivities] = None
    noise: Optional[NoiseSpec] = None
    share: Optional[BudgetShare] = None
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a measure needs a non-empty name, got {self.name!r}")
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, f"measure {self.name!r} epsilon"))
        object.__setattr__(self, "delta", check_delta(self.delta, f"measure {self.name!r} delta"))
        if self.rho is not None:
            object.__setattr__(self, "rho", check_rho(self.rho, f"measure {self.name!r} rho"))
        object.__setattr__(self, "neighbouring", _relation(self.neighbouring))

    # ----------------------------------------------------------------- constructors
    @classmethod
    def of_noise(cls, name: str, noise: NoiseSpec, sensitivities: Sensitivities, *,
                 neighbouring=Neighbouring.ADD_REMOVE, share: Optional[BudgetShare] = None,
                 description: str = "") -> "Measure":
        """A measure adding calibrated ``noise`` (its cost is the spec's guarantee; Gaussian
        kinds also carry their zCDP cost, rho = L2^2 / (2 sigma^2), for the zCDP accountant)."""
        if noise.kind.is_integer and noise.kind.is_gaussian and noise.l0 < sensitivities.l0:
            # The one-key discrete Gaussian curve is not a multi-key guarantee (calibration docstring).
            raise ValueError(f"measure {name!r}: discrete Gaussian noise calibrated for l0={noise.l0} "
                             f"key(s) but one unit changes up to l0={sensitivities.l0}; calibrate "
                             f"with l0={sensitivities.l0}")
        rho = noise.rho if noise.rho is not None or not noise.kind.is_gaussian else noise.zcdp_rho()
        return cls(name=name, mechanism=noise.kind.value, epsilon=noise.epsilon, delta=noise.delta,
                   rho=rho, neighbouring=neighbouring, sensitivities=sensitivities,
                   noise=noise, share=share, description=description)

    @classmethod
    def calibrated(cls, name: str, kind, share: BudgetShare, sensitivities: Sensitivities, *,
                   neighbouring=Neighbouring.ADD_REMOVE, description: str = "",
                   delta_for_reporting: float = 1e-9) -> "Measure":
        """Calibrate ``kind`` noise for ``share`` and ``sensitivities`` (L1 for Laplace kinds,
        L2 for Gaussian kinds; L0 for grid adjustments). The sensitivities must have been derived
        for ``neighbouring`` (see :mod:`accounting.sensitivity`).

        A zCDP share gives Gaussian kinds sigma = L2/sqrt(2 rho) and Laplace kinds epsilon =
        sqrt(2 rho); an (epsilon, delta) share gives Gaussian kinds the analytic Gaussian sigma.
        """
        kind = NoiseKind.parse(kind)
        if share.rho is not None and kind.is_gaussian:
            noise = calibrate_zcdp(kind, rho=share.rho, l2_sensitivity=sensitivities.l2,
                                   l0=sensitivities.l0, delta_for_reporting=delta_for_reporting,
                                   l1_sensitivity=sensitivities.l1)
        elif kind.is_gaussian:
            if share.delta == 0:
                raise ValueError(f"measure {name!r}: {kind.value} noise needs a share with "
                                 f"delta > 0 (list it in needs_delta when splitting)")
            noise = calibrate(kind, epsilon=share.epsilon, delta=share.delta,
                              l1_sensitivity=sensitivities.l1, l2_sensitivity=sensitivities.l2,
                              l0=sensitivities.l0)
        else:
            noise = calibrate(kind, epsilon=share.epsilon, l1_sensitivity=sensitivities.l1,
                              l0=sensitivities.l0)
        return cls.of_noise(name, noise, sensitivities, neighbouring=neighbouring, share=share,
                            description=description)

    # ----------------------------------------------------------------- cost
    @property
    def is_pure(self) -> bool:
        """Pure epsilon-DP: no delta and not accounted as zCDP."""
        return self.delta == 0 and self.rho is None

    @property
    def zcdp_rho(self) -> float:
        """A zCDP bound: ``rho`` if set, else epsilon^2/2 for a pure measure (Bun & Steinke 2016)."""
        if self.rho is not None:
            return self.rho
        if self.noise is not None and self.noise.kind.is_gaussian:
            return self.noise.zcdp_rho()
        if self.delta == 0:
            return self.epsilon ** 2 / 2
        raise ValueError(f"measure {self.name!r} is (epsilon, delta)-DP without a zCDP form")

    @property
    def accountant(self) -> str:
        """Which accountant states this measure's epsilon (accounting.composition.FIGURE_ACCOUNTANTS):
        its noise's, else ``pure`` (no delta), ``zcdp`` (a rho) or ``basic`` (a stated pair)."""
        if self.noise is not None:
            return self.noise.accountant
        if self.is_pure:
            return "pure"
        return "zcdp" if self.rho is not None else "basic"

    @property
    def sensitivity_used(self) -> tuple[str, float]:
        """The norm the noise is calibrated to: ("L2", l2) for Gaussian kinds, else ("L1", l1)."""
        if self.sensitivities is None:
            return "-", float("nan")
        if self.noise is not None and self.noise.kind.is_gaussian:
            return "L2", self.sensitivities.l2
        return "L1", self.sensitivities.l1

    def dp_event(self):
        """The ``dp_accounting`` event of this measure (what happened)."""
        from dp_accounting import dp_event

        if self.noise is not None:
            return self.noise.dp_event()
        if self.rho is not None:
            return dp_event.ZCDpEvent(rho=self.rho)
        return dp_event.EpsilonDeltaDpEvent(epsilon=self.epsilon, delta=self.delta)

    def privacy_loss_distribution(self, value_discretization_interval: float = 1e-4):
        """A ``dp_accounting`` PLD of this measure (its noise's curve, else its (eps, delta))."""
        if self.noise is not None:
            return self.noise.privacy_loss_distribution(value_discretization_interval)
        from dp_accounting.pld import common, privacy_loss_distribution as pld

        return pld.from_privacy_parameters(
            common.DifferentialPrivacyParameters(self.epsilon, self.delta),
            value_discretization_interval=value_discretization_interval)

    # ----------------------------------------------------------------- (de)serialisation
    def to_json(self) -> dict:
        noise = None
        if self.noise is not None:
            noise = {f.name: getattr(self.noise, f.name) for f in dataclasses.fields(self.noise)}
            noise["kind"] = self.noise.kind.value
        return {
            "name": self.name, "mechanism": self.mechanism, "epsilon": self.epsilon,
            "delta": self.delta, "rho": self.rho, "neighbouring": self.neighbouring,
            "sensitivities": None if self.sensitivities is None else self.sensitivities.to_dict(),
            "noise": noise, "budget_fraction": None if self.share is None else self.share.fraction,
            "description": self.description,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> "Measure":
        noise = data.get("noise")
        if noise is not None:
            noise = NoiseSpec(**{**noise, "kind": NoiseKind.parse(noise["kind"])})
        sens = data.get("sensitivities")
        return cls(name=data["name"], mechanism=data["mechanism"], epsilon=data["epsilon"],
                   delta=data.get("delta", 0.0), rho=data.get("rho"),
                   neighbouring=data.get("neighbouring", Neighbouring.ADD_REMOVE.value),
                   sensitivities=None if sens is None else Sensitivities(**sens),
                   noise=noise, description=data.get("description", ""))

    def to_dict(self) -> dict:
        """JSON-ready description for reports (the cost, the noise and its error)."""
        out = self.to_json()
        out.pop("noise")
        out["accountant"] = self.accountant
        if self.noise is not None:
            out.update(noise_scale=self.noise.scale, granularity=self.noise.granularity,
                       std=self.noise.std, ci95_halfwidth=self.noise.ci_halfwidth(0.95))
        return out
