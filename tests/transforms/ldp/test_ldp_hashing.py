"""OLH's hash family: strong universality (exhaustively, at small word sizes), the production
32-bit kernel against the formula, bucket collision probability, and support counting."""
import itertools

import numpy as np
import pytest

from transforms.ldp import hashing


def _family_table(word_bits, digit_bits, out_bits, digits):
    """h(x) for every function (a_0..a_{k-1}, b) and every x < 2^(digit_bits * digits)."""
    size = 1 << word_bits
    params = np.array(list(itertools.product(range(size), repeat=digits + 1)), dtype=np.int64)
    xs = np.arange(1 << (digit_bits * digits), dtype=np.int64)
    x_digits = [(xs >> (digit_bits * i)) & ((1 << digit_bits) - 1) for i in range(digits)]
    acc = params[:, digits][:, None] + sum(params[:, i][:, None] * x_digits[i][None, :]
                                           for i in range(digits))
    return (acc % size) >> (word_bits - out_bits)


def _strongly_universal(table, out_bits):
    """Every pair x != x' has (h(x), h(x')) exactly uniform over the functions."""
    functions, values = table.shape
    cells = 1 << (2 * out_bits)
    for x, y in itertools.combinations(range(values), 2):
        joint = np.bincount(table[:, x] * (1 << out_bits) + table[:, y], minlength=cells)
        if not np.all(joint == functions // cells):
            return False
    return True


def test_vector_multiply_add_shift_is_strongly_universal_when_word_bits_suffice():
    # word >= digit + out - 1 (the condition the production 32 >= 16 + 16 - 1 meets).
    assert _strongly_universal(_family_table(5, 2, 4, digits=2), out_bits=4)
    assert _strongly_universal(_family_table(5, 3, 3, digits=1), out_bits=3)


def test_the_check_fails_for_too_short_words():
    assert not _strongly_universal(_family_table(4, 2, 4, digits=2), out_bits=4)


def test_production_hash_matches_the_formula():
    rng = np.random.default_rng(3)
    for digits in (1, 2, 4):
        n = 500
        a = rng.integers(0, 1 << 32, size=(n, digits), dtype=np.uint64).astype(np.uint32)
        b = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
        x = rng.integers(0, 1 << min(63, 16 * digits), size=n, dtype=np.uint64)
        expected = [((sum(int(a[j, i]) * ((int(x[j]) >> (16 * i)) & 0xFFFF) for i in range(digits))
                      + int(b[j])) % (1 << 32)) >> 16 for j in range(n)]
        assert hashing.hash16(a, b, x).tolist() == expected


def test_buckets_partition_the_hash_range_and_collision_is_exact():
    for g in (2, 3, 5, 7, 56, 1000):
        lo, size = hashing.bucket_bounds(g)
        assert size.sum() == 1 << 16 and size.max() - size.min() <= 1
        h = np.arange(1 << 16, dtype=np.uint32)
        bucket = hashing.bucket_of(h, g)
        assert np.array_equal(np.bincount(bucket, minlength=g), size)
        assert np.array_equal(lo, np.searchsorted(bucket, np.arange(g)))
        kappa = hashing.collision_probability(g)
        assert kappa == pytest.approx(np.sum((size / 65536.0) ** 2))
        assert kappa >= 1 / g
    with pytest.raises(ValueError):
        hashing.bucket_bounds(1)


def test_support_counts_equal_a_naive_count():
    rng = np.random.default_rng(4)
    for digits, g, threads in ((1, 4, 1), (2, 5, 2), (3, 23, 2)):
        n, c = 3000, 700
        a = rng.integers(0, 1 << 32, size=(n, digits), dtype=np.uint64).astype(np.uint32)
        b = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
        y = rng.integers(0, g, size=n).astype(np.uint16)
        candidates = np.sort(rng.choice(1 << (16 * digits - 1), size=c, replace=False)).astype(np.uint64)
        naive = np.array([np.sum(hashing.bucket_of(hashing.hash16(a, b, np.full(n, v, np.uint64)), g) == y)
                          for v in candidates])
        got = hashing.support_counts(a, b, y, candidates, g, threads=threads)
        assert np.array_equal(got, naive)
    assert hashing.support_counts(a[:0], b[:0], y[:0], candidates, g).sum() == 0


@pytest.mark.parametrize("digits,g,threads,block", [
    (1, 4, 1, 777), (1, 3, 2, 777), (1, 7, 1, 777), (1, 300, 2, 777), (1, 5, 2, 1 << 17),
    (1, 6, 3, 1 << 17), (2, 5, 2, 777), (3, 300, 1, 1 << 17)])
def test_incremental_support_counting_equals_a_naive_count(monkeypatch, digits, g, threads, block):
    """Incremental hashing over the candidates (steps of the low digit, restarts where the high
    digits change; reports split by bucket width; several report blocks on threads, or one
    block with the candidates split over threads): equal to hashing every (report, candidate)
    pair from the formula."""
    monkeypatch.setattr(hashing, "_REPORT_BLOCK", block)
    rng = np.random.default_rng(g)
    n = 3000
    a = rng.integers(0, 1 << 32, size=(n, digits), dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    y = rng.integers(0, g, size=n).astype(np.uint16)
    progression = np.arange(0, 65536, 97, dtype=np.uint64)  # one gap: one multiply
    scattered = rng.choice(1 << 16, size=300, replace=False).astype(np.uint64)
    low = np.concatenate([progression, scattered, [0, 1, 2, 65535]])
    highs = rng.choice(1 << (16 * (digits - 1)), size=3, replace=False).astype(np.uint64) \
        if digits > 1 else np.zeros(1, np.uint64)
    candidates = np.unique((highs[:, None] << np.uint64(16)) + low[None, :])
    naive = np.array([np.sum(hashing.bucket_of(hashing.hash16(a, b, np.full(n, v, np.uint64)), g) == y)
                      for v in candidates])
    got = hashing.support_counts(a, b, y, candidates, g, threads=threads)
    assert np.array_equal(got, naive)
    # Any candidate order (gaps are taken mod 2^32): the same count per candidate.
    shuffled = rng.permutation(candidates.size)
    assert np.array_equal(hashing.support_counts(a, b, y, candidates[shuffled], g), naive[shuffled])


def test_empirical_collision_rate_of_random_functions_is_kappa():
    rng = np.random.default_rng(5)
    n, g = 400_000, 5
    a = rng.integers(0, 1 << 32, size=(n, 1), dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    x = hashing.bucket_of(hashing.hash16(a, b, np.full(n, 17, np.uint64)), g)
    y = hashing.bucket_of(hashing.hash16(a, b, np.full(n, 40000, np.uint64)), g)
    rate = np.mean(x == y)
    kappa = hashing.collision_probability(g)
    assert abs(rate - kappa) < 4 * np.sqrt(kappa * (1 - kappa) / n)
