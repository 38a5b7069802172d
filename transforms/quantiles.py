"""DP quantiles from a noisy hierarchical histogram (a quantile tree); pure numpy, no Beam.

The clamping range ``[low, high]`` is cut into ``branching ** depth`` equal leaves; the tree has
``depth`` levels below the root, level ``d`` holding ``branching ** d`` node counts (rows of the
key whose clamped value falls in the node's interval). Every node count is released with
integer noise; a quantile ``q`` is then post-processing: from the root, descend into the child
where the cumulative (negative-clipped) noisy counts of the children reach ``q`` of their sum,
carry the remaining fraction down, and interpolate linearly inside the final leaf.

This is the hierarchical-histogram method of Hay, Rastogi, Miklau & Suciu (2010, "Boosting the
accuracy of differentially private histograms through consistency") and Qardaji, Yang & Li (2013,
"Understanding hierarchical methods for differentially private histograms"), as used for
quantiles by Google's DP library and PipelineDP (the "quantile tree"). Several quantiles are
read from one tree, so they cost one budget share together.

Sensitivity: a row lands in exactly one node per level, so one privacy unit changes each level's
counts of one key by at most ``Linf`` in L1 (and L2), i.e. the whole tree of a key by
``depth * Linf`` in L1 and ``sqrt(depth) * Linf`` in L2, over at most ``L0`` keys
(:func:`tree_sensitivity`).

Error: (1) resolution: the answer is exact up to the leaf width ``(high - low) / branching **
depth`` when the leaf's rows are spread evenly, worse when they are not; (2) rank error from
noise: each step sums at most ``branching`` noisy counts, so the rank the descent reaches is off
by a noise of standard deviation at most ``sqrt(branching * depth) * sigma`` rows (sigma: one
node's noise std; :func:`rank_error_std`); relative to the key's row count ``n`` that is a shift
of ``sqrt(branching * depth) * sigma / n`` in ``q``. Values outside the range are clamped, so a
quantile can never leave ``[low, high]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from accounting.sensitivity import Sensitivities
from accounting.validation import check_positive_int


@dataclass(frozen=True, kw_only=True)
class QuantileTree:
    """The public shape of the tree: range, branching factor, depth, and the partial columns'
    name prefix (``<prefix><node>``, nodes numbered level by level, level 1 first)."""

    low: float
    high: float
    branching: int = 16
    depth: int = 2
    prefix: str = "tree."

    def __post_init__(self):
        check_positive_int(self.depth, "depth")
        if not isinstance(self.branching, int) or self.branching < 2:
            raise ValueError(f"branching must be an integer >= 2, got {self.branching!r}")
        if self.branching ** self.depth > 65_536:
            raise ValueError(f"branching ** depth = {self.branching ** self.depth} leaves is too many "
                             "(at most 65536): lower the branching factor or the depth")
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low > self.high:
            raise ValueError(f"the quantile range must be finite with low <= high, got "
                             f"[{self.low!r}, {self.high!r}]")

    @property
    def leaves(self) -> int:
        return self.branching ** self.depth

    @property
    def num_nodes(self) -> int:
        return sum(self.branching ** d for d in range(1, self.depth + 1))

    @property
    def columns(self) -> tuple:
        return tuple(f"{self.prefix}{i}" for i in range(self.num_nodes))

    @property
    def leaf_width(self) -> float:
        return (self.high - self.low) / self.leaves

    def leaf_of(self, values: np.ndarray) -> np.ndarray:
        """Leaf index of each (clamped) value; ``high`` falls in the last leaf."""
        values = np.asarray(values, dtype=np.float64)
        if self.high == self.low:
            return np.zeros(values.shape, dtype=np.int64)
        scaled = (values - self.low) / (self.high - self.low) * self.leaves
        return np.clip(np.floor(scaled), 0, self.leaves - 1).astype(np.int64)

    def node_counts(self, leaf_histogram: np.ndarray) -> np.ndarray:
        """(keys, leaves) leaf counts -> (keys, num_nodes) counts of every node, level 1 first."""
        hist = np.asarray(leaf_histogram)
        levels = []
        for d in range(1, self.depth + 1):
            width = self.branching ** (self.depth - d)
            levels.append(hist.reshape(hist.shape[0], self.branching ** d, width).sum(axis=2))
        return np.concatenate(levels, axis=1)

    def quantiles(self, nodes: np.ndarray, qs) -> np.ndarray:
        """Post-processing: (keys, num_nodes) noisy node counts -> (keys, len(qs)) quantiles."""
        nodes = np.maximum(np.asarray(nodes, dtype=np.float64), 0.0)
        keys = nodes.shape[0]
        b = self.branching
        offsets = np.cumsum([0] + [b ** d for d in range(1, self.depth + 1)])
        out = np.empty((keys, len(qs)), dtype=np.float64)
        rows = np.arange(keys)
        for j, q in enumerate(qs):
            node = np.zeros(keys, dtype=np.int64)  # index within the current level (root: 0)
            fraction = np.full(keys, float(q))
            for d in range(self.depth):
                children = nodes[rows[:, None], offsets[d] + node[:, None] * b + np.arange(b)[None, :]]
                total = children.sum(axis=1)
                target = fraction * total
                cumulative = np.cumsum(children, axis=1)
                # First non-empty child whose cumulative count reaches the target; if none (float
                # rounding), the last non-empty child; in an empty subtree, the middle child.
                reached = (cumulative >= target[:, None]) & (children > 0)
                positive = children > 0
                last_positive = b - 1 - np.argmax(positive[:, ::-1], axis=1)
                child = np.where(reached.any(axis=1), np.argmax(reached, axis=1),
                                 np.where(positive.any(axis=1), last_positive, b // 2))
                before = cumulative[rows, child] - children[rows, child]
                inside = children[rows, child]
                with np.errstate(divide="ignore", invalid="ignore"):
                    fraction = np.where(inside > 0, (target - before) / inside, 0.5)
                fraction = np.clip(fraction, 0.0, 1.0)
                node = node * b + child
            out[:, j] = self.low + (node + fraction) * self.leaf_width
        return np.clip(out, self.low, self.high)


def tree_sensitivity(count: Sensitivities, depth: int) -> Sensitivities:
    """The tree's sensitivities from the row count's (module docstring): each of ``depth``
    levels changes like the per-key row counts; L0 counts the nodes one unit can change."""
    return Sensitivities(l0=int(count.l0 * depth * max(1, int(count.linf))), linf=count.linf,
                         l1=count.l1 * depth, l2=count.l2 * math.sqrt(depth))


def rank_error_std(tree: QuantileTree, node_std: float) -> float:
    """Standard deviation bound, in rows, of the rank the descent reaches (module docstring)."""
    return math.sqrt(tree.branching * tree.depth) * node_std
