"""The universal hash family of optimized local hashing (OLH), and support counting against it.

Family (vector multiply-add-shift; Dietzfelbinger 1996, "Universal hashing and k-wise
independent random variables via integer arithmetic without primes", as presented in Thorup,
"High Speed Hashing for Integers and Strings", 2015). A value ``x < 2^(16·k)`` is written as
``k`` 16-bit digits ``x_0 .. x_{k-1}`` (least significant first). A function is drawn as ``k+1``
independent uniform 32-bit words ``a_0 .. a_{k-1}, b`` and evaluates

    h(x) = ((sum_i a_i · x_i + b) mod 2^32) >> 16          in [0, 2^16),

which is *strongly universal* (pairwise independent) because 32 >= 16 + 16 - 1: for x != x' the
pair (h(x), h(x')) is exactly uniform on [2^16]^2 over the draw of the function. The 16-bit hash
is mapped to one of the ``g`` OLH buckets by ``bucket(h) = (h · g) >> 16`` (bucket ``c`` holds the
``n_c`` hashes in ``[ceil(c·2^16/g), ceil((c+1)·2^16/g))``; sizes differ by at most one when
``g`` does not divide 2^16).

What the estimator needs is exact, not approximate: for x != x', pairwise independence gives

    P[bucket(h(x)) == bucket(h(x'))] = kappa = sum_c (n_c / 2^16)^2      (>= 1/g, ~ 1/g)

so the support probability of a non-matching report is ``q* = kappa·p + (1 - kappa)·(1 - p)/(g - 1)``
exactly (see :mod:`transforms.ldp.oracles`), and the OLH estimator is exactly unbiased. (The
paper's analysis assumes kappa = 1/g; Wang et al. use xxhash with a random seed instead of a
documented family.)

Support counting. A report ``(a, b, y)`` supports ``x`` iff ``bucket(h(x)) == y`` iff
``(sum a_i x_i + b - lo_y · 2^16) mod 2^32 < n_y · 2^16`` -- with ``b' = b - lo_y·2^16`` and the
width precomputed per report, one multiply-add chain and one unsigned comparison in 32-bit
lanes. :func:`support_counts` takes the reports as the vector (cache-sized blocks of uint32
lanes) and the candidates as the loop, and hashes incrementally: in candidate order, while the
high digits stay the same, ``a·x_{j+1} + b' = (a·x_j + b') + a_0·(x_{j+1} - x_j)`` (mod 2^32),
so a candidate costs one vector add (plus one multiply only when the gap to the previous
candidate changes: an arithmetic progression, or the consecutive extensions of a PEM prefix,
multiply once), one comparison with a *scalar* width (reports are ordered once per batch by
their bucket's width, of which there are at most two) and one ``count_nonzero`` -- three
streaming passes; the full chain is evaluated only where the high digits change. numpy
releases the GIL inside each pass, so report blocks (or, for a single block, candidate ranges)
run on threads.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

DIGIT_BITS = 16
HASH_BITS = 16
WORD_BITS = 32
MAX_BUCKETS = 1 << HASH_BITS
_REPORT_BLOCK = 1 << 17  # reports per block (~1.1 MB of uint32 lanes and flags)


def digits_for_bits(value_bits: int) -> int:
    """How many 16-bit digits a value of ``value_bits`` bits has (at least one)."""
    if not 1 <= value_bits <= 64:
        raise ValueError(f"OLH hashes values of 1..64 bits, got {value_bits!r}")
    return max(1, -(-value_bits // DIGIT_BITS))


def value_digits(values: np.ndarray, digits: int) -> np.ndarray:
    """``(digits, n)`` uint32: the 16-bit digits of uint64 ``values``, least significant first."""
    values = np.asarray(values, dtype=np.uint64)
    shifts = (np.arange(digits, dtype=np.uint64) * np.uint64(DIGIT_BITS))[:, None]
    return ((values[None, :] >> shifts) & np.uint64(0xFFFF)).astype(np.uint32)


def hash16(a: np.ndarray, b: np.ndarray, values: np.ndarray) -> np.ndarray:
    """h(x) for each report's own value: ``a`` (n, k) uint32, ``b`` (n,) uint32 -> (n,) uint32."""
    digits = value_digits(values, a.shape[1])
    acc = b.astype(np.uint32).copy()
    for i in range(a.shape[1]):
        acc += a[:, i] * digits[i]  # uint32 arithmetic wraps mod 2^32
    return acc >> np.uint32(WORD_BITS - HASH_BITS)


def bucket_bounds(buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, size)`` of each bucket's hash range: bucket c = [lo_c, lo_c + size_c)."""
    if not 2 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"OLH needs 2..{MAX_BUCKETS} buckets, got {buckets!r}")
    c = np.arange(buckets + 1, dtype=np.int64)
    edges = -((-c * MAX_BUCKETS) // buckets)  # ceil(c · 2^16 / g)
    return edges[:-1].astype(np.uint32), np.diff(edges).astype(np.uint32)


def bucket_of(h16: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of 16-bit hashes: (h · g) >> 16 (uint32, no overflow for g <= 2^16)."""
    return (np.asarray(h16, dtype=np.uint32) * np.uint32(buckets)) >> np.uint32(HASH_BITS)


def collision_probability(buckets: int) -> float:
    """kappa = P[two distinct values share a bucket] under the family (exact; see module doc)."""
    _, size = bucket_bounds(buckets)
    return math.fsum(float(s) * float(s) for s in size) / float(MAX_BUCKETS) ** 2


def support_counts(a: np.ndarray, b: np.ndarray, y: np.ndarray, candidates: np.ndarray,
                   buckets: int, *, threads: Optional[int] = None) -> np.ndarray:
    """For each candidate, how many reports ``(a, b, y)`` support it (int64[len(candidates)]).

    ``a``: (n, k) uint32 hash words; ``b``: (n,) uint32; ``y``: (n,) bucket reports in [0, g);
    ``candidates``: uint64 values of at most 16·k bits. ``threads``: worker threads for the
    blocks (default: up to 2, numpy releases the GIL inside each block).
    """
    a = np.ascontiguousarray(a, dtype=np.uint32)
    n, k = a.shape
    candidates = np.asarray(candidates, dtype=np.uint64)
    counts = np.zeros(candidates.size, dtype=np.int64)
    if n == 0 or candidates.size == 0:
        return counts
    lo, size = bucket_bounds(buckets)
    y = np.asarray(y)
    # Shift each report's accepted interval to start at 0: b' = b - lo_y << 16, width_y << 16.
    shifted_b = (np.asarray(b, dtype=np.uint32) - (lo[y] << np.uint32(HASH_BITS))).astype(np.uint32)
    width = (size[y].astype(np.uint64) << np.uint64(WORD_BITS - HASH_BITS))
    # A bucket of 2^16 hashes is impossible (g >= 2), so width < 2^32 fits uint32.
    width = width.astype(np.uint32)
    return _incremental_support(a, shifted_b, width, candidates, size, threads)


def _incremental_support(a: np.ndarray, shifted_b: np.ndarray, width: np.ndarray,
                         candidates: np.ndarray, size: np.ndarray,
                         threads: Optional[int]) -> np.ndarray:
    """Support counts by incremental hashing over the candidates (module doc).

    ``a`` (n, k), ``shifted_b`` / ``width`` (n,): per report, as in :func:`support_counts`;
    ``size``: the bucket sizes.
    """
    n, k = a.shape
    narrow = np.uint32(int(size.min()) << HASH_BITS)
    # Order the reports by width (stable): the first ``split`` have the narrow width, the rest
    # (buckets one hash larger when g does not divide 2^16) the wide one.
    wide = width != narrow
    split = n - int(np.count_nonzero(wide))
    if split < n:
        order = np.argsort(wide, kind="stable")
        a, shifted_b = a[order], shifted_b[order]
        wide_width = np.uint32((int(size.min()) + 1) << HASH_BITS)
    else:
        wide_width = narrow
    lanes_by_digit = np.ascontiguousarray(a.T)  # (k, n): each digit's words contiguous
    digits = value_digits(candidates, k)  # (k, C) uint32
    # gap: the change of the low digit (mod 2^32); restart: the high digits changed.
    gaps = np.diff(digits[0], prepend=np.uint32(0))
    restart = np.ones(candidates.size, dtype=bool)
    if k > 1:
        restart[1:] = np.any(digits[1:, 1:] != digits[1:, :-1], axis=0)
    workers = threads if threads is not None else 2
    row_blocks = [(r0, min(n, r0 + _REPORT_BLOCK)) for r0 in range(0, n, _REPORT_BLOCK)]
    # Fewer report blocks than workers (one batch of a Beam bundle): split the candidates too.
    pieces = max(1, min(workers // len(row_blocks), candidates.size // 64))
    bounds = [candidates.size * i // pieces for i in range(pieces + 1)]
    blocks = [(r0, r1, c0, c1) for r0, r1 in row_blocks for c0, c1 in zip(bounds, bounds[1:])]

    def run(block):
        r0, r1, c0, c1 = block
        m = r1 - r0
        s = min(max(split - r0, 0), m)
        lanes = lanes_by_digit[:, r0:r1]
        base = shifted_b[r0:r1]
        acc = np.empty(m, dtype=np.uint32)  # a·x + b' for the current candidate
        step = np.empty(m, dtype=np.uint32)
        hit = np.empty(m, dtype=bool)
        acc_n, acc_w, hit_n, hit_w = acc[:s], acc[s:], hit[:s], hit[s:]
        out = np.zeros(candidates.size, dtype=np.int64)
        last_gap = None
        for j in range(c0, c1):
            if j == c0 or restart[j]:  # the whole chain (uint32 arithmetic wraps mod 2^32)
                np.copyto(acc, base)
                for i in range(k):
                    np.multiply(lanes[i], digits[i, j], out=step)
                    np.add(acc, step, out=acc)
                last_gap = None
            else:
                gap = gaps[j]
                if gap != last_gap:
                    np.multiply(lanes[0], gap, out=step)
                    last_gap = gap
                np.add(acc, step, out=acc)
            np.less(acc_n, narrow, out=hit_n)
            if s < m:
                np.less(acc_w, wide_width, out=hit_w)
            out[j] = np.count_nonzero(hit)
        return out

    if workers > 1 and len(blocks) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(run, blocks))
    else:
        parts = [run(block) for block in blocks]
    return np.sum(parts, axis=0, dtype=np.int64)
