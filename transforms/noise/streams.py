"""Keyed random streams: one independent, reproducible stream of random bits per output key.

A release's randomness must be (1) cryptographically secure, (2) reproducible: the bits used for
output key K under purpose P depend only on (release key, P, K), never on bundling, worker or
order, and (3) fast: a million keys in well under a second. Construction:

* Each key is encoded canonically (:mod:`transforms.noise.encoding`) and mapped to a 128-bit
  lane seed by the PRF of :mod:`transforms.noise.prf` (length-prefixed AES-256 CBC-MAC) under a
  purpose-specific sub-key, so seeds of distinct keys look independent and uniformly random to
  anyone without the release key.
* Lane i's j-th block is AES-256_{K'}(seed_i XOR j) under a second sub-key K' (counter mode): an
  unbounded stream per lane. Samplers draw whole arrays of blocks in one AES call.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey
from transforms.noise.prf import ecb, encrypt_words, mac_keys

_U64 = np.uint64


class RandomStreams:
    """Independent keyed random streams, one per lane (output key).

    Draws advance per-lane counters, so a sampler that needs a variable number of draws per lane
    (rejection sampling) stays reproducible: lane i's values depend only on its own seed.
    """

    def __init__(self, release_key: ReleaseKey, purpose: str, seeds: np.ndarray):
        if not isinstance(release_key, ReleaseKey):
            raise TypeError("release_key must be a ReleaseKey")
        self.release_key = release_key
        self.purpose = purpose
        self._seeds = seeds.view(np.uint64).reshape(-1, 2).copy()
        self._counters = np.zeros(len(self._seeds), dtype=np.uint64)
        self._encryptor = ecb(release_key.subkey("stream:" + purpose).secret_bytes())

    @classmethod
    def for_keys(cls, release_key: ReleaseKey, purpose: str, keys) -> "RandomStreams":
        mac_key = release_key.subkey("key-mac:" + purpose).secret_bytes()
        return cls(release_key, purpose, mac_keys(mac_key, keys))

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
        if lanes is None:
            lanes = np.arange(self.size)
        blocks = self._seeds[lanes]  # fancy indexing: already a copy
        counters = self._counters[lanes]
        blocks[:, 0] ^= counters
        self._counters[lanes] = counters + _U64(1)
        return _first_words(self._encryptor, blocks)

    def ahead(self, lanes: np.ndarray, count: int) -> np.ndarray:
        """The next ``count`` words of each of ``lanes`` (distinct) as a (count, len(lanes))
        array, row j holding what the (j+1)-th ``draw`` would return, without drawing them: a
        sampler that reads a fixed number of words per lane gets them in one AES call and then
        :meth:`advance` s the lanes it used them for (a lane it does not advance is left where it
        was, for a sampler to draw its words one by one instead)."""
        lanes = np.asarray(lanes)
        if not lanes.size or not count:
            return np.zeros((count, lanes.size), dtype=np.uint64)
        blocks = np.empty((count, lanes.size, 2), dtype=np.uint64)
        blocks[:] = self._seeds[lanes]
        blocks[:, :, 0] ^= self._counters[lanes][None, :] + np.arange(count, dtype=np.uint64)[:, None]
        return _first_words(self._encryptor, blocks.reshape(-1, 2)).reshape(count, lanes.size)

    def advance(self, lanes: np.ndarray, count: int) -> None:
        """Move each of ``lanes`` (distinct) past ``count`` words (read with :meth:`ahead`)."""
        self._counters[lanes] += _U64(count)

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

    def randint(self, bound: np.ndarray, lanes: np.ndarray = None) -> np.ndarray:
        """Exactly uniform integers in [0, bound) per lane (rejection of the biased top range)."""
        if lanes is None:
            lanes = np.arange(self.size)
        if np.ndim(bound) == 0:
            return self._randint_common(int(bound), lanes)
        bound = np.broadcast_to(np.asarray(bound, dtype=np.uint64), lanes.shape)
        if np.any(bound == 0):
            raise ValueError("randint bound must be positive")
        if bound.size and np.all(bound == bound.flat[0]):
            return self._randint_common(int(bound.flat[0]), lanes)
        # Accept x < limit = floor(2^64 / bound) * bound; 2^64 mod bound = (2^64 - bound) mod bound.
        limit_gap = (_U64(0) - bound) % bound
        out = np.empty(lanes.shape, dtype=np.uint64)
        pending = np.arange(lanes.size)
        while pending.size:
            x = self.draw(lanes[pending])
            ok = x <= (np.iinfo(np.uint64).max - limit_gap[pending])
            out[pending[ok]] = x[ok] % bound[pending[ok]]
            pending = pending[~ok]
        return out

    def _randint_common(self, bound: int, lanes: np.ndarray) -> np.ndarray:
        """``randint`` with one bound for every lane: the same draws and values as the per-lane
        path, without its per-lane arrays (the samplers' loops call this thousands of times)."""
        if not 0 < bound < 1 << 64:
            raise ValueError("randint bound must be positive")
        if not bound & (bound - 1):
            # A power-of-two bound: the low bits are exactly uniform; no rejection needed.
            return self.draw(lanes) & _U64(bound - 1)
        # Accept x <= 2^64 - 1 - (2^64 mod bound), i.e. x < floor(2^64 / bound) * bound.
        limit = _U64((1 << 64) - 1 - ((1 << 64) % bound))
        x = self.draw(lanes)
        ok = x <= limit
        if ok.all():
            return x % _U64(bound)
        out = np.empty(lanes.shape, dtype=np.uint64)
        out[ok] = x[ok] % _U64(bound)
        pending = np.flatnonzero(~ok)
        while pending.size:
            x = self.draw(lanes[pending])
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
