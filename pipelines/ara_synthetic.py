"""Synthetic attributed-conversion data of Aksu et al. (PoPETs 2024), with its three presets.

Three steps: (1) the number of impressions of each impression-side slice follows a discrete
power law on [1, number of slices] whose exponent ``a = log2(rate_of_size_1 / rate_of_size_2)``
matches the published ratio of slices with one and two conversions (P(2) / P(1) = 2^-a);
(2) each impression (source) gets Poisson(lambda) conversions; (3) each conversion has a
log-normal value with mu = (2 ln mean + ln mode) / 3, sigma = sqrt(mu - ln mode), times a
published rescaling factor. The power law is sampled exactly (inverse CDF of the truncated
discrete distribution), so P(2) / P(1) equals the published ratio; the paper's released code
uses the continuous approximation of Clauset et al. (2009, eq. D.6), which at x = 1, 2 deviates
from that ratio (e.g. 0.13 instead of 0.18 for exponent 2.5).

This module is a simulation tool: it takes an explicit seed (numpy Generator), never a release key.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
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


#: The published presets (lambda = 10 conversions per impression).
PRESETS: dict[str, SyntheticPreset] = {
    "criteo": SyntheticPreset("criteo", 0.50, 0.0675, 10.0, (20, 10, 8, 2), 130.05, 17.22),
    "adtech_real_estate": SyntheticPreset("adtech_real_estate", 0.51, 0.25, 10.0, (2, 90),
                                          2.6357769599728544, 1.9870358387102465, 5000.0),
    "adtech_travel": SyntheticPreset("adtech_travel", 0.44045663923, 0.20, 10.0, (90, 2),
                                     13.522676270135175, 1.8988795467748725, 5000.0),
}


@dataclasses.dataclass(frozen=True)
class ConversionData:
    """Attributed conversions, one row per conversion (columnar).

    source_id: impression id (the unit of privacy); order: position of the conversion among its
    source's conversions (time order); features: (n, D) impression-side slice features;
    count: 1 per conversion; value: conversion value.
    """

    source_id: np.ndarray
    order: np.ndarray
    features: np.ndarray
    count: np.ndarray
    value: np.ndarray
    dimensions: tuple[int, ...]

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
        cols = {"source_id": pa.array(self.source_id), "order": pa.array(self.order)}
        for d in range(self.features.shape[1]):
            cols[f"dim_{d}"] = pa.array(self.features[:, d])
        cols["count"] = pa.array(self.count)
        cols["value"] = pa.array(self.value)
        return pa.table(cols)


def sample_power_law(rng: np.random.Generator, exponent: float, x_max: int, size: int) -> np.ndarray:
    """Exact truncated discrete power law P(x) = x^-exponent / sum_{k<=x_max} k^-exponent on
    [1, x_max], by inverse CDF (x_max is a number of slices: the table is small)."""
    if not exponent > 0:
        raise ValueError(f"power-law exponent must be positive, got {exponent}")
    if x_max < 1:
        raise ValueError("x_max must be >= 1")
    cdf = np.cumsum(np.arange(1, x_max + 1, dtype=np.float64) ** -exponent)
    cdf /= cdf[-1]
    x = np.searchsorted(cdf, rng.random(size), side="right") + 1
    return np.minimum(x, x_max).astype(np.int64)


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
    impressions = sample_power_law(rng, preset.power_law_exponent, n_slices, n_slices)
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
                          dimensions=tuple(dims))
