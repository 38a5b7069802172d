"""Synthetic data for Masked LARk: conversion records to aggregate, and a classification set.

No dataset ships with this toolkit's dependencies (scikit-learn's Wisconsin Breast Cancer set,
used by the paper, is not one), so the training experiments use a generator shaped like the
paper's WBCD experiment and like conversion prediction: ``num_features`` byte features from two
classes with a shared covariance (Fisher's linear discriminant setting, where the Bayes rule is
linear and logistic regression is well specified), about a quarter positives (the paper's WBCD
is ~75% "0"). The class separation is chosen so that the Bayes accuracy is about 0.95 (WBCD is
linearly separable to about that level); ``bayes_accuracy`` reports it for the exact generator
before byte quantisation. Data generation uses numpy's PCG64 from a public seed: this is
simulated *input*, not privacy randomness.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from scipy import stats


def _covariance_factor(num_features: int, rng: np.random.Generator) -> np.ndarray:
    """A factor L with L L^T a correlated covariance (3 latent factors + unit noise)."""
    loadings = rng.normal(0.0, 0.6, size=(num_features, 3))
    cov = loadings @ loadings.T + np.eye(num_features)
    return np.linalg.cholesky(cov), cov


def classification_data(num_records: int, *, num_features: int = 30, positive_rate: float = 0.25,
                        separation: float = 3.3, seed: int = 0, task_seed: int = 0):
    """(features uint8 (n, d), labels int64 (n,), bayes_accuracy) of the synthetic task.

    ``separation``: Mahalanobis distance between the class means; ``task_seed`` fixes the task
    (covariance and class means), ``seed`` the sample drawn from it.
    """
    structure = np.random.default_rng([task_seed, num_features, 7919])
    factor, cov = _covariance_factor(num_features, structure)
    direction = structure.normal(size=num_features)
    scale = separation / math.sqrt(direction @ np.linalg.solve(cov, direction))
    shift = direction * scale
    rng = np.random.default_rng([seed, num_records, 104729])
    labels = (rng.random(num_records) < positive_rate).astype(np.int64)
    latent = rng.normal(size=(num_records, num_features)) @ factor.T + labels[:, None] * shift
    features = np.clip(np.rint(128 + 22 * (latent - shift / 2)), 0, 255).astype(np.uint8)
    return features, labels, bayes_accuracy(separation, positive_rate)


def bayes_accuracy(separation: float, positive_rate: float) -> float:
    """Accuracy of the Bayes rule for two Gaussians at Mahalanobis distance ``separation``."""
    d, p = separation, positive_rate
    threshold = math.log((1 - p) / p) / d
    return (1 - p) * stats.norm.cdf(d / 2 + threshold) + p * stats.norm.cdf(d / 2 - threshold)


def train_test_split(num_train: int, num_test: int, **kwargs):
    """Independent train and test draws from the same task."""
    seed = kwargs.pop("seed", 0)
    x_train, y_train, bayes = classification_data(num_train, seed=2 * seed, **kwargs)
    x_test, y_test, _ = classification_data(num_test, seed=2 * seed + 1, **kwargs)
    return x_train, y_train, x_test, y_test, bayes


def gradient_records(features: np.ndarray, labels: np.ndarray, *, fake_rate: float = 0.0,
                     seed: int = 0, start_id: int = 0) -> pa.Table:
    """Records for :func:`transforms.lark.browser.gradient_reports` (record_id, x_j, label,
    and ``fake``: strictly fake records at ``fake_rate``)."""
    n, d = features.shape
    columns = {"record_id": pa.array(np.arange(start_id, start_id + n, dtype=np.int64))}
    columns.update({f"x_{j}": pa.array(features[:, j]) for j in range(d)})
    columns["label"] = pa.array(np.asarray(labels, dtype=np.int64))
    if fake_rate:
        rng = np.random.default_rng([seed, 31])
        columns["fake"] = pa.array(rng.random(n) < fake_rate)
    return pa.table(columns)


def conversion_records(num_records: int, *, num_campaigns: int = 20, num_batches: int = 1,
                       max_value: float = 100.0, seed: int = 0) -> pa.Table:
    """Attributed conversions for Algorithm 2: record_id, batch_id, key (campaign), value.

    Campaign popularity is Zipf-like, so some keys fall under a k-anonymity threshold; values
    are conversion amounts in [0, max_value] with cents (log-normal, clipped).
    """
    rng = np.random.default_rng([seed, num_records, 17])
    weights = 1.0 / np.arange(1, num_campaigns + 1) ** 1.1
    campaign = rng.choice(num_campaigns, size=num_records, p=weights / weights.sum())
    value = np.round(np.clip(rng.lognormal(2.5, 0.9, num_records), 0.0, max_value), 2)
    batch = rng.integers(0, num_batches, num_records)
    return pa.table({
        "record_id": pa.array(np.arange(num_records, dtype=np.int64)),
        "batch_id": pa.array([f"batch-{b:03d}" for b in batch], pa.string()),
        "key": pa.array([f"campaign-{c:03d}" for c in campaign], pa.string()),
        "value": pa.array(value)})
