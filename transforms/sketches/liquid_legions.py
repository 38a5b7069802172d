"""LiquidLegions sketch (WFA any-sketch): m registers chosen with a truncated exponential law.

An id with fingerprint f goes to register floor(x * m), where u = f / 2^64 and
x = 1 - ln(e^a + u (1 - e^a)) / a  (equivalently -log1p(-u (1 - e^-a)) / a, the inverse CDF of
the density a e^{-a x} / (1 - e^{-a}) on [0, 1)). Register 0 is the busiest. ``decay_rate = 0``
gives the uniform law, i.e. a one-hash Bloom filter with counts ("linear counting"); it shares
every interface and estimator with the exponential sketch.

Each register holds
* ``counts``: the number of impressions that landed in it (SUM aggregator), and
* a unique-key aggregate over the fingerprints of those impressions: empty, exactly one distinct
  fingerprint (``keys``), or ``collided`` (two or more distinct fingerprints).

The arrays are canonical (``keys`` is 0 unless the register holds exactly one distinct
fingerprint), so two sketches of the same multiset of impressions compare equal whatever the
order or partitioning in which they were built; ``merge`` is associative and commutative with the
empty sketch as identity, which is what lets Beam combine partial sketches in any order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from transforms.sketches.fingerprint import FingerprintSalt, fingerprint

__all__ = ["SketchConfig", "LiquidLegionsSketch"]

_U53 = np.uint64(11)
_TWO_M53 = 2.0 ** -53


#: The most registers a sketch may have: each campaign's and publisher's sketch is an array of
#: this many counters in memory (the default, 100,000, is 40 times fewer).
MAX_REGISTERS = 1 << 22


@dataclass(frozen=True, kw_only=True)
class SketchConfig:
    """Public parameters of a sketch: m registers and decay rate a (0 = uniform)."""

    num_registers: int = 100_000
    decay_rate: float = 10.0

    def __post_init__(self):
        if isinstance(self.num_registers, bool) or not isinstance(self.num_registers,
                                                                  (int, np.integer)) \
                or not 1 <= self.num_registers <= MAX_REGISTERS:
            raise ValueError(f"num_registers: must be an integer in [1, {MAX_REGISTERS}] (a "
                             f"sketch is held in memory per campaign and publisher), got "
                             f"{self.num_registers!r}")
        a = float(self.decay_rate)
        if not math.isfinite(a) or a < 0 or a > 700:
            raise ValueError(f"decay_rate: must be finite in [0, 700], got {self.decay_rate!r}")
        object.__setattr__(self, "num_registers", int(self.num_registers))
        object.__setattr__(self, "decay_rate", a)

    def registers_of(self, fingerprints: np.ndarray) -> np.ndarray:
        """Register index (int64) of each uint64 fingerprint."""
        m = self.num_registers
        u = (fingerprints >> _U53).astype(np.float64)
        u *= _TWO_M53  # the top 53 bits as a float in [0, 1)
        if self.decay_rate == 0.0:
            u *= m
        else:
            u *= math.expm1(-self.decay_rate)  # -u (1 - e^-a)
            np.log1p(u, out=u)
            u *= -m / self.decay_rate
        reg = u.astype(np.int64)
        np.minimum(reg, m - 1, out=reg)
        return reg

    def register_probabilities(self) -> np.ndarray:
        """Probability that one id lands in each register (exact for the continuous u)."""
        m = self.num_registers
        edges = np.arange(m + 1, dtype=np.float64) / m
        if self.decay_rate == 0.0:
            return np.diff(edges)
        a = self.decay_rate
        cdf = -np.expm1(-a * edges) / -math.expm1(-a)
        return np.diff(cdf)


class LiquidLegionsSketch:
    """Registers of one (campaign, publisher) or of a union of publishers of one campaign."""

    __slots__ = ("config", "salt", "counts", "keys", "collided")

    def __init__(self, config: SketchConfig, salt: FingerprintSalt, counts: np.ndarray,
                 keys: np.ndarray, collided: np.ndarray):
        m = config.num_registers
        if counts.shape != (m,) or keys.shape != (m,) or collided.shape != (m,):
            raise ValueError(f"register arrays must all have shape ({m},)")
        self.config = config
        self.salt = salt
        self.counts = counts.astype(np.int64, copy=False)
        self.keys = keys.astype(np.uint64, copy=False)
        self.collided = collided.astype(bool, copy=False)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def empty(cls, config: SketchConfig, salt: FingerprintSalt) -> "LiquidLegionsSketch":
        """The identity of ``merge``: no impressions."""
        m = config.num_registers
        return cls(config, salt, np.zeros(m, np.int64), np.zeros(m, np.uint64),
                   np.zeros(m, bool))

    @classmethod
    def from_fingerprints(cls, config: SketchConfig, salt: FingerprintSalt,
                          fingerprints: np.ndarray,
                          impressions: np.ndarray | None = None) -> "LiquidLegionsSketch":
        """Sketch of impressions given by fingerprint (one row = one impression, or
        ``impressions[i] >= 1`` impressions of ``fingerprints[i]``)."""
        fps = np.asarray(fingerprints, dtype=np.uint64)
        m = config.num_registers
        reg = config.registers_of(fps)
        if impressions is None:
            counts = np.bincount(reg, minlength=m).astype(np.int64)
        else:
            imp = np.asarray(impressions)
            if imp.shape != fps.shape:
                raise ValueError("impressions: must have one entry per fingerprint")
            if imp.size and (imp.dtype.kind not in "iu" or imp.min() < 1):
                raise ValueError("impressions: must be integers >= 1")
            # float64 sums are exact below 2^53 impressions per register.
            counts = np.rint(np.bincount(reg, weights=imp, minlength=m)).astype(np.int64)
        # Unique-key aggregate without sorting: write one fingerprint per register (whichever
        # write wins), then any fingerprint differing from its register's pick is a collision.
        first = np.zeros(m, np.uint64)
        first[reg] = fps
        collided = np.zeros(m, bool)
        collided[reg[fps != first[reg]]] = True
        keys = np.where(collided, np.uint64(0), first)
        return cls(config, salt, counts, keys, collided)

    @classmethod
    def from_ids(cls, config: SketchConfig, salt: FingerprintSalt, ids,
                 impressions: np.ndarray | None = None) -> "LiquidLegionsSketch":
        """Sketch of impressions given by virtual person id (integers or strings, no nulls)."""
        return cls.from_fingerprints(config, salt, fingerprint(ids, salt), impressions)

    # -- merge --------------------------------------------------------------------------
    def _check_compatible(self, other: "LiquidLegionsSketch") -> None:
        if self.config != other.config:
            raise ValueError(f"cannot merge sketches with different configs: {self.config} "
                             f"vs {other.config}")
        if self.salt != other.salt:
            raise ValueError("cannot merge sketches with different fingerprint salts "
                             "(different campaigns)")

    def merge_in_place(self, other: "LiquidLegionsSketch") -> "LiquidLegionsSketch":
        """Union ``other`` into ``self`` (register-wise count sum, unique-merge of keys)."""
        self._check_compatible(other)
        both = (self.counts > 0) & (other.counts > 0)
        clash = both & (self.keys != other.keys)
        self.collided |= other.collided
        self.collided |= clash
        self.counts += other.counts
        # Canonical keys are 0 on empty and collided registers, so OR picks the single key.
        self.keys |= other.keys
        self.keys[self.collided] = 0
        return self

    def merge(self, other: "LiquidLegionsSketch") -> "LiquidLegionsSketch":
        """A new sketch: the union of ``self`` and ``other``."""
        return self.copy().merge_in_place(other)

    @classmethod
    def union(cls, sketches) -> "LiquidLegionsSketch":
        """Union of a non-empty iterable of compatible sketches."""
        it = iter(sketches)
        try:
            acc = next(it).copy()
        except StopIteration:
            raise ValueError("sketches: need at least one sketch to know config and salt")
        for sk in it:
            acc.merge_in_place(sk)
        return acc

    def copy(self) -> "LiquidLegionsSketch":
        return LiquidLegionsSketch(self.config, self.salt, self.counts.copy(), self.keys.copy(),
                                   self.collided.copy())

    # -- statistics ---------------------------------------------------------------------
    def active_registers(self) -> int:
        """Number of non-empty registers (the reach statistic)."""
        return int(np.count_nonzero(self.counts))

    def frequency_histogram(self, max_frequency: int) -> np.ndarray:
        """Counts of non-empty, non-collided registers by impression count, capped: entry k-1
        is the number of such registers with count k for k < K and entry K-1 those with >= K."""
        if isinstance(max_frequency, bool) or int(max_frequency) != max_frequency \
                or max_frequency < 1:
            raise ValueError(f"max_frequency: must be an integer >= 1, got {max_frequency!r}")
        k = int(max_frequency)
        solo = self.counts[(self.counts > 0) & ~self.collided]
        return np.bincount(np.minimum(solo, k) - 1, minlength=k).astype(np.int64)

    # -- equality and compact pickling ------------------------------------------------------
    def __eq__(self, other) -> bool:
        if not isinstance(other, LiquidLegionsSketch):
            return NotImplemented
        return (self.config == other.config and self.salt == other.salt
                and np.array_equal(self.counts, other.counts)
                and np.array_equal(self.keys, other.keys)
                and np.array_equal(self.collided, other.collided))

    __hash__ = None

    def __repr__(self) -> str:
        return (f"LiquidLegionsSketch(m={self.config.num_registers}, a={self.config.decay_rate}, "
                f"active={self.active_registers()})")

    def __getstate__(self):
        # Publishers' sketches are mostly sparse: ship only the active registers.
        idx = np.flatnonzero(self.counts)
        dtype = np.uint32 if self.config.num_registers <= 2 ** 32 else np.int64
        return (self.config, self.salt, idx.astype(dtype), self.counts[idx], self.keys[idx],
                np.packbits(self.collided[idx]))

    def __setstate__(self, state):
        config, salt, idx, counts, keys, collided_bits = state
        m = config.num_registers
        self.config, self.salt = config, salt
        self.counts = np.zeros(m, np.int64)
        self.keys = np.zeros(m, np.uint64)
        self.collided = np.zeros(m, bool)
        idx = idx.astype(np.int64)
        self.counts[idx] = counts
        self.keys[idx] = keys
        self.collided[idx] = np.unpackbits(collided_bits, count=idx.size).astype(bool)
