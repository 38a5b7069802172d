"""Label randomization for a training export: K-ary randomized response on a label column
(epsilon-label-DP), and what a trainer needs to debias (pure numpy/pyarrow).

Seed ``000_015430204a1d6d17.txt`` (label DP); Ghazi, Golowich, Kumar, Manurangsi & Zhang, "Deep
Learning with Label Differential Privacy" (NeurIPS 2021) for RR and RR-with-prior.

Privacy unit: one example's label. Two datasets are neighbours when one example's label differs
(features are public to the trainer); every label is randomized independently, so the exported
dataset is epsilon-label-DP. (For a person with several examples, spend epsilon / K per example
for K examples, or bound examples per person first: group privacy.)

* RR (no prior): output the true label w.p. p = e^e/(e^e+K-1), each other label w.p.
  q = (1-p)/(K-1). Transition matrix T[a, b] = P[out a | true b] = q + (p-q)[a = b]; it is
  invertible, T^-1 = (I - q 11^T)/(p - q), so (e_out - q 1)/(p - q) is an unbiased one-hot label
  (exact for losses linear in the label) and T^-1 times the randomized class frequencies is an
  unbiased class prior.
* RR-with-prior (a *public* prior pi, e.g. from an earlier DP release): keep only the k labels of
  largest prior, k maximising (sum of their prior) · e^e/(e^e + k - 1); a label in that set is
  randomized by RR among the k, a label outside it maps uniformly onto the k. Ratios of output
  probabilities are p/q, k·p and 1/(k·q), all <= e^epsilon. T is not invertible when k < K.

A row whose label is null or not declared is not dropped (its absence would depend on its label):
it gets a label drawn uniformly from the randomized-among set, the output law of a label outside
the support, which is within e^epsilon of every declared label's output law; such rows are counted
for the operator only.

Probabilities are realised on the 2^-32 grid with p rounded down (realised epsilon <= nominal).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms import error_columns
from transforms.ldp.oracles import check_local_epsilon
from transforms.ldp.randomness import (TWO32, KeyedRandomness, retry_u32, threshold_floor,
                                       uniform_below)
from transforms.randomness import RandomSource, SystemRandomness


@dataclass(frozen=True, kw_only=True)
class LabelRandomizer:
    """K-ary randomized response over the public label set ``labels`` (optionally with a prior)."""

    epsilon: float
    labels: tuple
    prior: Optional[tuple] = None
    support: tuple = field(init=False)
    keep_threshold: int = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_local_epsilon(self.epsilon))
        labels = tuple(self.labels) if self.labels is not None else ()
        if len(labels) < 2 or len(set(labels)) != len(labels):
            raise ValueError("labels: declare at least two distinct public label values")
        if any(label is None for label in labels):
            raise ValueError("labels: None is not a label")
        object.__setattr__(self, "labels", labels)
        K = len(labels)
        e = math.exp(self.epsilon)
        if self.prior is None:
            support = tuple(range(K))
        else:
            prior = np.asarray(self.prior, dtype=np.float64)
            if prior.shape != (K,) or (prior < 0).any() or not prior.sum() > 0 \
                    or not np.isfinite(prior).all():
                raise ValueError(f"prior: {K} non-negative weights, one per label, not all zero")
            object.__setattr__(self, "prior", tuple(float(x) for x in prior / prior.sum()))
            order = np.lexsort((np.arange(K), -prior))  # ties: label order (public)
            mass = np.cumsum(prior[order]) / prior.sum()
            ks = np.arange(1, K + 1)
            best = int(np.argmax(mass * e / (e + ks - 1)))  # first maximum: the smallest such k
            support = tuple(sorted(int(i) for i in order[:best + 1]))
        object.__setattr__(self, "support", support)
        k = len(support)
        object.__setattr__(self, "keep_threshold",
                           threshold_floor(e / (e + k - 1)) if k > 1 else TWO32)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def probabilities(self) -> tuple[float, float]:
        """(p, q): keep probability inside the support, and each other support label's."""
        k = len(self.support)
        p = self.keep_threshold / TWO32
        return p, ((1.0 - p) / (k - 1) if k > 1 else 0.0)

    @property
    def realised_epsilon(self) -> float:
        k = len(self.support)
        if k == 1:
            return 0.0
        p, q = self.probabilities()
        ratios = [p / q]
        if k < self.num_labels:
            ratios += [k * p, 1.0 / (k * q)]
        return math.log(max(ratios))

    def transition_matrix(self) -> np.ndarray:
        """T[a, b] = P[randomized label a | true label b] (columns sum to one)."""
        K, k = self.num_labels, len(self.support)
        p, q = self.probabilities()
        T = np.zeros((K, K))
        s = np.asarray(self.support)
        inside = np.zeros(K, dtype=bool)
        inside[s] = True
        for b in range(K):
            if inside[b]:
                T[s, b] = q
                T[b, b] = p
            else:
                T[s, b] = 1.0 / k
        return T

    def debias_matrix(self) -> Optional[np.ndarray]:
        """T^-1 for plain RR (None with a prior: T is not invertible when labels are dropped)."""
        if len(self.support) != self.num_labels:
            return None
        p, q = self.probabilities()
        K = self.num_labels
        return (np.eye(K) - q * np.ones((K, K))) / (p - q)

    def describe(self) -> dict:
        p, q = self.probabilities()
        out = {
            "mechanism": "randomized response on labels" + (" with prior" if self.prior else ""),
            "epsilon": self.epsilon, "realised_epsilon": self.realised_epsilon,
            "labels": [str(x) for x in self.labels],
            "randomized_among": [str(self.labels[i]) for i in self.support],
            "keep_probability": p, "other_label_probability": q,
            "transition_matrix": self.transition_matrix().tolist(),
            "privacy": (f"{self.realised_epsilon:.6g}-label-DP: each example's label is randomized "
                        "independently; neighbouring datasets differ in one example's label"),
        }
        inverse = self.debias_matrix()
        if inverse is not None:
            out["debias_matrix"] = inverse.tolist()
            out["unbiased_label"] = "(onehot(randomized) - q) / (p - q)"
        return out


def label_indices(randomizer: LabelRandomizer, column) -> tuple[np.ndarray, np.ndarray]:
    """Index of each row's label in ``randomizer.labels`` and a mask of rows with a declared
    label (nulls and undeclared labels are False)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not isinstance(column, pa.Array):
        column = pa.array(column)
    declared = pa.array(list(randomizer.labels))
    try:
        value_set = declared.cast(column.type)
        faithful = (value_set.cast(declared.type).equals(declared)
                    and len(pc.unique(value_set)) == len(declared))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        faithful = False
    if not faithful:
        raise ValueError(f"the declared labels {list(randomizer.labels)!r} do not fit the label "
                         f"column's type {column.type}")
    index = pc.index_in(column, value_set=value_set)
    valid = index.is_valid().to_numpy(zero_copy_only=False)
    return index.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), valid


def randomize_label_indices(randomizer: LabelRandomizer, index: np.ndarray, *,
                            source: RandomSource, ids) -> np.ndarray:
    """Randomized label indices (one 64-bit word per example, plus rare redraws); index -1 (no
    declared label) draws uniformly from the support."""
    index = np.asarray(index, dtype=np.int64)
    support = np.asarray(randomizer.support, dtype=np.int64)
    k = support.size
    if k == 1:
        return np.full(index.size, support[0], dtype=np.int64)
    words = source.words(ids, 1, "labels")[:, 0]
    keep = (words & np.uint64(0xFFFFFFFF)) < np.uint64(randomizer.keep_threshold)
    lookup = np.full(randomizer.num_labels, -1, dtype=np.int64)
    lookup[support] = np.arange(k)
    # Position of the true label in the support (-1: outside it, or no declared label).
    position = np.where(index >= 0, lookup[np.maximum(index, 0)], -1)
    inside = position >= 0
    # Inside: a uniform other among k - 1; outside: a uniform one among k (always "moved").
    bound = np.where(inside, k - 1, k).astype(np.uint64)
    pick = uniform_below(words >> np.uint64(32), bound, retry_u32(source, ids, "labels/other"))
    pick = pick.astype(np.int64)
    pick += inside & (pick >= position)
    out = support[pick]
    return np.where(inside & keep, index, out)


def example_ids(source: RandomSource, column) -> object:
    """Per-example ids for keyed randomness: integers as they are, other types through the noise
    engine's keyed MAC (128-bit lane bases)."""
    if isinstance(source, SystemRandomness):
        return len(column)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise ValueError("example ids must not be null (they key each example's randomness)")
    if pa.types.is_integer(column.type):
        values = column.to_numpy(zero_copy_only=False)
        if values.size and values.min() < 0:
            raise ValueError("integer example ids must not be negative")
        return values.astype(np.uint64)
    if not isinstance(source, KeyedRandomness):
        raise TypeError("non-integer example ids need KeyedRandomness")
    return source.lane_bases(column)


def randomize_label_table(randomizer: LabelRandomizer, table: pa.Table, *, label_column: str,
                          id_column: Optional[str], source: RandomSource,
                          unbiased_column: Optional[str] = None) -> tuple[pa.Table, int]:
    """The table with ``label_column`` randomized (every row kept, in its input order).

    Returns (randomized table, rows whose label was null or undeclared -- for a counter). ``unbiased_column`` adds the unbiased label (plain
    RR only): a float for two labels (the unbiased estimate of "label is labels[1]"), else a list
    of K floats (the unbiased one-hot vector).
    """
    if label_column not in table.column_names:
        raise ValueError(f"no label column {label_column!r} in {table.column_names}")
    if id_column is not None and id_column not in table.column_names:
        raise ValueError(f"no example id column {id_column!r} in {table.column_names}")
    if id_column is None and not isinstance(source, SystemRandomness):
        raise ValueError("keyed label randomization needs an example id column (id_column=...)")
    column = table.column(label_column)
    index, valid = label_indices(randomizer, column)
    undeclared = int((~valid).sum())
    index = np.where(valid, index, -1)
    ids = len(index) if id_column is None else example_ids(source, table.column(id_column))
    new_index = randomize_label_indices(randomizer, index, source=source, ids=ids)
    labels = pa.array(list(randomizer.labels)).cast(column.type)
    position = table.column_names.index(label_column)
    out = table.set_column(position, table.schema.field(label_column),
                           labels.take(pa.array(new_index)))
    if unbiased_column:
        inverse = randomizer.debias_matrix()
        if inverse is None:
            raise ValueError("unbiased labels need plain RR (no prior)")
        if randomizer.num_labels == 2:
            out = out.append_column(unbiased_column, pa.array(inverse[1][new_index], pa.float64()))
        else:
            vectors = inverse[:, new_index].T
            out = out.append_column(unbiased_column, pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.reshape(-1), pa.float64()), randomizer.num_labels))
    return out, undeclared


def label_counts(randomizer: LabelRandomizer, table: pa.Table, label_column: str) -> np.ndarray:
    index, valid = label_indices(randomizer, table.column(label_column))
    return np.bincount(index[valid], minlength=randomizer.num_labels)


def estimate_label_counts(randomizer: LabelRandomizer, randomized_counts) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased true class counts from randomized counts (plain RR), and their std."""
    inverse = randomizer.debias_matrix()
    if inverse is None:
        raise ValueError("class counts are not identifiable with a prior that drops labels")
    counts = np.asarray(randomized_counts, dtype=np.float64)
    n = counts.sum()
    estimate = inverse @ counts
    p, q = randomizer.probabilities()
    c = np.clip(estimate, 0, n)
    variance = (c * p * (1 - p) + (n - c) * q * (1 - q)) / (p - q) ** 2
    return estimate, np.sqrt(variance)


def debias_table(randomizer: LabelRandomizer, randomized_counts: Sequence[int]) -> pa.Table:
    """What a trainer needs, one row per label: its index, the transition matrix column, the
    debias matrix row (plain RR), and the estimated class count with its approximate 95%
    interval and std (``estimated_count_ci95_low``, ``_ci95_high``, ``_std``: the std at the
    estimate clipped to [0, n], the interval estimate -/+ 1.96 std clipped to [0, n]; plug-in
    variance, normal approximation: :func:`transforms.error_columns.plug_in_interval`)."""
    K = randomizer.num_labels
    T = randomizer.transition_matrix()
    inverse = randomizer.debias_matrix()
    columns = {
        "label": pa.array([str(x) for x in randomizer.labels]),
        "label_index": pa.array(np.arange(K, dtype=np.int32)),
        "randomized_count": pa.array(np.asarray(randomized_counts, dtype=np.int64)),
        "transition_from_label": pa.array([T[:, b].tolist() for b in range(K)],
                                          pa.list_(pa.float64(), K)),
    }
    if inverse is not None:
        estimate, std = estimate_label_counts(randomizer, randomized_counts)
        columns["debias_row"] = pa.array([inverse[a].tolist() for a in range(K)],
                                         pa.list_(pa.float64(), K))
        low, high = error_columns.plug_in_interval(
            estimate, std, low=0.0, high=float(np.sum(randomized_counts)))
        columns["estimated_count"] = pa.array(estimate)
        columns["estimated_count_ci95_low"] = pa.array(low)
        columns["estimated_count_ci95_high"] = pa.array(high)
        columns["estimated_count_std"] = pa.array(std)
    return pa.table(columns)
