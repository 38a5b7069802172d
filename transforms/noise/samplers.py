"""Exact integer noise samplers, vectorised over lanes of :class:`RandomStreams`.

The Bernoulli and discrete Gaussian samplers follow Canonne, Kamath & Steinke (2020), "The Discrete
Gaussian for Differential Privacy", Algorithms 1 and 3, using only uniform integers from the keyed
streams; the discrete Laplace sampler compares uniform words with exact binary expansions (no
floating point in the discrete Laplace path). Each algorithm runs over arrays of still-active
lanes, so a million samples cost a few dozen numpy passes rather than a million Python calls.

* Bernoulli(exp(-γ)) for rational γ = num/den in [0, 1]: draw A_k ~ Bernoulli(γ/k) for
  k = 1, 2, ... until the first failure; return whether that k is odd. Bernoulli(γ/k) is drawn as
  [uniform{0..k-1} == 0] and [uniform{0..den-1} < num], exact and free of overflow.
* Discrete Laplace with scale t/s (P[z] ∝ exp(-|z| s/t)): a sign and a geometric magnitude whose
  low binary digits and high part are independent, each read from one uniform word compared with
  the binary expansion of its exact (irrational) probability, further words read only on a tie
  (:func:`discrete_laplace_units`; about 3 words per sample at scale 1, K + 2 at larger scales).
  Scales are represented as t / 2^20 with integer t.
* Discrete Gaussian N_Z(0, σ²): discrete Laplace proposal with scale floor(σ)+1, accepted with
  probability exp(-(|Y| - σ²/t)²/(2σ²)). The exponent is computed in double precision and its
  fractional part rounded up to a multiple of 2^-60 before the exact Bernoulli: this perturbs each
  acceptance probability by a relative factor within 1 ± 2^-50 (documented, far below any
  privacy-relevant level); the output is always an integer.
"""
from __future__ import annotations

import decimal
import functools
import math
from dataclasses import dataclass

import numpy as np

from accounting.calibration import SCALE_FRACTION_BITS
from transforms.noise.prf import Scratch
from transforms.noise.streams import RandomStreams

_U64 = np.uint64
_FRACTION_BITS_GAMMA = 60


def _all(streams: RandomStreams, lanes):
    return np.arange(streams.size) if lanes is None else np.asarray(lanes)


def bernoulli_ratio(streams: RandomStreams, num: np.ndarray, den, k: int,
                    lanes: np.ndarray, scratch: Scratch = None) -> np.ndarray:
    """Bernoulli(num / (k·den)) per lane, exactly. ``den`` is an array (one per lane) or one
    integer for every lane (the samplers' common case: no per-lane arrays to build and scan).
    ``scratch``: AES buffers reused across a sampler's draws (:meth:`RandomStreams.draw_into`)."""
    if np.ndim(den) == 0:
        den = int(den)  # a Python int: exact products, and randint takes it as one common bound
    if k == 1 and np.all(num == den):
        return np.ones(lanes.size, dtype=bool)
    if np.all(den <= (1 << 63) // k):
        return streams.randint(den * k, lanes, scratch) < num
    # k·den would overflow 64 bits: draw the 1/k and num/den parts separately.
    first = streams.randint(k, lanes, scratch) == 0
    return first & (streams.randint(den, lanes, scratch) < num)


def bernoulli_exp_fraction(streams: RandomStreams, num, den, lanes: np.ndarray,
                           scratch: Scratch = None) -> np.ndarray:
    """Bernoulli(exp(-num/den)) per lane, for 0 <= num <= den (exact). ``num`` and ``den`` are
    arrays (one per lane) or integers common to every lane."""
    common_num, common_den = np.ndim(num) == 0, np.ndim(den) == 0
    num = int(num) if common_num else np.asarray(num, dtype=np.uint64)
    den = int(den) if common_den else np.asarray(den, dtype=np.uint64)
    scratch = Scratch() if scratch is None else scratch
    result = np.zeros(lanes.size, dtype=bool)
    active = np.arange(lanes.size)
    k = 1
    if (common_den and not common_num and not den & (den - 1) and den <= 1 << 62
            and lanes.size >= _PREFETCH_LANES and not np.all(num == den)):
        active = _first_two_steps(streams, num, den, lanes, result, scratch)
        k = 3
    while active.size:
        success = bernoulli_ratio(streams, num if common_num else num[active],
                                  den if common_den else den[active], k, lanes[active], scratch)
        finished = active[~success]
        result[finished] = (k % 2) == 1
        active = active[success]
        k += 1
    return result


#: Lanes from which bernoulli_exp_fraction reads its first two steps' words ahead.
_PREFETCH_LANES = 1 << 10


def _first_two_steps(streams: RandomStreams, num: np.ndarray, den: int, lanes: np.ndarray,
                     result: np.ndarray, scratch: Scratch) -> np.ndarray:
    """Steps k = 1 and 2 of :func:`bernoulli_exp_fraction` for a power-of-two ``den``: each
    reads exactly one word (a power-of-two bound, no rejection), so both words of every lane
    are read ahead in one AES call per cache-sized group and each lane is advanced past the
    words it used (one if it stopped at k = 1, else two): the words and outcomes of the loop.
    Writes the finished lanes' results; returns the positions of the lanes going on to k = 3."""
    step = _BLOCKS_PER_PASS // 2
    going_on = []
    for start in range(0, lanes.size, step):
        part = slice(start, start + step)
        ln, bound = lanes[part], num[part]
        words = streams.ahead_by_lane(ln, 2, scratch)
        first = (words[:, 0] & _U64(den - 1)) < bound  # A_1 ~ Bernoulli(num / den)
        second = first & ((words[:, 1] & _U64(2 * den - 1)) < bound)  # A_2, where A_1 held
        result[part] = ~first  # stopped at k = 1 (odd): True; at k = 2 (even): False
        streams.advance(ln, first.astype(np.uint64) + _U64(1))
        going_on.append(np.flatnonzero(second) + start)
    return np.concatenate(going_on) if going_on else np.zeros(0, dtype=np.int64)


def bernoulli_exp_minus_one(streams: RandomStreams, lanes: np.ndarray, scratch: Scratch = None) -> np.ndarray:
    return bernoulli_exp_fraction(streams, 1, 1, lanes, scratch)


def bernoulli_exp(streams: RandomStreams, gamma: np.ndarray, lanes: np.ndarray,
                  scratch: Scratch = None) -> np.ndarray:
    """Bernoulli(exp(-γ)) for real γ >= 0 (doubles): floor(γ) exp(-1) trials, then the fraction."""
    scratch = Scratch() if scratch is None else scratch
    gamma = np.asarray(gamma, dtype=np.float64)
    whole = np.floor(gamma)
    fraction = gamma - whole
    alive = np.ones(lanes.size, dtype=bool)
    remaining = whole.astype(np.int64)
    candidates = np.nonzero(remaining > 0)[0]
    while candidates.size:
        ok = bernoulli_exp_minus_one(streams, lanes[candidates], scratch)
        alive[candidates[~ok]] = False
        remaining[candidates] -= 1
        candidates = candidates[ok & (remaining[candidates] > 0)]
    idx = np.nonzero(alive)[0]
    if idx.size:
        # One denominator for every lane: the common-bound draws (the same words and values
        # as a per-lane array of it).
        num = np.ceil(np.ldexp(fraction[idx], _FRACTION_BITS_GAMMA)).astype(np.uint64)
        alive[idx] = bernoulli_exp_fraction(streams, num, 1 << _FRACTION_BITS_GAMMA, lanes[idx], scratch)
    return alive


def scale_to_units(scale: float) -> int:
    """Integer t with t / 2^20 >= scale (the sampled discrete Laplace scale, rounded up)."""
    t = math.ceil(math.ldexp(scale, SCALE_FRACTION_BITS))
    if t >= 1 << 52:
        raise ValueError(f"discrete Laplace scale {scale} is too large for the exact sampler")
    return max(t, 1)


# --------------------------------------------------------------------------- discrete Laplace

@dataclass(frozen=True, kw_only=True)
class _Exponential:
    """The real number e^(-x), x = num / den > 0, or, with ``logistic``, e^(-x) / (1 + e^(-x))."""
    num: int
    den: int
    logistic: bool = False

    def words(self, count: int) -> int:
        """floor(v · 2^(64·count)): the first ``count`` 64-bit words of v's binary expansion."""
        return _expansion(self.num, self.den, self.logistic, count)

    def word(self, index: int) -> int:
        """Word ``index`` (0 first) of v's binary expansion."""
        return self.words(index + 1) & _WORD_MASK


_WORD_MASK = (1 << 64) - 1


@functools.lru_cache(maxsize=4096)
def _expansion(num: int, den: int, logistic: bool, count: int) -> int:
    """floor(v · 2^(64·count)) exactly, v as in :class:`_Exponential`, by decimal arithmetic:
    ``Decimal.exp`` is correctly rounded, so at p significant digits every step is off by a
    relative 10^(4-p) at most (the argument's rounding costs x·10^(1-p), x < 2^7 here); the
    floor is returned once it is the same at both ends of a 10^(10-p) interval, else p grows.
    v is irrational (e^(-x) for rational x != 0 is transcendental), so the floor is well defined
    and the loop ends."""
    digits = int(64 * count * 0.30103) + 40 + len(str(num))
    while True:
        with decimal.localcontext() as ctx:
            ctx.prec = digits
            ctx.Emin, ctx.Emax = decimal.MIN_EMIN, decimal.MAX_EMAX
            ctx.traps[decimal.Inexact] = ctx.traps[decimal.Rounded] = False
            e = (-(decimal.Decimal(num) / decimal.Decimal(den))).exp()
            v = e / (1 + e) if logistic else e
            scaled = v * decimal.Decimal(1 << (64 * count))
            slack = scaled * decimal.Decimal(10) ** (10 - digits)
            low = int((scaled - slack).to_integral_value(decimal.ROUND_FLOOR))
            high = int((scaled + slack).to_integral_value(decimal.ROUND_FLOOR))
        if low == high:
            return low
        digits *= 2


def _below(words: list, more, number: _Exponential) -> bool:
    """Whether U < v for the uniform real U = 0.w0 w1 w2 ... whose 64-bit words are ``words``,
    extended in place with ``more()`` only while they equal v's (so no word is read after the
    first that differs)."""
    index = 0
    while True:
        if index == len(words):
            words.append(more())
        target = number.word(index)
        if words[index] != target:
            return words[index] < target
        index += 1


def _count_below(words: list, more, numbers) -> int:
    """How many of the decreasing reals ``numbers(1), numbers(2), ...`` exceed the uniform U whose
    words are ``words`` (extended in place as :func:`_below` needs them)."""
    m = 0
    while _below(words, more, numbers(m + 1)):
        m += 1
    return m


@dataclass(frozen=True, kw_only=True)
class _GeometricPlan:
    """How Y ~ Geometric(1 - q), P[Y = y] = (1 - q) q^y with q = e^(-s/t), is read from words.

    For any K >= 0, Y = C + 2^K D with independent parts: C's binary digits c_0 .. c_(K-1),
    c_j ~ Bernoulli(q^(2^j) / (1 + q^(2^j))) (the truncated geometric on [0, 2^K) factorises over
    its digits), and D ~ Geometric(1 - r), r = q^(2^K), the number of m >= 1 with U < r^m (a
    sorted search over the first words of r^1 > r^2 > ... down to the first below 2^-64). K is
    :data:`_TAIL_BITS` less than the least K with 2^K s >= t (at least 0), so r <= e^(-2^-4)
    and D's table holds at most about 710 thresholds. Each part is one uniform word compared
    with the first word of a real threshold's binary expansion; a word equal to it (probability
    2^-64 per comparison) is resolved exactly by reading more words (:func:`_below`)."""
    t: int
    s: int
    k: int
    digit_thresholds: np.ndarray  # (K,) uint64: first words of q^(2^j) / (1 + q^(2^j))
    tail_thresholds: np.ndarray   # ascending uint64: first words of r^m, m = M .. 1 (r^M < 2^-64)

    @property
    def digit_bytes(self) -> int:
        """Bytes that hold a lane's K digit bits (1, 2, 4 or 8: a little-endian integer)."""
        for size in (1, 2, 4, 8):
            if 8 * size >= self.k:
                return size
        raise ValueError(f"a discrete Laplace plan of {self.k} digits does not fit 64 bits")

    @property
    def digit_dtype(self) -> np.dtype:
        return np.dtype(f"<u{self.digit_bytes}")

    def digit(self, j: int) -> _Exponential:
        return _digit(self.t, self.s, j)

    def tail(self, m: int) -> _Exponential:
        return _tail(self.t, self.s, self.k, m)


def _digit(t: int, s: int, j: int) -> _Exponential:
    """P[c_j = 1] = q^(2^j) / (1 + q^(2^j)), q = e^(-s/t)."""
    return _Exponential(num=s << j, den=t, logistic=True)


def _tail(t: int, s: int, k: int, m: int) -> _Exponential:
    """r^m = e^(-m 2^K s / t)."""
    return _Exponential(num=(m * s) << k, den=t)


#: Digits of Y read from D's threshold table instead (its length grows by 2^_TAIL_BITS).
_TAIL_BITS = 4


@functools.lru_cache(maxsize=64)
def _geometric_plan(t: int, s: int) -> _GeometricPlan:
    # K: the least with 2^K >= t / s, less up to _TAIL_BITS digits moved into a longer table of
    # D's thresholds (one sorted search instead of a pass per digit).
    k = max(0, (-(-t // s) - 1).bit_length() - _TAIL_BITS)
    digits = [_digit(t, s, j).words(1) for j in range(k)]
    tail = []
    while not tail or tail[-1]:
        tail.append(_tail(t, s, k, len(tail) + 1).words(1))
    return _GeometricPlan(t=t, s=s, k=k, digit_thresholds=np.array(digits, dtype=np.uint64),
                          tail_thresholds=np.array(tail[::-1], dtype=np.uint64))


def _attempt_exact(streams: RandomStreams, lane: int, plan: _GeometricPlan):
    """One attempt (sign, then Y) for one lane, reading its words one at a time: the definition
    the vectorised path follows whenever no word equals a threshold."""
    lanes = np.array([lane])

    def more() -> int:
        return int(streams.draw(lanes)[0])

    negative = bool(more() & 1)
    y = 0
    for j in range(plan.k):
        if _below([more()], more, plan.digit(j)):
            y |= 1 << j
    y += _count_below([more()], more, plan.tail) << plan.k
    return negative, y


def discrete_laplace_units(streams: RandomStreams, t: int, s: int, lanes: np.ndarray,
                           scratch: Scratch = None) -> np.ndarray:
    """Discrete Laplace with P[z] ∝ exp(-|z| s / t) for integers s, t >= 1, exactly.

    Per lane (``lanes`` distinct): a sign (one word's lowest bit) and Y ~ Geometric(1 - e^(-s/t))
    (:class:`_GeometricPlan`: K + 1 words, K = ceil(log2(t / s)) - 4 or 0); a negative zero is rejected
    and the lane tries again, so P[z] ∝ e^(-|z| s/t). Every comparison of a uniform word with a
    threshold is exact: the thresholds are the binary expansions of the real probabilities,
    read as far as the uniform's words need (Knuth & Yao, "The complexity of nonuniform random
    number generation", 1976: a uniform real revealed only as far as a decision needs).

    Vectorised: an attempt reads K + 2 words for all pending lanes in one AES call
    (:meth:`RandomStreams.ahead`) and decides every part with a comparison or a sorted search;
    a lane whose word equals a threshold (at most about (K + 710) · 2^-64 per attempt) redoes that attempt
    word by word (:func:`_attempt_exact`). Either way a lane reads the words of its own stream in
    the same order, so its sample depends on its stream alone. ``scratch``: AES buffers reused
    across a sampler's draws (the discrete Gaussian's rejection rounds)."""
    lanes = np.asarray(lanes)
    first = int(lanes[0]) if lanes.size else 0
    in_range = (lanes.size > 1 and int(lanes[-1]) - first == lanes.size - 1
                and bool(np.all(np.diff(lanes) == 1)))
    return _discrete_laplace_pass(streams, _geometric_plan(int(t), int(s)), lanes,
                                  Scratch() if scratch is None else scratch,
                                  slice(first, first + lanes.size) if in_range else None)


#: AES blocks of one call of :func:`_attempts` (K + 2 per lane): its blocks, ciphertexts and
#: comparisons, a few hundred KiB each, stay in the processor's cache.
_BLOCKS_PER_PASS = 1 << 15
_MIN_LANES_PER_PASS = 1 << 8


def _discrete_laplace_pass(streams: RandomStreams, plan: _GeometricPlan, lanes: np.ndarray,
                           scratch: Scratch = None, span: slice = None) -> np.ndarray:
    """:func:`discrete_laplace_units` of ``lanes`` (distinct; ``span``: the same lanes as a
    slice, if they are a range) under ``plan``: rounds of one attempt for every pending lane, a
    cache-sized group of lanes at a time, until no lane drew a negative zero. (Every lane reads
    its own stream in the same order whatever the grouping, so rounds over all pending lanes
    give the values lane-by-lane loops would, with far fewer small numpy calls.)"""
    scratch = Scratch() if scratch is None else scratch
    step = max(_MIN_LANES_PER_PASS, _BLOCKS_PER_PASS // (plan.k + 2))
    out = np.empty(lanes.size, dtype=np.int64)
    pending = None  # every lane
    while True:
        ln = lanes if pending is None else lanes[pending]
        retry = []
        for start in range(0, ln.size, step):
            part = slice(start, start + step)
            read = ln[part] if span is None or pending is not None else \
                slice(span.start + start, span.start + min(start + step, ln.size))
            values, again = _attempts(streams, plan, ln[part], read, scratch)
            if pending is None:
                out[part] = values
            else:
                out[pending[part]] = values
            if again.size:
                retry.append(again + start)
        if not retry:
            return out
        again = np.concatenate(retry)
        pending = again if pending is None else pending[again]


def _attempts(streams: RandomStreams, plan: _GeometricPlan, lanes: np.ndarray, read, scratch: Scratch):
    """One attempt for each of ``lanes`` (``read``: the same lanes, or the same as a slice):
    the values (0 where a negative zero is drawn) and the positions of those lanes to retry."""
    k, tail, digits = plan.k, plan.tail_thresholds, plan.digit_thresholds
    words = streams.ahead_by_lane(read, k + 2, scratch)  # row i: lane i's sign, digits, tail
    negative = (words[:, 0] & _U64(1)).astype(bool)
    # D = how many of r^1 > r^2 > ... exceed U: thresholds above the word (ties go the exact
    # way below, so an untied word's count is exact).
    last = words[:, k + 1]
    at = np.searchsorted(tail, last, side="left")
    tied = tail[np.minimum(at, tail.size - 1)] == last
    y = (tail.size - at).astype(np.uint64) << _U64(k)
    if k:
        # Digit j is 1 where word j + 1 is below its threshold: bits packed 8 to a byte,
        # little-endian, read as the low K bits of Y.
        words_digits = words[:, 1:k + 1]
        below = np.zeros((lanes.size, plan.digit_bytes * 8), dtype=bool)
        np.less(words_digits, digits, out=below[:, :k])
        y |= np.packbits(below.reshape(-1), bitorder="little").view(plan.digit_dtype)
        equal = np.equal(words_digits, digits)
        if equal.any():
            tied |= equal.any(axis=1)
    if tied.any():
        streams.advance(lanes[~tied], k + 2)
        for i in np.flatnonzero(tied):
            negative[i], y[i] = _attempt_exact(streams, int(lanes[i]), plan)
    else:
        streams.advance(read, k + 2)
    values = y.astype(np.int64)
    np.negative(values, out=values, where=negative)
    return values, np.flatnonzero(negative & (y == 0))  # a negative zero: that lane tries again


def discrete_laplace(streams: RandomStreams, scale: float, lanes: np.ndarray = None) -> np.ndarray:
    """One sample of discrete Laplace (P[z] ∝ exp(-|z|/b), b = scale rounded up to 2^-20) per lane."""
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    lanes = _all(streams, lanes)
    return discrete_laplace_units(streams, scale_to_units(scale), 1 << SCALE_FRACTION_BITS, lanes)


def discrete_gaussian(streams: RandomStreams, sigma: float, lanes: np.ndarray = None) -> np.ndarray:
    """One sample of the discrete Gaussian N_Z(0, σ²) per lane (CKS Algorithm 3)."""
    if not sigma > 0:
        raise ValueError(f"sigma must be positive, got {sigma!r}")
    lanes = _all(streams, lanes)
    t = math.floor(sigma) + 1
    sigma2 = sigma * sigma
    scratch = Scratch()
    out = np.zeros(lanes.size, dtype=np.int64)
    pending = np.arange(lanes.size)
    while pending.size:
        ln = lanes[pending]
        y = discrete_laplace_units(streams, t << SCALE_FRACTION_BITS, 1 << SCALE_FRACTION_BITS, ln,
                                   scratch)
        gamma = (np.abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        accept = bernoulli_exp(streams, gamma, ln, scratch)
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out
