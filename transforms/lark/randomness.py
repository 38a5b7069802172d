"""Where a browser's random choices come from: the OS CSPRNG by default, or keyed streams.

A browser draws share words, mask words, label orders, report ids and local-DP noise from a
:class:`~transforms.randomness.RandomSource` (the one client-randomness interface,
:mod:`transforms.randomness`):

* :class:`~transforms.randomness.SystemRandomness` (the default everywhere): what a real browser
  does -- uniform words straight from the operating system's CSPRNG, and samplers (local-DP
  noise, exact bounded integers) on AES streams under a fresh key from the same CSPRNG that is
  never stored. Nothing is reproducible;
* :meth:`BrowserRandomness.keyed`: :class:`transforms.noise.RandomStreams` (AES-256 in counter
  mode) under a secret :class:`~accounting.keys.ReleaseKey` the operator keeps (the share job
  gets one per release from the ledger), one stream per record, keyed by the record's *content*
  (its record id and every value it shares), never by batch or position. A re-run reproduces the
  same reports on any runner and with any bundling; two rows that differ in any value get
  independent randomness -- which matters for additive shares: re-sharing a *different* value
  with the *same* first share would hand the other helper the difference of the two values;
  identical rows get identical reports (same report id), which helpers refuse as duplicates;
* :meth:`BrowserRandomness.for_testing`: the keyed mode under a public, NON-secret key, for
  tests and benchmarks only.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams
from transforms.randomness import RandomSource, RecordDraws

#: What the keyed browser source derives its record streams' key for (ReleaseKey.subkey).
BROWSER_KEY_LABEL = "masked-lark/browser"


class BrowserRandomness(RandomSource):
    """The keyed browser source (module docstring): each record's streams keyed by its content."""

    __slots__ = ("_key",)

    def __init__(self, key: ReleaseKey):
        if not isinstance(key, ReleaseKey):
            raise TypeError("keyed BrowserRandomness needs an accounting.keys.ReleaseKey")
        self._key = key

    @classmethod
    def keyed(cls, key: ReleaseKey) -> "BrowserRandomness":
        return cls(key)

    @classmethod
    def for_testing(cls, seed: int) -> "BrowserRandomness":
        return cls(ReleaseKey.for_testing(seed))

    @property
    def is_testing(self) -> bool:
        return self._key.is_testing

    def claim(self, owner: str) -> None:
        """A keyed source drives one sharing (:meth:`accounting.keys.ReleaseKey.claim`)."""
        self._key.claim(BROWSER_KEY_LABEL, owner=owner)

    def records(self, stage: str, lanes: pa.Table) -> RecordDraws:
        """Draws for each row of ``lanes``: the row's content is the identity of its stream."""
        return RecordDraws(lanes.num_rows, streams=RandomStreams.for_keys(
            self._key.subkey(BROWSER_KEY_LABEL), stage, lanes))

    def words(self, ids, count: int, stage: str) -> np.ndarray:
        """Record ``ids[i]``'s words: its content is its id."""
        if count < 0:
            raise ValueError("count must not be negative")
        return self.records(stage, pa.table({"id": pa.array(np.asarray(ids))})).words(count)

    def word_at(self, ids, index, stage: str) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        if not index.size:
            return np.zeros(0, dtype=np.uint64)
        words = self.words(ids, int(index.max()) + 1, stage)
        return words[np.arange(index.size), index]

    def describe(self) -> str:
        kind = "testing key (public seed)" if self.is_testing else "secret release key"
        return f"keyed AES streams per record content ({kind})"

    def __repr__(self):
        return f"BrowserRandomness({'testing' if self.is_testing else 'keyed'})"

    def __reduce__(self):
        # Beam ships DoFns holding a source to workers; a keyed source pickles its secret.
        return (BrowserRandomness, (self._key,))
