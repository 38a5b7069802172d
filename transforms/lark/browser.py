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

Faults: of a table, or of one record
====================================

A fault of the *table* is a caller's error, the same whatever the rows hold, and raises
:class:`~transforms.lark.reports.LarkInputError`: a required column missing, a value, feature
or label column whose type holds no numbers (nested, binary, temporal, boolean: numbers and
text are accepted, text parsed per value), a ``fake`` column that is neither boolean, integer
nor text, no ``batch_id`` at all.

A fault of *one record* never stops the others (one record must not decide whether a batch
is shared, nor whether a key is released downstream). Rules, per record, one
reason each (the first that applies, in this order), counted by :func:`check_aggregation_records`
/ :func:`check_gradient_records` for the caller's operator counters:

* **Removed** -- the report's public identity is missing: ``missing_record_id``,
  ``missing_key`` (aggregation), ``missing_batch_id`` (a ``batch_id`` column with an empty
  value). Keys and batches reach the helpers in the clear and the helpers' relation fixes them
  (:mod:`transforms.lark.params`), so removing such a record is a function of public facts; a
  record without an id could not be checked for duplicates.
* **Neutralised** -- what the relation protects is broken: ``value_missing``,
  ``value_not_a_number``, ``value_not_finite`` (aggregation); ``feature_missing``,
  ``feature_not_a_number``, ``feature_not_a_byte`` (not an integer 0..255), ``label_missing``,
  ``label_not_a_number``, ``label_outside_domain``, ``fake_not_boolean`` (gradients). The
  record is NOT dropped: its report is still sent, so the number of reports per key and batch
  -- which the helpers see, which k-anonymity compares with k, and which the relation holds
  fixed ("replace one report's values") -- does not depend on one record's content; dropping it
  would let one record's bad value move a key from released to suppressed. Instead its content
  is replaced, which the relation covers: an aggregation record shares the default value
  ``clip(0, lower, upper)`` in every value column (nothing, when 0 is in the declared range); a
  gradient record becomes *strictly fake* (both masks share 0: it adds nothing to any
  gradient, and no H - 1 helpers can tell) with features 0 and label 0. Its randomness is keyed
  by that replaced content (a gradient record's stream marks it neutralised -- label -1 in its
  stream's identity, never a label a real record has -- so it never shares a stream with a
  real record), never by the other records of its table.

Values outside [lower, upper] are not faults: they are clipped (above).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

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


#: A number as text (ASCII digits, optional sign, fraction and exponent, surrounding spaces).
_NUMBER = r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$"
_TRUE, _FALSE = ("true", "1"), ("false", "0")


def _batch_ids(records: pa.Table, batch_id: Optional[str]) -> pa.Array:
    if _present(records, "batch_id"):
        column = records.column("batch_id").combine_chunks().cast(pa.string())
        if column.null_count:
            raise LarkInputError("batch_id must not be missing")
        return column
    if batch_id is None:
        raise LarkInputError("records have no batch_id column: pass batch_id=")
    return pa.array([str(batch_id)] * records.num_rows, pa.string())


def _helper_column(h: int, n: int) -> pa.Array:
    return pa.array(np.full(n, h, dtype=np.int32))


def _present(records: pa.Table, name: str) -> bool:
    """``name`` is a column with values (Arrow's null type: an optional column a file lacks)."""
    return name in records.column_names and not pa.types.is_null(records.column(name).type)


def _text(column) -> bool:
    return pa.types.is_string(column.type) or pa.types.is_large_string(column.type)


def _column(records: pa.Table, name: str) -> pa.Array:
    column = records.column(name).combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


def _numbers(records: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 values, missing, not a number) of column ``name``, per record. Numbers as they
    are; text parsed per value (an empty value is missing); a type without numbers raises."""
    column = _column(records, name)
    n = len(column)
    if pa.types.is_null(column.type):
        return np.zeros(n), np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
    if _text(column):
        missing = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(column), ""), True)
        parses = pc.fill_null(pc.match_substring_regex(column, _NUMBER), False)
        kept = pc.if_else(parses, pc.utf8_trim_whitespace(column), pa.scalar(None, pa.string()))
        numbers = pc.fill_null(pc.cast(kept, pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        missing = missing.to_numpy(zero_copy_only=False)
        return numbers, missing, ~missing & ~parses.to_numpy(zero_copy_only=False)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
            or pa.types.is_decimal(column.type)):
        raise LarkInputError(f"column {name!r} has type {column.type}: it holds no numbers")
    missing = column.is_null().to_numpy(zero_copy_only=False)
    numbers = pc.fill_null(pc.cast(column, pa.float64()), 0.0).to_numpy(zero_copy_only=False)
    return numbers.astype(np.float64), missing, np.zeros(n, dtype=bool)


def _booleans(records: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, faulty) of a true/false column: boolean, integer 0/1, or text true/false/1/0
    (any case, surrounding spaces); missing or anything else is faulty."""
    column = _column(records, name)
    if pa.types.is_boolean(column.type):
        faulty = column.is_null().to_numpy(zero_copy_only=False)
        return pc.fill_null(column, False).to_numpy(zero_copy_only=False).astype(bool), faulty
    if pa.types.is_integer(column.type):
        values = pc.fill_null(column, -1).to_numpy(zero_copy_only=False)
        return values == 1, (values != 0) & (values != 1)
    if _text(column):
        text = pc.ascii_lower(pc.utf8_trim_whitespace(column))
        true = pc.fill_null(pc.is_in(text, pa.array(_TRUE)), False).to_numpy(zero_copy_only=False)
        false = pc.fill_null(pc.is_in(text, pa.array(_FALSE)), False).to_numpy(zero_copy_only=False)
        return true, ~(true | false)
    raise LarkInputError(f"column {name!r} has type {column.type}: fake must be true/false")


@dataclass(frozen=True, kw_only=True)
class CheckedRecords:
    """What a browser can share of a table of records (see "Faults" in the module docstring).

    ``kept``: the input's rows with a public identity, in input order (``rows``: their
    indices in the input); ``values``: per kept row, float64 numbers -- the value columns
    (aggregation) or the features then the label (gradients) -- with the neutralised rows'
    replaced; ``neutralised``: the kept rows whose content was faulty; ``fake``: gradients only,
    the ``fake`` column as booleans (None when the records have none); ``faults``: reason ->
    records removed or neutralised for it (each record counted once)."""

    kept: pa.Table
    rows: np.ndarray
    values: np.ndarray
    neutralised: np.ndarray
    fake: Optional[np.ndarray] = None
    faults: Mapping[str, int] = field(default_factory=dict)


class _Faults:
    """One reason per record: the first one found, in the order of the module docstring."""

    def __init__(self, n: int):
        self.reason = np.full(n, -1, dtype=np.int64)
        self.names: list[str] = []

    def add(self, name: str, faulty: np.ndarray) -> None:
        new = np.asarray(faulty, dtype=bool) & (self.reason < 0)
        self.reason[new] = len(self.names)
        self.names.append(name)

    def counts(self) -> dict[str, int]:
        counts = np.bincount(self.reason[self.reason >= 0], minlength=len(self.names))
        return {name: int(c) for name, c in zip(self.names, counts) if c}


def _identity(records: pa.Table, faults: _Faults, key: bool) -> None:
    faults.add("missing_record_id", records.column("record_id").is_null().to_numpy(
        zero_copy_only=False))
    if key:
        faults.add("missing_key", records.column("key").is_null().to_numpy(zero_copy_only=False))
    if _present(records, "batch_id"):
        faults.add("missing_batch_id", records.column("batch_id").is_null().to_numpy(
            zero_copy_only=False))


def _checked(records: pa.Table, faults: _Faults, identity_reasons: int, values: np.ndarray,
             default: np.ndarray, fake: Optional[np.ndarray]) -> CheckedRecords:
    removed = (faults.reason >= 0) & (faults.reason < identity_reasons)
    neutralised = faults.reason >= identity_reasons
    values = np.where(neutralised[:, None], default[None, :], values)
    rows = np.nonzero(~removed)[0]
    kept = records if rows.size == records.num_rows else records.take(pa.array(rows))
    return CheckedRecords(kept=kept, rows=rows, values=values[rows], neutralised=neutralised[rows],
                          fake=None if fake is None else fake[rows], faults=faults.counts())


def check_aggregation_records(records: pa.Table, params: AggregationParams) -> CheckedRecords:
    """The aggregation records a browser can share, faulty ones removed or neutralised (the
    default ``clip(0, lower, upper)`` in every value column) and counted: module docstring."""
    require_columns(records, ["record_id", "key", *params.value_columns], "aggregation records")
    n = records.num_rows
    faults = _Faults(n)
    _identity(records, faults, key=True)
    identity = len(faults.names)
    values = np.empty((n, len(params.value_columns)), dtype=np.float64)
    missing, unparseable = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for j, name in enumerate(params.value_columns):
        values[:, j], m, u = _numbers(records, name)
        missing |= m
        unparseable |= u
    faults.add("value_missing", missing)
    faults.add("value_not_a_number", unparseable)
    faults.add("value_not_finite", ~np.all(np.isfinite(values), axis=1))
    default = np.full(len(params.value_columns),
                      min(max(0.0, float(params.lower)), float(params.upper)))
    return _checked(records, faults, identity, values, default, None)


def check_gradient_records(records: pa.Table, *, num_features: int,
                           num_labels: int = 2) -> CheckedRecords:
    """The gradient records a browser can share, faulty ones removed or neutralised (strictly
    fake, features 0, label 0) and counted: module docstring. ``values`` holds the features
    then the label."""
    xcols = feature_columns(num_features)
    require_columns(records, ["record_id", "label", *xcols], "gradient records")
    n = records.num_rows
    faults = _Faults(n)
    _identity(records, faults, key=False)
    identity = len(faults.names)
    values = np.empty((n, num_features + 1), dtype=np.float64)
    missing, unparseable = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for j, name in enumerate(xcols):
        values[:, j], m, u = _numbers(records, name)
        missing |= m
        unparseable |= u
    features = values[:, :num_features]
    with np.errstate(invalid="ignore"):
        byte = np.isfinite(features) & (features == np.floor(features)) & (features >= 0) & \
            (features <= 255)
    faults.add("feature_missing", missing)
    faults.add("feature_not_a_number", unparseable)
    faults.add("feature_not_a_byte", ~np.all(byte, axis=1))
    values[:, num_features], m, u = _numbers(records, "label")
    label = values[:, num_features]
    with np.errstate(invalid="ignore"):
        in_domain = np.isfinite(label) & (label == np.floor(label)) & (label >= 0) & \
            (label < num_labels)
    faults.add("label_missing", m)
    faults.add("label_not_a_number", u)
    faults.add("label_outside_domain", ~in_domain)
    fake = None
    if _present(records, "fake"):
        fake, faulty = _booleans(records, "fake")
        faults.add("fake_not_boolean", faulty)
    out = _checked(records, faults, identity, values, np.zeros(num_features + 1), fake)
    if out.fake is not None:
        out = CheckedRecords(kept=out.kept, rows=out.rows, values=out.values,
                             neutralised=out.neutralised, fake=out.fake | out.neutralised,
                             faults=out.faults)
    return out


def aggregation_reports(records: pa.Table, params: AggregationParams, *,
                        randomness: Optional[RandomSource] = None,
                        batch_id: Optional[str] = None) -> list[pa.Table]:
    """One report table per helper (Algorithm 1) for every record a browser can share (faulty
    records removed or neutralised: :func:`check_aggregation_records`)."""
    randomness = randomness or SystemRandomness()
    checked = check_aggregation_records(records, params)
    records = checked.kept
    n = records.num_rows
    ring = params.codec.encode(np.clip(checked.values, params.lower, params.upper))
    keys = records.column("key").combine_chunks().cast(pa.string())
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
                     batch_id: Optional[str] = None,
                     faulty: Optional[np.ndarray] = None) -> list[pa.Table]:
    """One report table per helper for masked gradient computation (Section 4), for every record
    a browser can share (faulty records removed or neutralised: :func:`check_gradient_records`).
    ``faulty``: booleans per record of ``records``, records the caller found faulty: they are
    shared neutralised too."""
    randomness = randomness or SystemRandomness()
    num_helpers = check_num_helpers(num_helpers)
    xcols = feature_columns(num_features)
    checked = check_gradient_records(records, num_features=num_features, num_labels=num_labels)
    records = checked.kept
    neutral = checked.neutralised
    if faulty is not None:
        neutral = neutral | np.asarray(faulty, dtype=bool)[checked.rows]
    values = np.where(neutral[:, None], 0.0, checked.values)
    n = records.num_rows
    features = check_byte_features(values[:, :num_features])
    labels = check_labels(values[:, num_features].astype(np.int64), num_labels)
    # A neutralised record's stream is marked by label -1 (no real record has it): module
    # docstring.
    lane_columns = {"record_id": records.column("record_id"),
                    **{c: pa.array(features[:, j]) for j, c in enumerate(xcols)},
                    "label": pa.array(np.where(neutral, -1, labels))}
    fake = None
    if checked.fake is not None:
        fake = checked.fake | neutral
        lane_columns["fake"] = pa.array(fake)
    elif neutral.any():
        fake = neutral
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
