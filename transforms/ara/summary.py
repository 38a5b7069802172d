"""Algorithm S (summary report) and algorithm R (reconstruction) of ARA summary reports.

Neighbouring relation: two report batches differ in all the reports of one source. Algorithm C
keeps a source's contributions to at most 65,536 in L1 norm, so the vector of bucket sums has L1
sensitivity 65,536 and discrete Laplace noise of scale 65,536 / epsilon per declared bucket makes
the summary report epsilon-DP (the aggregation service allows epsilon <= 64). The set of output
buckets is declared before aggregation, so which buckets appear reveals nothing: keys outside
the domain are dropped and declared keys without contributions are released as pure noise.
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from transforms.ara.contribution import CONTRIBUTION_BUDGET, parse_bucket_key

#: The aggregation service refuses epsilon above this value.
MAX_EPSILON = 64.0

KEY_DTYPE = np.dtype([("hi", np.uint64), ("lo", np.uint64)])
_LOW_MASK = (1 << 64) - 1


def keys_to_hi_lo(keys: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
    keys = [int(k) for k in keys]
    hi = np.fromiter((k >> 64 for k in keys), dtype=np.uint64, count=len(keys))
    lo = np.fromiter((k & _LOW_MASK for k in keys), dtype=np.uint64, count=len(keys))
    return hi, lo


def hi_lo_to_keys(hi: np.ndarray, lo: np.ndarray) -> list[int]:
    return [(int(h) << 64) | int(l) for h, l in zip(hi.tolist(), lo.tolist())]


def key_bytes(key: int) -> bytes:
    """16-byte big-endian form of a bucket key (the lane id of its noise stream)."""
    return int(key).to_bytes(16, "big")


class BucketDomain:
    """The declared output domain: a sorted set of 128-bit bucket keys.

    Keys are held as two uint64 columns so that look-ups vectorise with numpy.
    """

    def __init__(self, keys: Iterable[int]):
        hi, lo = keys_to_hi_lo(keys)
        packed = np.empty(hi.shape[0], dtype=KEY_DTYPE)
        packed["hi"], packed["lo"] = hi, lo
        packed = np.unique(packed)
        if packed.size == 0:
            raise ValueError("the output domain must declare at least one bucket key")
        self._packed = packed

    def __len__(self) -> int:
        return int(self._packed.size)

    @property
    def keys(self) -> list[int]:
        return hi_lo_to_keys(self._packed["hi"], self._packed["lo"])

    def index(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """Position of each (hi, lo) key in the domain, or -1 for keys outside it."""
        q = np.empty(np.shape(hi), dtype=KEY_DTYPE)
        q["hi"], q["lo"] = hi, lo
        pos = np.searchsorted(self._packed, q)
        found = pos < self._packed.size
        found[found] = self._packed[pos[found]] == q[found]
        return np.where(found, pos, -1)


def parse_output_domain(text: str) -> BucketDomain:
    """Domain file: one bucket key per line (decimal or 0x-hex); blank and ``#`` lines ignored."""
    keys = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            keys.append(parse_bucket_key(line))
        except ValueError:  # the line is not quoted: the file may be the wrong one (a secret)
            raise ValueError(f"line {lineno} is not a decimal or 0x-hex bucket key of at most "
                             "128 bits") from None
    return BucketDomain(keys)


def format_output_domain(keys: Iterable[int]) -> str:
    return "".join(f"{int(k):#034x}\n" for k in keys)


def check_summary_epsilon(epsilon) -> float:
    from accounting.validation import check_epsilon
    epsilon = check_epsilon(epsilon)
    if epsilon > MAX_EPSILON:
        raise ValueError(f"epsilon must be at most {MAX_EPSILON:g} for summary reports, got {epsilon}")
    return epsilon


def sum_by_bucket(domain: BucketDomain, hi: np.ndarray, lo: np.ndarray,
                  values: np.ndarray) -> tuple[np.ndarray, int]:
    """Per-domain-key sums of integer contributions, plus the number of contributions dropped
    because their key is outside the domain (for operator metrics only, never released)."""
    values = np.asarray(values, dtype=np.int64)
    idx = domain.index(np.asarray(hi, dtype=np.uint64), np.asarray(lo, dtype=np.uint64))
    inside = idx >= 0
    sums = np.bincount(idx[inside], weights=values[inside], minlength=len(domain))
    # bincount sums in float64: exact while |sum| < 2**53, i.e. for any realistic batch.
    return np.rint(sums).astype(np.int64), int((~inside).sum())


def summary_noise_spec(epsilon: float):
    """The discrete Laplace NoiseSpec of a summary report: scale 65,536 / epsilon."""
    from accounting.calibration import NoiseKind, calibrate
    epsilon = check_summary_epsilon(epsilon)
    return calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=epsilon,
                     l1_sensitivity=CONTRIBUTION_BUDGET)


def add_summary_noise(sums: np.ndarray, epsilon: float, streams) -> np.ndarray:
    """Algorithm S's noise: ``sums`` + DLap(65536 / epsilon), one lane of ``streams`` per bucket."""
    from transforms.noise import add_noise
    return add_noise(summary_noise_spec(epsilon), np.asarray(sums, dtype=np.int64), streams)


def bucket_streams(release_key, keys: Iterable[int], purpose: str = "ara-summary-report"):
    """One keyed random stream per bucket: it depends only on (release key, purpose, bucket key),
    so noise does not depend on how the buckets are batched or ordered."""
    from transforms.noise import RandomStreams
    return RandomStreams.for_keys(release_key, purpose, [key_bytes(k) for k in keys])


def noisy_summary(sums: np.ndarray, keys: Iterable[int], epsilon: float, release_key,
                  purpose: str = "ara-summary-report") -> np.ndarray:
    """Noisy sums of the declared buckets ``keys`` (same order as ``sums``)."""
    return add_summary_noise(sums, epsilon, bucket_streams(release_key, keys, purpose))


def discrete_laplace_variance(scale: float) -> float:
    """Variance of DLap(scale) (P[i] proportional to exp(-|i| / scale)): 2p / (1 - p)^2."""
    p = math.exp(-1.0 / scale)
    return 2.0 * p / (1.0 - p) ** 2


def summary_noise_variance(epsilon: float) -> float:
    """Variance of the noise of one summary-report bucket, in contribution units."""
    return discrete_laplace_variance(CONTRIBUTION_BUDGET / epsilon)


def reconstruct(noisy_sums: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """Algorithm R: unbiased estimate of the clipped sum, noisy sum x C / b."""
    return np.asarray(noisy_sums, dtype=np.float64) * np.asarray(scale, dtype=np.float64)
