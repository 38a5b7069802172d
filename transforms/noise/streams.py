"""Keyed random streams: one independent, reproducible stream of random bits per output key.

A release's randomness must be (1) cryptographically secure, (2) reproducible: the bits used for
output key K under purpose P depend only on (release key, P, K), never on bundling, worker or
order, and (3) fast: a million keys in well under a second. Construction:

* Each key is encoded canonically (:mod:`transforms.noise.encoding`) and mapped to a 128-bit
  lane seed by the PRF of :mod:`transforms.noise.prf` (length-prefixed AES-256 CBC-MAC) under a
  purpose-specific sub-key, so seeds of distinct keys look independent and uniformly random to
  anyone without the release key.
* Lane i's j-th block is AES-256_{K'}(seed_i XOR j) under a second sub-key K' (counter mode): an
  unbounded stream per lane. Samplers draw the blocks of a cache-sized group of lanes in one
  AES call, into buffers reused from call to call (:class:`~transforms.noise.prf.Scratch`).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey
from transforms.noise.prf import Scratch, ecb, encrypt_words, mac_keys

_U64 = np.uint64
_BLOCK = np.dtype("V16")  # one AES block, copied as a unit


class RandomStreams:
    """Independent keyed random streams, one per lane (output key).

    Draws advance per-lane counters, so a sampler that needs a variable number of draws per lane
    (rejection sampling) stays reproducible: lane i's values depend only on its own seed.
    """

    def __init__(self, release_key: ReleaseKey, purpose: str, seeds: np.ndarray, *, _copy: bool = True):
        if not isinstance(release_key, ReleaseKey):
            raise TypeError("release_key must be a ReleaseKey")
        self.release_key = release_key
        self.purpose = purpose
        seeds = seeds.view(np.uint64).reshape(-1, 2)
        # The streams own their seeds: a copy, unless they are the PRF's fresh output (for_keys).
        self._seeds = seeds.copy() if _copy else seeds
        self._counters = np.zeros(len(self._seeds), dtype=np.uint64)
        self._encryptor = ecb(release_key.subkey("stream:" + purpose).secret_bytes())

    @classmethod
    def for_keys(cls, release_key: ReleaseKey, purpose: str, keys) -> "RandomStreams":
        mac_key = release_key.subkey("key-mac:" + purpose).secret_bytes()
        return cls(release_key, purpose, mac_keys(mac_key, keys), _copy=False)

    @classmethod
    def for_range(cls, release_key: ReleaseKey, purpose: str, n: int, offset: int = 0) -> "RandomStreams":
        ids = np.arange(offset, offset + n, dtype=np.int64)
        return cls.for_keys(release_key, purpose, pa.table({"i": ids}))

    @property
    def noise_free(self) -> bool:
        """True only under a testing key from ``ReleaseKey.for_exact_testing``: samplers of noise
        return zero (the exact mode of the neighbouring-pair audits; never a release)."""
        return self.release_key.noise_free

    @property
    def size(self) -> int:
        return len(self._seeds)

    def __len__(self):
        return self.size

    def draw(self, lanes: np.ndarray = None) -> np.ndarray:
        """One uniform 64-bit word for each of ``lanes`` (all lanes if None)."""
        return self.draw_into(lanes, None).copy()

    def draw_into(self, lanes: np.ndarray, scratch: "Scratch" = None) -> np.ndarray:
        """:meth:`draw`, the words returned as a strided view of ``scratch``'s AES output (valid
        until its next use; a fresh buffer if None): the samplers' loops draw thousands of times
        and read each word once, so they reuse one cache-resident buffer instead of allocating,
        zeroing and copying a new one per draw."""
        scratch = Scratch() if scratch is None else scratch
        if lanes is None:
            blocks = scratch.blocks(self.size)
            np.copyto(blocks, self._seeds)
            counters = self._counters
            np.bitwise_xor(blocks[:, 0], counters, out=blocks[:, 0])
            counters += _U64(1)
        else:
            lanes = np.asarray(lanes)
            blocks = scratch.blocks(lanes.size)
            np.take(self._seeds, lanes, axis=0, out=blocks)
            counters = self._counters[lanes]
            np.bitwise_xor(blocks[:, 0], counters, out=blocks[:, 0])
            counters += _U64(1)
            self._counters[lanes] = counters
        return scratch.encrypt(self._encryptor, blocks)[:, 0]

    def ahead(self, lanes: np.ndarray, count: int) -> np.ndarray:
        """The next ``count`` words of each of ``lanes`` (distinct) as a (count, len(lanes))
        array, row j holding what the (j+1)-th ``draw`` would return, without drawing them: a
        sampler that reads a fixed number of words per lane gets them in one AES call and then
        :meth:`advance` s the lanes it used them for (a lane it does not advance is left where it
        was, for a sampler to draw its words one by one instead)."""
        return self.ahead_by_lane(lanes, count).T

    def ahead_by_lane(self, lanes: np.ndarray, count: int, scratch: "Scratch" = None) -> np.ndarray:
        """:meth:`ahead` transposed (``lanes`` distinct, or a slice: a range of lanes): a
        (len(lanes), count) array, row i holding lane i's next
        ``count`` words -- the order the blocks are encrypted in (each lane's blocks adjacent:
        its seed's second word is written once per lane, its counters are one broadcast add),
        and the order a sampler reads them in (a lane's words in one cache line or two). A
        strided view of ``scratch``'s AES output when given (valid until its next use)."""
        scratch = Scratch() if scratch is None else scratch
        if isinstance(lanes, slice):  # a range of lanes: views of their seeds and counters
            seeds, counters = self._seeds[lanes], self._counters[lanes]
        else:
            lanes = np.asarray(lanes)
            seeds, counters = np.take(self._seeds, lanes, axis=0), self._counters[lanes]
        size = counters.size
        if not size or not count:
            return np.zeros((size, count), dtype=np.uint64)
        blocks = scratch.blocks(size * count).reshape(size, count, 2)
        # Each lane's seed in each of its blocks (16-byte copies), then its counters XOR'd in.
        np.copyto(blocks.view(_BLOCK).reshape(size, count), seeds.view(_BLOCK))
        first = counters[0]
        if counters[-1] == first and np.all(counters == first):
            # Lanes at one place in their streams (a first sample): one row of counters for
            # all, XOR'd over contiguous words ((counter, 0) per block).
            flat = blocks.reshape(size, 2 * count)
            np.bitwise_xor(flat, scratch.counter_row(int(first), count), out=flat)
        else:
            steps = np.add(counters[:, None], np.arange(count, dtype=_U64))
            np.bitwise_xor(blocks[:, :, 0], steps, out=blocks[:, :, 0])
        words = scratch.encrypt(self._encryptor, blocks.reshape(-1, 2))
        return words.reshape(size, count, 2)[:, :, 0]

    def advance(self, lanes: np.ndarray, count) -> None:
        """Move each of ``lanes`` (distinct; or a slice, a range of them) past ``count`` words
        (read with :meth:`ahead`; one count for all, or one per lane)."""
        self._counters[lanes] += np.asarray(count, dtype=np.uint64)

    @classmethod
    def first_draw(cls, release_key: ReleaseKey, purpose: str, seeds: np.ndarray) -> np.ndarray:
        """What ``RandomStreams(release_key, purpose, seeds).draw()`` returns -- the first word
        of every lane -- without building per-lane state: one AES pass over ``seeds`` ((n, 2)
        uint64, C-contiguous), no copies. For callers that give every word its own lane seed."""
        if not isinstance(release_key, ReleaseKey):
            raise TypeError("release_key must be a ReleaseKey")
        encryptor = ecb(release_key.subkey("stream:" + purpose).secret_bytes())
        return _first_words(encryptor, np.ascontiguousarray(seeds, dtype=np.uint64).reshape(-1, 2))

    def uniform_uint64(self, lanes: np.ndarray = None) -> np.ndarray:
        return self.draw(lanes)

    def uniform_float(self, lanes: np.ndarray = None) -> np.ndarray:
        """Uniform on the 2^-53 grid of [0, 1)."""
        return (self.draw(lanes) >> _U64(11)).astype(np.float64) * 2.0 ** -53

    def randint(self, bound: np.ndarray, lanes: np.ndarray = None, scratch: Scratch = None) -> np.ndarray:
        """Exactly uniform integers in [0, bound) per lane (rejection of the biased top range);
        ``scratch`` as for :meth:`draw_into`."""
        if lanes is None:
            lanes = np.arange(self.size)
        if np.ndim(bound) == 0:
            return self._randint_common(int(bound), lanes, scratch)
        bound = np.broadcast_to(np.asarray(bound, dtype=np.uint64), lanes.shape)
        if np.any(bound == 0):
            raise ValueError("randint bound must be positive")
        if bound.size and np.all(bound == bound.flat[0]):
            return self._randint_common(int(bound.flat[0]), lanes, scratch)
        # Accept x < limit = floor(2^64 / bound) * bound; 2^64 mod bound = (2^64 - bound) mod bound.
        limit_gap = (_U64(0) - bound) % bound
        out = np.empty(lanes.shape, dtype=np.uint64)
        pending = np.arange(lanes.size)
        while pending.size:
            x = self.draw_into(lanes[pending], scratch)
            ok = x <= (np.iinfo(np.uint64).max - limit_gap[pending])
            out[pending[ok]] = x[ok] % bound[pending[ok]]
            pending = pending[~ok]
        return out

    def _randint_common(self, bound: int, lanes: np.ndarray, scratch: Scratch = None) -> np.ndarray:
        """``randint`` with one bound for every lane: the same draws and values as the per-lane
        path, without its per-lane arrays (the samplers' loops call this thousands of times)."""
        if not 0 < bound < 1 << 64:
            raise ValueError("randint bound must be positive")
        if not bound & (bound - 1):
            # A power-of-two bound: the low bits are exactly uniform; no rejection needed.
            return self.draw_into(lanes, scratch) & _U64(bound - 1)
        # Accept x <= 2^64 - 1 - (2^64 mod bound), i.e. x < floor(2^64 / bound) * bound.
        limit = _U64((1 << 64) - 1 - ((1 << 64) % bound))
        x = self.draw_into(lanes, scratch)
        ok = x <= limit
        if ok.all():
            return x % _U64(bound)
        out = np.empty(lanes.shape, dtype=np.uint64)
        out[ok] = x[ok] % _U64(bound)
        pending = np.flatnonzero(~ok)
        while pending.size:
            x = self.draw_into(lanes[pending], scratch)
            ok = x <= limit
            out[pending[ok]] = x[ok] % _U64(bound)
            pending = pending[~ok]
        return out

    def generator(self) -> np.random.Generator:
        """A numpy Generator keyed from lane 0's stream: for simulations, not release noise."""
        words = self.draw(np.array([0, 0]))
        key = int(words[0]) | (int(words[1]) << 64)
        return np.random.Generator(np.random.Philox(key=key))


def _first_words(encryptor, blocks: np.ndarray) -> np.ndarray:
    """AES(block) for each C-contiguous (n, 2) uint64 block (counter already applied): the first
    64-bit word of each ciphertext block (:func:`~transforms.noise.prf.encrypt_words`)."""
    return encrypt_words(encryptor, blocks)[:, 0].copy()
