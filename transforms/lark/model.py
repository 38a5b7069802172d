"""Logistic regression whose per-record gradients every helper computes bit for bit alike.

Masking only works if all helpers compute the *same* f(x, y, theta): helper h contributes
alpha^h * f, and if two helpers' f differed by a single unit, the ad server would decode
f + alpha^0 * (difference) -- a uniformly random ring element instead of a gradient. Floating
point results can differ between machines when libraries pick different code paths (BLAS
blocking, SIMD ``exp`` variants). So the forward pass here uses only IEEE-754 basic operations
(+, -, *, /, ldexp), each correctly rounded and therefore identical on every conforming machine,
in a fixed order:

* the logit z = b + sum_j (x_j * s) * w_j, accumulated feature by feature (no dot product);
* exp by Cody-Waite range reduction (t = k ln 2 + r, |r| <= ln 2 / 2) and a degree-13 Taylor
  polynomial in Horner form (truncation error below 2^-60 relative), scaled by 2^k exactly;
* the gradient of the log-loss, (sigmoid(z) - y) * (x * s, 1), converted to fixed point by
  truncation toward zero, then clipped to L1 norm psi in exact integer arithmetic
  (``clipped_gradient_units``): |trunc(u * c / n)| <= |u| * c / n, so the clipped integer
  vector's L1 norm is at most floor(psi * 2^f) -- the sensitivity the noise is calibrated to,
  with no rounding slack.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from transforms.lark.local_dp import check_byte_features

_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * LN2_HI is exact for |k| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_TAYLOR = [1.0 / math.factorial(n) for n in range(14)]


def deterministic_exp(t) -> np.ndarray:
    """exp(t) for float64 t <= 0 from basic IEEE operations only (identical on every machine)."""
    t = np.maximum(np.asarray(t, dtype=np.float64), -740.0)
    k = np.rint(t * _INV_LN2)
    r = (t - k * _LN2_HI) - k * _LN2_LO
    p = np.full_like(r, _TAYLOR[13])
    for c in reversed(_TAYLOR[:13]):
        p = p * r + c
    return np.ldexp(p, k.astype(np.int64))


def sigmoid(z) -> np.ndarray:
    """1 / (1 + exp(-z)), from :func:`deterministic_exp` (stable for both signs)."""
    z = np.asarray(z, dtype=np.float64)
    e = deterministic_exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@dataclass(frozen=True, kw_only=True)
class LogisticModel:
    """theta = (weights, bias) of P(y = 1 | x) = sigmoid(b + sum_j xs_j w_j), where the byte
    features are standardised publicly as xs_j = (x_j - feature_offset) * feature_scale
    (default: offset 0, scale 1/255, i.e. to [0, 1]).
    """

    weights: tuple
    bias: float = 0.0
    feature_scale: float = 1.0 / 255.0
    feature_offset: float = 0.0

    def __post_init__(self):
        weights = tuple(float(w) for w in np.asarray(self.weights, dtype=np.float64).ravel())
        if not weights or not all(math.isfinite(w) for w in weights):
            raise ValueError("a logistic model needs at least one finite weight")
        bias = float(self.bias)
        scale = float(self.feature_scale)
        offset = float(self.feature_offset)
        if not math.isfinite(bias) or not (math.isfinite(scale) and scale > 0) \
                or not math.isfinite(offset):
            raise ValueError("bias and feature_offset must be finite and feature_scale positive")
        object.__setattr__(self, "feature_offset", offset)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "bias", bias)
        object.__setattr__(self, "feature_scale", scale)

    @classmethod
    def zeros(cls, num_features: int, feature_scale: float = 1.0 / 255.0,
              feature_offset: float = 0.0) -> "LogisticModel":
        return cls(weights=(0.0,) * num_features, bias=0.0, feature_scale=feature_scale,
                   feature_offset=feature_offset)

    def with_vector(self, theta) -> "LogisticModel":
        """The same standardisation with parameters (w_0, ..., w_{d-1}, b), the gradient layout."""
        theta = np.asarray(theta, dtype=np.float64)
        return LogisticModel(weights=tuple(theta[:-1]), bias=float(theta[-1]),
                             feature_scale=self.feature_scale, feature_offset=self.feature_offset)

    @property
    def num_features(self) -> int:
        return len(self.weights)

    @property
    def dimension(self) -> int:
        """Gradient coordinates: one per weight, then the bias."""
        return self.num_features + 1

    def vector(self) -> np.ndarray:
        return np.array(self.weights + (self.bias,), dtype=np.float64)

    def digest(self) -> str:
        """Hex digest of the exact parameters (float bits), bound into helper outputs."""
        text = ",".join(float(v).hex() for v in (*self.weights, self.bias, self.feature_scale,
                                                      self.feature_offset))
        return hashlib.sha256(b"masked-lark/logistic/v1:" + text.encode()).hexdigest()[:32]

    def to_json(self) -> dict:
        return {"weights": list(self.weights), "bias": self.bias,
                "feature_scale": self.feature_scale, "feature_offset": self.feature_offset}

    @classmethod
    def from_json(cls, obj: dict) -> "LogisticModel":
        return cls(weights=tuple(obj["weights"]), bias=obj.get("bias", 0.0),
                   feature_scale=obj.get("feature_scale", 1.0 / 255.0),
                   feature_offset=obj.get("feature_offset", 0.0))

    def scaled_features(self, features) -> np.ndarray:
        features = check_byte_features(features)
        if features.shape[1] != self.num_features:
            raise ValueError(f"model has {self.num_features} features, records have "
                             f"{features.shape[1]}")
        return (features.astype(np.float64) - self.feature_offset) * self.feature_scale

    def logits(self, features) -> np.ndarray:
        return self._logits_scaled(self.scaled_features(features))

    def predict_proba(self, features) -> np.ndarray:
        return sigmoid(self.logits(features))

    def accuracy(self, features, labels) -> float:
        labels = np.asarray(labels)
        return float(np.mean((self.predict_proba(features) >= 0.5) == (labels == 1)))

    def gradients(self, features, labels) -> np.ndarray:
        """Per-record log-loss gradients (n, d + 1) in float64 (unclipped)."""
        xs = self.scaled_features(features)
        residual = sigmoid(self._logits_scaled(xs)) - np.asarray(labels, dtype=np.float64)
        return np.hstack([xs * residual[:, None], residual[:, None]])

    def _logits_scaled(self, xs) -> np.ndarray:
        z = np.full(xs.shape[0], self.bias)
        for j, w in enumerate(self.weights):
            z = z + xs[:, j] * w
        return z


def clip_cap_units(clip_norm: float, fraction_bits: int) -> int:
    """floor(psi * 2^f): the largest L1 norm, in units, of a clipped per-record gradient."""
    cap = math.floor(math.ldexp(clip_norm, fraction_bits))
    if cap < 1:
        raise ValueError(f"clip norm {clip_norm} is below the fixed-point resolution 2^-{fraction_bits}")
    return cap


def clipped_gradient_units(gradients: np.ndarray, cap: int, fraction_bits: int) -> np.ndarray:
    """Per-record gradients in fixed point (int64 units), each clipped to L1 norm <= ``cap``.

    Truncation toward zero, then, for rows above the cap, u -> trunc(u * cap / ||u||_1) in
    exact integer arithmetic (see the module docstring).
    """
    scaled = np.ldexp(np.asarray(gradients, dtype=np.float64), fraction_bits)
    limit = float(1 << 62) / max(cap, 1)
    if scaled.size and not np.all(np.abs(scaled) < limit):
        raise OverflowError("per-record gradient too large for exact fixed-point clipping; "
                            "lower fraction_bits or feature_scale")
    units = np.trunc(scaled).astype(np.int64)
    norms = np.abs(units).sum(axis=1)
    over = norms > cap
    if np.any(over):
        u = units[over]
        units[over] = np.sign(u) * ((np.abs(u) * np.int64(cap)) // norms[over][:, None])
    return units


def clipped_gradient_floats(gradients: np.ndarray, clip_norm: float) -> np.ndarray:
    """The same clipping in real arithmetic (for central baselines): g * min(1, psi / ||g||_1)."""
    gradients = np.asarray(gradients, dtype=np.float64)
    norms = np.abs(gradients).sum(axis=1)
    factor = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    return gradients * factor[:, None]
