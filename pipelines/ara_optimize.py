"""Choosing clip thresholds and the budget split of ARA summary reports from training data.

Error metric (Aksu et al., PoPETs 2024): for query q and slice s with true value x and estimate
Y, ``RMSRE_tau = sqrt(E[((Y - x) / max(tau_q, x))^2])``; the error of a configuration is the
root mean square over queries of the per-query RMS over the non-empty slices. ``tau_q`` is 5 x
the median of the measure's per-conversion values in the training data (5 for counts).

Closed form used for optimisation (``expected_error``): with per-report budget ``b_q``, clip
``C_m`` and K reports per source sure to fit, the reconstructed estimate has

* bias = sum over the slice's conversions of rank < K of min(v, C_m), minus x (clipping plus
  the conversions algorithm C would drop once K full-budget reports are in, a conservative
  model: C keeps later reports whenever earlier ones rounded down enough);
* variance = (C_m / b_q)^2 (Var[DLap(65536 / eps)] + n_s / 6), the discrete Laplace noise plus
  randomized rounding (variance f(1 - f) per contribution, 1/6 on average over f ~ U[0, 1)).

For fixed C and K the noise term of query q is ``A_q / share_q^2`` so the best shares are
proportional to ``A_q^(1/3)``; for fixed shares the error is convex in each C_m. The optimiser
alternates those two exact steps, polishes jointly with SLSQP (the problem is not jointly
convex, so the better of the two is kept) and scans K. ``simulate_error`` instead runs
algorithms A, C, S and R for real (numpy randomness, exact discrete Laplace sampler) on held-out
data. Simulations use a numpy Generator and are never release noise.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import optimize as sopt

from transforms.ara.contribution import (CONTRIBUTION_BUDGET, ContributionConfig,
                                         bound_ranked_contributions, contribution_vectors,
                                         rank_within_source, split_budget)
from transforms.ara.hierarchy import tree_consistency
from transforms.ara.summary import MAX_EPSILON, summary_noise_variance

TAU_MULTIPLIER = 5.0
_ROUNDING_VARIANCE = 1.0 / 6.0


@dataclasses.dataclass
class Workload:
    """Conversions prepared for error evaluation of one query family.

    values: (n, M) non-negative measure values; source_index: dense source ids; rank: position
    of each conversion within its source; codes: (n, L) slice code per level; level_sizes: the
    declared number of slices per level; fanouts: children per node going down the levels.
    """

    measures: tuple[str, ...]
    values: np.ndarray
    source_index: np.ndarray
    rank: np.ndarray
    codes: np.ndarray
    level_sizes: tuple[int, ...]
    slice_dimensions: tuple[int, ...]
    prefixes: tuple[int, ...]

    def __post_init__(self):
        self._cache = {}
        if (self.values < 0).any() or not np.isfinite(self.values).all():
            raise ValueError("workload values must be finite and non-negative")
        self.truth = []   # truth[l]: (size_l, M) true sums
        self.counts = []  # counts[l]: (size_l,) conversions per slice
        for l, size in enumerate(self.level_sizes):
            c = self.codes[:, l]
            self.counts.append(np.bincount(c, minlength=size))
            self.truth.append(np.stack([np.bincount(c, weights=self.values[:, m], minlength=size)
                                        for m in range(self.n_measures)], axis=1))

    @property
    def n_measures(self) -> int:
        return self.values.shape[1]

    @property
    def n_levels(self) -> int:
        return len(self.level_sizes)

    @property
    def max_reports_per_source(self) -> int:
        return int(self.rank.max()) + 1 if self.rank.size else 1

    def nonempty(self, level: int) -> np.ndarray:
        return self.counts[level] > 0

    def fanouts(self) -> list[int]:
        out = [1]
        for l in range(1, self.n_levels):
            out.append(self.level_sizes[l] // self.level_sizes[l - 1])
        return out

    def kept_counts(self, k: int) -> list[np.ndarray]:
        key = ("n", k)
        if key not in self._cache:
            kept = self.rank < k
            self._cache[key] = [np.bincount(self.codes[kept, l], minlength=s)
                                for l, s in enumerate(self.level_sizes)]
        return self._cache[key]

    def kept_values(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Values and codes of the conversions of rank < k."""
        key = ("v", k)
        if key not in self._cache:
            kept = self.rank < k
            self._cache[key] = (self.values[kept], self.codes[kept])
        return self._cache[key]


def workload_from_conversions(data, prefixes: Sequence[int] | None = None,
                              measures: tuple[str, ...] = ("count", "value")) -> Workload:
    """A workload over ``ConversionData`` (see ``synthetic``); default: flat finest slicing."""
    dims = tuple(data.dimensions)
    prefixes = tuple(prefixes) if prefixes is not None else (len(dims),)
    if list(prefixes) != sorted(prefixes):
        raise ValueError("prefixes must be ascending (root to leaves)")
    probe = ContributionConfig(measures=measures, clip_thresholds=(1.0,) * len(measures),
                               slice_dimensions=dims, prefixes=prefixes,
                               budgets=((1,) * len(measures),) * len(prefixes))
    columns = {"count": data.count.astype(np.float64), "value": data.value}
    values = np.column_stack([columns[m] for m in measures])
    _, src = np.unique(data.source_id, return_inverse=True)
    return Workload(measures=measures, values=np.maximum(values, 0.0), source_index=src,
                    rank=rank_within_source(src, data.order), codes=probe.slice_codes(data.features),
                    level_sizes=tuple(probe.level_sizes()), slice_dimensions=dims, prefixes=prefixes)


def taus_from_training(train: Workload) -> np.ndarray:
    """tau per measure: 5 x the median per-conversion value in the training data."""
    med = np.median(train.values, axis=0)
    return TAU_MULTIPLIER * np.where(med > 0, med, 1.0)


@dataclasses.dataclass(frozen=True)
class Parameters:
    """Continuous parameters: clip per measure, budget shares (levels, measures) summing to 1,
    and K reports per source; ``to_config`` rounds them to ARA's integer budgets."""

    clip: np.ndarray
    shares: np.ndarray
    reports_per_source: int

    def budgets(self) -> np.ndarray:
        """Per-report budgets; continuous for the closed form (their sum is 65536 / K)."""
        return self.shares * (CONTRIBUTION_BUDGET / self.reports_per_source)

    def to_config(self, workload: Workload) -> ContributionConfig:
        b = split_budget(self.shares.ravel(), self.reports_per_source).reshape(self.shares.shape)
        return ContributionConfig(measures=workload.measures,
                                  clip_thresholds=tuple(float(c) for c in self.clip),
                                  slice_dimensions=workload.slice_dimensions,
                                  prefixes=workload.prefixes,
                                  budgets=tuple(tuple(int(x) for x in row) for row in b),
                                  reports_per_source=self.reports_per_source)


def _check_epsilon(epsilon: float) -> float:
    if not 0 < epsilon <= MAX_EPSILON:
        raise ValueError(f"epsilon must be in (0, {MAX_EPSILON:g}], got {epsilon}")
    return float(epsilon)


def _clip_bias_terms(w: Workload, k: int, measure: int, clip: float) -> list[np.ndarray]:
    """Per level: squared bias over max(tau, x)^2 is computed by the caller; here the biases."""
    vals, codes = w.kept_values(k)
    clipped = np.minimum(vals[:, measure], clip)
    return [np.bincount(codes[:, l], weights=clipped, minlength=size) - w.truth[l][:, measure]
            for l, size in enumerate(w.level_sizes)]


def _noise_coefficients(w: Workload, k: int, taus: np.ndarray, epsilon: float,
                        clip: np.ndarray) -> np.ndarray:
    """A[l, m]: mean over non-empty slices of the variance term with share 1, over denominators.

    Variance of query (l, m) = A[l, m] / share[l, m]^2 after dividing by max(tau, x)^2.
    """
    noise = summary_noise_variance(epsilon)
    nk = w.kept_counts(k)
    per_report = CONTRIBUTION_BUDGET / k
    out = np.empty((w.n_levels, w.n_measures))
    for l in range(w.n_levels):
        ne = w.nonempty(l)
        for m in range(w.n_measures):
            denom = np.maximum(taus[m], w.truth[l][ne, m]) ** 2
            var_units = noise + _ROUNDING_VARIANCE * nk[l][ne]
            out[l, m] = np.mean(var_units / denom) * (clip[m] / per_report) ** 2
    return out


def _measure_bias_term(w: Workload, k: int, taus: np.ndarray, measure: int,
                       clip: float) -> np.ndarray:
    """Per level: mean over non-empty slices of bias^2 / max(tau, x)^2."""
    biases = _clip_bias_terms(w, k, measure, clip)
    out = np.empty(w.n_levels)
    for l in range(w.n_levels):
        ne = w.nonempty(l)
        out[l] = np.mean(biases[l][ne] ** 2 / np.maximum(taus[measure], w.truth[l][ne, measure]) ** 2)
    return out


def expected_error(w: Workload, params: Parameters, taus: np.ndarray, epsilon: float) -> float:
    """Closed-form RMSRE_tau of a configuration on a workload (see the module docstring)."""
    epsilon = _check_epsilon(epsilon)
    k = params.reports_per_source
    a = _noise_coefficients(w, k, taus, epsilon, params.clip)
    bias = np.stack([_measure_bias_term(w, k, taus, m, params.clip[m])
                     for m in range(w.n_measures)], axis=1)
    return float(math.sqrt(np.mean(bias + a / params.shares ** 2)))


def _best_shares(a: np.ndarray) -> np.ndarray:
    s = np.cbrt(a)
    return s / s.sum()


def _clip_bounds(w: Workload, m: int) -> tuple[float, float]:
    v = w.values[:, m]
    pos = v[v > 0]
    if pos.size == 0:
        return 1.0, 1.0
    return float(pos.min()), float(pos.max())


def _alternate(w: Workload, k: int, taus: np.ndarray, epsilon: float, clip0: np.ndarray,
               iterations: int = 25, tol: float = 1e-7) -> tuple[Parameters, float]:
    clip = clip0.astype(np.float64).copy()
    shares = _best_shares(_noise_coefficients(w, k, taus, epsilon, clip))
    prev = math.inf
    for _ in range(iterations):
        for m in range(w.n_measures):
            lo, hi = _clip_bounds(w, m)
            if hi <= lo:
                clip[m] = hi
                continue
            noise_share = (_noise_coefficients(w, k, taus, epsilon, np.ones(w.n_measures))[:, m]
                           / shares[:, m] ** 2)

            def f(log_c, m=m, noise_share=noise_share):
                c = math.exp(log_c)
                return float(np.sum(_measure_bias_term(w, k, taus, m, c) + noise_share * c * c))

            res = sopt.minimize_scalar(f, bounds=(math.log(lo), math.log(hi)), method="bounded",
                                       options={"xatol": 1e-4})
            clip[m] = math.exp(res.x)
        shares = _best_shares(_noise_coefficients(w, k, taus, epsilon, clip))
        err = expected_error(w, Parameters(clip, shares, k), taus, epsilon)
        if prev - err <= tol * prev:
            break
        prev = err
    params = Parameters(clip, shares, k)
    return params, expected_error(w, params, taus, epsilon)


def _slsqp(w: Workload, k: int, taus: np.ndarray, epsilon: float,
           start: Parameters) -> tuple[Parameters, float]:
    """Joint SLSQP polish over (shares, log C) for fixed K (the paper's optimiser)."""
    shape = start.shares.shape
    nq = start.shares.size
    bounds = [(1e-9, 1.0)] * nq + [tuple(math.log(b) for b in _clip_bounds(w, m))
                                   for m in range(w.n_measures)]

    def unpack(z):
        return Parameters(np.exp(z[nq:]), np.asarray(z[:nq]).reshape(shape) / np.sum(z[:nq]), k)

    def objective(z):
        return expected_error(w, unpack(z), taus, epsilon) ** 2

    z0 = np.concatenate([start.shares.ravel(), np.log(start.clip)])
    z0[nq:] = np.clip(z0[nq:], [b[0] for b in bounds[nq:]], [b[1] for b in bounds[nq:]])
    res = sopt.minimize(objective, z0, method="SLSQP", bounds=bounds,
                        constraints=[{"type": "eq", "fun": lambda z: np.sum(z[:nq]) - 1.0}],
                        options={"maxiter": 100, "ftol": 1e-10})
    params = unpack(res.x)
    return params, expected_error(w, params, taus, epsilon)


def optimize_parameters(train: Workload, epsilon: float, taus: np.ndarray | None = None,
                        k_candidates: Sequence[int] | None = None,
                        polish: bool = True) -> tuple[Parameters, float]:
    """Parameters minimising the closed-form RMSRE_tau on ``train``; returns (params, error).

    K is scanned over ``k_candidates`` (default 1 .. the 99.9th percentile of reports per source
    in training data, stopping once the error has risen for 3 consecutive K).
    """
    epsilon = _check_epsilon(epsilon)
    taus = taus_from_training(train) if taus is None else np.asarray(taus, dtype=np.float64)
    if k_candidates is None:
        per_source = np.bincount(train.source_index)
        k_max = max(1, int(np.ceil(np.quantile(per_source, 0.999))))
        k_candidates = range(1, k_max + 1)
    clip0 = np.array([np.quantile(train.values[:, m], 0.99) or 1.0
                      for m in range(train.n_measures)])
    best, best_err, rises = None, math.inf, 0
    for k in k_candidates:
        params, err = _alternate(train, int(k), taus, epsilon, clip0)
        if polish:
            p2, e2 = _slsqp(train, int(k), taus, epsilon, params)
            if e2 < err:
                params, err = p2, e2
        if err < best_err:
            best, best_err, rises = params, err, 0
        else:
            rises += 1
            if rises >= 3:
                break
        clip0 = params.clip
    return best, best_err


def baseline_parameters(train: Workload, percentile: float) -> Parameters:
    """Baseline: equal budget split over all queries; each clip threshold, and K, the given
    percentile of the training values (of the conversions per source for K)."""
    clip = np.array([np.percentile(train.values[:, m], percentile) for m in range(train.n_measures)])
    clip = np.where(clip > 0, clip, 1.0)
    per_source = np.bincount(train.source_index)
    k = max(1, int(np.ceil(np.percentile(per_source, percentile))))
    shares = np.full((train.n_levels, train.n_measures), 1.0 / (train.n_levels * train.n_measures))
    return Parameters(clip, shares, k)


def sample_discrete_laplace(rng: np.random.Generator, scale: float, size) -> np.ndarray:
    """Exact DLap(scale) as a difference of two geometric variables (simulation only)."""
    p = math.exp(-1.0 / scale)
    return rng.geometric(1.0 - p, size) - rng.geometric(1.0 - p, size)


def simulate_error(test: Workload, config: ContributionConfig, taus: np.ndarray, epsilon: float,
                   rng: np.random.Generator, repetitions: int = 20,
                   consistency: bool = False) -> float:
    """RMSRE_tau of running algorithms A, C, S, R ``repetitions`` times on ``test``.

    Each repetition draws fresh randomized rounding and fresh summary noise over every declared
    bucket; with ``consistency`` the reconstructed estimates of each measure are made
    tree-consistent (``hierarchy.tree_consistency``) before measuring. The error is the root
    mean square over queries of the root mean square over repetitions and non-empty slices.
    """
    epsilon = _check_epsilon(epsilon)
    budgets = config.budget_array
    clip = config.clip_array
    scale = CONTRIBUTION_BUDGET / epsilon
    noise_var = summary_noise_variance(epsilon)
    factors = clip[None, :] / budgets  # algorithm R's C / b per query
    sq = np.zeros((test.n_levels, test.n_measures))
    fanouts = test.fanouts()
    for _ in range(repetitions):
        u = rng.random((len(test.rank),) + budgets.shape)
        contrib = contribution_vectors(test.values, clip, budgets, u)
        keep = bound_ranked_contributions(test.source_index, test.rank,
                                          contrib.sum(axis=(1, 2)))
        estimates = [[None] * test.n_measures for _ in range(test.n_levels)]
        for l, size in enumerate(test.level_sizes):
            codes = test.codes[keep, l]
            for m in range(test.n_measures):
                sums = np.bincount(codes, weights=contrib[keep, l, m], minlength=size)
                noisy = sums + sample_discrete_laplace(rng, scale, size)
                estimates[l][m] = noisy * factors[l, m]
        if consistency and test.n_levels > 1:
            for m in range(test.n_measures):
                col = tree_consistency([estimates[l][m] for l in range(test.n_levels)],
                                       [noise_var * factors[l, m] ** 2
                                        for l in range(test.n_levels)], fanouts)
                for l in range(test.n_levels):
                    estimates[l][m] = col[l]
        for l in range(test.n_levels):
            ne = test.nonempty(l)
            for m in range(test.n_measures):
                x = test.truth[l][ne, m]
                rel = (estimates[l][m][ne] - x) / np.maximum(taus[m], x)
                sq[l, m] += np.mean(rel ** 2)
    return float(math.sqrt(np.mean(sq / repetitions)))
