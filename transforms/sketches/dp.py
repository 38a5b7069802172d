"""Differential privacy for sketch-based reach and frequency.

Privacy unit: one virtual person of a campaign, with all of their impressions at all publishers
(the fingerprint salt is per campaign and shared by its publishers, so the person lands in the
same register of every sketch of the campaign).

Released statistics per campaign, for each publisher's sketch and for the union sketch (a
"scope"):

* the active-register count (reach);
* the frequency histogram: counts of non-empty, non-collided registers by impression count,
  capped at K (last bin "K or more").

Sensitivities (``Neighbouring.ADD_REMOVE``): adding or removing a person changes exactly one
register of a sketch, so the active count moves by at most 1, and the histogram changes by at
most one bin by one (empty -> singleton adds the person's bin; singleton -> collided removes the
other person's bin; collided stays collided). Hence L0 = Linf = L1 = L2 = 1 for each statistic.
(Integer ids have distinct fingerprints by construction; two string ids share a 64-bit
fingerprint with probability about n * 2^-64 per added person, the only event in which a
singleton could instead move bins, L1 = 2.)
``Neighbouring.SUBSTITUTE`` (replace a person) is a removal followed by an addition: the removal
empties at most one register and the addition fills at most one, in opposite directions, so the
active-register count still moves by at most 1 (the reach keeps its sensitivities); the histogram's
norms double (two registers change; one bin can move by 2 when the removed and the collided person
share a frequency), which also covers the reference's "adding one impression moves a register from
bin k to k+1: L1 = 2". Both bounds are checked by exact enumeration over every neighbouring pair
of small populations in the privacy tests.

Budget: a campaign's releases are 2 (P + 1) noisy statistics (P declared publishers plus the
union) on the same people, so they compose sequentially (``accounting.composition.sequential``):
each scope gets epsilon / (P + 1), split between reach (``reach_fraction``) and histogram.

Global noise: discrete Laplace (or discrete Gaussian) from ``accounting.calibration.calibrate``,
drawn from keyed streams ``RandomStreams.for_keys(release_key, purpose, keys)`` with one lane per
output key (campaign, scope kind, publisher, measure, bin), so it reproduces on any runner.

Distributed noise (discrete Laplace only): n helpers each add X_i - Y_i with X_i, Y_i ~
Polya(1/n, p), p = exp(-1/b). Polya (negative binomial with real shape r) is infinitely divisible:
the sum of n Polya(1/n, p) is Polya(1, p) = Geometric, so the total noise is the difference of two
geometrics, i.e. the two-sided geometric = discrete Laplace with scale b, while each helper
knows only its own share.

* Keys: each helper draws from its *own* :class:`~accounting.keys.ReleaseKey` (a mapping helper
  -> key), never from sub-keys of one common key: whoever held a common parent key would know
  every share, hence the total noise. Lanes are keyed by the output key (campaign, scope,
  measure, bin), so shares reproduce per output key whatever the bundling.
* Sampler (:class:`PolyaTable`): an inverse-CDF table of Polya(1/n, p) computed in 50-digit
  decimal arithmetic, with integer thresholds ``T_k = floor(2^64 F(k))`` on 64-bit uniforms from
  the helper's keyed stream: a draw is the number of thresholds at or below the uniform. The
  table stops at the first K with ``1 - F(K) < 2^-60`` (the remaining mass goes to K). No
  floating point touches a sample.
* Distance to the exact law: each threshold is within 2^-64 of ``2^64 F(k)`` (the decimal
  computation adds less than 2^-120), so one draw is within total variation
  ``eta_draw <= (K + 2) 2^-64 + 2^-60`` of Polya(1/n, p); a noisy value adds 2n independent
  draws, so its noise is within ``eta = 2 n eta_draw`` of the exact discrete Laplace, and a
  statistic of d values within ``d eta``. If the exact mechanism is (epsilon, delta)-DP, one
  whose output law is within TV ``t`` of it for every input is
  ``(epsilon, delta + (1 + e^epsilon) t)``-DP (apply the TV bound on both neighbours). So each
  statistic's delta grows by ``(1 + e^epsilon) d eta`` (:func:`distributed_noise_delta`), which
  composes like any delta; :meth:`ReachFrequencyNoise.charged_specs` and
  :meth:`ReachFrequencyNoise.total` include it, so the job charges it (typically ~1e-15).
"""
from __future__ import annotations

import decimal
import functools
import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from accounting.budget import PrivacyBudget, check_spendable
from accounting.calibration import NoiseKind, NoiseSpec, calibrate
from accounting.composition import EpsDelta, sequential
from accounting.sensitivity import Neighbouring, Sensitivities
from accounting.validation import check_delta, check_positive_int
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise

__all__ = ["SketchStatistics", "ReachFrequencyNoise", "REACH_SENSITIVITY",
           "HISTOGRAM_SENSITIVITY", "output_keys", "add_global_noise", "PolyaTable",
           "polya_table", "polya_difference", "distributed_noise_delta", "helper_keys_for_testing",
           "helper_shares", "add_helper_share", "NOISE_PURPOSE", "SHARE_PURPOSE"]

NOISE_PURPOSE = "reach-frequency/noise"
SHARE_PURPOSE = "reach-frequency/polya-share"

#: One person changes one register: both statistics have all norms 1 under add/remove.
REACH_SENSITIVITY = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)
HISTOGRAM_SENSITIVITY = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)


class SketchStatistics(NamedTuple):
    """What a sketch releases: active registers and the capped frequency histogram (int64)."""

    active_registers: int
    histogram: np.ndarray

    @classmethod
    def of(cls, sketch, max_frequency: int) -> "SketchStatistics":
        return cls(sketch.active_registers(), sketch.frequency_histogram(max_frequency))


@dataclass(frozen=True, kw_only=True)
class ReachFrequencyNoise:
    """How a campaign's :class:`~accounting.budget.PrivacyBudget` becomes the noise of its
    2 (P + 1) statistics (each scope's reach and frequency histogram).

    Not a budget: the budget is ``budget`` (the campaign's total (epsilon, delta); delta only for
    the discrete Gaussian), the one budget type every job shares. This object is the split rule
    and calibration on top of it: each scope gets epsilon / (P + 1) by sequential composition,
    ``reach_fraction`` of it for reach and the rest for the histogram.
    ``num_publishers``: P, the number of declared publishers (public, not read from data).
    """

    budget: PrivacyBudget
    num_publishers: int
    reach_fraction: float = 0.5
    kind: NoiseKind = NoiseKind.DISCRETE_LAPLACE
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self):
        check_spendable(self.budget, "ReachFrequencyNoise")
        if not isinstance(self.budget, PrivacyBudget) or self.budget.is_zcdp:
            raise ValueError(f"budget: an (epsilon, delta) PrivacyBudget (sketch statistics "
                             f"compose sequentially), got {self.budget!r}")
        check_positive_int(self.num_publishers, "num_publishers")
        if not 0.0 < float(self.reach_fraction) < 1.0:
            raise ValueError(f"reach_fraction must be in (0, 1), got {self.reach_fraction!r}")
        object.__setattr__(self, "kind", NoiseKind.parse(self.kind))
        object.__setattr__(self, "neighbouring", Neighbouring(self.neighbouring))
        if self.kind not in (NoiseKind.DISCRETE_LAPLACE, NoiseKind.DISCRETE_GAUSSIAN):
            raise ValueError(f"noise kind: sketch statistics are integers, use discrete_laplace "
                             f"or discrete_gaussian, got {self.kind.value}")
        check_delta(self.budget.delta, allow_zero=self.kind is NoiseKind.DISCRETE_LAPLACE)

    @property
    def num_scopes(self) -> int:
        return self.num_publishers + 1

    def _spec(self, fraction: float, sens: Sensitivities, coordinates: int,
              doubles_under_substitution: bool = True) -> NoiseSpec:
        """``sens``: what adding or removing a person moves; under substitution it is scaled by
        the relation's factor unless the statistic's change stays within it (the reach: module
        docstring)."""
        factor = self.neighbouring.factor if doubles_under_substitution else 1
        l0 = min(sens.l0 * factor, coordinates)  # a replaced person touches two registers
        sens = sens.scaled(factor)
        eps = self.budget.epsilon * fraction / self.num_scopes
        if self.kind is NoiseKind.DISCRETE_LAPLACE:
            return calibrate(self.kind, epsilon=eps, l1_sensitivity=sens.l1)
        return calibrate(self.kind, epsilon=eps, delta=self.budget.delta * fraction / self.num_scopes,
                         l2_sensitivity=sens.l2, l0=l0)

    def reach_spec(self) -> NoiseSpec:
        return self._spec(self.reach_fraction, REACH_SENSITIVITY, coordinates=1,
                          doubles_under_substitution=False)

    def histogram_spec(self) -> NoiseSpec:
        return self._spec(1.0 - self.reach_fraction, HISTOGRAM_SENSITIVITY, coordinates=2,
                          doubles_under_substitution=True)

    def charged_specs(self, num_helpers: int = 0, max_frequency: int = None) -> dict[str, NoiseSpec]:
        """The specs a release charges per scope ({"reach", "frequency"}): the calibrated ones,
        with distributed noise's extra delta (module docstring) when ``num_helpers`` > 0."""
        specs = {"reach": self.reach_spec(), "frequency": self.histogram_spec()}
        if num_helpers:
            if max_frequency is None:
                raise ValueError("distributed noise: max_frequency (histogram bins) is needed "
                                 "to state its delta")
            sizes = {"reach": 1, "frequency": int(max_frequency)}
            specs = {name: replace(spec, delta=spec.delta + distributed_noise_delta(
                spec, num_helpers, sizes[name])) for name, spec in specs.items()}
        return specs

    def total(self, num_helpers: int = 0, max_frequency: int = None) -> EpsDelta:
        """Sequential composition of every noisy statistic of one campaign (with distributed
        noise's extra delta when ``num_helpers`` > 0)."""
        specs = list(self.charged_specs(num_helpers, max_frequency).values()) * self.num_scopes
        return sequential([(s.epsilon, s.delta) for s in specs])


def output_keys(campaign: str, scope: tuple[str, str], measure: str, size: int) -> list[tuple]:
    """Keys of the noise lanes of one statistic: (campaign, scope kind, publisher, measure, bin)."""
    kind, publisher = scope
    return [(str(campaign), kind, publisher, measure, i) for i in range(size)]


def add_global_noise(stats: SketchStatistics, noise: ReachFrequencyNoise,
                     release_key: ReleaseKey, campaign: str,
                     scope: tuple[str, str]) -> SketchStatistics:
    """Central noise on both statistics of one sketch (one keyed lane per released number)."""
    reach_streams = RandomStreams.for_keys(release_key, NOISE_PURPOSE,
                                           output_keys(campaign, scope, "reach", 1))
    hist = np.asarray(stats.histogram, dtype=np.int64)
    hist_streams = RandomStreams.for_keys(release_key, NOISE_PURPOSE,
                                          output_keys(campaign, scope, "frequency", hist.size))
    reach = add_noise(noise.reach_spec(), np.array([stats.active_registers], np.int64),
                      reach_streams)
    return SketchStatistics(int(reach[0]), add_noise(noise.histogram_spec(), hist, hist_streams))


# --------------------------------------------------------------------------- distributed noise

#: The Polya table stops where the remaining mass is below 2^-POLYA_TAIL_BITS.
POLYA_TAIL_BITS = 60
#: Largest table (entries) the exact sampler builds: refuse larger scales.
MAX_POLYA_TABLE = 1 << 24
_TWO64 = 1 << 64


@dataclass(frozen=True, kw_only=True)
class PolyaTable:
    """Integer inverse-CDF thresholds of Polya(1/n, p), p = exp(-1/unit_scale) (module docstring).

    ``thresholds[k] = floor(2^64 F(k))`` for k < K; a draw from a uniform 64-bit word u is the
    number of thresholds <= u (K when all are).
    """

    num_helpers: int
    unit_scale: float
    thresholds: np.ndarray = field(repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.thresholds)

    @property
    def tv_per_draw(self) -> float:
        """A bound on the total variation distance of one draw to the exact Polya(1/n, p)."""
        return (self.size + 2) * 2.0 ** -64 + 2.0 ** -POLYA_TAIL_BITS

    @property
    def tv_per_value(self) -> float:
        """A bound on the TV distance of the summed shares of one value to discrete Laplace."""
        return 2 * self.num_helpers * self.tv_per_draw

    def draw(self, streams: RandomStreams) -> np.ndarray:
        """One Polya(1/n, p) draw per lane of ``streams`` (int64)."""
        return np.searchsorted(self.thresholds, streams.draw(), side="right").astype(np.int64)


@functools.lru_cache(maxsize=32)
def polya_table(num_helpers: int, unit_scale: float) -> PolyaTable:
    """The inverse-CDF table of Polya(1/num_helpers, exp(-1/unit_scale)), in exact integers."""
    n = check_positive_int(num_helpers, "num_helpers")
    if not unit_scale > 0:
        raise ValueError(f"scale must be positive, got {unit_scale!r}")
    context = decimal.Context(prec=50)
    one = decimal.Decimal(1)
    p = context.exp(context.divide(-one, decimal.Decimal(unit_scale)))   # unit_scale: exact float
    r = context.divide(one, decimal.Decimal(n))
    mass = context.exp(context.multiply(r, context.ln(context.subtract(one, p))))  # P(0) = (1-p)^r
    cdf = mass
    tail = context.power(decimal.Decimal(2), -POLYA_TAIL_BITS)
    two64 = decimal.Decimal(_TWO64)
    thresholds = []
    k = 0
    while context.subtract(one, cdf) >= tail:
        thresholds.append(int(context.multiply(cdf, two64).to_integral_value(decimal.ROUND_FLOOR)))
        # P(k + 1) = P(k) p (k + r) / (k + 1)
        mass = context.divide(context.multiply(context.multiply(mass, p), context.add(r, k)), k + 1)
        cdf = context.add(cdf, mass)
        k += 1
        if k > MAX_POLYA_TABLE:
            raise ValueError(f"distributed noise: scale {unit_scale:g} needs more than "
                             f"{MAX_POLYA_TABLE} table entries; use global noise or more budget")
    return PolyaTable(num_helpers=n, unit_scale=float(unit_scale),
                      thresholds=np.array(thresholds, dtype=np.uint64))


def polya_difference(streams: RandomStreams, table: PolyaTable) -> np.ndarray:
    """One helper's share per lane: X - Y with X, Y ~ Polya(1/n, p) from the helper's stream
    (zero under an exact testing key, :meth:`accounting.keys.ReleaseKey.for_exact_testing`)."""
    if streams.noise_free:
        return np.zeros(streams.size, dtype=np.int64)
    return table.draw(streams) - table.draw(streams)


def distributed_noise_delta(spec: NoiseSpec, num_helpers: int, num_values: int) -> float:
    """The delta a statistic of ``num_values`` noisy values adds when its discrete Laplace noise
    is the sum of ``num_helpers`` table-sampled Polya shares: (1 + e^eps) * d * eta."""
    if spec.kind is not NoiseKind.DISCRETE_LAPLACE:
        raise ValueError("distributed noise: Polya shares sum to discrete Laplace noise only")
    table = polya_table(num_helpers, spec.unit_scale)
    return (1 + math.exp(spec.epsilon)) * num_values * table.tv_per_value


def helper_keys_for_testing(release_key: ReleaseKey, num_helpers: int) -> dict[str, ReleaseKey]:
    """TESTS ONLY: n helper keys derived from one public testing key (a real deployment gives
    each helper a key of its own; one parent key would reveal every share)."""
    if not release_key.is_testing:
        raise ValueError("helper keys derived from one key let its holder know every share: give "
                         "each helper its own ReleaseKey (helper_keys={name: key})")
    n = check_positive_int(num_helpers, "num_helpers")
    return {f"helper{i}": release_key.derive(f"helper/{i}/of/{n}") for i in range(n)}


def helper_shares(helper_key: ReleaseKey, num_helpers: int, noise: ReachFrequencyNoise,
                  campaign: str, scope: tuple[str, str], num_bins: int) -> SketchStatistics:
    """One helper's shares for one sketch's reach and histogram, from the helper's own key."""
    if noise.kind is not NoiseKind.DISCRETE_LAPLACE:
        raise ValueError("distributed noise: Polya shares sum to discrete Laplace noise only; "
                         "use kind=discrete_laplace")
    if not isinstance(helper_key, ReleaseKey):
        raise TypeError("helper_key must be the helper's own ReleaseKey")
    reach_streams = RandomStreams.for_keys(helper_key, SHARE_PURPOSE,
                                           output_keys(campaign, scope, "reach", 1))
    hist_streams = RandomStreams.for_keys(helper_key, SHARE_PURPOSE,
                                          output_keys(campaign, scope, "frequency", num_bins))
    reach = polya_difference(reach_streams, polya_table(num_helpers, noise.reach_spec().unit_scale))
    hist = polya_difference(hist_streams, polya_table(num_helpers, noise.histogram_spec().unit_scale))
    return SketchStatistics(int(reach[0]), hist)


def add_helper_share(stats: SketchStatistics, helper_key: ReleaseKey, num_helpers: int,
                     noise: ReachFrequencyNoise, campaign: str,
                     scope: tuple[str, str]) -> SketchStatistics:
    """The statistics after the helper holding ``helper_key`` has added its share."""
    share = helper_shares(helper_key, num_helpers, noise, campaign, scope, len(stats.histogram))
    return SketchStatistics(stats.active_registers + share.active_registers,
                            np.asarray(stats.histogram, np.int64) + share.histogram)
