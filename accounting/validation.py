"""Parameter checks shared by calibration, accounting and transforms.

Each check returns the validated value (as float or int) or raises ``ValueError`` whose message
names the parameter, so a bad job fails before any data is read.
"""
from __future__ import annotations

import math
import numbers


def _as_real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return value


def check_epsilon(value, name: str = "epsilon") -> float:
    """epsilon > 0 and finite."""
    value = _as_real(value, name)
    if not (0 < value < math.inf):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def check_delta(value, name: str = "delta", allow_zero: bool = True) -> float:
    """delta in [0, 1) (or (0, 1) when ``allow_zero`` is False, e.g. for Gaussian noise)."""
    value = _as_real(value, name)
    if not (0 <= value < 1):
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    if value == 0 and not allow_zero:
        raise ValueError(f"{name} must be > 0 for this mechanism (Gaussian noise needs delta > 0)")
    return value


def check_rho(value, name: str = "rho") -> float:
    """zCDP rho > 0 and finite."""
    return check_epsilon(value, name)


def check_sensitivity(value, name: str = "sensitivity") -> float:
    """A sensitivity: finite and > 0 (a zero-sensitivity query needs no noise and no budget)."""
    value = _as_real(value, name)
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    if value == 0 or math.isinf(value):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_probability(value, name: str, allow_zero: bool = False, allow_one: bool = True) -> float:
    value = _as_real(value, name)
    low_ok = value >= 0 if allow_zero else value > 0
    high_ok = value <= 1 if allow_one else value < 1
    if not (low_ok and high_ok):
        raise ValueError(f"{name} must be a probability in "
                         f"{'[' if allow_zero else '('}0, 1{']' if allow_one else ')'}, got {value!r}")
    return value


def check_finite(value, name: str) -> float:
    value = _as_real(value, name)
    if math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value
