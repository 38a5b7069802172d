"""The browser side (the map step): records in, one Arrow table of reports per helper out.

Pure numpy/pyarrow, importable without Beam. Randomness comes from a
:class:`~transforms.randomness.RandomSource` (the OS CSPRNG by default); in its keyed
modes each record's stream is keyed by its content and the draws are made in a fixed order --
report id, then masks or shares, then blinding -- so a record's reports do not depend on the
other records of its table.

Aggregation records (Algorithm 1): ``record_id``, ``key``, the value columns and optionally
``batch_id`` (otherwise the ``batch_id`` argument). Values are clipped to the declared
[lower, upper] (the sensitivity the helpers' noise relies on: helpers cannot check a shared
value's range) and encoded in fixed point; a value that does not fit the ring is refused.

Gradient records (Section 4): ``record_id``, byte features ``x_0..x_{d-1}``, a ``label`` and
optionally ``fake`` (strictly fake records, both masks sharing 0) and ``batch_id``; optional
local DP noise on the features (Section 4.2.3).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.lark.local_dp import LocalFeatureNoise, check_byte_features
from transforms.lark.masks import blinding, check_labels, mask_labels
from transforms.lark.params import AggregationParams
from transforms.randomness import RandomSource, SystemRandomness
from transforms.lark.reports import (LarkInputError, blind_columns, feature_columns,
                                     ids_to_hex, require_columns, share_column)
from transforms.lark.sharing import check_num_helpers, share_from_words

SHARE_PURPOSE = "masked-lark/aggregation-report"
GRADIENT_PURPOSE = "masked-lark/gradient-report"
FEATURE_NOISE_PURPOSE = "masked-lark/feature-noise"


def _batch_ids(records: pa.Table, batch_id: Optional[str]) -> pa.Array:
    if "batch_id" in records.column_names:
        column = records.column("batch_id").combine_chunks().cast(pa.string())
        if column.null_count:
            raise LarkInputError("batch_id must not be missing")
        return column
    if batch_id is None:
        raise LarkInputError("records have no batch_id column: pass batch_id=")
    return pa.array([str(batch_id)] * records.num_rows, pa.string())


def _helper_column(h: int, n: int) -> pa.Array:
    return pa.array(np.full(n, h, dtype=np.int32))


def _real_matrix(records: pa.Table, columns: Sequence[str]) -> np.ndarray:
    out = np.empty((records.num_rows, len(columns)), dtype=np.float64)
    for j, name in enumerate(columns):
        column = records.column(name)
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            try:
                column = pc.cast(column, pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise LarkInputError(f"value column {name!r} is not numeric")
        if column.null_count:
            raise LarkInputError(f"value column {name!r} has missing values")
        out[:, j] = column.to_numpy().astype(np.float64)
    return out


def aggregation_reports(records: pa.Table, params: AggregationParams, *,
                        randomness: Optional[RandomSource] = None,
                        batch_id: Optional[str] = None) -> list[pa.Table]:
    """One report table per helper (Algorithm 1) for every record."""
    randomness = randomness or SystemRandomness()
    require_columns(records, ["record_id", "key", *params.value_columns], "aggregation records")
    n = records.num_rows
    values = _real_matrix(records, params.value_columns)
    if not np.all(np.isfinite(values)):
        raise LarkInputError("values must be finite numbers")
    ring = params.codec.encode(np.clip(values, params.lower, params.upper))
    keys = records.column("key").combine_chunks().cast(pa.string())
    if keys.null_count:
        raise LarkInputError("key must not be missing")
    lanes = pa.table({"record_id": records.column("record_id"), "key": keys,
                      **{f"v{j}": pa.array(ring[:, j]) for j in range(ring.shape[1])}})
    d, num_helpers = params.dimension, params.num_helpers
    drawn = randomness.records(SHARE_PURPOSE, lanes).words(2 + (num_helpers - 1) * d)
    report_ids = ids_to_hex(drawn[:, :2])
    uniform = drawn[:, 2:].reshape(n, num_helpers - 1, d)
    shares = share_from_words(ring, np.moveaxis(uniform, 1, 0))
    batch_ids = _batch_ids(records, batch_id)
    return [pa.table({"batch_id": batch_ids, "report_id": report_ids,
                      "helper": _helper_column(h, n), "key": keys,
                      **{share_column(c): pa.array(shares[h][:, j])
                         for j, c in enumerate(params.value_columns)}})
            for h in range(num_helpers)]


def gradient_reports(records: pa.Table, *, num_features: int, num_helpers: int = 2,
                     num_labels: int = 2, local_noise: Optional[LocalFeatureNoise] = None,
                     randomness: Optional[RandomSource] = None,
                     batch_id: Optional[str] = None) -> list[pa.Table]:
    """One report table per helper for masked gradient computation (Section 4)."""
    randomness = randomness or SystemRandomness()
    num_helpers = check_num_helpers(num_helpers)
    xcols = feature_columns(num_features)
    require_columns(records, ["record_id", "label", *xcols], "gradient records")
    n = records.num_rows
    features = check_byte_features(_real_matrix(records, xcols) if n else
                                   np.zeros((0, num_features)))
    labels = check_labels(_real_matrix(records, ["label"])[:, 0], num_labels)
    fake = None
    lane_columns = {"record_id": records.column("record_id"),
                    **{c: pa.array(features[:, j]) for j, c in enumerate(xcols)},
                    "label": pa.array(labels)}
    if "fake" in records.column_names:
        fake_col = records.column("fake").combine_chunks()
        if fake_col.null_count or not pa.types.is_boolean(fake_col.type):
            raise LarkInputError("fake must be a boolean column without missing values")
        fake = fake_col.to_numpy(zero_copy_only=False).astype(bool)
        lane_columns["fake"] = fake_col
    draws = randomness.records(GRADIENT_PURPOSE, pa.table(lane_columns))
    id_words = draws.words(2)
    report_ids = ids_to_hex(id_words)
    masked = mask_labels(labels, num_labels=num_labels, num_helpers=num_helpers,
                         draws=draws, strictly_fake=fake)
    blinds = blinding(n, num_features + 1, num_helpers, draws)
    if local_noise is not None:
        feature_lanes = pa.table({
            "id_hi": pa.array(np.repeat(id_words[:, 0], num_features)),
            "id_lo": pa.array(np.repeat(id_words[:, 1], num_features)),
            "j": pa.array(np.tile(np.arange(num_features, dtype=np.int64), n))})
        features = local_noise.apply(features, randomness.streams(FEATURE_NOISE_PURPOSE,
                                                                  feature_lanes))
    batch_ids = _batch_ids(records, batch_id)
    feature_arrays = {c: pa.array(features[:, j]) for j, c in enumerate(xcols)}
    label_a = pa.array(masked.label_a.astype(np.int8))
    label_b = pa.array(masked.label_b.astype(np.int8))
    return [pa.table({"batch_id": batch_ids, "report_id": report_ids,
                      "helper": _helper_column(h, n), **feature_arrays,
                      "label_a": label_a, "label_b": label_b,
                      "mask_a": pa.array(masked.mask_a[h]), "mask_b": pa.array(masked.mask_b[h]),
                      **{c: pa.array(blinds[h][:, j])
                         for j, c in enumerate(blind_columns(num_features + 1))}})
            for h in range(num_helpers)]
