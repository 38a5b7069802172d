"""Sensitivities of the released aggregates, derived from contribution bounds.

A privacy unit (a user, or a block of k impressions) is first bounded to at most ``L0``
partitions, at most ``Linf`` contributions per partition and optionally ``L1`` contributions in
total, with values clamped to ``[min_value, max_value]``. Adding or removing one unit then
changes the vector of per-partition aggregates by at most the sensitivities computed here
(Wilson et al. 2020, "Differentially private SQL with bounded user contribution", section 3;
Amin et al. 2022 for the L0/Linf/L1 bounds). Under substitution (replace one unit) the change is
a removal plus an addition, so every norm at most doubles (triangle inequality).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from accounting.validation import check_finite, check_positive_int


class Neighbouring(str, enum.Enum):
    """Which datasets are neighbours; the value is the text shown in release reports."""

    ADD_REMOVE = "add/remove one privacy unit"
    SUBSTITUTE = "replace one privacy unit"

    @property
    def dp_accounting(self) -> "NeighboringRelation":  # noqa: F821
        """The matching ``dp_accounting`` NeighboringRelation (imported on use: dp_accounting
        takes about a second to import and only accounting needs it)."""
        from dp_accounting.privacy_accountant import NeighboringRelation

        if self is Neighbouring.ADD_REMOVE:
            return NeighboringRelation.ADD_OR_REMOVE_ONE
        return NeighboringRelation.REPLACE_ONE

    @property
    def factor(self) -> int:
        """How much every sensitivity grows relative to add/remove (1 or 2)."""
        return 1 if self is Neighbouring.ADD_REMOVE else 2


@dataclass(frozen=True, kw_only=True)
class ContributionBounds:
    """How much one privacy unit may contribute after bounding.

    max_partitions: L0, partitions (output keys) one unit may touch.
    max_contributions_per_partition: Linf, rows one unit may have in one partition.
    max_contributions: L1, rows one unit may have in total (optional; default L0 * Linf).
    min_value, max_value: clamping range of summed values (only for sum and mean).
    """

    max_partitions: int
    max_contributions_per_partition: int
    max_contributions: int | None = None
    min_value: float | None = None
    max_value: float | None = None

    def __post_init__(self):
        check_positive_int(self.max_partitions, "max_partitions")
        check_positive_int(self.max_contributions_per_partition, "max_contributions_per_partition")
        if self.max_contributions is not None:
            check_positive_int(self.max_contributions, "max_contributions")
        if (self.min_value is None) != (self.max_value is None):
            raise ValueError("min_value and max_value must be given together")
        if self.min_value is not None:
            low = check_finite(self.min_value, "min_value")
            high = check_finite(self.max_value, "max_value")
            if low > high:
                raise ValueError(f"min_value ({low!r}) must not exceed max_value ({high!r})")

    def value_range(self) -> tuple[float, float]:
        if self.min_value is None:
            raise ValueError("min_value and max_value are required for sums and means")
        return float(self.min_value), float(self.max_value)


@dataclass(frozen=True, kw_only=True)
class Sensitivities:
    """Norms of the largest change of the released vector between neighbours."""

    l0: int
    linf: float
    l1: float
    l2: float

    def scaled(self, factor: float) -> "Sensitivities":
        """Every per-partition change multiplied by ``factor`` (>= 0); L0 is unchanged."""
        return Sensitivities(l0=self.l0, linf=self.linf * factor, l1=self.l1 * factor, l2=self.l2 * factor)

    def to_dict(self) -> dict:
        return {"l0": self.l0, "linf": self.linf, "l1": self.l1, "l2": self.l2}


def _under(relation: Neighbouring | str, s: Sensitivities) -> Sensitivities:
    factor = Neighbouring(relation).factor
    return Sensitivities(l0=s.l0 * factor, linf=s.linf * factor, l1=s.l1 * factor, l2=s.l2 * factor)


def count_sensitivity(bounds: ContributionBounds,
                      relation: Neighbouring | str = Neighbouring.ADD_REMOVE) -> Sensitivities:
    """Per-partition row counts.

    One unit changes at most ``L0' = min(L0, L1)`` partitions by at most ``Linf' = min(Linf, L1)``
    each, and by at most ``L1`` in total: ``l1 = min(L0' Linf', L1)``. The L2 norm is largest when
    the L1 mass fills whole partitions first: q = floor(L1 / Linf') full ones plus a remainder r,
    ``l2 = sqrt(min(q, L0') Linf'^2 + (r^2 if q < L0')) <= sqrt(L0') Linf'``.
    """
    l0 = bounds.max_partitions
    linf = bounds.max_contributions_per_partition
    total = bounds.max_contributions
    if total is None or total >= l0 * linf:
        result = Sensitivities(l0=l0, linf=float(linf), l1=float(l0 * linf), l2=math.sqrt(l0) * linf)
    else:
        l0 = min(l0, total)
        linf = min(linf, total)
        full, remainder = divmod(total, linf)
        if full >= l0:
            l2 = math.sqrt(l0) * linf
        else:
            l2 = math.sqrt(full * linf ** 2 + remainder ** 2)
        result = Sensitivities(l0=l0, linf=float(linf), l1=float(total), l2=l2)
    return _under(relation, result)


def privacy_unit_count_sensitivity(bounds: ContributionBounds,
                                   relation: Neighbouring | str = Neighbouring.ADD_REMOVE
                                   ) -> Sensitivities:
    """Per-partition counts of distinct privacy units: a unit adds 1 to each of at most L0' keys.

    ``L0' = min(L0, L1)``; ``linf = 1, l1 = L0', l2 = sqrt(L0')``.
    """
    l0 = bounds.max_partitions
    if bounds.max_contributions is not None:
        l0 = min(l0, bounds.max_contributions)
    return _under(relation, Sensitivities(l0=l0, linf=1.0, l1=float(l0), l2=math.sqrt(l0)))


def sum_sensitivity(bounds: ContributionBounds,
                    relation: Neighbouring | str = Neighbouring.ADD_REMOVE) -> Sensitivities:
    """Per-partition sums of values clamped to ``[min_value, max_value]``.

    Removing a row changes a sum by at most ``max(|min_value|, |max_value|)`` (the range may cross
    zero), so the sum's sensitivities are the count's scaled by that magnitude.
    """
    low, high = bounds.value_range()
    magnitude = max(abs(low), abs(high))
    return count_sensitivity(bounds, relation).scaled(magnitude)


@dataclass(frozen=True, kw_only=True)
class MeanSensitivities:
    """A mean released as ``midpoint + noisy normalized sum / noisy count``."""

    count: Sensitivities
    normalized_sum: Sensitivities
    midpoint: float


def mean_sensitivity(bounds: ContributionBounds,
                     relation: Neighbouring | str = Neighbouring.ADD_REMOVE) -> MeanSensitivities:
    """Normalized-sum mean: sum of ``(v - midpoint)`` has per-row magnitude ``(max - min) / 2``.

    The count and the normalized sum are two noisy releases (each needs its own budget share);
    the mean is post-processing. Centering halves the per-row magnitude when the range does not
    contain zero (Wilson et al. 2020, section 4.2; PipelineDP's normalized-sum mean).
    """
    low, high = bounds.value_range()
    count = count_sensitivity(bounds, relation)
    return MeanSensitivities(count=count, normalized_sum=count.scaled((high - low) / 2),
                             midpoint=(low + high) / 2)


@dataclass(frozen=True, kw_only=True)
class VarianceSensitivities:
    """A variance released from a noisy count, normalized sum and normalized sum of squares."""

    count: Sensitivities
    normalized_sum: Sensitivities
    normalized_squares: Sensitivities
    midpoint: float
    half_range: float


def variance_sensitivity(bounds: ContributionBounds,
                         relation: Neighbouring | str = Neighbouring.ADD_REMOVE) -> VarianceSensitivities:
    """Variance as post-processing of three noisy sums per key (PipelineDP's variance):
    the count, the sum of ``v - m`` (per-row magnitude ``h = (max - min) / 2``) and the sum of
    ``(v - m)^2 - h^2 / 2`` (``(v - m)^2`` lies in ``[0, h^2]``, so centred its per-row
    magnitude is ``h^2 / 2``), with ``m`` the midpoint. Each is the count's sensitivities scaled
    by its per-row magnitude.
    """
    low, high = bounds.value_range()
    half = (high - low) / 2
    count = count_sensitivity(bounds, relation)
    return VarianceSensitivities(count=count, normalized_sum=count.scaled(half),
                                 normalized_squares=count.scaled(half * half / 2),
                                 midpoint=(low + high) / 2, half_range=half)
