"""Vector sums with per-row norm clipping (pure numpy, no Beam).

Each row's vector (a list column of ``dimension`` numbers) is scaled down to norm at most
``max_norm`` (L1 or L2; a vector already inside the ball is unchanged), and the clipped vectors
are summed per key -- PipelineDP's ``VECTOR_SUM`` with ``vector_max_norm`` / ``vector_norm_kind``.

Sensitivity (:func:`vector_sum_sensitivity`): after contribution bounding a unit has ``n_k <=
Linf`` rows in each of at most ``L0`` keys, so its change of key ``k``'s sum has norm at most
``n_k * max_norm`` in the clipping norm. Over all keys and coordinates, with the row count's
sensitivities ``count``: L2-clipping gives ``l2 = count.l2 * C`` and, since ``|x|_1 <= sqrt(d)
|x|_2``, ``l1 = count.l1 * C * sqrt(d)``; L1-clipping gives ``l1 = count.l1 * C`` and
``l2 = count.l2 * C`` (``|x|_2 <= |x|_1``). Laplace noise uses L1, Gaussian noise L2, so pair
L1-clipping with Laplace and L2-clipping with Gaussian for the least noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.sensitivity import Sensitivities
from accounting.validation import check_positive_int

NORMS = ("l1", "l2")


@dataclass(frozen=True, kw_only=True)
class VectorSpec:
    """A vector-sum's public shape: dimension, clipping norm and bound, partial-column prefix."""

    dimension: int
    max_norm: float
    norm: str = "l2"
    prefix: str = "vector."

    def __post_init__(self):
        check_positive_int(self.dimension, "dimension")
        if isinstance(self.max_norm, bool) or not isinstance(self.max_norm, (int, float)) \
                or not math.isfinite(self.max_norm) or self.max_norm <= 0:
            raise ValueError(f"max_norm must be a finite number > 0, got {self.max_norm!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")

    @property
    def columns(self) -> tuple:
        return tuple(f"{self.prefix}{j}" for j in range(self.dimension))


def vectors_of(column, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """A list column -> ((rows, dimension) float64 matrix, valid mask). A row is invalid when
    it is null, has another length, or holds a null or non-finite number."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_fixed_size_list(column.type):
        column = column.cast(pa.list_(column.type.value_type))
    lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False)
    valid = lengths == dimension
    flat = pc.list_flatten(column)
    parents = pc.list_parent_indices(column).to_numpy()
    values = pc.cast(flat, pa.float64()).to_numpy(zero_copy_only=False)
    matrix = np.zeros((len(column), dimension))
    ok_rows = valid[parents] if len(parents) else np.zeros(0, dtype=bool)
    position = np.arange(len(parents)) - np.searchsorted(parents, parents)
    matrix[parents[ok_rows], position[ok_rows]] = values[ok_rows]
    finite = np.ones(len(column), dtype=bool)
    bad = ~np.isfinite(values)
    finite[parents[bad]] = False
    return matrix, valid & finite


def clip(matrix: np.ndarray, max_norm: float, norm: str) -> np.ndarray:
    """Scale each row down to norm <= max_norm (rows inside the ball are unchanged)."""
    norms = np.abs(matrix).sum(axis=1) if norm == "l1" else np.sqrt((matrix ** 2).sum(axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(norms > max_norm, max_norm / norms, 1.0)
    return matrix * scale[:, None]


def row_words(matrix: np.ndarray) -> np.ndarray:
    """64 bits per row mixing every coordinate (enters the secret row priority, so that rows
    with distinct vectors get distinct priorities whatever the batching)."""
    bits = (np.asarray(matrix, dtype=np.float64) + 0.0).view(np.uint64)
    words = np.zeros(len(bits), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(bits.shape[1]):
            words = (words ^ bits[:, j]) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(j + 1)
            words ^= words >> np.uint64(29)
    return words


def vector_sum_sensitivity(count: Sensitivities, spec: VectorSpec) -> Sensitivities:
    """The vector sums' sensitivities from the row count's (module docstring)."""
    c = float(spec.max_norm)
    l1_factor = c * (math.sqrt(spec.dimension) if spec.norm == "l2" else 1.0)
    return Sensitivities(l0=count.l0 * spec.dimension, linf=count.linf * c, l1=count.l1 * l1_factor,
                         l2=count.l2 * c)
