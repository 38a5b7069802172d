"""Noise calibration: from (epsilon, delta, sensitivity) to the parameters of a noise mechanism.

The result is a :class:`NoiseSpec`, a declarative description of *how much* noise a measure gets
and what guarantee that buys. Sampling lives in :mod:`transforms.noise`, which only reads a spec.

Mechanisms (all sampled as integers, so no floating-point attack applies, Mironov 2012):

* ``DISCRETE_LAPLACE``: P[z] ∝ exp(-|z|/b) with b = Δ1/ε: ε-DP for integer queries whose
  L1 sensitivity is Δ1 (Ghazi & Manurangsi, "Privacy in Web Advertising: Analytics &
  Modeling", seed 000_015430204a1d6d17.txt; Canonne, Kamath & Steinke 2020). The sampler
  rounds b *up* to a multiple of 2^-20.
* ``LAPLACE``: real-valued queries. The true value is rounded to a power-of-two grid g far below
  the noise scale, and discrete Laplace noise is added in units of g. Rounding can move each of
  the L0 affected coordinates by up to g, so the sensitivity used is Δ1 + L0·g (in units an
  integer, ceil(Δ1/g) + L0). Outputs are exact multiples of g: this is discretisation with the
  sensitivity and epsilon adjusted, as in Google's secure noise generation.
* ``GAUSSIAN``: real-valued, analytic Gaussian calibration (Balle & Wang 2018) for sensitivity
  Δ2 + sqrt(L0)·g, sampled as a discrete Gaussian on the grid g with σ/g ≥ 2^20; at that
  resolution the discrete and continuous privacy curves coincide to far below double precision
  (Poisson summation: the difference is of order exp(-2π²(σ/g)²)).
* ``DISCRETE_GAUSSIAN``: integer queries (Canonne, Kamath & Steinke 2020). For a one-dimensional
  integer shift (L0 = 1) σ is the smallest value whose exact privacy curve, computed by
  ``dp_accounting``'s discrete Gaussian privacy loss, meets (ε, δ); note that the discrete curve is
  slightly *worse* than the continuous one at small σ, so the continuous analytic σ is not reused.
  For L0 > 1 it uses the worst case over the shifts one unit can make, each on its exact curve,
  or the multivariate zCDP bound where that is smaller (see "Multi-key changes").

Multi-key changes (settled, issue "privacy on every path", point 8). A privacy unit that can
change up to L0 > 1 keys, e.g. a CentralNotice user with at most m clicks (L0 = L1 = m,
L2 <= m), shifts the count vector by any integer vector c with Σ|c_i| <= m. For the continuous
Gaussian the loss depends only on ‖c‖₂, so the one-key curve at sensitivity m covers every
split; for the discrete Gaussian it does not follow: the sum of independent discrete Gaussians is
not a discrete Gaussian, and CKS 2020 give only the zCDP statement (Theorem 14: ρ = ‖c‖₂²/(2σ²),
exactly as in the continuous case) and an (ε, δ) bound with a slack term (Theorem 15) for the
multivariate case. We do not claim the one-key exact curve for L0 > 1. Instead the statement
is the worst case over every shift the unit can make, each on its exact curve:

* For one neighbouring pair with shift c the output is a product of independent one-key discrete
  Gaussians, so its privacy loss is the sum of the coordinates' losses and its PLD is *exactly*
  the composition of the one-key PLDs of shifts |c_i| (``dp_accounting``'s
  DiscreteGaussianPrivacyLoss, pessimistic discretisation; coordinates with c_i = 0 cancel; the
  noise is symmetric, so signs do not matter and add and remove have the same curve). The
  composition is one FFT convolution per pattern on the PLDs' common lattice, with no tail
  dropped, and δ(ε) is read off it by sums of non-negative terms (the FFT's rounding is
  charged as :data:`FFT_ROUNDING_MASS`): the curve of ``dp_accounting``'s ``compose`` of the
  same PLDs to about 1e-14, at about a tenth of its cost per curve, which keeps calibrating a
  sigma (a few such curves) well under a second for up to 42 patterns.
* The shifts are the multisets of at most L0 positive integers with Σc_i <= L1 and
  Σc_i² <= L2² (:func:`shift_patterns`). A pattern to which one more key shifted by 1 can be
  added is dominated by the larger one (its pair is a post-processing of the larger pair's:
  drop that coordinate), so only the maximal patterns are composed; for a user's m clicks
  (L0 = L1 = L2 = m) these are the partitions of m. No monotonicity in one coordinate's shift is
  assumed for L0 > 1.
* dp_accounting renormalises the noise truncated to ±ceil(11.6σ), where the mass left out is at
  most 1e-30 (CKS 2020 tail bound). The true noise of k shifted keys is a mixture
  (1 - a)·truncated + a·rest with a <= k·1e-30 for both P and Q, so the true delta is at most the
  truncated pair's plus k·1e-30 (:data:`TAIL_MASS`), which the calibration and the statement
  reserve out of delta.

So the mechanism is (ε, δ)-DP with ε = max over the maximal patterns of the composed PLD's ε at
δ (:func:`multi_key_discrete_gaussian_epsilon`); σ is calibrated as the smallest meeting (ε, δ)
on that worst case (:func:`multi_key_discrete_gaussian_delta`), and the smaller of this figure
and the zCDP route (ρ = Δ2²/(2σ²), CKS 2020 Theorem 14, and the tight conversion) is stated, with
the accountant that produced it. The PLD route saves 5-7% of σ against zCDP at the deltas jobs
use (m = 2, 5, 10 clicks; issue 39, item 2). With more than :data:`MAX_SHIFT_PATTERNS` maximal patterns or σ beyond
dp_accounting's practical range, only the zCDP route is used.

In composition with other measures (:mod:`accounting.guarantee`) such a measure enters by one PLD
that dominates every pattern at once (:func:`multi_key_dominating_pld`): the pointwise maximum of
the patterns' privacy profiles, plus their truncation mass, is itself a privacy profile, and
dp_accounting's pessimistic connect-the-dots discretisation of it (Doroshenko, Ghazi, Kamath,
Kumar & Manurangsi, "Connect the Dots", PETS 2022) is a PLD whose profile is never below it. A
pair dominating each neighbouring pair's output composes under adaptive composition, so a
release's other measures compose with the multi-key count on its curve, not on its (ε, δ) pair.
Where the patterns do not apply (σ past :data:`MAX_PLD_SIGMA`, too many patterns) the measure
enters by its (ε, δ) pair, the dominating pair of any (ε, δ)-DP mechanism (Kairouz, Oh &
Viswanath 2015), valid under adaptive composition. The exact
multi-key curve of every split (:func:`accounting.distributions.discrete_gaussian_shift_delta`)
is checked against the stated (ε, δ) in the tests.
Callers pass ``l0`` (the number of keys one unit can change); :class:`accounting.measures.Measure`
refuses a discrete Gaussian calibrated for fewer keys than its sensitivities state.
"""
from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from accounting.composition import FIGURE_ACCOUNTANTS, zcdp_delta, zcdp_to_dp
from accounting.validation import (check_delta, check_epsilon, check_positive_int, check_rho,
                                   check_sensitivity)

#: Bits of resolution between the noise scale and the grid of real-valued mechanisms.
GRID_BITS = 24
#: Discrete Laplace scales are rounded up to a multiple of 2^-SCALE_FRACTION_BITS.
SCALE_FRACTION_BITS = 20


class NoiseKind(str, enum.Enum):
    LAPLACE = "laplace"
    DISCRETE_LAPLACE = "discrete_laplace"
    GAUSSIAN = "gaussian"
    DISCRETE_GAUSSIAN = "discrete_gaussian"

    @property
    def is_gaussian(self) -> bool:
        return self in (NoiseKind.GAUSSIAN, NoiseKind.DISCRETE_GAUSSIAN)

    @property
    def is_integer(self) -> bool:
        return self in (NoiseKind.DISCRETE_LAPLACE, NoiseKind.DISCRETE_GAUSSIAN)

    @classmethod
    def parse(cls, value) -> "NoiseKind":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"noise kind must be one of {[k.value for k in cls]}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class NoiseSpec:
    """How much noise one measure gets, and the guarantee it buys.

    ``scale`` is the Laplace parameter b or the Gaussian σ, in output units, *as sampled* (it
    already includes the rounding up and grid adjustments). ``granularity`` is 1 for integer
    noise and a power of two for real-valued kinds: every output is a multiple of it.
    ``l1_sensitivity``/``l2_sensitivity`` are those of the query (before grid adjustment).
    """

    kind: NoiseKind
    epsilon: float
    delta: float
    scale: float
    granularity: float
    l1_sensitivity: Optional[float] = None
    l2_sensitivity: Optional[float] = None
    l0: int = 1
    rho: Optional[float] = None
    #: grid units: sensitivity in units of ``granularity`` (an integer) and the unit scale.
    unit_sensitivity: int = field(default=1, compare=False)
    unit_scale: float = field(default=1.0, compare=False)
    #: which accountant states ``epsilon`` at ``delta`` (:data:`FIGURE_ACCOUNTANTS`): ``"pure"``
    #: (Laplace kinds), ``"pld"`` (the mechanism's exact privacy curve; for a multi-key discrete
    #: Gaussian the PLD dominating its shift patterns) or ``"zcdp"`` (the zCDP conversion). None
    #: (a spec read from a ledger written before the field existed) is inferred: a multi-key
    #: discrete Gaussian -> pld where its worst shift pattern's PLD states no more than its
    #: epsilon at its delta, else zcdp; another Gaussian -> zcdp with ``rho`` set, else pld (the
    #: analytic / exact discrete curve); Laplace kinds -> pure.
    accountant: Optional[str] = field(default=None, compare=False)

    def __post_init__(self):
        if self.accountant is None:
            object.__setattr__(self, "accountant", _inferred_accountant(self))
        elif self.accountant not in FIGURE_ACCOUNTANTS:
            raise ValueError(f"a noise spec's accountant must be one of {FIGURE_ACCOUNTANTS}, "
                             f"got {self.accountant!r}")

    @property
    def variance(self) -> float:
        if self.kind.is_gaussian:
            # The discrete Gaussian's variance is below σ² (CKS 2020, Prop. 5); σ² is the bound.
            return self.scale ** 2
        if self.kind is NoiseKind.DISCRETE_LAPLACE or self.kind is NoiseKind.LAPLACE:
            # Discrete Laplace with p = exp(-1/b): variance 2p/(1-p)^2 (in grid units).
            p = math.exp(-1.0 / self.unit_scale)
            if (1 - p) ** 2 == 0:   # a scale past double precision: no finite deviation (the
                return math.inf     # release layer refuses it, naming the measure)
            return (2 * p / (1 - p) ** 2) * self.granularity ** 2
        raise AssertionError(self.kind)

    @property
    def std(self) -> float:
        return math.sqrt(self.variance)

    def ci_halfwidth(self, level: float = 0.95) -> float:
        """Half-width h with P(|noise| <= h) >= level (the symmetric interval around the value)."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level!r}")
        if self.kind.is_gaussian:
            from scipy import special  # lazily: ~0.15 s of start-up a Laplace release never needs

            return float(special.ndtri(0.5 + level / 2) * self.scale)
        # Discrete Laplace in units: P(|Z| > h) = 2 p^(h+1) / (1 + p) for integer h >= 0.
        p = math.exp(-1.0 / self.unit_scale)
        if p == 0:
            raise ValueError(f"{self.kind.value} noise of scale {self.scale:.3g} vanishes in "
                             "double precision (it would be 0 with probability 1 - 1e-300): "
                             "epsilon is too large for the sensitivity")
        h = math.ceil(math.log((1 - level) * (1 + p) / 2) / math.log(p) - 1)
        return max(h, 0) * self.granularity

    def dp_event(self):
        """The dp_accounting event of one application of this mechanism."""
        from dp_accounting import dp_event

        if self.kind is NoiseKind.LAPLACE:
            return dp_event.LaplaceDpEvent(noise_multiplier=self.unit_scale / self.unit_sensitivity)
        if self.kind is NoiseKind.DISCRETE_LAPLACE:
            return dp_event.DiscreteLaplaceDpEvent(noise_parameter=1.0 / self.unit_scale,
                                                   sensitivity=self.unit_sensitivity)
        if self.kind is NoiseKind.GAUSSIAN:
            return dp_event.GaussianDpEvent(noise_multiplier=self.unit_scale / self.unit_sensitivity)
        # Discrete Gaussian: the zCDP bound holds for any integer shift (CKS 2020, Thm. 14).
        return dp_event.ZCDpEvent(rho=self.zcdp_rho())

    def zcdp_rho(self) -> float:
        """A zCDP bound for this mechanism: pure ε-DP gives ε²/2; Gaussian Δ2²/(2σ²)."""
        if self.kind.is_gaussian:
            return self.unit_sensitivity ** 2 / (2 * self.unit_scale ** 2) if self.rho is None \
                else max(self.rho, self.unit_sensitivity ** 2 / (2 * self.unit_scale ** 2))
        return self.epsilon ** 2 / 2

    def privacy_loss_distribution(self, value_discretization_interval: float = 1e-4):
        """A dp_accounting PLD of one application (for tight composition)."""
        from dp_accounting.pld import common, privacy_loss_distribution as pld

        # Real-valued kinds live on a grid 2^24 times finer than the noise: account for them as
        # the continuous mechanism with the same scale-to-sensitivity ratio.
        if self.kind is NoiseKind.LAPLACE:
            return pld.from_laplace_mechanism(self.unit_scale / self.unit_sensitivity, sensitivity=1,
                                              value_discretization_interval=value_discretization_interval)
        if self.kind is NoiseKind.DISCRETE_LAPLACE:
            return pld.from_discrete_laplace_mechanism(
                1.0 / self.unit_scale, sensitivity=self.unit_sensitivity,
                value_discretization_interval=value_discretization_interval)
        if self.kind is NoiseKind.GAUSSIAN:
            return pld.from_gaussian_mechanism(self.unit_scale / self.unit_sensitivity, sensitivity=1,
                                               value_discretization_interval=value_discretization_interval)
        if self.l0 == 1 and float(self.unit_sensitivity).is_integer() and self.unit_scale < 1e4:
            return pld.from_discrete_gaussian_mechanism(
                self.unit_scale, sensitivity=int(self.unit_sensitivity),
                value_discretization_interval=value_discretization_interval)
        patterns = self.shift_patterns()
        if patterns is not None:  # one PLD dominating every shift the unit can make
            return multi_key_dominating_pld(self.unit_scale, patterns, value_discretization_interval)
        return pld.from_privacy_parameters(common.DifferentialPrivacyParameters(self.epsilon, self.delta),
                                           value_discretization_interval=value_discretization_interval)

    def shift_patterns(self):
        """The maximal shift patterns of a multi-key discrete Gaussian whose PLD applies
        (:func:`shift_patterns` of its l0, L2 and L1; σ below :data:`MAX_PLD_SIGMA`), else None
        (another kind, one key, or too many patterns)."""
        if self.l0 == 1 or self.l2_sensitivity is None:
            return None
        return _multi_key_patterns(self.kind, self.l0, self.unit_sensitivity, self.l1_sensitivity,
                                   self.unit_scale)

    def describe(self) -> str:
        sens = f"L1={self.l1_sensitivity:g}" if not self.kind.is_gaussian else f"L2={self.l2_sensitivity:g}"
        guarantee = f"eps={self.epsilon:g}, delta={self.delta:g}"
        if self.rho is not None:
            guarantee += f", rho={self.rho:g}"
        return f"{self.kind.value}(scale={self.scale:.6g}, {sens}, {guarantee})"


def _inferred_accountant(spec: NoiseSpec) -> str:
    if not spec.kind.is_gaussian:
        return "pure"
    if spec.kind is NoiseKind.DISCRETE_GAUSSIAN and spec.l0 > 1:
        # pld where the worst shift pattern's PLD states the spec's epsilon (its epsilon at
        # delta is no larger), else the zCDP route that calibrated it.
        patterns = spec.shift_patterns()
        if patterns is not None and spec.delta > 0:
            stated = multi_key_discrete_gaussian_epsilon(spec.unit_scale, spec.delta, patterns)
            if stated <= spec.epsilon * (1 + 1e-9):
                return "pld"
        return "zcdp"
    if spec.rho is not None:
        return "zcdp"
    return "pld"


# --------------------------------------------------------------------------- basic calibrations

def laplace_scale(epsilon: float, l1_sensitivity: float) -> float:
    """b = Δ1/ε for the Laplace and discrete Laplace mechanisms."""
    return check_sensitivity(l1_sensitivity, "l1_sensitivity") / check_epsilon(epsilon)


def gaussian_delta(sigma: float, epsilon: float, l2_sensitivity: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Theorem 8)."""
    from scipy import special  # lazily: ~0.15 s of start-up a Laplace release never needs

    a = l2_sensitivity / (2 * sigma)
    b = epsilon * sigma / l2_sensitivity
    # Φ(a - b) - e^ε Φ(-a - b), the second term in log space to avoid overflow of e^ε.
    first = special.ndtr(a - b)
    second = math.exp(epsilon + special.log_ndtr(-a - b))
    return max(first - second, 0.0)


def _smallest_sigma(delta_of_sigma, target_delta: float, start: float) -> float:
    """Smallest σ with delta_of_sigma(σ) <= target (δ decreases in σ), found in log space.

    Returns the upper end of the final bracket, so the guarantee holds at the returned σ.
    """
    lo, hi = start, start
    while delta_of_sigma(lo) <= target_delta:
        lo /= 2
        if lo < 1e-12:
            return lo
    while delta_of_sigma(hi) > target_delta:
        hi *= 2
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if delta_of_sigma(mid) > target_delta:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return hi


def analytic_gaussian_sigma(epsilon: float, delta: float, l2_sensitivity: float) -> float:
    """Smallest σ making the Gaussian mechanism (ε, δ)-DP (analytic Gaussian, Balle & Wang 2018)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    l2 = check_sensitivity(l2_sensitivity, "l2_sensitivity")
    start = l2 * math.sqrt(2 * math.log(1.25 / delta)) / epsilon  # the textbook bound
    return _smallest_sigma(lambda s: gaussian_delta(s, epsilon, l2), delta, start)


def _smallest_epsilon(delta_of_epsilon, target_delta: float, start: float) -> float:
    """Smallest ε >= 0 with delta_of_epsilon(ε) <= target (δ(ε) decreases in ε), by bisection.

    Returns the upper end of the final bracket, so the guarantee holds at the returned ε.
    """
    if delta_of_epsilon(0.0) <= target_delta:
        return 0.0
    hi = max(start, 1e-6)
    while delta_of_epsilon(hi) > target_delta:
        hi *= 2
        if hi > 1e6:
            raise ValueError(f"no epsilon below 1e6 reaches delta={target_delta:g}")
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if delta_of_epsilon(mid) > target_delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def gaussian_epsilon(sigma: float, delta: float, l2_sensitivity: float) -> float:
    """Smallest ε with the Gaussian mechanism (σ, Δ2) (ε, δ)-DP: the inverse of the exact curve
    :func:`gaussian_delta` (Balle & Wang 2018, Theorem 8), below the zCDP conversion of
    ρ = Δ2²/(2σ²) by 5-8% at the deltas jobs use."""
    sigma = check_epsilon(sigma, "sigma")
    delta = check_delta(delta, allow_zero=False)
    l2 = check_sensitivity(l2_sensitivity, "l2_sensitivity")
    start = l2 * math.sqrt(2 * math.log(1.25 / delta)) / sigma
    return _smallest_epsilon(lambda e: gaussian_delta(sigma, e, l2), delta, start)


def discrete_gaussian_epsilon(sigma: float, delta: float, sensitivity: int) -> float:
    """Smallest ε with the one-key discrete Gaussian (σ, integer shift ``sensitivity``)
    (ε, δ)-DP, on its exact privacy curve (``dp_accounting``'s DiscreteGaussianPrivacyLoss, the
    curve :func:`discrete_gaussian_sigma` calibrates on)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    sigma = check_epsilon(sigma, "sigma")
    delta = check_delta(delta, allow_zero=False)
    loss = plm.DiscreteGaussianPrivacyLoss(sigma, sensitivity=check_positive_int(sensitivity, "sensitivity"))
    return _smallest_epsilon(loss.get_delta_for_epsilon, delta,
                             gaussian_epsilon(sigma, delta, sensitivity))


def _exact_curve_applies(kind: NoiseKind, l0: int, unit_sensitivity, unit_scale: float) -> bool:
    """Whether the mechanism's exact one-shift privacy curve is a valid statement: always for the
    continuous Gaussian (its loss depends on the shift's L2 norm only); for the discrete Gaussian
    only for one key and an integer shift (the calibration docstring, "Multi-key changes")."""
    if kind is NoiseKind.GAUSSIAN:
        return True
    return l0 == 1 and float(unit_sensitivity).is_integer() and unit_scale < 2e3


# --------------------------------------------------------------------------- multi-key discrete Gaussian

#: At most this many maximal shift patterns are composed for a multi-key discrete Gaussian
#: (beyond, only the zCDP route is used; a user's m clicks have p(m) patterns: 42 for m = 10).
MAX_SHIFT_PATTERNS = 64
#: At most this many candidate shifts (maximal or not) are visited looking for the patterns.
MAX_PATTERN_SEARCH = 20000
#: Noise mass dp_accounting's discrete Gaussian leaves out by truncation, per key (at most).
TAIL_MASS = 1e-30
#: Largest σ whose multi-key PLD is computed (dp_accounting builds the noise's mass function
#: over ±11.6σ for each shift size and composes the PLDs).
MAX_PLD_SIGMA = 2e3
#: value_discretization_interval of the multi-key PLDs (pessimistic).
MULTI_KEY_DISCRETIZATION = 1e-4
#: Mass the dominating multi-key PLD puts at +inf for the rounding of its FFT convolutions (of
#: order 1e-17 per lattice point; dp_accounting's own compositions move up to 1e-15 of tail
#: to +inf at each step): a few parts per million of the deltas jobs use.
FFT_ROUNDING_MASS = 1e-14
#: At most about this many lattice points per pattern in the dominating multi-key PLD (beyond,
#: a coarser lattice: :func:`multi_key_dominating_pld`), which keeps building it near 0.1 s.
MAX_PROFILE_POINTS = 2 ** 16


def shift_patterns(l0: int, l2_sensitivity: float, l1_sensitivity: Optional[float] = None):
    """The maximal shift patterns of a unit changing up to ``l0`` integer counts with L1 norm at
    most ``l1_sensitivity`` (default sqrt(l0)·L2, implied by the L2 bound) and L2 norm at most
    ``l2_sensitivity``: multisets of positive integers (as non-increasing tuples) to which no
    further key shifted by 1 can be added. Every feasible shift is a sub-multiset of one of
    them (or equal), and its pair is a post-processing of that pattern's pair (the module
    docstring, "Multi-key changes"). None when there are more than :data:`MAX_SHIFT_PATTERNS`,
    more than :data:`MAX_PATTERN_SEARCH` candidates to visit, or no integer shift at all."""
    l0 = check_positive_int(l0, "l0")
    l2 = check_sensitivity(l2_sensitivity, "l2_sensitivity")
    l1 = math.sqrt(l0) * l2 if l1_sensitivity is None else check_sensitivity(l1_sensitivity,
                                                                            "l1_sensitivity")
    squares_cap, sum_cap = l2 * l2 * (1 + 1e-12), l1 * (1 + 1e-12)
    top = int(math.floor(min(l2 * (1 + 1e-12), sum_cap)))
    if top < 1:
        return None
    out = []
    # Depth-first over non-increasing tuples: (pattern, largest next part, sum, sum of squares).
    stack, visited = [((), top, 0, 0)], 0
    while stack:
        pattern, biggest, total, squares = stack.pop()
        visited += 1
        if visited > MAX_PATTERN_SEARCH:
            return None
        room = len(pattern) < l0 and total + 1 <= sum_cap and squares + 1 <= squares_cap
        if pattern and not room:
            out.append(pattern)
            if len(out) > MAX_SHIFT_PATTERNS:
                return None
        if len(pattern) == l0:
            continue
        for c in range(1, biggest + 1):
            if total + c <= sum_cap and squares + c * c <= squares_cap:
                stack.append((pattern + (c,), c, total + c, squares + c * c))
    return tuple(sorted(out, reverse=True))


def _pattern_tail(pattern) -> float:
    """Mass the curve of ``pattern`` reserves beyond its lattice PLD: the truncation's
    len(p)·:data:`TAIL_MASS` (module docstring) and :data:`FFT_ROUNDING_MASS`."""
    return len(pattern) * TAIL_MASS + FFT_ROUNDING_MASS


def multi_key_discrete_gaussian_delta(sigma: float, epsilon: float, patterns) -> float:
    """δ(ε) of the discrete Gaussian with σ over every shift in ``patterns``
    (:func:`shift_patterns`): the maximum over the patterns (and both directions) of
    T + (1 - T)·δ_p(ε), δ_p the pattern's composed PLD (:func:`_composed_pattern_pmfs`, one FFT
    convolution of dp_accounting's pessimistic one-key PLDs) and T = :func:`_pattern_tail`: the
    curve of :func:`multi_key_profile` (and so of the dominating PLD), at ε itself.

    Never below the true δ of any pattern: the one-key PLDs are pessimistic, their convolution
    is exact up to FFT rounding (negative values clipped up, the rest covered by
    :data:`FFT_ROUNDING_MASS`), and the noise's truncation is charged by T. Against composing
    the same one-key PLDs with dp_accounting's ``compose``/``self_compose`` (which moves up to
    1e-15 of tail to +∞ per composition, pessimistically) it is larger by about
    :data:`FFT_ROUNDING_MASS` less those moves: the same curve to a relative 1e-5 at δ = 1e-9."""
    d = MULTI_KEY_DISCRETIZATION
    worst = 0.0
    for p, directions in _composed_pattern_pmfs(sigma, patterns, d):
        tail = _pattern_tail(p)
        for lower, probs, infinity in directions:
            # δ(ε) = ∞-mass + Σ_(l > ε) p_l (1 - e^(ε - l)): from one point below ε's lattice
            # point (its term clipped to 0), every term non-negative.
            start = len(probs) if epsilon >= (lower + len(probs)) * d else \
                max(math.floor(epsilon / d) - lower, 0)
            losses = (lower + start + np.arange(len(probs) - start)) * d
            terms = np.maximum(-np.expm1(epsilon - losses), 0.0) * np.maximum(probs[start:], 0.0)
            worst = max(worst, tail + (1.0 - tail) * (infinity + float(terms.sum())))
    return min(worst, 1.0)


def _lattice_epsilon_for_delta(lower: int, probs, infinity_mass: float, tail: float,
                               delta: float, discretization: float) -> float:
    """Smallest ε >= 0 with T + (1 - T)·δ(ε) <= ``delta`` (T = ``tail``) for a PLD on the lattice
    (as :func:`hockey_stick_on_lattice`), exactly: on [(j - 1)d, jd] the losses above ε are
    those from jd up, so δ(jd - t) = δ_j + (δ_(j-1) - δ_j)(1 - e^(-t)) / (1 - e^(-d)), solved
    for t between the lattice points where the curve crosses ``delta`` (the recursion's δ_j
    are non-increasing in j, also in floating point). math.inf where the ∞ mass exceeds it."""
    if tail + (1.0 - tail) * infinity_mass > delta:
        return math.inf
    first, last = min(lower, 0) - 1, max(lower + len(probs) - 1, 0)
    curve = tail + (1.0 - tail) * hockey_stick_on_lattice(lower, probs, infinity_mass, first,
                                                          last, discretization)
    zero = -first  # the index of ε = 0
    if curve[zero] <= delta:
        return 0.0
    j = zero + int(np.argmax(curve[zero:] <= delta))  # exists: curve[-1] is the ∞ mass's
    above, below = curve[j - 1], curve[j]
    q = (delta - below) / (above - below) * -math.expm1(-discretization)
    return (first + j) * discretization + math.log1p(-q)


@functools.lru_cache(maxsize=64)
def multi_key_discrete_gaussian_epsilon(sigma: float, delta: float, patterns) -> float:
    """Smallest ε with the discrete Gaussian with σ (ε, δ)-DP for every shift in ``patterns``:
    the inverse of :func:`multi_key_discrete_gaussian_delta` (the largest pattern's ε on the
    curve T + (1 - T)·δ_p, exactly between lattice points)."""
    d = MULTI_KEY_DISCRETIZATION
    worst = 0.0
    for p, directions in _composed_pattern_pmfs(sigma, patterns, d):
        tail = _pattern_tail(p)
        for lower, probs, infinity in directions:
            worst = max(worst, _lattice_epsilon_for_delta(lower, probs, infinity, tail, delta, d))
    return worst


# --------------------------------------------------------------------------- the multi-key dominating PLD

def _dense_pmfs(distribution) -> list:
    """``(lower, probs, infinity_mass)`` of each direction of a dp_accounting PLD on its lattice
    (one entry when the PLD is symmetric). dp_accounting exposes no accessor for the mass
    function, so its dense form's fields are read; a version without them raises here."""
    pmfs = [distribution._pmf_remove]  # pylint: disable=protected-access
    if not distribution._symmetric:  # pylint: disable=protected-access
        pmfs.append(distribution._pmf_add)  # pylint: disable=protected-access
    out = []
    for pmf in pmfs:
        sparse = getattr(pmf, "_loss_probs", None)
        if sparse is not None:  # SparsePLDPmf: its dict laid out on the lattice (to_dense_pmf
            losses = np.fromiter(sparse.keys(), dtype=np.int64, count=len(sparse))  # loops in
            probs = np.zeros(int(losses.max() - losses.min()) + 1)  # Python per lattice point)
            probs[losses - losses.min()] = np.fromiter(sparse.values(), dtype=np.float64,
                                                       count=len(sparse))
            out.append((int(losses.min()), probs, float(pmf._infinity_mass)))
            continue
        dense = pmf.to_dense_pmf()
        out.append((int(dense._lower_loss), np.asarray(dense._probs, dtype=np.float64),
                    float(dense._infinity_mass)))
    return out


def hockey_stick_on_lattice(lower: int, probs, infinity_mass: float, first: int, last: int,
                            discretization: float) -> np.ndarray:
    """δ(j·d) for every lattice point j = first..last of a PLD with mass ``probs[i]`` at loss
    (lower + i)·d and ``infinity_mass`` at +∞: δ(ε) = ∞-mass + Σ_{l > ε} p_l (1 - e^(ε - l)).

    Computed by the positive recursion δ_j = δ_(j+1) + (e^d - 1)·B_j with
    B_j = Σ_(k > j) p_k e^(-(k - j)d) = e^(-d)(p_(j+1) + B_(j+1)) (a first-order filter), so no
    difference of large sums cancels: every term is non-negative and small deltas keep their
    relative precision. ``first`` must be below and ``last`` at or above the support."""
    from scipy import signal

    probs = np.maximum(np.asarray(probs, dtype=np.float64), 0.0)
    if first >= lower or last < lower + len(probs) - 1:
        raise ValueError("the lattice must cover the PLD's support (and one point below it)")
    padded = np.zeros(last - first + 1)
    padded[lower - first:lower - first + len(probs)] = probs
    decay = math.exp(-discretization)
    # reversed: b[t] = B_(last - t), b[0] = 0, b[t] = decay (r[t-1] + b[t-1])
    b = signal.lfilter([0.0, decay], [1.0, -decay], padded[::-1])
    return (infinity_mass + math.expm1(discretization) * np.cumsum(b))[::-1]


def _composed_pattern_pmfs(sigma: float, patterns, discretization: float):
    """Per pattern and direction, the mass function of the pattern's composed PLD: the one-key
    PLDs (dp_accounting's DiscreteGaussianPrivacyLoss, pessimistic) of its shift sizes convolved
    exactly on their common lattice (one FFT of each one-key mass function, a product per
    pattern: no tail is dropped). Yields ``(pattern, [(lower, probs, infinity), ...])`` pattern
    by pattern, so one pattern's mass function is held at a time."""
    from dp_accounting.pld import privacy_loss_distribution as pld
    from scipy import fft

    sizes = sorted({c for p in patterns for c in p})
    one = {c: _dense_pmfs(pld.from_discrete_gaussian_mechanism(
        sigma, sensitivity=int(c), value_discretization_interval=discretization)) for c in sizes}
    directions = max(len(v) for v in one.values())
    one = {c: v * directions if len(v) == 1 else v for c, v in one.items()}
    length = max(sum(len(one[c][0][1]) - 1 for c in p) + 1 for p in patterns)
    n = fft.next_fast_len(length, real=True)
    spectra = {(c, k): fft.rfft(one[c][k][1], n) for c in sizes for k in range(directions)}
    for p in patterns:
        per_direction = []
        for k in range(directions):
            spectrum, lower, keep = None, 0, 1.0
            for c in sorted(set(p)):
                s = _integer_power(spectra[(c, k)], p.count(c))
                spectrum = s if spectrum is None else spectrum * s
                lower += one[c][k][0] * p.count(c)
                keep *= (1.0 - one[c][k][2]) ** p.count(c)
            size = sum(len(one[c][k][1]) - 1 for c in p) + 1
            probs = fft.irfft(spectrum, n)[:size]
            per_direction.append((lower, probs, 1.0 - keep))
        yield p, per_direction


def _integer_power(x: np.ndarray, count: int) -> np.ndarray:
    """x ** count by repeated squaring: numpy's complex power takes the general route (several
    times a multiplication's cost) even for small integer exponents. ``x`` itself for 1."""
    out, square = None, x
    while True:
        if count & 1:
            out = square if out is None else out * square
        count >>= 1
        if not count:
            return out
        square = square * square


def multi_key_profile(sigma: float, patterns, discretization: float = MULTI_KEY_DISCRETIZATION):
    """The privacy profile of the multi-key discrete Gaussian on the lattice of ``discretization``:
    ``(first, deltas)`` with deltas[i] = max over the patterns (and both directions) of
    ``T + (1 - T)·δ_p((first + i)·d)``, T = len(p)·:data:`TAIL_MASS` the truncation's mass (the
    true noise of the k shifted keys is a mixture (1 - a)·truncated + a·rest with a <= T, whose
    curve is at most T + (1 - T)·δ: the module docstring) plus :data:`FFT_ROUNDING_MASS`.
    ``first`` is one point below every pattern's support, the last point at or above it."""
    pmfs = list(_composed_pattern_pmfs(sigma, patterns, discretization))
    first = min(lo for _, ds in pmfs for lo, _, _ in ds) - 1
    last = max(lo + len(pr) - 1 for _, ds in pmfs for lo, pr, _ in ds)
    worst = np.zeros(last - first + 1)
    for p, ds in pmfs:
        tail = _pattern_tail(p)
        for lo, pr, inf in ds:
            curve = hockey_stick_on_lattice(lo, pr, inf, first, last, discretization)
            np.maximum(worst, tail + (1.0 - tail) * curve, out=worst)
    return first, np.minimum(worst, 1.0)


@functools.lru_cache(maxsize=32)
def multi_key_dominating_pld(sigma: float, patterns,
                             discretization: float = MULTI_KEY_DISCRETIZATION):
    """One dp_accounting PLD that dominates the multi-key discrete Gaussian with σ over every
    shift in ``patterns`` (:func:`shift_patterns`), so the measure composes with others under
    the PLD accountant on its own curve rather than its (ε, δ) pair.

    Its privacy profile is at least the pointwise maximum of the patterns' profiles plus their
    truncation mass (:func:`multi_key_profile`) at every ε. The maximum of privacy profiles is a
    privacy profile (convex and non-increasing in e^ε, 1 at e^ε = 0), and the pessimistic
    connect-the-dots discretisation of a profile on a grid of epsilons is a PLD whose profile
    equals it on the grid and lies above it between (Doroshenko, Ghazi, Kamath, Kumar &
    Manurangsi, "Connect the Dots: Tighter Discrete Approximations of Privacy Loss
    Distributions", PETS 2022, Algorithm 1; dp_accounting's
    ``create_pmf_pessimistic_connect_dots_fixed_gap``). A PLD whose profile is above a
    mechanism's for every ε is a dominating pair of it, and dominating pairs compose under
    adaptive composition (Zhu, Dong & Wang, "Optimal Accounting of Differential Privacy via
    Characteristic Function", AISTATS 2022), so it may stand for the measure in any
    composition. The grid is the lattice of ``discretization`` (the accountant's, so it
    composes with the other measures' PLDs), and every value is placed one lattice step
    *above* the ε it was computed at: the profile only decreases in ε, so this errs on the
    safe side by a margin (about 1e-4 in ε) far above the rounding of the sums.

    Where the losses span more than :data:`MAX_PROFILE_POINTS` lattice points (small σ for its
    shifts: large epsilons) the patterns are computed on a lattice ``step`` times coarser and
    the grid is every ``step``-th point: rounding each one-key loss up to the coarser lattice
    only raises every profile (its grid contains the fine one), so this stays pessimistic, by
    at most (keys + 1)·step lattice steps in ε.

    Symmetric: the discrete Gaussian's add and remove pairs are mirror images (each direction
    of the patterns' PLDs is covered by the maximum)."""
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution as pld

    # One key shifted by c has losses over c(2B - c)/σ² with B = ceil(11.6σ): about 23.2c/σ.
    span = max(sum(p) for p in patterns) * 23.3 / sigma / discretization
    step = max(1, math.ceil(span / MAX_PROFILE_POINTS))
    first, deltas = multi_key_profile(sigma, patterns, step * discretization)
    if step == 1:
        pmf = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
            discretization, first + 1, first + len(deltas), deltas)
    else:
        pmf = pld_pmf.create_pmf_pessimistic_connect_dots(
            discretization, (first + 1 + np.arange(len(deltas))) * step, deltas)
    return pld.PrivacyLossDistribution(pmf)


def _multi_key_patterns(kind: NoiseKind, l0: int, l2, l1, sigma: float):
    """The patterns of a multi-key discrete Gaussian whose PLD statement applies, else None."""
    if kind is not NoiseKind.DISCRETE_GAUSSIAN or l0 == 1 or not sigma < MAX_PLD_SIGMA:
        return None
    return shift_patterns(l0, l2, l1)


#: Relative width of the final bracket of :func:`_multi_key_sigma` (its σ is at most this much
#: above the smallest meeting the target).
MULTI_KEY_SIGMA_TOLERANCE = 1e-4


@functools.lru_cache(maxsize=64)
def _multi_key_sigma(epsilon: float, delta: float, patterns, start: float) -> float:
    """Smallest σ (to a relative :data:`MULTI_KEY_SIGMA_TOLERANCE`, rounded up) meeting (ε, δ) on
    every pattern; ``start`` must meet it (the zCDP σ does). Returns ``start`` or a σ whose
    check passed, with a σ at most the tolerance below it whose check failed.

    A bracketing search on z = Φ⁻¹(δ) against log σ, because each check convolves every
    pattern: there the curve is nearly a line (a sum of discrete Gaussian losses is nearly a
    Gaussian one). The first probe is the analytic Gaussian σ for the patterns' largest L2 norm
    (within 0.1% of the answer at the sigmas jobs use), the second a Newton step on that
    Gaussian's slope, then false position within the bracket (or a secant through the two
    lowest passing probes before any failed). Each probe aims just past its estimate on the
    side that would close the bracket, so it usually closes after 2 to 4 checks; an estimate
    outside the bracket or not finite, a closing probe that did not close, and every probe after
    the 8th are followed by a bisection step (a step down by 10% before any check failed), so it
    ends within about 20 checks of a bracket (δ decreases in σ)."""
    from scipy import special

    tol = MULTI_KEY_SIGMA_TOLERANCE
    target = float(special.ndtri(delta))
    width = max(math.sqrt(sum(c * c for c in p)) for p in patterns)
    hi, lo = start, None        # the smallest σ known to pass (start: by assumption), largest failing
    z_hi = z_lo = None          # their z where checked and finite
    previous = None             # the passing probe before hi, while none failed: (σ, z)
    closing = False             # whether the last probe was aimed to close the bracket

    def line(x0, z0, x1, z1):   # the root of the line through (log x, z) of two probes
        if z0 == z1:
            return None
        u0, u1 = math.log(x0), math.log(x1)  # (a step past e^±5 is outside any bracket)
        return math.exp(u1 + max(-5.0, min(5.0, (target - z1) * (u1 - u0) / (z1 - z0))))

    for step in range(200):
        if lo is not None and hi / lo <= 1 + tol:
            return hi
        estimate = None
        if step == 0:
            estimate = min(start, analytic_gaussian_sigma(epsilon, delta, width))
        elif closing or step >= 8:
            pass                # the closing probe missed, or the estimates are slow: bisect
        elif lo is not None and z_lo is not None and z_hi is not None:
            estimate = line(lo, z_lo, hi, z_hi)
        elif lo is None and previous is not None and z_hi is not None:
            estimate = line(previous[0], previous[1], hi, z_hi)
        else:                   # one checked point: a Newton step on the Gaussian's slope
            x, z = (hi, z_hi) if z_hi is not None else (lo, z_lo)
            if z is not None:
                g0, g1 = (float(special.ndtri(gaussian_delta(y, epsilon, width)))
                          for y in (x, x * 1.001))
                if g1 < g0:
                    estimate = x * math.exp(max(-5.0, min(5.0, (target - z) * math.log(1.001)
                                                          / (g1 - g0))))
        closing = False
        if estimate is None or not math.isfinite(estimate) or not (
                estimate < hi and (lo is None or estimate > lo)):
            x = hi * 0.9 if lo is None else math.sqrt(lo * hi)
        elif hi / estimate <= 1 + tol / 2:      # hi just above the root: a failure closes
            x, closing = hi / (1 + 0.999 * tol), True
        elif lo is not None and estimate / lo <= 1 + tol / 2:   # lo just below: a pass closes
            x, closing = lo * (1 + 0.999 * tol), True
        else:
            x = estimate * (1 + tol / 2)
            x = x if x < hi else math.sqrt(estimate * hi)
        found = multi_key_discrete_gaussian_delta(x, epsilon, patterns)
        z = float(special.ndtri(found))
        z = z if math.isfinite(z) else None
        if found <= delta:
            if lo is None and z_hi is not None:
                previous = (hi, z_hi)
            hi, z_hi = x, z
        else:
            lo, z_lo = x, z
    return hi


def gaussian_sigma_for_rho(rho: float, l2_sensitivity: float) -> float:
    """σ = Δ2 / sqrt(2ρ): the Gaussian (or discrete Gaussian) mechanism is then ρ-zCDP."""
    return check_sensitivity(l2_sensitivity, "l2_sensitivity") / math.sqrt(2 * check_rho(rho))


def zcdp_to_epsilon(rho: float, delta: float) -> float:
    """Smallest ε with ρ-zCDP ⇒ (ε, δ)-DP, by the tight conversion (see composition.zcdp_to_dp)."""
    return zcdp_to_dp(rho, delta).epsilon


def discrete_gaussian_sigma(epsilon: float, delta: float, l2_sensitivity: float, l0: int = 1) -> float:
    """Smallest σ of the discrete Gaussian meeting (ε, δ) (see the module docstring)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    l2 = check_sensitivity(l2_sensitivity, "l2_sensitivity")
    l0 = check_positive_int(l0, "l0")
    start = analytic_gaussian_sigma(epsilon, delta, l2)
    if _exact_curve_applies(NoiseKind.DISCRETE_GAUSSIAN, l0, l2, start):
        from dp_accounting.pld import privacy_loss_mechanism as plm

        def exact_delta(sigma):
            return plm.DiscreteGaussianPrivacyLoss(sigma, sensitivity=int(l2)).get_delta_for_epsilon(epsilon)

        return _smallest_sigma(exact_delta, delta, start)
    # zCDP route: find the largest rho whose conversion meets (eps, delta).
    lo, hi = 0.0, epsilon
    for _ in range(100):
        mid = (lo + hi) / 2
        if zcdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return max(gaussian_sigma_for_rho(lo, l2), start)


# --------------------------------------------------------------------------- NoiseSpec factories

def grid_for_scale(scale: float) -> float:
    """The power-of-two grid used under a real-valued noise scale: 2^(floor(log2 scale) - 24)."""
    if not 0 < scale < math.inf:
        raise ValueError(f"a noise scale of {scale:.3g} has no grid: epsilon is too small (or "
                         "too large) for the sensitivity")
    grid = math.ldexp(1.0, math.floor(math.log2(scale)) - GRID_BITS)
    if grid == 0 or not math.isfinite(grid):
        raise ValueError(f"a noise scale of {scale:.3g} has no grid in double precision: "
                         "epsilon is too large (or too small) for the sensitivity")
    return grid


def round_up_scale(scale: float) -> float:
    """Discrete Laplace scales are sampled as t / 2^20 with integer t: round up (more private)."""
    try:
        return math.ceil(math.ldexp(scale, SCALE_FRACTION_BITS)) / 2 ** SCALE_FRACTION_BITS
    except (OverflowError, ValueError):
        raise ValueError(f"a noise scale of {scale:.3g} overflows: epsilon is too small for the "
                         "sensitivity") from None


def calibrate(kind, *, epsilon: float, delta: float = 0.0, l1_sensitivity: float = None,
              l2_sensitivity: float = None, l0: int = 1, multi_key_pld: bool = True) -> NoiseSpec:
    """Calibrate ``kind`` for (ε, δ) and the query's sensitivity.

    Laplace kinds need ``l1_sensitivity``; Gaussian kinds need ``l2_sensitivity`` and δ > 0.
    ``l0`` is the number of output coordinates one privacy unit can change (for the grid
    adjustment of real-valued kinds and the discrete Gaussian's multivariate bound).
    ``multi_key_pld=False`` skips the multi-key discrete Gaussian's PLD (the zCDP route's σ, never
    smaller: for searches that only need an upper bound on the variance, cheaply).
    """
    kind = NoiseKind.parse(kind)
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=not kind.is_gaussian)
    l0 = check_positive_int(l0, "l0")
    if kind.is_gaussian:
        if l2_sensitivity is None:
            raise ValueError(f"l2_sensitivity is required for {kind.value} noise")
        l2 = check_sensitivity(l2_sensitivity, "l2_sensitivity")
        if kind is NoiseKind.DISCRETE_GAUSSIAN:
            unit_sens = math.ceil(l2) if l0 == 1 else l2
            sigma = discrete_gaussian_sigma(epsilon, delta, unit_sens, l0)
            exact = _exact_curve_applies(kind, l0, unit_sens, analytic_gaussian_sigma(epsilon, delta, unit_sens))
            patterns = _multi_key_patterns(kind, l0, l2, l1_sensitivity, sigma) \
                if multi_key_pld else None
            if patterns is not None:  # the multi-key PLD: below the zCDP sigma where tighter
                pld_sigma = _multi_key_sigma(epsilon, delta, patterns, start=sigma)
                exact = pld_sigma < sigma
                sigma = min(sigma, pld_sigma)
            return NoiseSpec(kind=kind, epsilon=epsilon, delta=delta, scale=sigma, granularity=1.0,
                             l1_sensitivity=l1_sensitivity, l2_sensitivity=l2, l0=l0,
                             unit_sensitivity=unit_sens, unit_scale=sigma,
                             accountant="pld" if exact else "zcdp")
        grid = grid_for_scale(analytic_gaussian_sigma(epsilon, delta, l2))
        unit_sens = math.ceil(l2 / grid + math.sqrt(l0))
        unit_sigma = analytic_gaussian_sigma(epsilon, delta, unit_sens)
        return NoiseSpec(kind=kind, epsilon=epsilon, delta=delta, scale=unit_sigma * grid,
                         granularity=grid, l1_sensitivity=l1_sensitivity, l2_sensitivity=l2, l0=l0,
                         unit_sensitivity=unit_sens, unit_scale=unit_sigma)
    if l1_sensitivity is None:
        raise ValueError(f"l1_sensitivity is required for {kind.value} noise")
    l1 = check_sensitivity(l1_sensitivity, "l1_sensitivity")
    if kind is NoiseKind.DISCRETE_LAPLACE:
        unit_sens = math.ceil(l1)
        unit_scale = round_up_scale(unit_sens / epsilon)
        return NoiseSpec(kind=kind, epsilon=epsilon, delta=delta, scale=unit_scale, granularity=1.0,
                         l1_sensitivity=l1, l2_sensitivity=l2_sensitivity, l0=l0,
                         unit_sensitivity=unit_sens, unit_scale=unit_scale)
    grid = grid_for_scale(l1 / epsilon)
    unit_sens = math.ceil(l1 / grid) + l0
    unit_scale = round_up_scale(unit_sens / epsilon)
    return NoiseSpec(kind=kind, epsilon=epsilon, delta=delta, scale=unit_scale * grid, granularity=grid,
                     l1_sensitivity=l1, l2_sensitivity=l2_sensitivity, l0=l0,
                     unit_sensitivity=unit_sens, unit_scale=unit_scale)


def calibrate_zcdp(kind, *, rho: float, l2_sensitivity: float, l0: int = 1,
                   delta_for_reporting: float = 1e-9,
                   l1_sensitivity: Optional[float] = None, multi_key_pld: bool = True) -> NoiseSpec:
    """Gaussian kinds calibrated for ρ-zCDP: σ = Δ2/√(2ρ).

    The spec's (epsilon, delta) is the tight conversion at ``delta_for_reporting``; the spec's
    ``rho`` is what composition under zCDP uses. ``l1_sensitivity`` (optional) bounds the
    shifts of a multi-key discrete Gaussian (:func:`shift_patterns`; default sqrt(l0)·L2);
    ``multi_key_pld=False`` states such a spec by the zCDP route only (σ is the same).
    """
    kind = NoiseKind.parse(kind)
    if not kind.is_gaussian:
        raise ValueError(f"zCDP calibration is for Gaussian kinds, got {kind.value}")
    rho = check_rho(rho)
    l2 = check_sensitivity(l2_sensitivity, "l2_sensitivity")
    l0 = check_positive_int(l0, "l0")
    if kind is NoiseKind.DISCRETE_GAUSSIAN:
        unit_sens = int(l2) if l0 == 1 and float(l2).is_integer() else l2
        sigma = gaussian_sigma_for_rho(rho, l2)
        eps, accountant = _stated_epsilon(kind, rho, delta_for_reporting, l0, unit_sens, sigma,
                                          l1_sensitivity, multi_key_pld)
        return NoiseSpec(kind=kind, epsilon=eps, delta=delta_for_reporting, scale=sigma, granularity=1.0,
                         l1_sensitivity=l1_sensitivity, l2_sensitivity=l2, l0=l0, rho=rho,
                         unit_sensitivity=unit_sens, unit_scale=sigma, accountant=accountant)
    grid = grid_for_scale(gaussian_sigma_for_rho(rho, l2))
    unit_sens = math.ceil(l2 / grid + math.sqrt(l0))
    unit_sigma = gaussian_sigma_for_rho(rho, unit_sens)
    eps, accountant = _stated_epsilon(kind, rho, delta_for_reporting, l0, unit_sens, unit_sigma)
    return NoiseSpec(kind=kind, epsilon=eps, delta=delta_for_reporting, scale=unit_sigma * grid,
                     granularity=grid, l2_sensitivity=l2, l0=l0, rho=rho,
                     unit_sensitivity=unit_sens, unit_scale=unit_sigma, accountant=accountant)


def _stated_epsilon(kind: NoiseKind, rho: float, delta: float, l0: int, unit_sensitivity,
                    unit_scale: float, l1_sensitivity: Optional[float] = None,
                    multi_key_pld: bool = True) -> tuple[float, str]:
    """A ρ-calibrated Gaussian's ε at ``delta`` and the accountant stating it: the smaller of the
    zCDP conversion and, where it applies, the exact privacy curve -- for a multi-key discrete
    Gaussian the worst case over its shift patterns (module docstring) -- (issue 39: the zCDP
    route stated Gaussian releases 5-8% above their true ε)."""
    zcdp = zcdp_to_epsilon(rho, delta)
    patterns = _multi_key_patterns(kind, l0, unit_sensitivity, l1_sensitivity, unit_scale) \
        if multi_key_pld else None
    if patterns is not None:
        exact = multi_key_discrete_gaussian_epsilon(unit_scale, delta, patterns)
        return (exact, "pld") if exact < zcdp else (zcdp, "zcdp")
    if not _exact_curve_applies(kind, l0, unit_sensitivity, unit_scale):
        return zcdp, "zcdp"
    if kind is NoiseKind.GAUSSIAN:
        exact = gaussian_epsilon(unit_scale, delta, unit_sensitivity)
    else:
        exact = discrete_gaussian_epsilon(unit_scale, delta, int(unit_sensitivity))
    return (exact, "pld") if exact < zcdp else (zcdp, "zcdp")
