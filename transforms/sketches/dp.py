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
``Neighbouring.SUBSTITUTE`` (replace a person) doubles every norm (two registers change; one
bin can move by 2 when the removed and the collided person share a frequency), which also covers
the reference's "adding one impression moves a register from bin k to k+1: L1 = 2".

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
knows only its own share. The shares are *simulated* here: each helper draws from a numpy
Generator (``RandomStreams.generator()``) keyed from its own sub-key of the release key and the
output key; numpy's negative binomial is a floating-point gamma-Poisson sampler, acceptable for a
simulation of the protocol (the global mode uses the exact integer samplers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from accounting.calibration import NoiseKind, NoiseSpec, calibrate
from accounting.composition import EpsDelta, sequential
from accounting.sensitivity import Neighbouring, Sensitivities
from accounting.validation import check_delta, check_epsilon, check_positive_int
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise

__all__ = ["SketchStatistics", "ReachFrequencyBudget", "REACH_SENSITIVITY",
           "HISTOGRAM_SENSITIVITY", "output_keys", "add_global_noise", "polya_share",
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


@dataclass(frozen=True)
class ReachFrequencyBudget:
    """Per-campaign budget split over the 2 (P + 1) noisy statistics of a campaign.

    ``epsilon``/``delta``: total for one campaign (delta only for the discrete Gaussian).
    ``num_publishers``: P, the number of declared publishers (public, not read from data).
    """

    epsilon: float
    num_publishers: int
    reach_fraction: float = 0.5
    delta: float = 0.0
    kind: NoiseKind = NoiseKind.DISCRETE_LAPLACE
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    def __post_init__(self):
        check_epsilon(self.epsilon)
        check_positive_int(self.num_publishers, "num_publishers")
        if not 0.0 < float(self.reach_fraction) < 1.0:
            raise ValueError(f"reach_fraction must be in (0, 1), got {self.reach_fraction!r}")
        object.__setattr__(self, "kind", NoiseKind.parse(self.kind))
        object.__setattr__(self, "neighbouring", Neighbouring(self.neighbouring))
        if self.kind not in (NoiseKind.DISCRETE_LAPLACE, NoiseKind.DISCRETE_GAUSSIAN):
            raise ValueError(f"noise kind: sketch statistics are integers, use discrete_laplace "
                             f"or discrete_gaussian, got {self.kind.value}")
        check_delta(self.delta, allow_zero=self.kind is NoiseKind.DISCRETE_LAPLACE)

    @property
    def num_scopes(self) -> int:
        return self.num_publishers + 1

    def _spec(self, fraction: float, sens: Sensitivities, coordinates: int) -> NoiseSpec:
        factor = self.neighbouring.factor
        l0 = min(sens.l0 * factor, coordinates)  # a replaced person touches two registers
        sens = sens.scaled(factor)
        eps = self.epsilon * fraction / self.num_scopes
        if self.kind is NoiseKind.DISCRETE_LAPLACE:
            return calibrate(self.kind, epsilon=eps, l1_sensitivity=sens.l1)
        return calibrate(self.kind, epsilon=eps, delta=self.delta * fraction / self.num_scopes,
                         l2_sensitivity=sens.l2, l0=l0)

    def reach_spec(self) -> NoiseSpec:
        return self._spec(self.reach_fraction, REACH_SENSITIVITY, coordinates=1)

    def histogram_spec(self) -> NoiseSpec:
        return self._spec(1.0 - self.reach_fraction, HISTOGRAM_SENSITIVITY, coordinates=2)

    def total(self) -> EpsDelta:
        """Sequential composition of every noisy statistic of one campaign."""
        specs = [self.reach_spec(), self.histogram_spec()] * self.num_scopes
        return sequential([(s.epsilon, s.delta) for s in specs])


def output_keys(campaign: str, scope: tuple[str, str], measure: str, size: int) -> list[tuple]:
    """Keys of the noise lanes of one statistic: (campaign, scope kind, publisher, measure, bin)."""
    kind, publisher = scope
    return [(str(campaign), kind, publisher, measure, i) for i in range(size)]


def add_global_noise(stats: SketchStatistics, budget: ReachFrequencyBudget,
                     release_key: ReleaseKey, campaign: str,
                     scope: tuple[str, str]) -> SketchStatistics:
    """Central noise on both statistics of one sketch (one keyed lane per released number)."""
    reach_streams = RandomStreams.for_keys(release_key, NOISE_PURPOSE,
                                           output_keys(campaign, scope, "reach", 1))
    hist = np.asarray(stats.histogram, dtype=np.int64)
    hist_streams = RandomStreams.for_keys(release_key, NOISE_PURPOSE,
                                          output_keys(campaign, scope, "frequency", hist.size))
    reach = add_noise(budget.reach_spec(), np.array([stats.active_registers], np.int64),
                      reach_streams)
    return SketchStatistics(int(reach[0]), add_noise(budget.histogram_spec(), hist, hist_streams))


# --------------------------------------------------------------------------- distributed noise

def polya_share(rng: np.random.Generator, num_helpers: int, scale: float, size: int) -> np.ndarray:
    """One helper's share: Polya(1/n, p) - Polya(1/n, p), p = exp(-1/scale), int64[size].

    numpy's ``negative_binomial(r, q)`` counts failures before r successes of probability q,
    P(k) = Gamma(k + r) / (k! Gamma(r)) q^r (1 - q)^k: the Polya(r, p) law with q = 1 - p.
    """
    n = check_positive_int(num_helpers, "num_helpers")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    q = -math.expm1(-1.0 / scale)  # 1 - p, accurate for large scales
    return (rng.negative_binomial(1.0 / n, q, size).astype(np.int64)
            - rng.negative_binomial(1.0 / n, q, size).astype(np.int64))


def helper_shares(release_key: ReleaseKey, helper: int, num_helpers: int,
                  budget: ReachFrequencyBudget, campaign: str, scope: tuple[str, str],
                  num_bins: int) -> SketchStatistics:
    """Helper ``helper``'s shares for one sketch's reach and histogram.

    The helper's Generator is keyed by its own sub-key of the release key and by the output key,
    so shares reproduce per output key whatever the bundling (see the module docstring on why a
    numpy Generator is acceptable for this simulation).
    """
    if budget.kind is not NoiseKind.DISCRETE_LAPLACE:
        raise ValueError("distributed noise: Polya shares sum to discrete Laplace noise only; "
                         "use kind=discrete_laplace")
    if not 0 <= helper < num_helpers:
        raise ValueError(f"helper must be in [0, {num_helpers}), got {helper!r}")
    kind, publisher = scope
    streams = RandomStreams.for_keys(release_key.derive(f"helper/{helper}/of/{num_helpers}"),
                                     SHARE_PURPOSE, [(str(campaign), kind, publisher)])
    rng = streams.generator()
    reach = polya_share(rng, num_helpers, budget.reach_spec().scale, 1)
    hist = polya_share(rng, num_helpers, budget.histogram_spec().scale, num_bins)
    return SketchStatistics(int(reach[0]), hist)


def add_helper_share(stats: SketchStatistics, release_key: ReleaseKey, helper: int,
                     num_helpers: int, budget: ReachFrequencyBudget, campaign: str,
                     scope: tuple[str, str]) -> SketchStatistics:
    """The statistics after helper ``helper`` has added its share."""
    share = helper_shares(release_key, helper, num_helpers, budget, campaign, scope,
                          len(stats.histogram))
    return SketchStatistics(stats.active_registers + share.active_registers,
                            np.asarray(stats.histogram, np.int64) + share.histogram)
