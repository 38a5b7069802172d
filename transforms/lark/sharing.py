"""Additive secret sharing over Z/2^64 (the paper's Algorithm 1), pure numpy.

A ring element v is split for H helpers as psi^0, ..., psi^(H-2) drawn uniformly and
psi^(H-1) = v - sum of the others (mod 2^64). Any H - 1 of the shares are independent and
uniform whatever v is (the map from the uniform words to any H - 1 shares is a bijection of the
ring), so each helper -- and any coalition short of all of them -- sees values that are
indistinguishable from uniform; all H together recover v = sum of the shares.

The same construction gives the masks of Section 4: real masks are shares of 1, fake masks
shares of 0, and the blinding vectors of :mod:`transforms.lark.masks` are shares of 0.
"""
from __future__ import annotations

import numpy as np

from transforms.lark.ring import ring_sum, to_ring


def check_num_helpers(num_helpers) -> int:
    if isinstance(num_helpers, bool) or not isinstance(num_helpers, (int, np.integer)) \
            or num_helpers < 2:
        raise ValueError(f"Masked LARk needs at least 2 helpers, got {num_helpers!r}")
    return int(num_helpers)


def share_from_words(values, uniform: np.ndarray) -> list[np.ndarray]:
    """Shares of ring elements ``values`` given H - 1 uniform words per value.

    ``values``: uint64 (or signed ints, two's complement) of any shape S; ``uniform``: uint64 of
    shape (H - 1,) + S. Returns H arrays of shape S whose sum mod 2^64 is ``values``.
    """
    values = to_ring(values)
    uniform = np.asarray(uniform, dtype=np.uint64)
    if uniform.ndim < 1 or uniform.shape[1:] != values.shape or uniform.shape[0] < 1:
        raise ValueError(f"need (H - 1,) + {values.shape} uniform words, got {uniform.shape}")
    last = values - ring_sum(uniform, axis=0)
    return [uniform[h] for h in range(uniform.shape[0])] + [last]


def share(values, num_helpers: int, rng_words) -> list[np.ndarray]:
    """Shares of ``values`` for ``num_helpers`` helpers; ``rng_words(shape)`` returns uniform
    uint64 words of that shape (e.g. from :func:`transforms.randomness.stream_words`)."""
    num_helpers = check_num_helpers(num_helpers)
    values = to_ring(values)
    return share_from_words(values, rng_words((num_helpers - 1,) + values.shape))


def recover(shares) -> np.ndarray:
    """The shared values: the sum of all helpers' shares mod 2^64."""
    shares = [np.asarray(s, dtype=np.uint64) for s in shares]
    if len(shares) < 2:
        raise ValueError("recovering a secret needs every helper's share (at least 2)")
    shapes = {s.shape for s in shares}
    if len(shapes) != 1:
        raise ValueError(f"shares have different shapes: {sorted(shapes)}")
    return ring_sum(np.stack(shares), axis=0)
