"""Error columns: a released value's noise standard deviation and 95% interval, beside it.

Every job's released tables use one naming rule (:func:`names`): after a noisy column ``<name>``,
``<name>_std`` (the standard deviation of the noise in it), ``<name>_ci95_low`` and
``<name>_ci95_high`` (the value minus and plus the noise's symmetric 95% half-width), all
float64. For additive noise they are functions of the released value and of the *stated* noise
distribution only (its kind and scale, public in the release's measures), never of data: they
cost no budget and say nothing a reader could not compute from ``RELEASE.json`` (randomized
response's approximate intervals, below, are functions of released values only). The maths is
the noise spec's own (:meth:`accounting.calibration.NoiseSpec.std` and ``ci_halfwidth``): this
module only scales and places it. A value ``a x + c`` of one noisy answer ``x`` (a rescaled sum, a sum plus a public
constant) has ``|a|`` times its noise's std and half-width (:func:`scaled`).

Where a released number's error depends on the data, no interval of *guaranteed* coverage
follows from public information alone. For the debiased estimators of randomized response -- local-DP
frequency estimates (:mod:`transforms.ldp.estimators`), ARA event-level conversion counts
(:mod:`transforms.ara.event_debias`) and label-DP class counts (:mod:`transforms.ldp.labels`) --
the jobs release the standard *approximate* interval instead (:func:`plug_in_interval`): the
estimator's variance formula with released values plugged in for the unknown truth (the
estimate clipped to the quantity's range; ARA's unbiased variance estimate from the released
reports), its square root as ``<c>_std``, and ``<c> -/+ 1.96 <c>_std`` as ``<c>_ci95_low`` /
``<c>_ci95_high`` (a normal approximation), clipped to that range. It is post-processing of
privatised outputs (no budget), but its coverage is approximate: near 95% when the estimate sums
many reports (central limit theorem) and the plug-in variance is close to the variance at the
truth -- the coverage tests check 93-97% on synthetic data of known truth -- and lower for a
count of a few reports, where the estimator is skewed. The output's ``errors`` statement
(``RELEASE.json``, the catalog) says so, and names its assumptions
(:func:`approximate_statement`). A sketch's estimate or a model trained on noisy gradients has no
such formula: there the job says so instead of inventing an interval. Every interval describes
the noise only, never the bias of contribution bounding or clamping.

DPAggregate's counts and sums use :func:`output_columns`; its means, variances and standard
deviations derive their errors from several noisy answers (:func:`transforms.metrics.mean_error`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

#: The level of every released interval.
LEVEL = 0.95
#: The standard normal's 97.5% quantile: a normal-approximation 95% interval is +/- Z95 std.
Z95 = 1.959963984540054
#: Error-column suffixes, in their column order after the value.
SUFFIXES = ("_ci95_low", "_ci95_high", "_std")


def names(column: str) -> tuple:
    """The error columns of ``column``, in order: ``(<c>_ci95_low, <c>_ci95_high, <c>_std)``."""
    return tuple(column + suffix for suffix in SUFFIXES)


def base_column(name: str, columns: Sequence[str]) -> Optional[str]:
    """The value column an error column ``name`` belongs to (one of ``columns``), else None."""
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name[:-len(suffix)] in columns:
            return name[:-len(suffix)]
    return None


@dataclass(frozen=True, kw_only=True)
class NoiseError:
    """The public error of one released value: its noise's ``std`` and the ``halfwidth`` h with
    P(|noise| <= h) >= 95%."""

    std: float
    halfwidth: float

    @classmethod
    def of(cls, spec, scale: float = 1.0) -> "NoiseError":
        """The error of ``scale x + c``, ``x`` one answer noised by ``spec`` (a NoiseSpec)."""
        std = spec.std
        if not math.isfinite(std):    # a scale past double precision: the release layer refuses
            return cls(std=math.inf, halfwidth=math.inf)   # the measure, naming it
        return scaled(cls(std=std, halfwidth=spec.ci_halfwidth(LEVEL)), scale)

    def describe(self, column: str, what: str) -> str:
        """A statement for a release's metadata: which columns, and from what."""
        low, high, std = names(column)
        return (f"{std} = {self.std:.6g} and {low}/{high} = {column} -/+ {self.halfwidth:.6g}: "
                f"{what} (public: from the stated noise distribution, not from data); they "
                "describe the noise only, not the bias of bounding or clamping")


def scaled(error: NoiseError, scale: float) -> NoiseError:
    """The error of ``scale x + c`` given ``x``'s."""
    a = abs(float(scale))
    return NoiseError(std=error.std * a, halfwidth=error.halfwidth * a)


def combination(spec, coefficients) -> NoiseError:
    """The error of ``sum_i a_i x_i + c``, each ``x_i`` an independent answer noised by ``spec``:
    std ``||a||_2`` times the noise's; half-width a union bound, ``||a||_1`` times the noise's
    half-width at level ``1 - 5% / k`` (k nonzero terms; k = 1: :func:`scaled`, exact)."""
    a = np.abs(np.asarray(coefficients, dtype=np.float64))
    k = max(int(np.count_nonzero(a)), 1)
    return NoiseError(std=float(spec.std * np.sqrt(np.sum(a * a))),
                      halfwidth=float(np.sum(a) * spec.ci_halfwidth(1 - (1 - LEVEL) / k)))


def binomial(trials: int, probability: float) -> NoiseError:
    """The error of ``B - trials p`` (centred Binomial(trials, p) noise, the shuffle model's
    summed noise shares): std ``sqrt(trials p (1 - p))``; half-width the larger distance from the
    mean to the binomial's 2.5% and 97.5% quantiles (the interval between them holds at least
    95%, so the symmetric one around the mean that contains it does too)."""
    from scipy import stats  # lazily, as NoiseSpec.ci_halfwidth does

    mean = trials * probability
    tail = (1 - LEVEL) / 2
    low, high = stats.binom.ppf([tail, 1 - tail], trials, probability)
    return NoiseError(std=float(np.sqrt(trials * probability * (1 - probability))),
                      halfwidth=float(max(mean - low, high - mean)))


def arrays(values, std, halfwidth):
    """``(low, high, std)`` float64 arrays beside ``values`` (one per value; ``std`` and
    ``halfwidth`` scalars or per-value arrays); NaN where a value is NaN."""
    v = np.asarray(values, dtype=np.float64)
    half = np.broadcast_to(np.asarray(halfwidth, dtype=np.float64), v.shape)
    s = np.where(np.isnan(v), np.nan, np.broadcast_to(np.asarray(std, dtype=np.float64), v.shape))
    return v - half, v + half, s


def _part(noisy, *, source, error, part):
    return arrays(source.values(noisy), error.std, error.halfwidth)[part]


def output_columns(released, error: NoiseError) -> list:
    """The three :class:`~transforms.release.OutputColumn` of ``released`` (an OutputColumn of
    the release stage) with ``error``: each ``follows`` it, so a suppressed value's error
    columns are null too."""
    from transforms.release import OutputColumn

    return [OutputColumn(name=name, follows=released.name,
                         derive=functools.partial(_part, source=released, error=error, part=part))
            for part, name in zip((0, 1, 2), names(released.name))]


def plug_in_interval(values, std, *, low=-math.inf, high=math.inf):
    """``(low, high)`` float64 arrays of the approximate 95% interval ``values -/+ Z95 std``
    (``std`` the plug-in standard deviation, scalar or per value: the module docstring), clipped
    to the estimated quantity's range ``[low, high]`` (scalars or per value; the truth lies in
    it, so clipping never loses coverage); NaN where a value or its std is NaN (NaN passes
    through :func:`arrays` and the clip)."""
    lower, upper, _ = arrays(values, std, Z95 * np.asarray(std, dtype=np.float64))
    with np.errstate(invalid="ignore"):
        return np.clip(lower, low, high), np.clip(upper, low, high)


#: The words every :func:`approximate_statement` carries: how a reader of ``errors`` statements
#: (the catalog) tells a plug-in interval from one of the stated noise's.
APPROXIMATE = "APPROXIMATE 95% interval"


def approximate_statement(column: str, std: str, assumptions: str, clipped_to: str) -> str:
    """The ``errors`` statement of a value released with a plug-in interval
    (:func:`plug_in_interval`): which columns, how the std is computed (``std``), the range the
    interval is clipped to and the approximation's ``assumptions``."""
    low, high, std_column = names(column)
    return (f"{low}/{high} = {column} -/+ 1.96 {std_column}, clipped to {clipped_to}: an "
            f"{APPROXIMATE} (plug-in variance, normal approximation), not one of "
            f"guaranteed coverage. {std_column} is {std}. The interval assumes {assumptions}; "
            "its coverage is near 95% when that holds (tested on synthetic data of known truth) "
            "and lower for counts of a few reports, where the estimator is skewed. Computed from "
            "released values only (post-processing: no budget); it describes the randomization "
            "only, not the bias of bounding or clamping")
