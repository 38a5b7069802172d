"""Simulated clients: value distributions, client values and their reports (pure numpy).

The seed's experiments (``002_8efe61bb3e32549d.txt``) draw client values from Poisson(5),
Poisson(100), uniform on [0, 14] and uniform on [0, 100]; :func:`seed_distributions` gives those
four, and :func:`zipf` adds the heavy-tailed law most frequency-oracle papers use. Client ``i``'s
value is the inverse CDF of a 53-bit uniform drawn from keyed randomness by its id, so a
simulation of n clients gives the same values in any batching (and the same values for the same
seed whatever the oracle). Values are on a finite support that covers all but < 1e-15 of the
mass; they are clipped into ``[0, domain_size)`` when a domain is given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
from scipy import stats

from transforms.ldp.oracles import Oracle
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import KeyedRandomness
from transforms.randomness import RandomSource

_TAIL = 1e-15


@dataclass(frozen=True, kw_only=True)
class ValueDistribution:
    """A distribution over non-negative integers with finite support ``values``."""

    name: str
    values: tuple = field(repr=False)
    probabilities: tuple = field(repr=False)

    def __post_init__(self):
        p = np.asarray(self.probabilities, dtype=np.float64)
        if len(self.values) != p.size or p.size == 0 or (p < 0).any():
            raise ValueError(f"{self.name}: bad support/probabilities")
        if not math.isclose(p.sum(), 1.0, rel_tol=1e-9):
            raise ValueError(f"{self.name}: probabilities sum to {p.sum()}, not 1")

    def cdf(self) -> np.ndarray:
        c = np.cumsum(np.asarray(self.probabilities, dtype=np.float64))
        c[-1] = 1.0
        return c

    def sample(self, uniforms: np.ndarray) -> np.ndarray:
        """Inverse-CDF samples from uniforms in [0, 1)."""
        index = np.searchsorted(self.cdf(), uniforms, side="right")
        return np.asarray(self.values, dtype=np.uint64)[np.minimum(index, len(self.values) - 1)]

    def pmf(self, domain_size: int) -> np.ndarray:
        """The probability of each value 0..domain_size-1 (mass beyond is clipped onto d-1)."""
        out = np.zeros(domain_size, dtype=np.float64)
        values = np.minimum(np.asarray(self.values, dtype=np.int64), domain_size - 1)
        np.add.at(out, values, np.asarray(self.probabilities, dtype=np.float64))
        return out


def _finite(name: str, values: np.ndarray, probabilities: np.ndarray) -> ValueDistribution:
    probabilities = probabilities / probabilities.sum()
    return ValueDistribution(name=name, values=tuple(int(v) for v in values),
                             probabilities=tuple(float(p) for p in probabilities))


def poisson(lam: float) -> ValueDistribution:
    """Poisson(lam) truncated where the upper tail falls below 1e-15 (renormalised)."""
    if not lam > 0:
        raise ValueError("poisson: lambda must be positive")
    top = int(stats.poisson.isf(_TAIL, lam)) + 1
    values = np.arange(top + 1)
    return _finite(f"poisson({lam:g})", values, stats.poisson.pmf(values, lam))


def uniform(low: int, high: int) -> ValueDistribution:
    """Uniform on the integers low..high (inclusive)."""
    if not 0 <= low <= high:
        raise ValueError("uniform: need 0 <= low <= high")
    values = np.arange(low, high + 1)
    return _finite(f"uniform[{low},{high}]", values, np.ones(values.size))


def zipf(exponent: float, size: int) -> ValueDistribution:
    """Zipf on 0..size-1: P(v) proportional to (v + 1)^-exponent."""
    if not exponent > 0 or size < 1 or size > 1 << 24:
        raise ValueError("zipf: exponent > 0 and 1 <= size <= 2^24")
    values = np.arange(size)
    return _finite(f"zipf({exponent:g},{size})", values, (values + 1.0) ** -exponent)


def seed_distributions() -> dict[str, ValueDistribution]:
    """The four client distributions of seed 002 (PEM experiments)."""
    return {"poisson5": poisson(5), "poisson100": poisson(100),
            "uniform14": uniform(0, 14), "uniform100": uniform(0, 100)}


def distribution_by_name(name: str, domain_size: Optional[int] = None) -> ValueDistribution:
    """``poisson5``, ``poisson100``, ``uniform14``, ``uniform100`` or ``zipf<exponent>``
    (e.g. ``zipf1.1`` over ``domain_size`` values)."""
    seeds = seed_distributions()
    if name in seeds:
        return seeds[name]
    if name.startswith("zipf"):
        try:
            exponent = float(name[4:] or 1.1)
        except ValueError:
            raise ValueError(f"bad zipf distribution name {name!r}") from None
        return zipf(exponent, min(domain_size or 1 << 16, 1 << 24))
    raise ValueError(f"unknown distribution {name!r}; choose {sorted(seeds)} or zipf<exponent>")


def client_values(distribution: ValueDistribution, ids: np.ndarray, source: RandomSource,
                  domain_size: Optional[int] = None) -> np.ndarray:
    """Each client's value (uint64), a function of the source's key and the client's id."""
    words = source.words(ids, 1, f"values/{distribution.name}")[:, 0]
    uniforms = (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    values = distribution.sample(uniforms)
    if domain_size is not None:
        values = np.minimum(values, np.uint64(domain_size - 1))
    return values


@dataclass(frozen=True, kw_only=True)
class Simulation:
    """n simulated clients with values from ``distribution``, generated in id batches."""

    distribution: ValueDistribution
    num_clients: int
    seed: int = 0
    domain_size: Optional[int] = None
    batch_size: int = 1 << 18

    def source(self) -> KeyedRandomness:
        return KeyedRandomness.for_testing(self.seed, "simulation")

    def id_batches(self) -> Iterator[np.ndarray]:
        for start in range(0, self.num_clients, self.batch_size):
            yield np.arange(start, min(self.num_clients, start + self.batch_size), dtype=np.uint64)

    def values(self, ids: np.ndarray) -> np.ndarray:
        return client_values(self.distribution, ids, self.source(), self.domain_size)

    def true_counts(self, domain_size: int) -> np.ndarray:
        """Exact counts of every value 0..domain_size-1 among the simulated clients."""
        counts = np.zeros(domain_size, dtype=np.int64)
        for ids in self.id_batches():
            counts += np.bincount(np.minimum(self.values(ids), domain_size - 1).astype(np.int64),
                                  minlength=domain_size)
        return counts

    def reports(self, oracle: Oracle, ids: np.ndarray, *, source: Optional[RandomSource] = None,
                with_ids: bool = False) -> pa.Table:
        """The clients' reports under ``oracle`` (randomized with ``source``, default: keyed by
        this simulation's seed under another purpose)."""
        source = source or KeyedRandomness.for_testing(self.seed, "clients")
        values = self.values(ids)
        extra = {"client_id": pa.array(ids, pa.uint64())} if with_ids else None
        return randomize(oracle, values, source=source, ids=ids, extra=extra)
