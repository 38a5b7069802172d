"""Synthetic attributed-conversion data of Aksu et al. (PoPETs 2024), with its three presets.

The generator published with the paper (Google Research, ``ara_optimization``; described in the
paper's section on synthetic data and the seed 003 article) takes three steps, reproduced here in
distribution (independent code; a numpy Generator with an explicit seed, never a release key):

1. Impressions per impression-side slice: every slice draws X from the discrete power law of
   Clauset, Shalizi & Newman (2009), eq. (D.6) -- floor((x_min - 1/2)(1 - r)^(-1/(a-1)) + 1/2) with
   r uniform, truncated at x_max = number of slices -- with exponent
   ``a = log2(rate_of_size_1 / rate_of_size_2)``, and gets X + 1 impressions (the published code
   stores sample ``x`` under slice size ``x + 1``). We sample that exact distribution by inverse
   CDF of its probability table (:func:`published_impressions_pmf`).
2. Each impression (source) gets Poisson(lambda) conversions (lambda = 10 in every preset).
3. Each conversion gets a log-normal value with mu = (2 ln mean + ln mode) / 3,
   sigma = sqrt(mu - ln mode), times the preset's published rescaling factor.

Dataset statistics (expected values, :meth:`SyntheticPreset.expected_statistics`; measured ones
agree within sampling error, see ``tests/pipelines/ara/test_ara_optimize.py``):

    preset               slices  impressions  conversions  value mean
    criteo                 3200        7,317       73,166      130.05
    adtech_real_estate      180        5,383       53,830      13,179 (x5000)
    adtech_travel           180        4,300       43,000      67,613 (x5000)

Every slice has at least two impressions (the published code's + 1), so no slice is empty.
(What changed when this module came to match the published generator is in
``benchmarks/RESULTS.md``.)

Remaining differences, documented rather than copied:

* The published code hands the sampled slice sizes to the slices in ascending order of size along
  the lexicographic order of the slice keys (the first keys get the smallest slices). Here sizes
  are assigned to slices at random (exchangeable slices). Flat (finest-slice) queries see the
  same distribution either way; hierarchical (prefix) queries differ: with the published order,
  coarse slices aggregate similarly sized fine slices, so their totals spread far more (the last
  dim_0 value holds most impressions). We consider the random assignment the realistic model of
  an ad tech's slices and keep it.
* The paper's real datasets (Criteo about 15M clicks, AdTech Real Estate about 100K conversions,
  AdTech Travel about 30K conversions, one conversion per click) are matched in shape, not size:
  the presets fix the slices and lambda, so the totals above follow from the model. Errors are
  relative to per-slice truth (RMSRE_tau), so smaller data sets mean higher errors at a given
  epsilon than the paper reports for the real data.
* The published generator can also split conversions over conversion-side keys; all three
  published presets use one conversion-side key, the only case supported here.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticPreset:
    name: str
    rate_of_size_1: float
    rate_of_size_2: float
    conversions_per_impression: float
    impression_dimensions: tuple[int, ...]
    value_mean: float
    value_mode: float
    value_scale: float = 1.0

    @property
    def power_law_exponent(self) -> float:
        return math.log2(self.rate_of_size_1 / self.rate_of_size_2)

    @property
    def lognormal_mu_sigma(self) -> tuple[float, float]:
        mu = (2.0 * math.log(self.value_mean) + math.log(self.value_mode)) / 3.0
        return mu, math.sqrt(mu - math.log(self.value_mode))

    @property
    def n_slices(self) -> int:
        return int(np.prod(self.impression_dimensions))

    def expected_statistics(self) -> dict:
        """Expected slices, impressions, conversions and value mean of one generated data set."""
        sizes = np.arange(1, self.n_slices + 1) + 1
        impressions = self.n_slices * float(np.sum(published_impressions_pmf(
            self.power_law_exponent, self.n_slices) * sizes))
        return {"slices": self.n_slices, "impressions": impressions,
                "conversions": impressions * self.conversions_per_impression,
                "value_mean": self.value_mean * self.value_scale}


#: The published presets (lambda = 10 conversions per impression).
PRESETS: dict[str, SyntheticPreset] = {
    "criteo": SyntheticPreset(
        name="criteo", rate_of_size_1=0.50, rate_of_size_2=0.0675, conversions_per_impression=10.0,
        impression_dimensions=(20, 10, 8, 2), value_mean=130.05, value_mode=17.22),
    "adtech_real_estate": SyntheticPreset(
        name="adtech_real_estate", rate_of_size_1=0.51, rate_of_size_2=0.25,
        conversions_per_impression=10.0, impression_dimensions=(2, 90),
        value_mean=2.6357769599728544, value_mode=1.9870358387102465, value_scale=5000.0),
    "adtech_travel": SyntheticPreset(
        name="adtech_travel", rate_of_size_1=0.44045663923, rate_of_size_2=0.20,
        conversions_per_impression=10.0, impression_dimensions=(90, 2),
        value_mean=13.522676270135175, value_mode=1.8988795467748725, value_scale=5000.0),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConversionData:
    """Attributed conversions, one row per conversion (columnar).

    source_id: impression id (the unit of privacy); order: position of the conversion among its
    source's conversions (time order); features: (n, D) impression-side slice features;
    count: 1 per conversion; value: conversion value; report_id: the id of the aggregatable
    report the browser sends for the conversion (random UUIDs, as in a report's shared_info; the
    summary-report job aggregates each at most once across batches), or None.
    """

    source_id: np.ndarray
    order: np.ndarray
    features: np.ndarray
    count: np.ndarray
    value: np.ndarray
    dimensions: tuple[int, ...]
    report_id: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.source_id.shape[0])

    def measures(self) -> np.ndarray:
        """(n, 2) matrix of the two measures (count, value)."""
        return np.column_stack([self.count.astype(np.float64), self.value])

    @classmethod
    def from_arrow(cls, table, dimensions) -> "ConversionData":
        """Conversions from a table with source_id, [order], dim_0.., [count], value columns.

        Rows with a null/NaN field or a feature outside ``dimensions`` are dropped (training
        data for the optimiser; the release pipeline counts such rows instead).
        """
        import pyarrow.compute as pc
        from transforms.privacy_units import canonical_unit_ids
        dims = tuple(int(d) for d in dimensions)
        names = table.column_names
        needed = ["source_id", "value"] + [f"dim_{d}" for d in range(len(dims))]
        for col in needed:
            if col not in names:
                raise ValueError(f"conversions table lacks column {col!r}")
        n = table.num_rows

        def floats(name, default):
            if name not in names:
                return np.full(n, default, dtype=np.float64)
            return np.asarray(pc.fill_null(table[name].cast("float64"), np.nan))

        feats = np.stack([floats(f"dim_{d}", 0) for d in range(len(dims))], axis=1) \
            if dims else np.zeros((n, 0))
        value, count, order = floats("value", 0), floats("count", 1), floats("order", 0)
        # One canonical form before grouping: 7, 7.0 and "7" are one source (refused otherwise).
        canonical = canonical_unit_ids(table["source_id"], "source_id")
        src = np.asarray(pc.is_valid(canonical))
        ok = src & np.isfinite(value) & np.isfinite(count) & np.isfinite(order) \
            & np.isfinite(feats).all(axis=1)
        ok &= ((feats >= 0) & (feats < np.asarray(dims))).all(axis=1) & (feats == np.floor(feats)).all(axis=1)
        sources = np.asarray(canonical.to_pylist(), dtype=object)
        _, source_index = np.unique(sources[ok].astype(str), return_inverse=True)
        return cls(source_id=source_index.astype(np.int64), order=order[ok].astype(np.int64),
                   features=feats[ok].astype(np.int64), count=count[ok], value=value[ok],
                   dimensions=dims)

    def to_arrow(self):
        import pyarrow as pa
        cols = {} if self.report_id is None else {"report_id": pa.array(self.report_id, pa.string())}
        cols.update({"source_id": pa.array(self.source_id), "order": pa.array(self.order)})
        for d in range(self.features.shape[1]):
            cols[f"dim_{d}"] = pa.array(self.features[:, d])
        cols["count"] = pa.array(self.count)
        cols["value"] = pa.array(self.value)
        return pa.table(cols)


def report_ids(seed: int, n: int) -> np.ndarray:
    """``n`` random version-4 UUIDs (text) from a stream of their own (``seed``): generating them
    draws nothing from the data's stream, so the other columns do not depend on them."""
    import uuid

    words = np.random.default_rng([int(seed), 0x5245504F5254]).integers(
        0, np.iinfo(np.uint64).max, size=(n, 2), dtype=np.uint64, endpoint=True)
    raw = words.astype(">u8").tobytes()
    return np.array([str(uuid.UUID(bytes=raw[16 * i:16 * i + 16], version=4))
                     for i in range(n)], dtype=object)


def published_impressions_pmf(exponent: float, x_max: int) -> np.ndarray:
    """P(X = x) for x = 1..x_max of the published generator's power law (Clauset et al. 2009,
    eq. D.6, x_min = 1, truncated at x_max): ``P(X >= x) ~ (2x - 1)^(1 - a)``, so
    ``P(X = x) = ((2x - 1)^(1-a) - (2x + 1)^(1-a)) / (1 - (2 x_max + 1)^(1-a))``."""
    if not exponent > 1:
        raise ValueError(f"power-law exponent must be above 1, got {exponent}")
    if x_max < 1:
        raise ValueError("x_max must be >= 1")
    x = np.arange(1, x_max + 1, dtype=np.float64)
    tail = (2.0 * x - 1.0) ** (1.0 - exponent) - (2.0 * x + 1.0) ** (1.0 - exponent)
    return tail / (1.0 - (2.0 * x_max + 1.0) ** (1.0 - exponent))


def sample_impressions_per_slice(rng: np.random.Generator, exponent: float, n_slices: int,
                                 size: int) -> np.ndarray:
    """Impressions of ``size`` slices: X + 1 with X ~ :func:`published_impressions_pmf`
    (inverse CDF of the table; ``n_slices`` is small)."""
    cdf = np.cumsum(published_impressions_pmf(exponent, n_slices))
    x = np.searchsorted(cdf / cdf[-1], rng.random(size), side="right") + 1
    return np.minimum(x, n_slices).astype(np.int64) + 1


def dataset_statistics(data: "ConversionData") -> dict:
    """Slices with conversions, impressions (sources with conversions), conversions, value mean."""
    codes = np.ravel_multi_index(data.features.T, data.dimensions) if data.dimensions else \
        np.zeros(len(data), dtype=np.int64)
    return {"slices": int(np.unique(codes).size), "impressions": int(np.unique(data.source_id).size),
            "conversions": len(data), "value_mean": float(np.mean(data.value)) if len(data) else 0.0}


def generate(preset: SyntheticPreset | str, seed: int, scale: float = 1.0) -> ConversionData:
    """One synthetic data set. ``scale`` multiplies the number of slices' impressions (use < 1
    for small test data; the power law and the value distribution are unchanged)."""
    if isinstance(preset, str):
        try:
            preset = PRESETS[preset]
        except KeyError:
            raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}") from None
    rng = np.random.default_rng(seed)
    dims = preset.impression_dimensions
    n_slices = preset.n_slices
    impressions = sample_impressions_per_slice(rng, preset.power_law_exponent, n_slices, n_slices)
    if scale != 1.0:
        impressions = np.maximum(1, np.round(impressions * scale)).astype(np.int64)
    slice_of_impression = np.repeat(np.arange(n_slices), impressions)
    conversions = rng.poisson(preset.conversions_per_impression, slice_of_impression.size)
    source_id = np.repeat(np.arange(slice_of_impression.size, dtype=np.int64), conversions)
    slice_code = slice_of_impression[source_id]
    # position of each conversion within its source (sources are contiguous)
    starts = np.cumsum(conversions) - conversions
    order = np.arange(source_id.size, dtype=np.int64) - np.repeat(starts, conversions)
    features = np.stack(np.unravel_index(slice_code, dims), axis=1).astype(np.int64)
    mu, sigma = preset.lognormal_mu_sigma
    value = rng.lognormal(mu, sigma, source_id.size) * preset.value_scale
    return ConversionData(source_id=source_id, order=order, features=features,
                          count=np.ones(source_id.size, dtype=np.int64), value=value,
                          dimensions=tuple(dims), report_id=report_ids(seed, source_id.size))
