"""Private key (partition) selection, for aggregations without a public keyset.

Releasing a key that only one privacy unit contributed to would reveal that unit, so without a
public keyset the set of released keys must itself be differentially private. Each strategy
decides per key from its exact number of (bounded) privacy units n. Below, L0 is the number of
keys whose n one neighbouring change can move, each by one (:func:`changed_keys`): a bounded
unit touches at most min(L0, L1) keys, so adding or removing it moves that many; *replacing* it
(``Neighbouring.SUBSTITUTE``) removes it from up to min(L0, L1) keys and adds its replacement to
up to as many others, so 2·min(L0, L1) keys move and every strategy is calibrated for twice the
keys. Each strategy spends (epsilon, delta) of the budget:

* ``TRUNCATED_GEOMETRIC``: the optimal keep-probabilities of Desfontaines, Voss, Gipson &
  Mandayam ("Differentially private partition selection", PoPETs 2022) for a per-key budget
  (eps', delta'): pi(0) = 0, pi(n) = min(e^eps' pi(n-1) + delta', 1 - e^-eps' (1 - pi(n-1) -
  delta'), 1). At L0 = 1, (eps', delta') = (epsilon, delta): the published optimum, the same
  curve as PipelineDP's (Google's "magic" partition selection). At L0 > 1 PipelineDP splits the
  budget by basic composition, (epsilon/L0, delta/L0); here (eps', delta') is the better of that
  split and the per-key budgets whose L0-fold *optimal* composition (Kairouz, Oh & Viswanath
  2015; every (eps', delta')-DP mechanism is dominated by the canonical pair, composed by
  ``dp_accounting``'s PLD with pessimistic discretisation) fits (epsilon, delta)
  (:func:`per_key_budget`). One neighbouring change moves at most L0 keys' counts, each key's
  decision is its own (eps', delta')-DP mechanism with independent randomness, so the decisions
  compose over those L0 keys. The basic split stays best up to about ten keys; at 20-50 keys the
  composed budget lowers the count kept with probability 1/2 by 14-40%.
* ``LAPLACE_THRESHOLDING``: keep if n + Lap(L0/eps) > tau, tau = 1 + (L0/eps) ln(L0 / (2 delta))
  (a key with one unit is kept with probability delta/L0).
* ``GAUSSIAN_THRESHOLDING``: keep if n + N(0, sigma^2) > tau with sigma the analytic Gaussian
  for L2 = sqrt(L0) at (eps, delta/2), tau = 1 + sigma * Phi^-1(1 - delta / (2 L0)).

The random decisions come from the release's keyed streams (purpose "key_selection"), so a re-run
keeps the same keys.
"""
from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

import numpy as np

from accounting.calibration import NoiseKind, calibrate
from accounting.distributions import (discrete_gaussian_quantile, discrete_gaussian_upper_tail,
                                      discrete_laplace_quantile)
from accounting.sensitivity import ContributionBounds, Neighbouring, privacy_unit_count_sensitivity
from accounting.validation import check_delta, check_epsilon, check_positive_int
from transforms.noise import RandomStreams, add_noise


class SelectionStrategy(str, enum.Enum):
    TRUNCATED_GEOMETRIC = "truncated_geometric"
    LAPLACE_THRESHOLDING = "laplace_thresholding"
    GAUSSIAN_THRESHOLDING = "gaussian_thresholding"


@dataclass(frozen=True, kw_only=True)
class PrivateSelection:
    """Choose released keys privately; ``weight`` is this step's share of the budget."""

    strategy: SelectionStrategy = SelectionStrategy.TRUNCATED_GEOMETRIC
    weight: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "strategy", SelectionStrategy(self.strategy))
        check_epsilon(self.weight, "selection weight")


def truncated_geometric_probabilities(epsilon: float, delta: float, max_partitions: int) -> np.ndarray:
    """pi[n] for n = 0 .. N, where pi[N] = 1 (every larger n is kept surely), for keys of which
    one neighbouring change moves up to ``max_partitions`` (:func:`per_key_budget`)."""
    return keep_curve(*per_key_budget(epsilon, delta, max_partitions))


def keep_curve(epsilon: float, delta: float) -> np.ndarray:
    """The optimal (epsilon, delta)-DP keep-probabilities of one key (Desfontaines et al. 2022)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    pi = [0.0]
    while pi[-1] < 1.0:
        prev = pi[-1]
        nxt = min(math.exp(epsilon) * prev + delta, 1 - math.exp(-epsilon) * (1 - prev - delta), 1.0)
        if nxt <= prev:  # numerical floor: cannot happen with delta > 0, guard anyway
            nxt = 1.0
        pi.append(nxt)
        if len(pi) > 10_000_000:
            raise ValueError("delta is too small for truncated geometric selection")
    return np.asarray(pi)


def _missed(epsilon: float, delta: float) -> float:
    """sum_n (1 - pi(n)): the expected count a key needs before it is kept (the objective)."""
    return float(np.sum(1.0 - keep_curve(epsilon, delta)))


def _composed_delta(epsilon_key: float, delta_key: float, k: int, epsilon: float) -> float:
    """delta at ``epsilon`` of k (epsilon_key, delta_key)-DP mechanisms composed optimally."""
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    one = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(epsilon_key, delta_key))
    return float(one.self_compose(k).get_delta_for_epsilon(epsilon))


#: Grid of per-key epsilons searched (multiples of epsilon/L0 between 1 and L0).
_FACTORS = 24


@functools.lru_cache(maxsize=256)
def per_key_budget(epsilon: float, delta: float, max_partitions: int) -> tuple[float, float]:
    """The per-key (eps', delta') of truncated geometric selection when one neighbouring change
    moves up to ``max_partitions`` keys: the basic split (epsilon/L0, delta/L0), or a larger eps'
    with the largest delta' whose L0-fold optimal composition is (epsilon, delta)-DP, whichever
    keeps keys at smaller counts (smallest sum_n (1 - pi(n))). Cached: a pure function."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    k = check_positive_int(max_partitions, "max_partitions")
    basic = (epsilon / k, delta / k)
    if k == 1:
        return basic
    best, best_cost = basic, _missed(*basic)
    for factor in np.geomspace(1.0, k, _FACTORS)[1:]:
        eps_key = epsilon / k * float(factor)
        lo = delta / k * 1e-4
        if _composed_delta(eps_key, lo, k, epsilon) > delta:
            break  # a larger eps' leaves even less delta
        hi = delta
        for _ in range(24):  # largest delta' that fits, in log space; keep the fitting end
            mid = math.sqrt(lo * hi)
            if _composed_delta(eps_key, mid, k, epsilon) <= delta:
                lo = mid
            else:
                hi = mid
        cost = _missed(eps_key, lo)
        if cost < best_cost:
            best, best_cost = (eps_key, lo), cost
    return best


def changed_keys(bounds: ContributionBounds, neighbouring=Neighbouring.ADD_REMOVE) -> int:
    """Keys whose privacy-unit count one neighbouring change moves (each by one): min(L0, L1)
    under add/remove, twice that under substitution."""
    return privacy_unit_count_sensitivity(bounds, neighbouring).l0


class Selector:
    """Vectorised keep/drop decisions for one release (pure: no Beam).

    ``max_partitions``: the number of keys one neighbouring change moves (:func:`changed_keys`;
    L0 under add/remove, 2·L0 under substitution), not the bounds' L0 itself.
    """

    @classmethod
    def for_bounds(cls, selection: PrivateSelection, epsilon: float, delta: float,
                   bounds: ContributionBounds, neighbouring=Neighbouring.ADD_REMOVE) -> "Selector":
        """A selector calibrated for ``bounds`` under the stated neighbouring relation."""
        return cls(selection, epsilon, delta, changed_keys(bounds, neighbouring))

    def __init__(self, selection: PrivateSelection, epsilon: float, delta: float, max_partitions: int):
        self.selection = selection
        self.max_partitions = max_partitions
        self.epsilon = check_epsilon(epsilon, "selection epsilon")
        self.delta = check_delta(delta, "selection delta", allow_zero=False)
        strategy = selection.strategy
        if strategy is SelectionStrategy.TRUNCATED_GEOMETRIC:
            #: each key's own (eps', delta') (:func:`per_key_budget`), stated in the explain
            self.per_key = per_key_budget(epsilon, delta, max_partitions)
            self.probabilities = truncated_geometric_probabilities(epsilon, delta, max_partitions)
        elif strategy is SelectionStrategy.LAPLACE_THRESHOLDING:
            self.noise = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=epsilon, l1_sensitivity=max_partitions)
            # Smallest integer m with P(Z >= m) <= delta / L0; keep iff n + Z > m, so a key with
            # a single unit is released with probability at most delta / L0.
            self.threshold = discrete_laplace_quantile(self.noise.unit_scale, delta / max_partitions)
        else:
            self.noise = calibrate(NoiseKind.DISCRETE_GAUSSIAN, epsilon=epsilon, delta=delta / 2,
                                   l2_sensitivity=math.sqrt(max_partitions), l0=max_partitions)
            self.threshold = discrete_gaussian_quantile(self.noise.scale, delta / (2 * max_partitions))

    def keep(self, units: np.ndarray, streams: RandomStreams) -> np.ndarray:
        """Boolean mask of keys to release given their exact privacy-unit counts. Under an exact
        testing key (``streams.noise_free``) the choice is deterministic and monotone in the
        count: thresholding compares the exact count, the truncated geometric keeps a key whose
        keep probability is at least 1/2."""
        units = np.asarray(units, dtype=np.int64)
        if self.selection.strategy is SelectionStrategy.TRUNCATED_GEOMETRIC:
            pi = self.probabilities[np.minimum(units, len(self.probabilities) - 1)]
            if streams.noise_free:
                return pi >= 0.5
            return streams.uniform_float() < pi
        noisy = add_noise(self.noise, units, streams)
        return noisy > self.threshold

    def keep_probability(self, n: int) -> float:
        """P(a key with n units is released), for reports and tests."""
        if self.selection.strategy is SelectionStrategy.TRUNCATED_GEOMETRIC:
            return float(self.probabilities[min(n, len(self.probabilities) - 1)])
        if self.selection.strategy is SelectionStrategy.LAPLACE_THRESHOLDING:
            p = math.exp(-1 / self.noise.unit_scale)
            gap = math.floor(self.threshold - n)  # need noise > threshold - n, i.e. >= gap + 1
            if gap < 0:
                return 1 - (p ** (-gap)) / (1 + p)
            return p ** (gap + 1) / (1 + p)
        m = math.floor(self.threshold - n) + 1  # need Z >= m
        return float(discrete_gaussian_upper_tail(self.noise.scale, m))
