"""The ring Z/2^64 and the fixed-point encoding of reals into it (pure numpy).

Every secret-shared quantity of Masked LARk lives in the ring R = Z/2^64Z, stored as numpy
``uint64`` whose addition and multiplication wrap modulo 2^64 by definition (C unsigned
arithmetic): sums and products of shares need no explicit reduction.

Fixed point. A real x is encoded with ``f`` fraction bits as the integer u = round(x * 2^f)
(round half to even) reduced modulo 2^64; a ring element r is decoded as its *signed*
representative s in [-2^63, 2^63) divided by 2^f. Decoding returns the true value exactly when
the true integer lies in that range, so every place that adds encoded values checks its bound:

* ``encode`` refuses values with |u| > ``max_abs_units`` (default 2^62);
* a sum of n values each at most B units in magnitude, plus noise at most T units from each of
  H helpers, decodes correctly iff n * B + H * T < 2^63 (``sum_fits``). Helpers refuse a batch
  that could break it (the noise tail T is taken at probability 2^-80, see
  :func:`noise_tail_units`), so the ad server never decodes a wrapped-around value.

Masks multiply ring elements by ring elements; a product alpha * u of a mask alpha and an encoded
value u stays at scale 2^f (masks are integers, not fixed-point numbers), so masking costs no
precision.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RING_BITS = 64
#: |signed representative| must stay below this for a correct decode.
SIGNED_LIMIT = 1 << (RING_BITS - 1)
MAX_FRACTION_BITS = 40
_U64 = np.uint64


class RingOverflowError(OverflowError):
    """A value or a sum would leave the range that decodes correctly (see the module docstring)."""


def to_ring(values) -> np.ndarray:
    """Signed or unsigned integers as ring elements (two's complement: -1 -> 2^64 - 1)."""
    values = np.asarray(values)
    if values.dtype == np.uint64:
        return values
    if not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"ring elements are integers, got {values.dtype}")
    return values.astype(np.int64).view(np.uint64)


def to_signed(ring: np.ndarray) -> np.ndarray:
    """The signed representative in [-2^63, 2^63) of each ring element, as int64."""
    return np.asarray(ring, dtype=np.uint64).view(np.int64)


def ring_sum(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Sum modulo 2^64 along ``axis`` (uint64 accumulation wraps)."""
    return np.sum(np.asarray(values, dtype=np.uint64), axis=axis, dtype=np.uint64)


def noise_tail_units(scale: float, failure_probability: float = 2.0 ** -80) -> int:
    """T with P(|Z| > T) <= failure_probability for discrete Laplace Z of scale ``scale``.

    P(|Z| > t) = 2 p^(t+1) / (1 + p) <= 2 p^(t+1), p = exp(-1/scale), so
    t = scale * ln(2 / failure_probability) suffices.
    """
    if scale <= 0:
        return 0
    return int(math.ceil(scale * math.log(2.0 / failure_probability)))


def sum_fits(count: int, max_abs_units: int, noise_units: int = 0) -> bool:
    """Whether ``count`` values of at most ``max_abs_units`` plus ``noise_units`` of total noise
    always decode correctly (see the module docstring)."""
    return int(count) * int(max_abs_units) + int(noise_units) < SIGNED_LIMIT


@dataclass(frozen=True, kw_only=True)
class FixedPoint:
    """Fixed-point codec with ``fraction_bits`` bits after the binary point (0: integers).

    ``max_abs_units``: the largest |round(x * 2^f)| that ``encode`` accepts.
    """

    fraction_bits: int = 16
    max_abs_units: int = 1 << 62

    def __post_init__(self):
        if isinstance(self.fraction_bits, bool) or not isinstance(self.fraction_bits, int) \
                or not 0 <= self.fraction_bits <= MAX_FRACTION_BITS:
            raise ValueError(f"fraction_bits must be an integer in [0, {MAX_FRACTION_BITS}], "
                             f"got {self.fraction_bits!r}")
        if not isinstance(self.max_abs_units, int) or not 0 < self.max_abs_units <= 1 << 62:
            raise ValueError(f"max_abs_units must be in (0, 2^62], got {self.max_abs_units!r}")

    @property
    def scale(self) -> float:
        return math.ldexp(1.0, self.fraction_bits)

    @property
    def resolution(self) -> float:
        """The grid step 2^-f: the decode of one unit."""
        return math.ldexp(1.0, -self.fraction_bits)

    def units(self, values) -> np.ndarray:
        """round(x * 2^f) as int64 (round half to even); refuses non-finite values and overflow."""
        values = np.asarray(values)
        if np.issubdtype(values.dtype, np.integer) and values.dtype != np.uint64:
            values64 = values.astype(np.int64)
            if values64.size and int(np.max(np.abs(values64))) > self.max_abs_units >> self.fraction_bits:
                raise RingOverflowError(self._overflow_message(values64))
            return values64 << self.fraction_bits
        values = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError("fixed-point encoding needs finite values (got NaN or infinity)")
        scaled = np.rint(np.ldexp(values, self.fraction_bits))
        if scaled.size and float(np.max(np.abs(scaled))) > self.max_abs_units:
            raise RingOverflowError(self._overflow_message(values))
        return scaled.astype(np.int64)

    def _overflow_message(self, values) -> str:
        bound = math.ldexp(self.max_abs_units, -self.fraction_bits)
        return (f"a value of magnitude {float(np.max(np.abs(values))):.6g} does not fit the "
                f"fixed-point ring encoding ({self.fraction_bits} fraction bits, |value| <= "
                f"{bound:.6g})")

    def encode(self, values) -> np.ndarray:
        """Ring elements (uint64) of real (or integer) values."""
        return self.units(values).view(np.uint64)

    def decode(self, ring) -> np.ndarray:
        """Reals (float64) of ring elements: signed representative / 2^f.

        Exact as long as |signed representative| < 2^53 (beyond, float64 rounds)."""
        return np.ldexp(to_signed(ring).astype(np.float64), -self.fraction_bits)

    def decode_units(self, ring) -> np.ndarray:
        """Signed integer units (int64) of ring elements: exact, no float rounding."""
        return to_signed(ring).copy()
