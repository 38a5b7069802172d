"""One quantile chosen among public candidates: permute-and-flip over the rank score, exactly.

Pure numpy, no Beam. Candidates ``c_0 < c_1 < ... < c_{k-1}`` (public) cut the line into cells
``(c_{i-1}, c_i]`` (``c_{-1} = -inf``); the data enter only through ``U_i = #{x <= c_i}``
(``counts_at_or_below``) and ``n``, the number of values, one per privacy unit. With ``L_i =
U_{i-1}`` (``L_0 = 0``) and the target rank ``q n``, candidate ``i``'s **rank distance** is

    d_i = max(q n - U_i, L_i - q n, 0),

the number of ranks by which the target lies outside cell ``i`` (0 for the cell holding it): the
score of Smith's (2011) mechanism over the intervals between sorted values, here on the public
cells (a cell holding no value is an interval of its own). The released value is the chosen
candidate ``c_i``: a quantile is as fine as its candidates (choose them on the grid the answer
needs).

**Neighbouring relation and calibration (the proof).** Add/remove: one privacy unit adds or
removes one value. Write ``E_i = U_i - L_i`` (values in cell ``i``), ``G_i = n - U_i`` and
``beta = max(q, 1 - q)``. Adding ``beta n``, the same constant for every candidate,

    d_i + beta n = max((q + beta) G_i + (q + beta - 1)(L_i + E_i),
                       (1 - q + beta) L_i + (beta - q)(E_i + G_i),  beta n),

whose coefficients are all >= 0; one more value raises exactly one of ``L_i, E_i, G_i`` (and
``n``) by one, so ``s_i = d_i + beta n`` never falls when a unit is added, never rises when one
is removed, and moves by at most ``max(q + beta, 1 - q + beta, beta) = 2 beta``: ``-s`` is a
**monotone** score of sensitivity ``2 beta``. A selection among candidates depends only on the
differences of their scores, so choosing over ``-d`` is choosing over ``-s``, and the monotone
bound applies with no further factor 2: candidate ``i`` accepted with probability ``exp(-epsilon
d_i / (2 beta))`` by permute-and-flip (McKenna & Sheldon 2020, Theorem 2; the exponential
mechanism with the same exponents is epsilon-DP too, McSherry & Talwar 2007) is epsilon-DP. At
the median ``beta = 1/2``: ``exp(-epsilon d_i)``, sensitivity 1, no factor 2 -- twice the
exponent of the general rule ``epsilon d / (2 * 1)`` that charged a score of sensitivity 1 as if
it were not monotone. Away from the median the exponent is ``epsilon d / (2 beta)``, and no
valid rule does better for this score: a unit added above a high target moves the cells below
the target by ``+q`` and those between the target and the unit by ``-q`` (``2 beta`` apart).
This is the exponent of OpenDP's ``make_quantile_score_candidates`` + ``make_noisy_max``.

Substitution (one value replaced, ``n`` fixed): ``L_i`` and ``U_i`` each move by at most one, so
``d_i`` moves by at most 1 in either direction (not monotone): exponent ``epsilon d / 2``.

**Exact on the grid.** ``q`` is taken on the 2^-GRID_BITS grid (nearest) and ``epsilon`` rounded
down to it, so ``d`` (in 2^-GRID_BITS ranks), the exponents' numerators and their common
denominator are integers and the draw (:mod:`transforms.noise.exponential`) reads uniform
integers only: every candidate has its exact, positive probability.

**Stated error.** A candidate is returned only when accepted, so ``P(d_chosen >= D) <= k
exp(-epsilon D / Delta')`` (``Delta' = 2 beta`` or 2 above): with probability at least ``1 -
b`` the chosen cell is within ``Delta' ln(k / b) / epsilon`` ranks of the target
(:func:`rank_error_bound`), whatever the data, plus the resolution of the candidates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from accounting.sensitivity import Neighbouring
from transforms.quantiles import QuantileTree

#: The quantile and epsilon are taken on this grid (2^-GRID_BITS), so the exponents are exact
#: rationals with a 64-bit denominator.
GRID_BITS = 20
_ONE = 1 << GRID_BITS


def grid_quantile(quantile: float) -> int:
    """``quantile`` in units of 2^-GRID_BITS (nearest), strictly between 0 and 1."""
    units = int(round(float(quantile) * _ONE))
    if not 0 < units < _ONE:
        raise ValueError(f"quantile must be in (0, 1) on the 2^-{GRID_BITS} grid, got {quantile!r}")
    return units


def grid_epsilon(epsilon: float) -> int:
    """``epsilon`` in units of 2^-GRID_BITS, rounded down (so the choice spends at most it)."""
    units = int(math.floor(float(epsilon) * _ONE))
    if units < 1:
        raise ValueError(f"epsilon {epsilon!r} is below the quantile mechanism's 2^-{GRID_BITS} grid")
    return units


def rank_distances(counts_at_or_below, n, quantile_units: int) -> np.ndarray:
    """Each candidate's rank distance ``d_i`` (module docstring) in units of 2^-GRID_BITS
    ranks, exactly (integers). ``counts_at_or_below``: (k,) with ``n`` a number, or one row per
    key (keys, k) with ``n`` one per key."""
    upper = np.asarray(counts_at_or_below, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    if n.size and int(n.max()) >= 1 << (62 - GRID_BITS):
        raise ValueError("too many units for the exact quantile mechanism (2^42)")
    upper = upper << GRID_BITS
    lower = np.concatenate([np.zeros(upper.shape[:-1] + (1,), np.int64), upper[..., :-1]], axis=-1)
    target = int(quantile_units) * (n[..., None] if upper.ndim == 2 else n)
    return np.maximum(target - upper, 0) + np.maximum(lower - target, 0)


def point_distances(counts_below, n, quantile_units: int) -> np.ndarray:
    """Rank distances of candidate *points* (2^-GRID_BITS ranks, exact): ``|L_i - q n|`` with
    ``L_i = counts_below[i]`` the values below point ``i`` -- a cell ``[c, c]`` holding no value
    (``E_i = 0``: a value at ``c`` counts in ``G_i``), so the module docstring's lemma and
    calibration hold unchanged. Shapes as :func:`rank_distances`."""
    below = np.asarray(counts_below, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    if n.size and int(n.max()) >= 1 << (62 - GRID_BITS):
        raise ValueError("too many units for the exact quantile mechanism (2^42)")
    target = int(quantile_units) * (n[..., None] if below.ndim == 2 else n)
    return np.abs((below << GRID_BITS) - target)


def rank_utility(counts_at_or_below, n: float, quantile: float) -> np.ndarray:
    """Minus the rank distance in ranks (floats; for analysis and the audits). One unit moves it
    by at most ``max(q, 1 - q)``, and ``-(d + beta n)`` monotonically by at most ``2 beta``."""
    upper = np.asarray(counts_at_or_below, dtype=float)
    lower = np.concatenate([[0.0], upper[:-1]])
    target = quantile * n
    return -(np.maximum(target - upper, 0.0) + np.maximum(lower - target, 0.0))


def score_scale_units(quantile_units: int, neighbouring) -> int:
    """``Delta'`` of the module docstring in 2^-GRID_BITS units: ``2 max(q, 1 - q)`` under
    add/remove (the monotone bound), 2 under substitution."""
    if Neighbouring(neighbouring) is Neighbouring.ADD_REMOVE:
        return 2 * max(int(quantile_units), _ONE - int(quantile_units))
    return 2 * _ONE


def score_scale(quantile: float, neighbouring) -> float:
    return score_scale_units(grid_quantile(quantile), neighbouring) / _ONE


def rank_exponents(distances: np.ndarray, epsilon: float, quantile_units: int,
                   neighbouring, steps: int = 1) -> tuple[np.ndarray, int]:
    """``(num, den)`` with ``num / den = epsilon' (d - min d) / (steps Delta')`` exactly per
    candidate (per row for (keys, k) distances; ``d`` from :func:`rank_distances`, ``epsilon'``
    :func:`grid_epsilon`). ``steps``: how many values one neighbouring change adds or removes
    (a unit's rows over all keys, :class:`CellSelection`); each step then costs ``epsilon /
    steps``, so the change costs ``epsilon`` (group privacy)."""
    eps_units = grid_epsilon(epsilon)
    if not isinstance(steps, int) or steps < 1 or steps > 1 << 20:
        raise ValueError(f"steps must be an integer in [1, 2^20], got {steps!r}")
    distances = np.asarray(distances, dtype=np.int64)
    shifted = distances - distances.min(axis=-1, keepdims=True)
    if shifted.size and int(shifted.max()) * eps_units >= 1 << 63:
        raise ValueError("epsilon * rank distance too large for the exact quantile mechanism")
    return shifted * eps_units, (steps * score_scale_units(quantile_units, neighbouring)) << GRID_BITS


def choose_candidate(counts_at_or_below, n: int, quantile: float, epsilon: float, neighbouring,
                     streams, lanes: np.ndarray = None) -> np.ndarray:
    """Per lane of ``streams`` (a :class:`~transforms.noise.RandomStreams`), the index of the
    candidate chosen by exact permute-and-flip with the exponents of :func:`rank_exponents`."""
    from transforms.noise.exponential import permute_and_flip

    units = grid_quantile(quantile)
    num, den = rank_exponents(rank_distances(counts_at_or_below, n, units), epsilon, units,
                              neighbouring)
    return permute_and_flip(streams, num, den, lanes)


def rank_error_bound(epsilon: float, quantile: float, candidates: int, neighbouring,
                     failure: float = 0.05, steps: int = 1) -> float:
    """Ranks within which the chosen cell lies of the target with probability >= 1 - failure
    (module docstring, "Stated error"), for ``candidates`` candidates."""
    if not 0 < failure < 1:
        raise ValueError(f"failure must be in (0, 1), got {failure!r}")
    eps = grid_epsilon(epsilon) / _ONE
    return steps * score_scale(quantile, neighbouring) * math.log(max(int(candidates), 1) / failure) / eps


def rank_error_std(epsilon: float, quantile: float, candidates: int, neighbouring,
                   steps: int = 1) -> float:
    """A bound on the root mean square rank distance of the chosen cell, whatever the data:
    from ``P(d >= D) <= min(1, k exp(-epsilon D / s))`` (``s = steps Delta'``),
    ``E[d^2] <= (s / epsilon)^2 (L^2 + 2 L + 2)`` with ``L = ln k``."""
    eps = grid_epsilon(epsilon) / _ONE
    log_k = math.log(max(int(candidates), 1))
    return steps * score_scale(quantile, neighbouring) / eps * math.sqrt(log_k ** 2 + 2 * log_k + 2)


@dataclass(frozen=True, kw_only=True)
class CellSelection:
    """A quantiles metric released by selection (the tree's rival, :mod:`transforms.quantiles`):
    per key and quantile, one of the ``leaves + 1`` edges of ``tree``'s leaves (``low + i w``),
    chosen by permute-and-flip over their rank distances (:func:`point_distances`: the values
    below edge ``i`` are the key's exact counts of leaves ``< i``, ``n`` below ``high``) and
    released as it. Points rather than cells: a cell holding the target may have its midpoint
    on the wrong side of it, an edge's rank is known exactly (OpenDP's candidates, on the
    tree's grid).

    ``epsilon``: per quantile (the metric's share over its quantiles: basic composition).
    ``steps``: the values one neighbouring change adds or removes over all keys, the L1 of the
    per-key row counts (``L0 Linf`` under add/remove, doubled under substitution: a replaced unit
    is removed, then added); a change is a chain of ``steps`` one-value additions/removals each
    moving one key's score monotonically (add/remove bound), so each step costs ``epsilon /
    steps``. The release stage reads ``columns`` (the tree's leaf counts) as the exact answer
    and draws each (key, quantile) from its own keyed lane.
    """

    name: str
    tree: QuantileTree
    quantiles: tuple
    epsilon: float
    steps: int
    integer: bool = True

    @property
    def columns(self) -> tuple:
        return self.tree.columns[-self.tree.leaves:]

    def exact(self, table: pa.Table) -> np.ndarray:
        return np.stack([table.column(c).to_numpy(zero_copy_only=False).astype(np.int64)
                         for c in self.columns], axis=1).reshape(table.num_rows, len(self.columns))

    @property
    def candidates(self) -> int:
        return self.tree.leaves + 1

    def _distances(self, counts: np.ndarray, j: int) -> np.ndarray:
        below = np.concatenate([np.zeros((counts.shape[0], 1), np.int64), np.cumsum(counts, axis=1)],
                               axis=1)
        return point_distances(below, counts.sum(axis=1), grid_quantile(self.quantiles[j]))

    def noise_free(self, counts: np.ndarray) -> np.ndarray:
        """(keys, quantiles) leaves holding each quantile, without noise (testing mode)."""
        return np.stack([np.argmin(self._distances(counts, j), axis=1)
                         for j in range(len(self.quantiles))], axis=1)

    def noisy(self, counts: np.ndarray, release_key, keys: pa.Table) -> np.ndarray:
        """(keys, quantiles) chosen leaves; lane (key, quantile j) of the measure's streams."""
        from transforms.noise import RandomStreams
        from transforms.noise.exponential import permute_and_flip

        width = len(self.quantiles)
        lanes = keys.take(pa.array(np.repeat(np.arange(keys.num_rows), width)))
        lanes = lanes.append_column("__quantile", pa.array(np.tile(np.arange(width), keys.num_rows)))
        streams = RandomStreams.for_keys(release_key, self.name, lanes)
        if streams.noise_free:
            return self.noise_free(counts)
        chosen = np.empty((keys.num_rows, width), dtype=np.int64)
        for j in range(width):
            num, den = rank_exponents(self._distances(counts, j), self.epsilon,
                                      grid_quantile(self.quantiles[j]), Neighbouring.ADD_REMOVE,
                                      self.steps)
            chosen[:, j] = permute_and_flip(streams, num, den,
                                            np.arange(keys.num_rows) * width + j)
        return chosen

    def values(self, chosen: np.ndarray, j: int) -> np.ndarray:
        """Quantile ``j`` of each key: its chosen edge."""
        tree = self.tree
        return np.clip(tree.low + chosen[:, j] * tree.leaf_width, tree.low, tree.high)

    def rank_error_std(self) -> float:
        """The largest of its quantiles' :func:`rank_error_std` bounds, in rows."""
        return max(rank_error_std(self.epsilon, q, self.candidates, Neighbouring.ADD_REMOVE,
                                  self.steps) for q in self.quantiles)

    def explain(self) -> str:
        worst = max(rank_error_bound(self.epsilon, q, self.candidates, Neighbouring.ADD_REMOVE,
                                     steps=self.steps) for q in self.quantiles)
        return (f"{self.name}: permute-and-flip over the {self.candidates} leaf edges per quantile "
                f"(epsilon {self.epsilon:g} each, {self.steps} value(s) per neighbouring change): "
                f"error = leaf width {self.tree.leaf_width:.4g} (resolution) plus a rank error of "
                f"rms <= {self.rank_error_std():.4g} rows, <= {worst:.4g} rows with probability "
                "95%, whatever the data")


def selection_if_better(name: str, tree: QuantileTree, quantiles, share_epsilon: float,
                        tree_rank_std: float, bounds, neighbouring) -> Optional[CellSelection]:
    """The :class:`CellSelection` for a quantiles metric's budget share when its stated rank
    error (rms bound) is below the tree's (``tree_rank_std``), else None: per request, the
    mechanism with the smaller stated error (one or two quantiles usually select; many read
    one tree)."""
    from accounting.sensitivity import count_sensitivity

    steps = int(count_sensitivity(bounds, neighbouring).l1)
    epsilon = share_epsilon / len(quantiles)
    inside = all(0 < round(float(q) * _ONE) < _ONE for q in quantiles)
    if not inside or epsilon * _ONE < 1 or steps > 1 << 20:
        return None
    selection = CellSelection(name=name, tree=tree, quantiles=tuple(quantiles), epsilon=epsilon,
                              steps=steps)
    return selection if selection.rank_error_std() < tree_rank_std else None
