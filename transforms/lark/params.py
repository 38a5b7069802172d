"""The public parameters of a Masked LARk computation, and what they imply for privacy.

The paper (Section 3.2) has k, epsilon and the value bounds declared publicly per ad server and
enforced by browsers and helpers alike. Here they are frozen value objects: browsers encode with
them, helpers compute sensitivities, noise and overflow bounds from them, and their digest is
bound into every helper output so that the ad server refuses to combine outputs made under
different parameters.

Neighbouring relations (the unit of privacy is one report, see :mod:`transforms.lark`):

* aggregation (Algorithm 2): two batches are neighbours when they hold the same reports with the
  same keys and differ in the values of one report. One report moves one key's d encoded values
  by at most (upper - lower) units each: L1 sensitivity d * (U - L) in units of 2^-f.
* gradients (Algorithm 3): the same reports, differing in one report's features and labels. Each
  report's combined contribution is its clipped gradient, L1 norm <= floor(psi 2^f) units, so
  replacing one moves the sum by at most 2 floor(psi 2^f) units in L1.

Each helper adds discrete Laplace noise with scale (L1 sensitivity) / epsilon to every released
coordinate -- the *full* noise, so that one honest helper suffices (see :mod:`transforms.lark`).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Optional

from accounting.calibration import NoiseKind, NoiseSpec, calibrate
from accounting.sensitivity import Sensitivities
from accounting.validation import check_epsilon, check_finite, check_positive_int
from transforms.lark.model import clip_cap_units
from transforms.lark.ring import FixedPoint, noise_tail_units, sum_fits
from transforms.lark.sharing import check_num_helpers

AGGREGATION_RELATION = ("replace one report's values (the batch's reports, their keys and "
                        "their number are fixed)")
GRADIENT_RELATION = ("replace one report's features and labels (the batch's reports and their "
                     "number are fixed)")
MECHANISM = ("discrete Laplace on Z/2^64, full scale added independently by each helper "
             "(the guarantee holds with one honest helper)")


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k (release only with more than k reports) must be an integer >= 0, "
                         f"got {k!r}")
    return k


def _digest(kind: str, fields: dict) -> str:
    text = json.dumps({"kind": kind, **fields}, sort_keys=True, separators=(",", ":"),
                      default=lambda v: float(v).hex() if isinstance(v, float) else str(v))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _float_fields(obj) -> dict:
    return {k: (float(v).hex() if isinstance(v, float) else v) for k, v in asdict(obj).items()}


class _Common:
    """Shared derivations of both parameter kinds (epsilon None: no noise, tests only)."""

    @property
    def codec(self) -> FixedPoint:
        return FixedPoint(fraction_bits=self.fraction_bits)

    def noise_spec(self) -> Optional[NoiseSpec]:
        """Each helper's noise per released coordinate, in fixed-point units (None: no noise)."""
        if self.epsilon is None:
            return None
        return calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=self.epsilon,
                         l1_sensitivity=self.l1_sensitivity_units)

    def noise_tail_units(self) -> int:
        """Bound on the total noise of all helpers (each below its tail with prob. 1 - 2^-80)."""
        spec = self.noise_spec()
        return 0 if spec is None else self.num_helpers * noise_tail_units(spec.unit_scale)

    def batch_fits(self, count: int) -> bool:
        """Whether a batch of ``count`` reports decodes correctly whatever its values."""
        return count <= self.max_batch_records and sum_fits(count, self.max_abs_units,
                                                            self.noise_tail_units())

    def digest(self) -> str:
        return _digest(type(self).__name__, _float_fields(self))


@dataclass(frozen=True, kw_only=True)
class AggregationParams(_Common):
    """Algorithm 2: sums of ``value_columns`` per key, each value in [lower, upper]."""

    value_columns: tuple = ("value",)
    lower: float
    upper: float
    epsilon: Optional[float]
    k: int
    fraction_bits: int = 0
    num_helpers: int = 2
    max_batch_records: int = 100_000_000

    def __post_init__(self):
        cols = tuple(self.value_columns)
        if not cols or len(set(cols)) != len(cols) or not all(isinstance(c, str) and c for c in cols):
            raise ValueError(f"value_columns must be distinct non-empty names, got {cols!r}")
        object.__setattr__(self, "value_columns", cols)
        lower = check_finite(self.lower, "lower")
        upper = check_finite(self.upper, "upper")
        if not lower < upper:
            raise ValueError(f"lower ({lower}) must be below upper ({upper})")
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        _check_k(self.k)
        check_num_helpers(self.num_helpers)
        check_positive_int(self.max_batch_records, "max_batch_records")
        self.codec  # validates fraction_bits
        self.codec.units([lower, upper])  # refuses bounds that overflow the encoding

    @property
    def dimension(self) -> int:
        return len(self.value_columns)

    @property
    def bounds_units(self) -> tuple[int, int]:
        low, high = self.codec.units([self.lower, self.upper])
        return int(low), int(high)

    @property
    def max_abs_units(self) -> int:
        low, high = self.bounds_units
        return max(abs(low), abs(high))

    @property
    def l1_sensitivity_units(self) -> int:
        low, high = self.bounds_units
        return self.dimension * (high - low)

    def sensitivities(self) -> Sensitivities:
        """In the values' own units (the noise works in units of 2^-f)."""
        width = self.upper - self.lower
        d = self.dimension
        return Sensitivities(l0=d, linf=width, l1=d * width, l2=math.sqrt(d) * width)

    @property
    def relation(self) -> str:
        return AGGREGATION_RELATION


@dataclass(frozen=True, kw_only=True)
class GradientParams(_Common):
    """Algorithm 3: the summed logistic-regression gradient of a batch, per-record L1 clip psi."""

    num_features: int
    clip_norm: float
    epsilon: Optional[float]
    k: int
    fraction_bits: int = 16
    num_helpers: int = 2
    num_labels: int = 2
    max_batch_records: int = 100_000_000

    def __post_init__(self):
        check_positive_int(self.num_features, "num_features")
        clip = check_finite(self.clip_norm, "clip_norm")
        if clip <= 0:
            raise ValueError(f"clip_norm (psi) must be positive, got {clip!r}")
        object.__setattr__(self, "clip_norm", clip)
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        _check_k(self.k)
        check_num_helpers(self.num_helpers)
        check_positive_int(self.max_batch_records, "max_batch_records")
        if self.num_labels != 2:
            raise ValueError("the logistic-regression gradient needs binary labels (num_labels=2)")
        self.codec
        clip_cap_units(clip, self.fraction_bits)

    @property
    def dimension(self) -> int:
        return self.num_features + 1

    @property
    def cap_units(self) -> int:
        return clip_cap_units(self.clip_norm, self.fraction_bits)

    @property
    def max_abs_units(self) -> int:
        return self.cap_units

    @property
    def l1_sensitivity_units(self) -> int:
        return 2 * self.cap_units

    def sensitivities(self) -> Sensitivities:
        psi = self.cap_units * 2.0 ** -self.fraction_bits
        return Sensitivities(l0=self.dimension, linf=2 * psi, l1=2 * psi, l2=2 * psi)

    @property
    def relation(self) -> str:
        return GRADIENT_RELATION
