"""Least-squares consistency of hierarchical (tree-nested) noisy counts (Hay et al., VLDB 2010).

Post-processing only: it reads released noisy estimates and the (public) noise variances, so it
costs no privacy budget. Levels are ordered root to leaves; node ``i`` of level ``l`` has the
children ``i * f .. i * f + f - 1`` of level ``l + 1`` (``f`` = fanout of level ``l + 1``), as the
mixed-radix slice codes of ``ContributionConfig`` produce. The result is the generalised
least-squares estimate (minimum variance among linear unbiased estimates) under the constraint
parent = sum of children, with independent noise of per-level variance; with equal variances it
is Hay et al.'s two-pass estimator. Bottom-up, each node combines its own measurement with the
sum of its children's combined estimates (inverse-variance weights); top-down, the parent's
final value's excess over its children's sum is shared out in proportion to their variances.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def tree_consistency(estimates: Sequence[np.ndarray], variances: Sequence[float | np.ndarray],
                     fanouts: Sequence[int]) -> list[np.ndarray]:
    """Consistent estimates for every level (same shapes as ``estimates``).

    estimates[l]: noisy values of level l (size N_l = N_{l-1} * fanouts[l]; fanouts[0] is
    ignored). variances[l]: noise variance of level l (scalar or per node, > 0).
    """
    levels = len(estimates)
    if levels == 0 or len(variances) != levels or len(fanouts) != levels:
        raise ValueError("estimates, variances and fanouts need one entry per level")
    y = [np.asarray(e, dtype=np.float64) for e in estimates]
    var = [np.broadcast_to(np.asarray(v, dtype=np.float64), y[l].shape).copy()
           for l, v in enumerate(variances)]
    for l in range(levels):
        if not (var[l] > 0).all():
            raise ValueError(f"variances of level {l} must be positive")
        if l and y[l].size != y[l - 1].size * fanouts[l]:
            raise ValueError(f"level {l} has {y[l].size} nodes, expected "
                             f"{y[l - 1].size} x fanout {fanouts[l]}")
    z, zvar = [None] * levels, [None] * levels
    z[-1], zvar[-1] = y[-1], var[-1]
    child_sum, child_var = [None] * levels, [None] * levels
    for l in range(levels - 2, -1, -1):
        f = fanouts[l + 1]
        child_sum[l] = z[l + 1].reshape(-1, f).sum(axis=1)
        child_var[l] = zvar[l + 1].reshape(-1, f).sum(axis=1)
        w_own, w_children = 1.0 / var[l], 1.0 / child_var[l]
        z[l] = (y[l] * w_own + child_sum[l] * w_children) / (w_own + w_children)
        zvar[l] = 1.0 / (w_own + w_children)
    out = [None] * levels
    out[0] = z[0]
    for l in range(1, levels):
        f = fanouts[l]
        excess = np.repeat(out[l - 1] - child_sum[l - 1], f)
        share = zvar[l] / np.repeat(child_var[l - 1], f)
        out[l] = z[l] + share * excess
    return out
