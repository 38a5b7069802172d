"""Selection by the exponential-mechanism family: permute-and-flip, sampled exactly from keyed
streams.

Permute-and-flip (McKenna & Sheldon, NeurIPS 2020): visit the ``k`` candidates in a uniformly
random order and accept candidate ``i`` with probability ``exp(-gamma_i)``, ``gamma_i = num_i /
den`` a non-negative rational (the candidate's score below the best, already scaled by ``epsilon
/ Delta``); return the first accepted. It is epsilon-DP under the exponential mechanism's (McSherry &
Talwar 2007) conditions -- exponents ``epsilon (u* - u_i) / (2 Delta)`` for a score of
sensitivity ``Delta``, ``epsilon (u* - u_i) / Delta`` for a monotone one (McKenna & Sheldon,
Theorems 1 and 2) -- and never worse than it in expected score; it is report-noisy-max with
exponential noise (Ding et al. 2021, "The permute-and-flip mechanism is identical to
report-noisy-max with exponential noise"), the mechanism of OpenDP's
``make_noisy_max`` under pure DP. The best candidate has ``gamma = 0`` and is always accepted, so
a walk takes at most ``k`` steps.

Why not noisy max from float uniforms: ``argmax(score + Gumbel)`` (or + exponential noise) is
the same distribution only for real uniforms. Uniforms on a 2^-53 grid, clipped away from 0 and
1, bound the Gumbel noise to about [-6.5, 36.7], so a candidate more than ~43 below the best can
never win on one input while it has positive probability on its neighbour: an unstated delta of
about 2^-53 (issue 30).

Exactness here: the order is a Fisher-Yates shuffle drawn step by step (an exact bounded uniform
integer per step, :meth:`~transforms.noise.streams.RandomStreams.randint`) and each acceptance
is ``floor(gamma)`` Bernoulli(e^-1) trials, stopped at the first failure, then
Bernoulli(exp(-f)) for the fraction ``f`` (Canonne, Kamath & Steinke 2020, Algorithm 1, as
:func:`transforms.noise.samplers.bernoulli_exp_fraction`): uniform integers only, no floating
point, so every candidate has its exact, positive probability and the ratio of any outcome's
probabilities on neighbouring inputs is bounded exactly as the theorem says.

Vectorised over lanes (one lane per independent choice), in blocks of lanes so that the
per-lane orders (``k`` small integers per lane) stay within a few tens of MB; a lane's draws
depend on its own stream only, so the blocks change no choice.
"""
from __future__ import annotations

import numpy as np

from transforms.noise.samplers import bernoulli_exp_fraction, bernoulli_exp_minus_one
from transforms.noise.streams import RandomStreams

#: The largest common denominator of the gammas.
MAX_DENOMINATOR = 1 << 62
#: Lanes per block x candidates held at once (int32 orders: 4 bytes each).
_BLOCK_CELLS = 1 << 22


def bernoulli_exp_rational(streams: RandomStreams, num: np.ndarray, den: int,
                           lanes: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(-num/den)) per lane, exactly, for integers ``num >= 0`` (one per lane, below
    2^63) and ``0 < den <= 2^62`` (common)."""
    num = np.asarray(num, dtype=np.int64)
    lanes = np.asarray(lanes)
    den = int(den)
    if np.any(num < 0) or not 0 < den <= MAX_DENOMINATOR:
        raise ValueError("bernoulli_exp_rational needs num >= 0 and 0 < den <= 2^62")
    whole, fraction = num // den, num % den
    alive = np.ones(lanes.size, dtype=bool)
    remaining = whole.copy()
    pending = np.flatnonzero(remaining > 0)
    while pending.size:  # floor(gamma) Bernoulli(e^-1) trials, stopped at the first failure
        ok = bernoulli_exp_minus_one(streams, lanes[pending])
        alive[pending[~ok]] = False
        remaining[pending] -= 1
        pending = pending[ok & (remaining[pending] > 0)]
    idx = np.flatnonzero(alive & (fraction > 0))
    if idx.size:
        alive[idx] = bernoulli_exp_fraction(streams, fraction[idx].astype(np.uint64), den, lanes[idx])
    return alive


def _exponents(num, lanes: np.ndarray) -> np.ndarray:
    """``num`` as int64, one row (k,) for every lane or one per lane (lanes, k), each row
    shifted so that its minimum is 0 (only differences matter)."""
    num = np.asarray(num)
    if num.dtype.kind not in "iu" or num.ndim not in (1, 2) or num.shape[-1] < 1:
        raise ValueError("num: integers, one per candidate (k,) or per lane and candidate (n, k)")
    num = num.astype(np.int64)
    if num.ndim == 2 and num.shape[0] != lanes.size:
        raise ValueError(f"num has {num.shape[0]} rows for {lanes.size} lanes")
    num = num - num.min(axis=-1, keepdims=True)
    if np.any(num < 0):
        raise ValueError("num: non-negative integers below 2^63")
    return num


def permute_and_flip(streams: RandomStreams, num, den: int, lanes: np.ndarray = None) -> np.ndarray:
    """Per lane, the index of the chosen candidate (module docstring): candidate ``i`` accepted
    with probability ``exp(-(num[i] - min(num)) / den)`` when visited.

    ``num``: non-negative integers, one per candidate (shape (k,), common to every lane) or one
    row per lane (shape (lanes, k)); ``den``: a positive integer <= 2^62.
    """
    lanes = np.arange(streams.size) if lanes is None else np.asarray(lanes)
    num = _exponents(num, lanes)
    chosen = np.empty(lanes.size, dtype=np.int64)
    step = max(1, _BLOCK_CELLS // num.shape[-1])
    for start in range(0, lanes.size, step):
        block = np.arange(start, min(start + step, lanes.size))
        chosen[block] = _walk(streams, num if num.ndim == 1 else num[block], den, lanes[block])
    return chosen


def _walk(streams: RandomStreams, num: np.ndarray, den: int, lanes: np.ndarray) -> np.ndarray:
    k = num.shape[-1]
    order = np.tile(np.arange(k, dtype=np.int32), (lanes.size, 1))
    chosen = np.full(lanes.size, -1, dtype=np.int64)
    pending = np.arange(lanes.size)
    for t in range(k):
        if not pending.size:
            break
        # Step t of Fisher-Yates: a uniform one of the k - t candidates not visited yet.
        j = t + streams.randint(k - t, lanes[pending]).astype(np.int64)
        visited = order[pending, j]
        order[pending, j] = order[pending, t]
        order[pending, t] = visited
        gamma = num[visited] if num.ndim == 1 else num[pending, visited]
        accept = bernoulli_exp_rational(streams, gamma, den, lanes[pending])
        chosen[pending[accept]] = visited[accept]
        pending = pending[~accept]
    return chosen


def permute_and_flip_probabilities(num, den: int) -> np.ndarray:
    """The exact distribution :func:`permute_and_flip` samples (as floats, for tests and utility
    analysis). Give each candidate an independent uniform arrival time: the visiting order is
    then uniformly random, and ``i`` is chosen when it is accepted and no candidate arriving
    before it is, so ``P(i) = p_i * integral_0^1 prod_{j != i} (1 - p_j t) dt`` with ``p_j =
    exp(-gamma_j)``: a polynomial of degree ``k - 1`` in ``t``, integrated exactly by
    ``k``-point Gauss-Legendre quadrature."""
    gamma = np.asarray(num, dtype=np.float64) / float(den)
    p = np.exp(-(gamma - gamma.min()))
    nodes, weights = np.polynomial.legendre.leggauss(max(p.size, 1))
    t, w = (nodes + 1) / 2, weights / 2  # [-1, 1] -> [0, 1]
    factors = 1.0 - p[:, None] * t[None, :]
    return np.array([p[i] * float(np.dot(w, np.prod(np.delete(factors, i, axis=0), axis=0)))
                     for i in range(p.size)])
