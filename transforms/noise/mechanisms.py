"""Adding calibrated noise to arrays of query answers, as described by a :class:`NoiseSpec`.

Integer kinds add integer noise to integer answers. Real kinds round the answer to the spec's
power-of-two grid and add integer noise in grid units, so every output is an exact multiple of the
grid and the floating-point attack on textbook Laplace samplers does not apply; the grid rounding
is already paid for in the spec's sensitivity (see :mod:`accounting.calibration`).
"""
from __future__ import annotations

import numpy as np

from accounting.calibration import NoiseSpec
from transforms.noise.samplers import discrete_gaussian, discrete_laplace
from transforms.noise.streams import RandomStreams

_MAX_UNITS = 2 ** 62


def sample_units(spec: NoiseSpec, streams: RandomStreams) -> np.ndarray:
    """Integer noise in grid units, one value per lane (zero under an exact testing key:
    :meth:`accounting.keys.ReleaseKey.for_exact_testing`)."""
    if streams.noise_free:
        return np.zeros(streams.size, dtype=np.int64)
    if spec.kind.is_gaussian:
        return discrete_gaussian(streams, spec.unit_scale)
    return discrete_laplace(streams, spec.unit_scale)


#: The largest unit scale the exact samplers take: a discrete Laplace scale t / 2^20 needs
#: t < 2^52 (samplers.scale_to_units), and the discrete Gaussian samples through a discrete
#: Laplace of scale floor(sigma) + 1.
MAX_UNIT_SCALE = float(2 ** 31)


def check_samplable(spec: NoiseSpec) -> None:
    """Raise ValueError if the exact samplers cannot draw ``spec``'s noise: a scale too large
    for them (a tiny epsilon), or not a positive finite number. Checked before a release is
    charged, so that the noise engine never refuses a spec after the charge."""
    scale = float(spec.unit_scale)
    if not 0 < scale < float("inf"):
        raise ValueError(f"{spec.kind.value} noise has no usable scale ({scale!r})")
    if scale >= MAX_UNIT_SCALE:
        raise ValueError(f"{spec.kind.value} noise of scale {spec.scale:.3g} (epsilon "
                         f"{spec.epsilon:.3g}) is too large for the exact samplers (at most "
                         f"{MAX_UNIT_SCALE:.3g} grid units): epsilon is too small")


class IntegerSumOverflowError(OverflowError):
    """An integer sum (per-key total, or value plus noise) leaves int64: it would wrap around.
    Its message names columns and counts only, never a value."""


def _checked_add(values: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """values + noise in int64, refusing (never wrapping) a result outside int64 (vectorised:
    an overflow is a sum whose sign differs from both operands')."""
    total = values + noise
    if ((values ^ total) & (noise ^ total) < 0).any():
        raise IntegerSumOverflowError("an integer answer plus its noise is outside the int64 range; "
                                      "refusing to release a wrapped value")
    return total


def add_noise(spec: NoiseSpec, values, streams: RandomStreams) -> np.ndarray:
    """``values`` + noise, one lane of ``streams`` per value.

    Integer kinds require integer values and return int64; real kinds return float64 multiples of
    ``spec.granularity``.
    """
    values = np.asarray(values)
    if values.ndim != 1 or values.size != streams.size:
        raise ValueError(f"got {values.size} values for {streams.size} random lanes")
    if spec.kind.is_integer:
        if not np.issubdtype(values.dtype, np.integer):
            raise TypeError(f"{spec.kind.value} noise needs integer answers (got {values.dtype}); "
                            "use a real-valued kind (laplace or gaussian) for real answers")
        return _checked_add(values.astype(np.int64), sample_units(spec, streams))
    values = values.astype(np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError("answers to noise must be finite")
    units = np.rint(values / spec.granularity)
    if np.any(np.abs(units) >= _MAX_UNITS):
        raise OverflowError("an answer is too large for the noise grid of this measure")
    noisy = units.astype(np.int64) + sample_units(spec, streams)
    return noisy.astype(np.float64) * spec.granularity
