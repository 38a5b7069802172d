"""Real and fake labels with their masks (the paper's Section 4.1), and blinding vectors.

For each record the browser sends a real label y and a fake label y_bar (4.1.1): the default
label is 0, so y = 0 gets a fake label drawn uniformly from {1, ..., L-1} and any y != 0 gets
y_bar = 0 (with binary labels the pair is always {0, 1}). The two labels go out in a uniformly
random order, the same order in every helper's report, each with a mask share (4.1.2): the real
label's masks alpha^h are additive shares of 1, the fake label's masks alpha_bar^h shares of 0.
A *strictly fake* record (the browser must sometimes send one, Section 4.1.1) has both masks
sharing 0. For every helper h the masks are uniform and independent of which label is real, so a
helper learns nothing about y from its report; summed over helpers,

    sum_h [alpha^h f(x, y) + alpha_bar^h f(x, y_bar)] = f(x, y)      (the paper's Equation 1).

Blinding. A helper's masked sum  sum_i alpha_i^h g_i  is uniform only over the subgroup of the
ring that the per-record values g_i generate: if every g_i of a coordinate were even, the sum
would be even, and its low bits would tell the ad server about the data. So each report also
carries a blinding vector b_i^h, additive shares of the zero vector, which the helper adds to its
sum: then any H - 1 helpers' sums are exactly uniform, and all H sum to the true total. (Shares of
plain values, Algorithm 2, need no blinding: a sum of uniform shares is already uniform.)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transforms.randomness import RecordDraws
from transforms.lark.sharing import check_num_helpers, share_from_words


@dataclass(frozen=True, kw_only=True)
class MaskedLabels:
    """Labels in sent order (``label_a``, ``label_b``) and, per helper, their mask shares."""

    label_a: np.ndarray
    label_b: np.ndarray
    mask_a: tuple
    mask_b: tuple


def check_labels(labels, num_labels: int) -> np.ndarray:
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 2:
        raise ValueError(f"num_labels must be an integer >= 2, got {num_labels!r}")
    labels = np.asarray(labels)
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        if not np.all(np.isfinite(labels)) or np.any(labels != np.floor(labels)):
            raise ValueError("labels must be integers in [0, num_labels)")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_labels):
        raise ValueError(f"labels must be integers in [0, {num_labels}), got values in "
                         f"[{labels.min()}, {labels.max()}]")
    return labels


def fake_labels(labels: np.ndarray, num_labels: int, draws: RecordDraws) -> np.ndarray:
    """y_bar per record: 0 for y != 0, uniform on {1, ..., L-1} for y = 0 (exactly uniform)."""
    labels = check_labels(labels, num_labels)
    fake = np.zeros_like(labels)
    zero = np.nonzero(labels == 0)[0]
    if zero.size:
        if num_labels == 2:
            fake[zero] = 1
        else:
            fake[zero] = 1 + draws.streams.randint(np.uint64(num_labels - 1),
                                                   zero).astype(np.int64)
    return fake


def mask_labels(labels, *, num_labels: int, num_helpers: int, draws: RecordDraws,
                strictly_fake=None) -> MaskedLabels:
    """Fake labels, random order and mask shares for each record (``draws``: one independent
    source per record). ``strictly_fake``: optional booleans, records whose both masks share 0."""
    num_helpers = check_num_helpers(num_helpers)
    labels = check_labels(labels, num_labels)
    n = labels.size
    if draws.size != n:
        raise ValueError(f"{n} labels but random draws for {draws.size} records")
    fake = fake_labels(labels, num_labels, draws)
    w = draws.words(2 * num_helpers - 1)  # (n, 2 (H-1) + 1)
    real_first = (w[:, -1] & np.uint64(1)).astype(bool)
    real_target = np.ones(n, dtype=np.uint64)
    if strictly_fake is not None:
        strictly_fake = np.asarray(strictly_fake, dtype=bool)
        if strictly_fake.shape != (n,):
            raise ValueError("strictly_fake needs one flag per record")
        real_target[strictly_fake] = 0
    real_masks = share_from_words(real_target, w[:, :num_helpers - 1].T)
    fake_masks = share_from_words(np.zeros(n, dtype=np.uint64),
                                  w[:, num_helpers - 1:2 * (num_helpers - 1)].T)
    label_a = np.where(real_first, labels, fake)
    label_b = np.where(real_first, fake, labels)
    mask_a = tuple(np.where(real_first, r, f) for r, f in zip(real_masks, fake_masks))
    mask_b = tuple(np.where(real_first, f, r) for r, f in zip(real_masks, fake_masks))
    return MaskedLabels(label_a=label_a, label_b=label_b, mask_a=mask_a, mask_b=mask_b)


def blinding(num_records: int, dimension: int, num_helpers: int,
             draws: RecordDraws) -> list[np.ndarray]:
    """Per helper, a (num_records, dimension) uint64 blinding matrix; all helpers' sum to 0."""
    num_helpers = check_num_helpers(num_helpers)
    if draws.size != num_records:
        raise ValueError(f"{num_records} records but random draws for {draws.size}")
    w = draws.words((num_helpers - 1) * dimension).reshape(num_records, num_helpers - 1,
                                                           dimension)
    return share_from_words(np.zeros((num_records, dimension), dtype=np.uint64),
                            np.moveaxis(w, 1, 0))
