"""A compact membership filter of public key hashes (pure: no Beam).

What a PCollection keyset (too large to hold as keys anywhere) gives every worker that bounds
rows: a test "may this row's key be in the keyset?" applied *before* contribution bounding, so
a row whose key is outside the keyset does not take one of its unit's L0 slots. The exact answer
comes later, from the keyset join of the release stage (:mod:`transforms.release`), which removes
every key outside the keyset; the filter only has to have no false negatives.

A *blocked Bloom filter* (Putze, Sanders and Singler, "Cache-, Hash- and Space-Efficient Bloom
Filters", WEA 2007): the filter is an array of 64-bit words; a key hash selects one word (from
its high 32 bits, by a multiply-shift onto the number of words) and :data:`PROBES` bit positions
inside it (6-bit fields of the hash times an odd constant). A key is added by setting its bits
in its word and is reported present when all its bits are set. One word per lookup: a batch of
rows costs one gather, not a binary search over the keyset (benchmarks/RESULTS.md compares
the two), and the filter takes :data:`BITS_PER_KEY` bits per key (2 bytes),
a quarter of a sorted array of 64-bit hashes.

False positives: at :data:`BITS_PER_KEY` = 16 and :data:`PROBES` = 6, a key outside the keyset
passes with probability about 0.4% (measured in tests/transforms/test_membership.py; 3.6% when the keyset
holds twice the keys the filter was sized for). Such a row is bounded with its unit's other rows
and then dropped at the keyset join (counted as ``dropped_outside_keyset_after_bounding``). The
filter is a function of the public keyset and a fixed public hash, so which rows pass it is
public information about the keyset: the bounding's sensitivity is unchanged.

Filters of the same size merge by OR (the union of their keys), so a CombineFn builds one from
any split of the keyset and the result does not depend on the split.
"""
from __future__ import annotations

import numpy as np

#: Filter bits per key of the size it is built for.
BITS_PER_KEY = 16
#: Bits set (and tested) per key, all in its one 64-bit word.
PROBES = 6
#: An odd 64-bit constant (2^64 / golden ratio): multiplying by it mixes the hash's bits into
#: the high bits, whose 6-bit fields give the probe positions.
_MIX = np.uint64(0x9E3779B97F4A7C15)
_U = np.uint64


def filter_words(expected_keys: int) -> int:
    """64-bit words of a filter sized for ``expected_keys`` keys (at least one)."""
    return max(1, -(-int(expected_keys) * BITS_PER_KEY // 64))


# Probe p of a key sets bit ((hash * _MIX) >> (58 - 6p)) & 63: two probes are one 12-bit field,
# whose two bits this table gives (32 KB: three lookups per key instead of six shifts).
_FIELD = np.arange(1 << 12, dtype=np.uint64)
_PROBE_PAIRS = (_U(1) << (_FIELD >> _U(6))) | (_U(1) << (_FIELD & _U(63)))
assert PROBES == 6


def _word_and_mask(hashes: np.ndarray, num_words: int):
    hashes = np.asarray(hashes, dtype=np.uint64)
    word = (((hashes >> _U(32)) * _U(num_words)) >> _U(32)).astype(np.intp)
    mixed = hashes * _MIX  # wraps mod 2^64
    mask = _PROBE_PAIRS[mixed >> _U(52)]  # probes 0 and 1: bits 58-63 and 52-57
    mask |= _PROBE_PAIRS[(mixed >> _U(40)) & _U(4095)]  # probes 2 and 3
    mask |= _PROBE_PAIRS[(mixed >> _U(28)) & _U(4095)]  # probes 4 and 5
    return word, mask


class KeyFilter:
    """A blocked Bloom filter over 64-bit key hashes (see the module docstring).

    ``words``: the filter's uint64 words (shared, not copied: a filter read from a side input's
    bytes stays in those bytes)."""

    def __init__(self, words: np.ndarray):
        self.words = words

    @classmethod
    def empty(cls, num_words: int) -> "KeyFilter":
        if num_words < 1:
            raise ValueError(f"a key filter needs at least one word, got {num_words}")
        return cls(np.zeros(int(num_words), dtype=np.uint64))

    @classmethod
    def of(cls, hashes: np.ndarray, num_words: int) -> "KeyFilter":
        filt = cls.empty(num_words)
        filt.add(hashes)
        return filt

    def add(self, hashes: np.ndarray) -> None:
        """Add keys (their 64-bit hashes), in place."""
        word, mask = _word_and_mask(hashes, len(self.words))
        # One gather and one scatter over the batch (the words are random accesses into a filter
        # larger than the cache; plain fancy indexing overlaps them, np.bitwise_or.at does not).
        # Hashes sharing a word in one scatter keep only the last one's bits, so the words are
        # read back and the keys whose bits are missing added again, until none is missing
        # (each round settles at least one key per shared word; a small share of keys repeats
        # once; benchmarks/RESULTS.md has the timings).
        while word.size:
            self.words[word] = self.words[word] | mask
            missing = (self.words[word] & mask) != mask
            word, mask = word[missing], mask[missing]

    def union(self, other: "KeyFilter") -> "KeyFilter":
        """The filter of both filters' keys (same size), in place; returns self."""
        if len(other.words) != len(self.words):
            raise ValueError(f"key filters of {len(self.words)} and {len(other.words)} words "
                             "cannot be merged")
        np.bitwise_or(self.words, other.words, out=self.words)
        return self

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """Per hash: True if its key may be in the filter (always True for an added key)."""
        if not len(hashes):
            return np.zeros(0, dtype=bool)
        word, mask = _word_and_mask(hashes, len(self.words))
        return (self.words[word] & mask) == mask

    def to_bytes(self) -> bytes:
        """The words as little-endian bytes (what :meth:`from_bytes` reads back in place)."""
        return self.words.astype("<u8", copy=False).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> "KeyFilter":
        """A read-only filter over ``data`` (no copy)."""
        if not len(data) or len(data) % 8:
            raise ValueError(f"key filter bytes must be a positive multiple of 8, got {len(data)}")
        return cls(np.frombuffer(data, dtype="<u8"))
