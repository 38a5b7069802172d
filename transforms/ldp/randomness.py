"""Local DP clients' randomness: the keyed source of records named by id, and exact samplers.

A local randomizer takes its bits from a :class:`~transforms.randomness.RandomSource` (the one
client-randomness interface, :mod:`transforms.randomness`): the OS CSPRNG on a device
(:class:`~transforms.randomness.SystemRandomness`, the default) or, here,
:class:`KeyedRandomness` -- keyed streams of the noise engine
(:class:`transforms.noise.RandomStreams`) under a :class:`accounting.keys.ReleaseKey`: a
server-side randomizer (label randomization for a training export), a simulation of millions of
clients, or a test. Record ``i``'s bits are a function of (key, purpose, stage, record id) only,
so a re-run reproduces exactly, and with a secret key (``ReleaseKey.generate()``, the default of
every job) nobody without the key can predict or reproduce them.
:meth:`KeyedRandomness.for_testing` is the seeded testing mode: the same code under a public key
derived from a seed (``ReleaseKey.for_testing``), flagged ``is_testing``.

Lane layout. The noise engine's stream for lane ``i`` encrypts ``seed_i XOR counter`` under an
AES-256 key derived from (release key, purpose). Here a record's ``j``-th 64-bit word comes from
the lane seed ``(j, id)`` drawn once, i.e. the AES input block is ``(j, id)``: distinct for
distinct (word, record), which is all counter mode needs, so integer record ids (client indices,
example ids) need no PRF of their own. Non-integer ids are first mapped to 128-bit pseudo-random
lane bases by the engine's keyed CBC-MAC (:meth:`RandomStreams.for_keys`), and word ``j`` of a
record with base ``(b0, b1)`` uses the block ``(b0 XOR j, b1)``.

Samplers use 32-bit halves of the words. A probability is realised exactly as ``T / 2^32`` for an
integer threshold ``T`` (:func:`threshold_floor` / :func:`threshold_ceil` say which way it is
rounded; each mechanism rounds so its realised epsilon never exceeds the nominal one), and
uniform integers below a bound are exact (rejection of the top partial range; the rare rejected
records redraw from a separate stage).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey
from transforms.randomness import RandomSource, RecordDraws

_U64 = np.uint64
TWO32 = 1 << 32
_MASK32 = _U64(0xFFFFFFFF)
MAX_RETRY_ROUNDS = 64


def record_ids(ids) -> np.ndarray:
    """Validate integer record ids as a uint64 array (no negatives, no nulls)."""
    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        if ids.null_count:
            raise ValueError("record ids must not be null")
        ids = ids.to_numpy(zero_copy_only=False)
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"record ids must be one-dimensional, got shape {ids.shape}")
    if ids.dtype.kind == "u":
        return ids.astype(np.uint64, copy=False)
    if ids.dtype.kind == "i":
        if ids.size and ids.min() < 0:
            raise ValueError("integer record ids must not be negative")
        return ids.astype(np.uint64)
    raise TypeError(f"record ids must be integers, got dtype {ids.dtype}; use "
                    "KeyedRandomness.lane_bases for other id types")


class KeyedRandomness(RandomSource):
    """Keyed, reproducible, secure randomness: the noise engine's AES streams (see module doc)."""

    def __init__(self, release_key: ReleaseKey, purpose: str):
        if not isinstance(release_key, ReleaseKey):
            raise TypeError("release_key must be an accounting.keys.ReleaseKey")
        if not isinstance(purpose, str) or not purpose:
            raise ValueError("purpose must be a non-empty string")
        self.release_key = release_key
        self.purpose = purpose
        self.is_testing = release_key.is_testing

    @classmethod
    def for_testing(cls, seed: int, purpose: str = "testing") -> "KeyedRandomness":
        """The seeded testing mode: a public key from ``seed`` (never for a release)."""
        return cls(ReleaseKey.for_testing(seed), purpose)

    def describe(self) -> str:
        kind = "testing key (public seed)" if self.is_testing else "secret release key"
        return f"keyed AES streams ({kind}), purpose {self.purpose!r}"

    def _streams(self, stage: str):
        from transforms.noise import RandomStreams  # imported lazily: no Beam, only AES + numpy
        return RandomStreams, f"ldp/{self.purpose}/{stage}"

    def lane_bases(self, keys) -> np.ndarray:
        """128-bit pseudo-random lane bases ``(n, 2)`` uint64 for arbitrary (non-integer) ids.

        ``keys``: an Arrow array/table or Python keys, encoded canonically by the noise engine.
        """
        RandomStreams, purpose = self._streams("lane-bases")
        streams = RandomStreams.for_keys(self.release_key, purpose, keys)
        return np.stack([streams.draw(), streams.draw()], axis=1)

    @staticmethod
    def _bases(ids) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids)
        if ids.ndim == 2 and ids.shape[1] == 2 and ids.dtype == np.uint64:
            return ids[:, 0], ids[:, 1]
        base1 = record_ids(ids)
        return np.zeros_like(base1), base1

    def word_at(self, ids, index, stage: str) -> np.ndarray:
        base0, base1 = self._bases(ids)
        index = np.asarray(index, dtype=np.uint64)
        if base1.size == 0:
            return np.zeros(0, dtype=np.uint64)
        RandomStreams, purpose = self._streams(stage)
        seeds = np.stack([base0 ^ index, base1], axis=1)
        return RandomStreams.first_draw(self.release_key, purpose, seeds)

    def records(self, stage: str, lanes: pa.Table) -> RecordDraws:
        """Draws per row of ``lanes``, keyed by the row's content (stage ``<stage>/records``)."""
        RandomStreams, purpose = self._streams(f"{stage}/records")
        streams = RandomStreams.for_keys(self.release_key, purpose, lanes)
        return RecordDraws(lanes.num_rows, streams=streams)

    def words(self, ids, count: int, stage: str) -> np.ndarray:
        if count < 0:
            raise ValueError("count must not be negative")
        base0, base1 = self._bases(ids)
        n = base1.size
        if n == 0 or count == 0:
            return np.zeros((n, count), dtype=np.uint64)
        RandomStreams, purpose = self._streams(stage)
        seeds = np.empty((n, count, 2), dtype=np.uint64)
        seeds[:, :, 0] = base0[:, None] ^ np.arange(count, dtype=np.uint64)[None, :]
        seeds[:, :, 1] = base1[:, None]
        # Each word has its own lane seed (j, id): its first stream word is the word itself.
        return RandomStreams.first_draw(self.release_key, purpose,
                                        seeds.reshape(-1, 2)).reshape(n, count)


# ------------------------------------------------------------------------------------- samplers

def halves(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low and high 32-bit halves of uint64 words (as uint64 arrays of values < 2^32)."""
    return words & _MASK32, words >> _U64(32)


def u32_stream(words: np.ndarray) -> np.ndarray:
    """All 32-bit halves of ``(n, w)`` words as ``(n, 2w)`` uint32 (low half first)."""
    return np.ascontiguousarray(words).view(np.uint32).reshape(words.shape[0], -1) \
        if np.little_endian else \
        np.stack(halves(words), axis=-1).reshape(words.shape[0], -1).astype(np.uint32)


def bernoulli_bytes(source: RandomSource, ids, u8: np.ndarray, threshold: int, stage: str,
                    rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Exact Bernoulli(threshold / 2^32) from a byte per draw, refined only on ties.

    A 32-bit uniform is the byte ``u8`` (its top 8 bits) followed by 24 more bits; those are
    needed only when the byte equals the threshold's top byte (probability 1/256), and are then
    word ``col`` of the record's ``stage/refine`` stream (so each (record, position) has one
    fixed uniform). ``rows``/``cols`` locate each byte of ``u8`` (any shape) in the batch.
    """
    high, low = threshold >> 24, threshold & 0xFFFFFF
    if high >= 256:  # threshold = 2^32: always
        return np.ones(u8.shape, dtype=bool)
    out = u8 < np.uint8(high)
    tie = np.nonzero(u8 == np.uint8(high))
    if low and tie[0].size:
        tie_rows, tie_cols = rows[tie], cols[tie]
        chosen = tie_rows if isinstance(ids, int) else np.asarray(ids)[tie_rows]
        if isinstance(ids, int):
            chosen = tie_rows.size
        refine = source.word_at(chosen, tie_cols, f"{stage}/refine") & _U64(0xFFFFFF)
        out[tie] = refine < _U64(low)
    return out


def threshold_floor(probability: float) -> int:
    """The largest T with T / 2^32 <= probability (a probability realised rounded down)."""
    _check_unit(probability)
    return int(math.floor(probability * TWO32))


def threshold_ceil(probability: float) -> int:
    """The smallest T with T / 2^32 >= probability (a probability realised rounded up)."""
    _check_unit(probability)
    return int(math.ceil(probability * TWO32))


def _check_unit(probability: float) -> None:
    if not (0.0 <= probability <= 1.0):
        raise ValueError(f"a probability must be in [0, 1], got {probability!r}")


def uniform_below(u32: np.ndarray, bound, redraw: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """Exactly uniform integers in ``[0, bound)`` from 32-bit uniforms ``u32`` (uint64 < 2^32).

    ``bound`` (>= 1, <= 2^32; scalar or per record) -- values ``x < floor(2^32 / b) * b`` are
    accepted as ``x mod b``; the few others (probability < b / 2^32) get fresh 32-bit uniforms
    from ``redraw(positions, round)`` until accepted.
    """
    u32 = np.asarray(u32, dtype=np.uint64)
    if np.ndim(bound) == 0:
        # One bound for every record: scalar division (numpy's fast constant-divisor path).
        b = int(bound)
        if not 1 <= b <= TWO32:
            raise ValueError("uniform_below: bound must be in [1, 2^32]")
        scalar_limit = _U64((TWO32 // b) * b)
        out = u32 % _U64(b)
        pending = np.nonzero(u32 >= scalar_limit)[0]
        limit = None
    else:
        bound = np.broadcast_to(np.asarray(bound, dtype=np.uint64), u32.shape)
        if bound.size and (bound.min() < 1 or bound.max() > TWO32):
            raise ValueError("uniform_below: bound must be in [1, 2^32]")
        limit = (_U64(TWO32) // bound) * bound
        out = u32 % bound
        pending = np.nonzero(u32 >= limit)[0]
    for round_ in range(1, MAX_RETRY_ROUNDS + 1):
        if not pending.size:
            return out
        fresh = np.asarray(redraw(pending, round_), dtype=np.uint64)
        if limit is None:
            ok = fresh < scalar_limit
            out[pending[ok]] = fresh[ok] % _U64(b)
        else:
            ok = fresh < limit[pending]
            out[pending[ok]] = fresh[ok] % bound[pending[ok]]
        pending = pending[~ok]
    if pending.size:  # probability < 2^-32 per round: a broken source, not bad luck
        raise RuntimeError("uniform_below: random source keeps returning rejected values")
    return out


def retry_u32(source: RandomSource, ids, stage: str) -> Callable[[np.ndarray, int], np.ndarray]:
    """A ``redraw`` callback for :func:`uniform_below`: low halves of the ``stage/retryR`` words."""
    ids_array = ids if isinstance(ids, int) else np.asarray(ids)

    def redraw(positions: np.ndarray, round_: int) -> np.ndarray:
        if isinstance(ids_array, int):
            chosen = positions.size
        else:
            chosen = ids_array[positions]
        return source.words(chosen, 1, f"{stage}/retry{round_}")[:, 0] & _MASK32

    return redraw


def source_for(release_key: Optional[ReleaseKey] = None, *, purpose: str = "randomize",
               source: Optional[RandomSource] = None) -> RandomSource:
    """The source a transform uses: ``source`` if given, else keyed by ``release_key``."""
    if source is not None:
        if not isinstance(source, RandomSource):
            raise TypeError("source must be a RandomSource")
        return source
    if release_key is None:
        raise ValueError("give a release_key (keyed, reproducible randomness) or a source")
    return KeyedRandomness(release_key, purpose)
