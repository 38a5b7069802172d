"""The exponential mechanism (McSherry & Talwar 2007), sampled exactly from keyed streams.

Candidate ``i`` of ``k`` is chosen with probability ``exp(-gamma_i) / sum_j exp(-gamma_j)``,
``gamma_i = num_i / den`` a non-negative rational (the candidate's score below the best, already
scaled by ``epsilon / (2 * sensitivity)``). The draw uses only uniform integers from the keyed
streams -- no floating point -- so every candidate has its exact, positive probability and the
ratio of any outcome's probabilities on neighbouring inputs is bounded by exactly ``e^epsilon``.

Why not Gumbel-max from uniforms: ``argmax(score + Gumbel)`` is the same distribution only for
real uniforms. Uniforms on a 2^-53 grid, clipped away from 0 and 1, bound the Gumbel noise to
about [-6.5, 36.7], so a candidate more than ~43 below the best can never win on one input while
it has positive probability on its neighbour: an unstated delta of about 2^-53 (issue 30).

Algorithm: rejection sampling, vectorised over lanes (one lane per independent choice). Propose a
candidate uniformly (an exact bounded integer), accept it with probability ``exp(-gamma)`` --
``floor(gamma)`` Bernoulli(e^-1) trials, stopped at the first failure, then Bernoulli(exp(-f)) for
the fraction ``f`` (Canonne, Kamath & Steinke 2020, Algorithm 1, as
:func:`transforms.noise.samplers.bernoulli_exp_fraction`) -- and repeat until one is accepted. The
best candidate has ``gamma = 0`` and is always accepted, so each round succeeds with probability at
least 1/k: at most k rounds on average, each a few uniform words per lane.
"""
from __future__ import annotations

import numpy as np

from transforms.noise.samplers import bernoulli_exp_fraction, bernoulli_exp_minus_one
from transforms.noise.streams import RandomStreams

#: The largest common denominator of the gammas (uniform integers are drawn below den * k).
MAX_DENOMINATOR = 1 << 62


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


def exponential_mechanism(streams: RandomStreams, num, den: int, lanes: np.ndarray = None) -> np.ndarray:
    """Per lane, the index of the chosen candidate: ``P(i) ∝ exp(-num[i] / den)`` exactly.

    ``num``: non-negative integers, one per candidate (shape (k,), common to every lane) or one
    row per lane (shape (lanes, k)); ``den``: a positive integer <= 2^62 (see the module
    docstring). Only differences matter: ``num`` is shifted so that its minimum is 0.
    """
    lanes = np.arange(streams.size) if lanes is None else np.asarray(lanes)
    num = np.asarray(num)
    if num.dtype.kind not in "iu" or num.ndim not in (1, 2) or num.shape[-1] < 1:
        raise ValueError("num: integers, one per candidate (k,) or per lane and candidate (n, k)")
    num = num.astype(np.int64)
    if num.ndim == 2 and num.shape[0] != lanes.size:
        raise ValueError(f"num has {num.shape[0]} rows for {lanes.size} lanes")
    num = num - num.min(axis=-1, keepdims=True)
    if np.any(num < 0):
        raise ValueError("num: non-negative integers below 2^63")
    k = num.shape[-1]
    chosen = np.full(lanes.size, -1, dtype=np.int64)
    pending = np.arange(lanes.size)
    while pending.size:
        proposal = streams.randint(k, lanes[pending]).astype(np.int64)
        gamma = num[proposal] if num.ndim == 1 else num[pending, proposal]
        accept = bernoulli_exp_rational(streams, gamma, den, lanes[pending])
        chosen[pending[accept]] = proposal[accept]
        pending = pending[~accept]
    return chosen


def exponential_probabilities(num, den: int) -> np.ndarray:
    """The exact distribution :func:`exponential_mechanism` samples (as floats, for tests and
    utility analysis)."""
    gamma = np.asarray(num, dtype=np.float64) / float(den)
    weights = np.exp(-(gamma - gamma.min()))
    return weights / weights.sum()
