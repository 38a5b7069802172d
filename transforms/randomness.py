"""Where a client's random bits come from: one interface for every client-side mechanism.

Local randomizers (:mod:`transforms.ldp`) and Masked LARk browsers (:mod:`transforms.lark`) run
on a client's device in production; in this toolkit the same code also runs server-side, in
simulations and in tests. Each takes its bits from a :class:`RandomSource`:

* :class:`SystemRandomness` -- the operating system's CSPRNG, what a real client device uses (it
  has no release key, and nothing needs to reproduce its reports). The default of every client.
* a keyed source -- the noise engine's AES streams (:class:`transforms.noise.RandomStreams`)
  under a secret :class:`accounting.keys.ReleaseKey` the operator keeps: a record's bits are a
  function of (key, purpose, stage, record) only -- never of batching, bundling, worker or
  order -- so a re-run reproduces exactly, and nobody without the key can predict them. Under a
  public key from a seed (``ReleaseKey.for_testing``) the same code is the seeded testing mode,
  flagged ``is_testing``. :class:`transforms.ldp.randomness.KeyedRandomness` (records named by
  their id) and :class:`transforms.lark.randomness.BrowserRandomness` (records named by their
  content) are the two keyed sources; their stream layouts are theirs.

A source gives a batch of records two kinds of draws:

* :meth:`RandomSource.words` / :meth:`RandomSource.word_at`: uniform 64-bit words of a stage's
  stream for each record, addressed by the record's id (client indices, example ids);
* :meth:`RandomSource.records`: a :class:`RecordDraws` per row of an Arrow table, whose words and
  per-row AES streams (for exact samplers) a keyed source derives from the row's *content*: two
  rows that differ in any value get independent randomness (re-sharing a different value never
  reuses a first share), identical rows identical randomness.
"""
from __future__ import annotations

import os
import secrets

import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey


class RecordDraws:
    """Independent random draws for each of ``size`` records (:meth:`RandomSource.records`):
    given ``streams`` (one keyed AES stream per record), words are drawn from them; given a
    fresh secret ``key`` instead (the OS CSPRNG's draws), words come from the CSPRNG and streams,
    made on first use under that key, are never reproducible."""

    def __init__(self, size: int, *, streams=None, key: ReleaseKey = None, purpose: str = ""):
        self.size = int(size)
        self._streams = streams
        self._key, self._purpose = key, purpose

    @property
    def streams(self):
        """Per-record AES streams (for exact samplers); created on first use in secure mode."""
        if self._streams is None:
            from transforms.noise import RandomStreams

            self._streams = RandomStreams.for_range(self._key, self._purpose, self.size)
        return self._streams

    def words(self, count: int) -> np.ndarray:
        """``count`` uniform 64-bit words per record: uint64 of shape (size, count)."""
        if self._key is not None:  # secure mode: the OS CSPRNG
            raw = secrets.token_bytes(8 * self.size * count)
            return np.frombuffer(raw, dtype=np.uint64).reshape(self.size, count).copy()
        return stream_words(self._streams, count)


def stream_words(streams, count: int) -> np.ndarray:
    """``count`` uniform 64-bit words per lane of ``streams``: uint64 of shape (lanes, count)."""
    out = np.empty((streams.size, count), dtype=np.uint64)
    for j in range(count):
        out[:, j] = streams.draw()
    return out


class RandomSource:
    """Uniform random bits for a batch of a client's records (module docstring); subclasses say
    where they come from."""

    #: True when the bits are reproducible from public information (tests, benchmarks).
    is_testing: bool = False

    def words(self, ids, count: int, stage: str) -> np.ndarray:
        """``(len(ids), count)`` uint64 words, independent across records and stages.

        ``ids``: one id per record (keyed sources derive the bits from it; others only use its
        length). ``stage`` names what the words are for (e.g. ``"grr"``); a keyed source gives
        independent bits per stage.
        """
        raise NotImplementedError

    def word_at(self, ids, index: np.ndarray, stage: str) -> np.ndarray:
        """Word ``index[i]`` of record ``ids[i]``'s ``stage`` stream (uint64, one per pair): the
        same word :meth:`words` would return at that position."""
        raise NotImplementedError

    def records(self, stage: str, lanes: pa.Table) -> RecordDraws:
        """Draws for each row of ``lanes``; a keyed source derives them from the row's content."""
        raise NotImplementedError

    def claim(self, owner: str) -> None:
        """Record that ``owner`` draws from this source (a keyed source claims its key's purpose,
        :meth:`accounting.keys.ReleaseKey.claim`); a source without a key claims nothing."""

    def streams(self, stage: str, lanes: pa.Table):
        """One AES stream per row of ``lanes`` (:meth:`records`' streams)."""
        return self.records(stage, lanes).streams

    def describe(self) -> str:
        raise NotImplementedError


class SystemRandomness(RandomSource):
    """The operating system's CSPRNG (``os.urandom``): a client device's default; not
    reproducible. Its record streams are AES streams under a fresh key that is never stored."""

    is_testing = False

    def words(self, ids, count: int, stage: str) -> np.ndarray:
        n = len(ids) if not isinstance(ids, int) else ids
        if count < 0:
            raise ValueError("count must not be negative")
        raw = os.urandom(8 * n * count)
        return np.frombuffer(raw, dtype=np.uint64).reshape(n, count).copy()

    def word_at(self, ids, index, stage: str) -> np.ndarray:
        return self.words(len(np.asarray(index)), 1, stage)[:, 0]

    def records(self, stage: str, lanes: pa.Table) -> RecordDraws:
        return RecordDraws(lanes.num_rows, key=ReleaseKey.generate(), purpose=stage)

    def describe(self) -> str:
        return "operating-system CSPRNG (os.urandom)"

    def __repr__(self):
        return "SystemRandomness()"
