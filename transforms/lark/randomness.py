"""Where the browser's random choices come from: keyed AES streams, secure by default.

A browser draws share words, mask words, label orders, report ids and local-DP noise. All of
them come from :class:`transforms.noise.RandomStreams` (AES-256 in counter mode, one stream per
report) under a :class:`~accounting.keys.ReleaseKey`:

* ``BrowserRandomness.secure()`` (the default everywhere): a fresh key from the operating
  system's CSPRNG, never stored -- what a real browser does; nothing is reproducible;
* ``BrowserRandomness.keyed(key)``: a secret key the operator keeps (the share job gets one per
  release from the ledger), so a re-run on the same input reproduces the same reports;
* ``BrowserRandomness.for_testing(seed)``: a public, NON-secret key for tests and benchmarks.

Each report's stream is keyed by the report's *content* (its record id and every value it
shares), never by batch or position: the same input row always gets the same randomness on any
runner and with any bundling, and two rows that differ in any value get independent randomness.
That matters for additive shares: re-sharing a *different* value with the *same* first share
would hand the other helper the difference of the two values.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams


class BrowserRandomness:
    """A source of per-report random streams (see the module docstring)."""

    __slots__ = ("_key", "mode")

    def __init__(self, key: ReleaseKey, mode: str):
        if not isinstance(key, ReleaseKey):
            raise TypeError("BrowserRandomness needs an accounting.keys.ReleaseKey")
        self._key = key
        self.mode = mode

    @classmethod
    def secure(cls) -> "BrowserRandomness":
        return cls(ReleaseKey.generate(), "secure")

    @classmethod
    def keyed(cls, key: ReleaseKey) -> "BrowserRandomness":
        return cls(key, "testing" if key.is_testing else "keyed")

    @classmethod
    def for_testing(cls, seed: int) -> "BrowserRandomness":
        return cls(ReleaseKey.for_testing(seed), "testing")

    @property
    def is_testing(self) -> bool:
        return self._key.is_testing

    def streams(self, purpose: str, lanes: pa.Table) -> RandomStreams:
        """One independent stream per row of ``lanes`` (the rows' canonical encoding is the
        stream's identity)."""
        return RandomStreams.for_keys(self._key.derive("masked-lark/browser"), purpose, lanes)

    def __repr__(self):
        return f"BrowserRandomness({self.mode})"

    def __reduce__(self):
        # Beam ships DoFns holding a source to workers; the key pickles as its secret.
        return (BrowserRandomness, (self._key, self.mode))


def words(streams: RandomStreams, count: int) -> np.ndarray:
    """``count`` uniform 64-bit words per lane: uint64 of shape (lanes, count)."""
    out = np.empty((streams.size, count), dtype=np.uint64)
    for j in range(count):
        out[:, j] = streams.draw()
    return out
