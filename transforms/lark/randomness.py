"""Where the browser's random choices come from: the OS CSPRNG by default, or keyed streams.

A browser draws share words, mask words, label orders, report ids and local-DP noise:

* ``BrowserRandomness.secure()`` (the default everywhere): what a real browser does -- uniform
  words straight from the operating system's CSPRNG (``secrets.token_bytes``), and samplers
  (local-DP noise, exact bounded integers) on AES streams under a fresh key from the same CSPRNG
  that is never stored. Nothing is reproducible;
* ``BrowserRandomness.keyed(key)``: :class:`transforms.noise.RandomStreams` (AES-256 in counter
  mode) under a secret :class:`~accounting.keys.ReleaseKey` the operator keeps (the share job
  gets one per release from the ledger), one stream per record, keyed by the record's *content*
  (its record id and every value it shares), never by batch or position. A re-run reproduces the
  same reports on any runner and with any bundling; two rows that differ in any value get
  independent randomness -- which matters for additive shares: re-sharing a *different* value
  with the *same* first share would hand the other helper the difference of the two values;
  identical rows get identical reports (same report id), which helpers refuse as duplicates;
* ``BrowserRandomness.for_testing(seed)``: the keyed mode under a public, NON-secret key, for
  tests and benchmarks only.
"""
from __future__ import annotations

import secrets

import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams


class RecordDraws:
    """Independent random draws for each of ``size`` records (see :class:`BrowserRandomness`)."""

    def __init__(self, size: int, *, streams: RandomStreams = None, key: ReleaseKey = None,
                 purpose: str = ""):
        self.size = int(size)
        self._streams = streams
        self._key, self._purpose = key, purpose

    @property
    def streams(self) -> RandomStreams:
        """Per-record AES streams (for exact samplers); created on first use in secure mode."""
        if self._streams is None:
            self._streams = RandomStreams.for_range(self._key, self._purpose, self.size)
        return self._streams

    def words(self, count: int) -> np.ndarray:
        """``count`` uniform 64-bit words per record: uint64 of shape (size, count)."""
        if self._key is not None:  # secure mode: the OS CSPRNG
            raw = secrets.token_bytes(8 * self.size * count)
            return np.frombuffer(raw, dtype=np.uint64).reshape(self.size, count).copy()
        return words(self._streams, count)


class BrowserRandomness:
    """A source of per-record randomness (see the module docstring)."""

    __slots__ = ("_key", "mode")

    def __init__(self, key, mode: str):
        if mode not in ("secure", "keyed", "testing"):
            raise ValueError(f"unknown randomness mode {mode!r}")
        if mode != "secure" and not isinstance(key, ReleaseKey):
            raise TypeError("keyed BrowserRandomness needs an accounting.keys.ReleaseKey")
        self._key = key
        self.mode = mode

    @classmethod
    def secure(cls) -> "BrowserRandomness":
        return cls(None, "secure")

    @classmethod
    def keyed(cls, key: ReleaseKey) -> "BrowserRandomness":
        return cls(key, "testing" if key.is_testing else "keyed")

    @classmethod
    def for_testing(cls, seed: int) -> "BrowserRandomness":
        return cls(ReleaseKey.for_testing(seed), "testing")

    @property
    def is_testing(self) -> bool:
        return self.mode == "testing"

    def claim(self, owner: str) -> None:
        """A keyed source drives one sharing (:meth:`accounting.keys.ReleaseKey.claim`); the
        secure source draws fresh keys and claims nothing."""
        if self._key is not None:
            self._key.claim("masked-lark/browser", owner=owner)

    def records(self, purpose: str, lanes: pa.Table) -> RecordDraws:
        """Draws for each row of ``lanes``; in the keyed modes the row's content is the identity
        of its stream."""
        if self.mode == "secure":
            return RecordDraws(lanes.num_rows, key=ReleaseKey.generate(), purpose=purpose)
        return RecordDraws(lanes.num_rows, streams=RandomStreams.for_keys(
            self._key.subkey("masked-lark/browser"), purpose, lanes))

    def streams(self, purpose: str, lanes: pa.Table) -> RandomStreams:
        """One AES stream per row of ``lanes`` (a fresh secret key in secure mode)."""
        return self.records(purpose, lanes).streams

    def __repr__(self):
        return f"BrowserRandomness({self.mode})"

    def __reduce__(self):
        # Beam ships DoFns holding a source to workers; a keyed source pickles its secret.
        return (BrowserRandomness, (self._key, self.mode))


def words(streams: RandomStreams, count: int) -> np.ndarray:
    """``count`` uniform 64-bit words per lane of ``streams``: uint64 of shape (lanes, count)."""
    out = np.empty((streams.size, count), dtype=np.uint64)
    for j in range(count):
        out[:, j] = streams.draw()
    return out
