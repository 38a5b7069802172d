"""Server side: support counts of a report batch, and unbiased estimates with their variance.

Aggregation is two steps so a runner can combine before the shuffle: each batch becomes a
:class:`SupportCounts` (how many reports, and how many support each candidate value), counts of
batches add up (:meth:`SupportCounts.merge`), and the total becomes estimates
(:func:`estimate_table`) with the oracle's unbiased estimator and exact variance
(:mod:`transforms.ldp.oracles`).

Candidates. Without a candidate set GRR and unary encodings count the whole domain (a bincount /
bit sums). OLH always counts against candidates -- one hash evaluation per (report, candidate),
:func:`transforms.ldp.hashing.support_counts` -- and the full domain is refused above
:data:`OLH_FULL_DOMAIN_LIMIT` values (give the values you want estimated, e.g. PEM's candidates).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from transforms import error_columns
from transforms.ldp import hashing
from transforms.ldp.oracles import OLH, Oracle, UnaryEncoding
from transforms.ldp.reports import ReportArrays, report_arrays

OLH_FULL_DOMAIN_LIMIT = 1 << 12
FULL_DOMAIN_LIMIT = 1 << 24
_UNARY_ROWS = 255  # rows summed in uint8 before widening (no overflow)


def candidate_values(oracle: Oracle, candidates=None) -> np.ndarray:
    """The sorted, distinct uint64 values to estimate (the whole domain when None)."""
    if candidates is None:
        limit = OLH_FULL_DOMAIN_LIMIT if isinstance(oracle, OLH) else FULL_DOMAIN_LIMIT
        if oracle.domain_size > limit:
            raise ValueError(f"{oracle.oracle_name}: estimating all {oracle.domain_size} values is "
                             f"refused above {limit}; give the candidate values to estimate")
        return np.arange(oracle.domain_size, dtype=np.uint64)
    values = np.asarray(candidates)
    if values.dtype.kind not in "iu":
        raise ValueError(f"candidates must be integers, got dtype {values.dtype}")
    if values.size and ((values.dtype.kind == "i" and values.min() < 0)
                        or int(values.max()) >= oracle.domain_size):
        raise ValueError(f"candidates must be in [0, {oracle.domain_size})")
    values = np.unique(values.astype(np.uint64))
    return values


@dataclass(frozen=True, kw_only=True)
class SupportCounts:
    """Mergeable partial aggregate: n reports, and the support count of each candidate."""

    n: int
    support: np.ndarray  # int64[len(candidates)]

    @classmethod
    def empty(cls, size: int) -> "SupportCounts":
        return cls(n=0, support=np.zeros(size, dtype=np.int64))

    def merge(self, other: "SupportCounts") -> "SupportCounts":
        """The sum of both; ``self``'s support array is reused (added into in place), so use
        only the returned value afterwards."""
        if other.support.shape != self.support.shape:
            raise ValueError("support counts over different candidate sets cannot be merged")
        np.add(self.support, other.support, out=self.support)
        return SupportCounts(n=self.n + other.n, support=self.support)


def count_support(oracle: Oracle, reports, candidates: np.ndarray, *,
                  threads: Optional[int] = None) -> SupportCounts:
    """Support counts of one report batch (a table, record batch or :class:`ReportArrays`)
    against sorted distinct ``candidates`` (see :func:`candidate_values`)."""
    arrays = reports if isinstance(reports, ReportArrays) else report_arrays(oracle, reports)
    if isinstance(oracle, UnaryEncoding):
        support = _unary_support(oracle, arrays.bits, candidates)
    elif isinstance(oracle, OLH):
        support = hashing.support_counts(arrays.hash_a, arrays.hash_b, arrays.report, candidates,
                                         oracle.buckets, threads=threads)
    else:
        support = _value_support(oracle, arrays.report, candidates)
    return SupportCounts(n=arrays.n, support=support)


def _is_full_domain(oracle: Oracle, candidates: np.ndarray) -> bool:
    return candidates.size == oracle.domain_size  # sorted distinct values in [0, d)


def _value_support(oracle: Oracle, report: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    if _is_full_domain(oracle, candidates):
        return np.bincount(report, minlength=oracle.domain_size).astype(np.int64)
    if candidates.size == 0 or report.size == 0:
        return np.zeros(candidates.size, dtype=np.int64)
    position = np.searchsorted(candidates, report.astype(np.uint64))
    position = np.minimum(position, candidates.size - 1)
    hit = candidates[position] == report
    return np.bincount(position[hit], minlength=candidates.size).astype(np.int64)


def _unary_support(oracle: UnaryEncoding, bits: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    n = bits.shape[0]
    if _is_full_domain(oracle, candidates):
        # Sum bytes of up to 255 rows in uint8 (SIMD, no overflow), then count each bit position.
        width = bits.shape[1]
        totals = np.zeros(width * 8, dtype=np.int64)
        rows = max(_UNARY_ROWS, ((1 << 22) // (width * 8)) // _UNARY_ROWS * _UNARY_ROWS)
        for r0 in range(0, n, rows):
            block = np.unpackbits(bits[r0:r0 + rows], axis=1, bitorder="little")
            for s0 in range(0, block.shape[0], _UNARY_ROWS):
                totals += np.add.reduce(block[s0:s0 + _UNARY_ROWS], axis=0, dtype=np.uint8)
        return totals[:oracle.domain_size]
    byte = (candidates >> np.uint64(3)).astype(np.intp)
    shift = (candidates & np.uint64(7)).astype(np.uint8)
    support = np.zeros(candidates.size, dtype=np.int64)
    for r0 in range(0, n, 65536):
        block = bits[r0:r0 + 65536]
        support += ((block[:, byte] >> shift) & np.uint8(1)).sum(axis=0, dtype=np.int64)
    return support


#: The frequency estimates' errors statement (their outputs' ``errors``): the estimator's
#: variance depends on the true count, so its std is the plug-in value at the released estimate
#: and its 95% interval a normal approximation (:func:`transforms.error_columns.plug_in_interval`).
APPROXIMATE_INTERVAL = error_columns.approximate_statement(
    "estimate",
    std="the exact standard deviation of the unbiased estimator evaluated at the released "
        "estimate clipped to [0, n] (the plug-in variance; the true variance depends on the true "
        "count)",
    assumptions="many reports (the estimate is a sum of n independent reports' bounded terms, "
                "close to normal by the central limit theorem) and a plug-in variance close to "
                "the variance at the true count",
    clipped_to="[0, n] (times the subsample's scale)") + (
    ". frequency = estimate / n; its std and interval are estimate's divided by n")


def estimate_table(oracle: Oracle, candidates: np.ndarray, counts: SupportCounts, *,
                   scale: float = 1.0) -> pa.Table:
    """Released estimates, one row per candidate, sorted by value (a public order).

    Columns: ``value``; ``estimate`` (unbiased count estimate, times ``scale``);
    ``frequency`` (estimate / n); ``estimate_ci95_low``, ``estimate_ci95_high`` and
    ``estimate_std``: the sqrt of the exact variance at the estimate clipped to [0, n], times
    ``scale``, and the approximate 95% interval ``estimate -/+ 1.96 estimate_std`` clipped to
    [0, n scale] (plug-in variance, normal approximation: the error columns' naming and
    :func:`~transforms.error_columns.plug_in_interval`; :data:`APPROXIMATE_INTERVAL`). ``scale``
    turns a subsample's counts into population counts (PEM).
    """
    n = counts.n
    estimate = oracle.estimate(counts.support, n) if n else np.zeros(candidates.size)
    variance = oracle.estimated_variance(n, estimate) if n else np.zeros(candidates.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        frequency = estimate / n if n else np.zeros(candidates.size)
    std = np.sqrt(variance) * scale
    low, high = error_columns.plug_in_interval(estimate * scale, std, low=0.0, high=n * scale)
    return pa.table({
        "value": pa.array(candidates, pa.uint64()),
        "estimate": pa.array(estimate * scale, pa.float64()),
        "frequency": pa.array(frequency, pa.float64()),
        "estimate_ci95_low": pa.array(low, pa.float64()),
        "estimate_ci95_high": pa.array(high, pa.float64()),
        "estimate_std": pa.array(std, pa.float64()),
    })


def estimate_frequencies(oracle: Oracle, reports, candidates=None) -> pa.Table:
    """One-shot estimation for an in-memory report table (tests, notebooks, benchmarks)."""
    values = candidate_values(oracle, candidates)
    return estimate_table(oracle, values, count_support(oracle, reports, values))


def mean_from_binary(oracle: Oracle, counts: SupportCounts) -> tuple[float, float]:
    """Binary RR: the estimated fraction of clients whose bit is 1, and its standard error.

    Per client x_hat = (y - q)/(p - q) is unbiased with variance p(1-p)/(p-q)^2 (=
    e^e/(e^e-1)^2 at the nominal p); the mean of n of them has variance that over n.
    """
    if oracle.oracle_name != "binary_rr":
        raise ValueError("mean_from_binary needs binary_rr reports")
    if counts.n == 0:
        raise ValueError("no reports")
    p, q = oracle.support_probabilities()
    ones = counts.support[1] if counts.support.size == 2 else counts.support[-1]
    mean = (ones / counts.n - q) / (p - q)
    return float(mean), float(np.sqrt(p * (1 - p) / (p - q) ** 2 / counts.n))
