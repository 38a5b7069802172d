"""Local differential privacy on features, in the browser (the paper's Sections 4.2.3 and 5.4).

Features travel as bytes (integers 0..255, the paper's footnote to Equation 3). The browser adds
noise to each coordinate and clips the result back to the byte range:

    x~_j = clip(x_j + Z_j, 0, 255),   Z_j ~ discrete Laplace with scale 255 / epsilon_j.

Integer noise for integer features (no floating-point Laplace, Mironov 2012). Changing one
coordinate anywhere in [0, 255] moves it by at most 255, so each coordinate is epsilon_j-LDP and
clipping is post-processing. The whole d-feature vector composes to d * epsilon_j
(``vector_epsilon``): that is the guarantee for a record's features against every party, the
helpers included. It does NOT cover the label: the helpers' sum of masked gradients depends on
the true labels exactly, so without the helpers' global noise (Algorithm 3) the released
gradients are not differentially private in the labels -- a point the paper's Section 4.2.3
passes over.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from accounting.validation import check_epsilon
from transforms.noise import RandomStreams, discrete_laplace

BYTE_MAX = 255


@dataclass(frozen=True, kw_only=True)
class LocalFeatureNoise:
    """Discrete Laplace noise on every byte feature, ``epsilon_per_feature``-LDP per coordinate."""

    epsilon_per_feature: float

    def __post_init__(self):
        from accounting.calibration import calibrate
        from transforms.noise.mechanisms import check_samplable

        check_epsilon(self.epsilon_per_feature, "epsilon_per_feature")
        # the noise the sampler will draw: samplable, and not vanishing in double precision
        # (an extreme epsilon is refused here, before any charge, not in the pipeline)
        spec = calibrate("discrete_laplace", epsilon=self.epsilon_per_feature,
                         l1_sensitivity=BYTE_MAX)
        check_samplable(spec)
        spec.ci_halfwidth(0.95)

    @property
    def scale(self) -> float:
        return BYTE_MAX / self.epsilon_per_feature

    def vector_epsilon(self, num_features: int) -> float:
        """The record's feature vector as a whole (basic composition over coordinates)."""
        return num_features * self.epsilon_per_feature

    def apply(self, features: np.ndarray, streams: RandomStreams) -> np.ndarray:
        """Noisy features (uint8), one stream lane per (record, feature) in row-major order."""
        features = check_byte_features(features)
        if streams.size != features.size:
            raise ValueError(f"{features.size} feature values but {streams.size} random streams")
        noise = discrete_laplace(streams, self.scale).reshape(features.shape)
        return np.clip(features.astype(np.int64) + noise, 0, BYTE_MAX).astype(np.uint8)


def check_byte_features(features) -> np.ndarray:
    """Features as a (records, d) uint8 matrix; refuses values outside 0..255 or fractions."""
    features = np.asarray(features)
    if features.ndim != 2:
        raise ValueError(f"features must be a (records, features) matrix, got shape {features.shape}")
    if features.dtype == np.uint8:
        return features
    if not np.issubdtype(features.dtype, np.integer):
        if not np.all(np.isfinite(features)) or np.any(features != np.floor(features)):
            raise ValueError("features must be integers in 0..255 (bytes)")
    if features.size and (features.min() < 0 or features.max() > BYTE_MAX):
        raise ValueError(f"features must be bytes (0..255), got values in "
                         f"[{features.min()}, {features.max()}]")
    return features.astype(np.uint8)


def expected_abs_noise(scale: float) -> float:
    """E|Z| for discrete Laplace with scale b: 2p / (1 - p^2), p = exp(-1/b) (for reports)."""
    p = math.exp(-1.0 / scale)
    return 2 * p / (1 - p * p)
