"""The helper side (the reduce step): Algorithms 2 and 3 as pure numpy, batch by batch.

A helper reads only its own stream of reports. For each Arrow table of reports it computes
*partials* -- per batch, per key: the report count and the ring sum of its values (Algorithm 2)
or of its masked, clipped gradients (Algorithm 3) -- plus the batch's report ids. Partials are
additive, so any runner may merge them in any order (:func:`merge_partials`). A complete batch is
then released once (:func:`release_batch`):

1. duplicate report ids refuse the whole batch (a replayed report would count several times,
   beyond the sensitivity the noise is calibrated to);
2. a batch whose sum could wrap around the ring (count * max value + noise tail >= 2^63) or that
   exceeds ``max_batch_records`` is refused;
3. k-anonymity (the paper's Definition 3.1): a key -- for gradients, the batch -- is released only
   with *more than* k reports; with exactly k it is suppressed;
4. every released coordinate gets discrete Laplace noise in fixed-point units, added in the
   ring, from keyed streams of this helper's key with one lane per (batch, key, coordinate): the
   noise depends on what is released, never on bundling or worker.

Refused batches release nothing (the reason goes to the operator's counters); the ad server then
finds the batch absent from every helper.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.keys import ReleaseKey
from transforms.lark.model import LogisticModel, clipped_gradient_units
from transforms.lark.params import AggregationParams, GradientParams
from transforms.lark.reports import (LarkInputError, aggregation_output_schema, batch_digest,
                                     blind_columns, count_duplicates, feature_columns,
                                     gradient_output_schema, hex_to_ids, int_column,
                                     require_columns, share_column, sort_ids, string_column,
                                     uint64_column)
from transforms.lark.ring import ring_sum
from transforms.noise import RandomStreams, sample_units


AGGREGATION_NOISE_PURPOSE = "masked-lark/aggregation-noise"
GRADIENT_NOISE_PURPOSE = "masked-lark/gradient-noise"
GRADIENT_KEY = ""
_CHUNK = 1 << 16


@dataclass(frozen=True, kw_only=True)
class BatchPartial:
    """What a helper has summed of one batch so far: keys (sorted), counts, ring sums, ids."""

    batch_id: str
    keys: np.ndarray            # object array of str, sorted, unique
    counts: np.ndarray          # int64 per key
    sums: np.ndarray            # (keys, dimension) uint64
    ids: np.ndarray             # (reports, 2) uint64 report ids

    @property
    def num_reports(self) -> int:
        return int(self.counts.sum())


class ParseStats:
    """Row faults of one table (raw-data facts: for the operator's counters only); an
    accumulator filled while a table is parsed, not a value object."""

    __slots__ = ("reports", "malformed", "faults")

    def __init__(self, reports: int = 0):
        self.reports, self.malformed, self.faults = reports, 0, {}

    def drop(self, name: str, mask: np.ndarray) -> None:
        bad = int((~mask).sum())
        if bad:
            self.faults[name] = self.faults.get(name, 0) + bad


def _check_helper(table: pa.Table, helper: int, stats: ParseStats) -> np.ndarray:
    values, ok = int_column(table.column("helper"), 0, 1 << 20)
    foreign = ok & (values != helper)
    if foreign.any():
        others = sorted(set(values[foreign].tolist()))[:5]
        raise LarkInputError(f"helper {helper} was given reports addressed to helper(s) {others}: "
                             "each helper reads only its own stream of reports")
    stats.drop("bad_helper_index", ok)
    return ok


def _codes(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Dictionary codes of a string column, renumbered so that codes follow sorted names."""
    encoded = pc.dictionary_encode(column)
    names = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
    rank = np.argsort(names.astype(str), kind="stable")
    inverse = np.empty(len(names), dtype=np.int64)
    inverse[rank] = np.arange(len(names))
    codes = inverse[encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
    return codes, names[rank]


def ring_bincount(groups: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per-group sums mod 2^64 of uint64 rows (n, d), in O(n): each 32-bit half is summed with
    ``np.bincount`` in float64, exact for up to 2^21 rows per pass (2^32 * 2^21 = 2^53)."""
    out = np.zeros((size, values.shape[1]), dtype=np.uint64)
    low_mask, shift = np.uint64(0xFFFFFFFF), np.uint64(32)
    for start in range(0, len(groups), 1 << 21):
        g = groups[start:start + (1 << 21)]
        v = values[start:start + (1 << 21)]
        for j in range(values.shape[1]):
            low = np.bincount(g, (v[:, j] & low_mask).astype(np.float64), size)
            high = np.bincount(g, (v[:, j] >> shift).astype(np.float64), size)
            out[:, j] += low.astype(np.uint64) + (high.astype(np.uint64) << shift)
    return out


def _rows_by_batch(b_codes: np.ndarray, b_names: np.ndarray) -> dict:
    """Row indices of each batch (no sort when the table holds one batch)."""
    if len(b_names) == 1:
        return {b_names[0]: slice(None)}
    order = np.argsort(b_codes, kind="stable")
    bounds = np.searchsorted(b_codes[order], np.arange(len(b_names) + 1))
    return {b_names[i]: order[bounds[i]:bounds[i + 1]] for i in range(len(b_names))}


# --------------------------------------------------------------------------- Algorithm 2

def aggregation_partials(table: pa.Table, params: AggregationParams,
                         helper: int) -> tuple[list[BatchPartial], ParseStats]:
    """Per batch and key of one report table: counts and ring sums of the shares."""
    share_cols = [share_column(c) for c in params.value_columns]
    require_columns(table, ["batch_id", "report_id", "helper", "key", *share_cols],
                    f"helper {helper}'s aggregation reports")
    stats = ParseStats(reports=table.num_rows)
    ok = _check_helper(table, helper, stats)
    batch_ids, ok_b = string_column(table.column("batch_id"))
    keys, ok_k = string_column(table.column("key"))
    ids, ok_i = hex_to_ids(table.column("report_id"))
    stats.drop("missing_batch_id", ok_b)
    stats.drop("missing_key", ok_k)
    stats.drop("bad_report_id", ok_i)
    ok &= ok_b & ok_k & ok_i
    shares = np.empty((table.num_rows, len(share_cols)), dtype=np.uint64)
    for j, col in enumerate(share_cols):
        shares[:, j], ok_s = uint64_column(table.column(col))
        stats.drop(f"bad_{col}", ok_s)
        ok &= ok_s
    stats.malformed = int((~ok).sum())
    if not ok.all():
        mask = pa.array(ok)
        batch_ids, keys = batch_ids.filter(mask), keys.filter(mask)
        ids, shares = ids[ok], shares[ok]
    if len(ids) == 0:
        return [], stats
    b_codes, b_names = _codes(batch_ids)
    k_codes, k_names = _codes(keys)
    groups = b_codes * len(k_names) + k_codes  # ordered by batch, then key
    size = len(b_names) * len(k_names)
    if size > 4 * len(groups) + 4096:  # many batches x keys: compact to the groups present
        present, groups = np.unique(groups, return_inverse=True)
    else:
        present = None
    counts = np.bincount(groups, minlength=present.size if present is not None else size)
    sums = ring_bincount(groups, shares, len(counts))
    occupied = np.flatnonzero(counts)
    codes = occupied if present is None else present[occupied]
    counts, sums = counts[occupied].astype(np.int64), sums[occupied]
    batch_of, key_of = codes // len(k_names), codes % len(k_names)
    rows = _rows_by_batch(b_codes, b_names)
    partials = []
    for b, batch in enumerate(b_names):
        sel = batch_of == b
        if sel.any():
            partials.append(BatchPartial(batch_id=batch, keys=k_names[key_of[sel]],
                                         counts=counts[sel], sums=sums[sel], ids=ids[rows[batch]]))
    return partials, stats


# --------------------------------------------------------------------------- Algorithm 3

def masked_gradient_sum(model: LogisticModel, params: GradientParams, features: np.ndarray,
                        label_a: np.ndarray, label_b: np.ndarray, mask_a: np.ndarray,
                        mask_b: np.ndarray, blinds: np.ndarray) -> np.ndarray:
    """sum_i [mask_a_i G(x_i, a_i) + mask_b_i G(x_i, b_i) + blind_i] in the ring, where G is the
    clipped fixed-point gradient (the paper's Algorithm 3 before noise; Equation 2)."""
    total = np.zeros(params.dimension, dtype=np.uint64)
    cap, f = params.cap_units, params.fraction_bits
    for start in range(0, len(features), _CHUNK):
        part = slice(start, start + _CHUNK)
        xs = model.scaled_features(features[part])
        p = model.predict_proba(features[part])
        for labels, masks in ((label_a[part], mask_a[part]), (label_b[part], mask_b[part])):
            residual = p - labels
            units = clipped_gradient_units(np.hstack([xs * residual[:, None], residual[:, None]]),
                                           cap, f)
            total += ring_sum(units.view(np.uint64) * masks[:, None], axis=0)
        total += ring_sum(blinds[part], axis=0)
    return total


def clear_gradient_units(model: LogisticModel, params: GradientParams, features: np.ndarray,
                         labels: np.ndarray) -> np.ndarray:
    """The same clipped fixed-point gradients summed in the clear (int64 units): what the
    helpers' combination equals without noise."""
    xs = model.scaled_features(features)
    residual = model.predict_proba(features) - np.asarray(labels, dtype=np.float64)
    units = clipped_gradient_units(np.hstack([xs * residual[:, None], residual[:, None]]),
                                   params.cap_units, params.fraction_bits)
    return units.sum(axis=0)


def gradient_partials(table: pa.Table, params: GradientParams, model: LogisticModel,
                      helper: int) -> tuple[list[BatchPartial], ParseStats]:
    """Per batch of one report table: count and masked gradient ring sum."""
    if model.num_features != params.num_features:
        raise LarkInputError(f"model has {model.num_features} features, parameters declare "
                             f"{params.num_features}")
    d, dim = params.num_features, params.dimension
    xcols, bcols = feature_columns(d), blind_columns(dim)
    require_columns(table, ["batch_id", "report_id", "helper", *xcols, "label_a", "label_b",
                            "mask_a", "mask_b", *bcols], f"helper {helper}'s gradient reports")
    n = table.num_rows
    stats = ParseStats(reports=n)
    ok = _check_helper(table, helper, stats)
    batch_ids, ok_b = string_column(table.column("batch_id"))
    ids, ok_i = hex_to_ids(table.column("report_id"))
    stats.drop("missing_batch_id", ok_b)
    stats.drop("bad_report_id", ok_i)
    ok &= ok_b & ok_i
    features = np.empty((n, d), dtype=np.uint8)
    for j, col in enumerate(xcols):
        values, ok_x = int_column(table.column(col), 0, 255)
        features[:, j] = values
        stats.drop("bad_feature", ok_x)
        ok &= ok_x
    labels = {}
    for col in ("label_a", "label_b"):
        labels[col], ok_l = int_column(table.column(col), 0, params.num_labels - 1)
        stats.drop("bad_label", ok_l)
        ok &= ok_l
    masks = {}
    for col in ("mask_a", "mask_b"):
        masks[col], ok_m = uint64_column(table.column(col))
        stats.drop("bad_mask", ok_m)
        ok &= ok_m
    blinds = np.empty((n, dim), dtype=np.uint64)
    for j, col in enumerate(bcols):
        blinds[:, j], ok_c = uint64_column(table.column(col))
        stats.drop("bad_blind", ok_c)
        ok &= ok_c
    stats.malformed = int((~ok).sum())
    if not ok.all():
        batch_ids = batch_ids.filter(pa.array(ok))
        ids, features, blinds = ids[ok], features[ok], blinds[ok]
        labels = {k: v[ok] for k, v in labels.items()}
        masks = {k: v[ok] for k, v in masks.items()}
    if len(ids) == 0:
        return [], stats
    b_codes, b_names = _codes(batch_ids)
    partials = []
    for batch, rows in _rows_by_batch(b_codes, b_names).items():
        batch_ids_rows = ids[rows]
        total = masked_gradient_sum(model, params, features[rows], labels["label_a"][rows],
                                    labels["label_b"][rows], masks["mask_a"][rows],
                                    masks["mask_b"][rows], blinds[rows])
        partials.append(BatchPartial(batch_id=batch, keys=np.asarray([GRADIENT_KEY], dtype=object),
                                     counts=np.asarray([len(batch_ids_rows)], dtype=np.int64),
                                     sums=total[None, :], ids=batch_ids_rows))
    return partials, stats


# --------------------------------------------------------------------------- merge and release

def merge_partials(partials) -> BatchPartial:
    """One partial of a batch from several (keys regrouped, sums added in the ring)."""
    partials = [p for p in partials if p is not None]
    if not partials:
        raise ValueError("nothing to merge")
    batch = partials[0].batch_id
    if any(p.batch_id != batch for p in partials):
        raise ValueError("partials of different batches cannot be merged")
    if len(partials) == 1:
        return partials[0]
    keys = np.concatenate([p.keys for p in partials])
    unique, inverse = np.unique(keys.astype(str), return_inverse=True)
    counts = np.zeros(len(unique), dtype=np.int64)
    np.add.at(counts, inverse, np.concatenate([p.counts for p in partials]))
    sums = np.zeros((len(unique), partials[0].sums.shape[1]), dtype=np.uint64)
    np.add.at(sums, inverse, np.concatenate([p.sums for p in partials]))
    return BatchPartial(batch_id=batch, keys=unique.astype(object), counts=counts, sums=sums,
                        ids=np.concatenate([p.ids for p in partials]))


@dataclass(frozen=True, kw_only=True)
class BatchOutcome:
    """What happened to one batch (for the operator's counters and report)."""

    batch_id: str
    reports: int
    status: str                 # released | duplicate_reports | overflow | below_k
    keys_released: int = 0
    keys_suppressed: int = 0


def _noise(params, release_key: ReleaseKey, helper: int, purpose: str, batch: str,
           keys: np.ndarray, dimension: int) -> np.ndarray:
    spec = params.noise_spec()
    if spec is None:
        return np.zeros((len(keys), dimension), dtype=np.uint64)
    lanes = pa.table({"batch_id": pa.array([batch] * (len(keys) * dimension), pa.string()),
                      "key": pa.array(np.repeat(keys.astype(str), dimension).tolist(), pa.string()),
                      "coordinate": pa.array(np.tile(np.arange(dimension, dtype=np.int64),
                                                     len(keys)))})
    streams = RandomStreams.for_keys(helper_key(release_key, helper), purpose, lanes)
    return sample_units(spec, streams).view(np.uint64).reshape(len(keys), dimension)


def helper_key(release_key: ReleaseKey, helper: int) -> ReleaseKey:
    """The sub-key of one helper's noise (distinct even if an operator reused a key)."""
    if not isinstance(release_key, ReleaseKey):
        raise TypeError("a helper needs an accounting.keys.ReleaseKey")
    return release_key.subkey(f"masked-lark/helper={int(helper)}")


def _screen(partial: BatchPartial, params) -> tuple[Optional[np.ndarray], BatchOutcome]:
    ids = sort_ids(partial.ids)
    total = partial.num_reports
    if count_duplicates(ids):
        return None, BatchOutcome(batch_id=partial.batch_id, reports=total,
                                  status="duplicate_reports")
    if not params.batch_fits(total):
        return None, BatchOutcome(batch_id=partial.batch_id, reports=total, status="overflow")
    return ids, None


def release_aggregation(partial: BatchPartial, params: AggregationParams, *, helper: int,
                        release_key: Optional[ReleaseKey]) -> tuple[Optional[pa.Table], BatchOutcome]:
    """Algorithm 2 for one complete batch: the released rows of this helper (or None)."""
    ids, refused = _screen(partial, params)
    if refused is not None:
        return None, refused
    keep = partial.counts > params.k
    keys = partial.keys[keep]
    outcome = BatchOutcome(batch_id=partial.batch_id, reports=partial.num_reports,
                           status="released" if keep.any() else "below_k",
                           keys_released=int(keep.sum()), keys_suppressed=int((~keep).sum()))
    if not keep.any():
        return None, outcome
    noisy = partial.sums[keep] + _noise(params, release_key, helper, AGGREGATION_NOISE_PURPOSE,
                                        partial.batch_id, keys, params.dimension)
    m = len(keys)
    columns = {"batch_id": [partial.batch_id] * m, "batch_digest": [batch_digest(ids)] * m,
               "params_digest": [params.digest()] * m, "helper": np.full(m, helper, np.int32),
               "num_helpers": np.full(m, params.num_helpers, np.int32),
               "key": keys.astype(str).tolist()}
    for j, col in enumerate(params.value_columns):
        columns[share_column(col)] = noisy[:, j]
    return pa.table(columns, schema=aggregation_output_schema(params.value_columns)), outcome


def gradient_params_digest(params: GradientParams, model: LogisticModel) -> str:
    return hashlib.sha256(f"{params.digest()}:{model.digest()}".encode()).hexdigest()[:32]


def release_gradient(partial: BatchPartial, params: GradientParams, model: LogisticModel, *,
                     helper: int, release_key: Optional[ReleaseKey]
                     ) -> tuple[Optional[pa.Table], BatchOutcome]:
    """Algorithm 3 for one complete batch: this helper's noisy masked gradient (or None)."""
    ids, refused = _screen(partial, params)
    if refused is not None:
        return None, refused
    total = partial.num_reports
    if total <= params.k:
        return None, BatchOutcome(batch_id=partial.batch_id, reports=total, status="below_k",
                                  keys_suppressed=1)
    summed = partial.sums.sum(axis=0, dtype=np.uint64)
    noisy = summed + _noise(params, release_key, helper, GRADIENT_NOISE_PURPOSE,
                            partial.batch_id, np.asarray([GRADIENT_KEY], dtype=object),
                            params.dimension)[0]
    dim = params.dimension
    table = pa.table({"batch_id": [partial.batch_id] * dim,
                      "batch_digest": [batch_digest(ids)] * dim,
                      "params_digest": [gradient_params_digest(params, model)] * dim,
                      "helper": np.full(dim, helper, np.int32),
                      "num_helpers": np.full(dim, params.num_helpers, np.int32),
                      "coordinate": np.arange(dim, dtype=np.int32), "share": noisy},
                     schema=gradient_output_schema())
    return table, BatchOutcome(batch_id=partial.batch_id, reports=total, status="released",
                                 keys_released=1)
