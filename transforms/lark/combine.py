"""The ad server's combine step: add the helpers' noisy partial sums and decode (pure pyarrow).

The ad server receives one output per helper and batch. It refuses, with a message naming the
batch and the helpers, anything that would decode to garbage rather than a noisy aggregate:

* a helper's output is missing for a batch (or a key of it), or batch ids do not match between
  helpers;
* the helpers summed different reports for the same batch id (their batch digests differ: shares
  from different batches, or a report dropped by one helper only);
* an output was made under other public parameters or another model (``params_digest``), or
  claims another number of helpers;
* a helper's output for a batch is given twice.

Then sum_h Psi~^h = sum_i v_i + sum_h eta^h (mod 2^64), decoded from fixed point. Combining is
post-processing of the helpers' releases: it spends no privacy budget.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.lark.params import AggregationParams, GradientParams
from transforms.lark.reports import (LarkInputError, aggregation_output_schema,
                                     gradient_output_schema, require_columns, share_column,
                                     uint64_column)
from transforms.lark.ring import FixedPoint


def _concat(tables, schema: pa.Schema, what: str) -> pa.Table:
    tables = [t for t in tables if t is not None]
    if not tables:
        raise LarkInputError(f"no helper outputs to combine ({what})")
    cast = []
    for t in tables:
        require_columns(t, schema.names, f"helper outputs ({what})")
        columns = {}
        for field in schema:
            col = t.column(field.name)
            if field.type == pa.uint64():
                values, ok = uint64_column(col)
                if not ok.all():
                    raise LarkInputError(f"helper outputs ({what}): column {field.name!r} holds "
                                         "values that are not ring elements")
                columns[field.name] = pa.array(values)
            else:
                if col.null_count:
                    raise LarkInputError(f"helper outputs ({what}): column {field.name!r} has "
                                         "missing values")
                columns[field.name] = col.cast(field.type)
        cast.append(pa.table(columns, schema=schema))
    return pa.concat_tables(cast).combine_chunks()


def check_batches(entries, num_helpers: int) -> None:
    """Refuse unless every batch has an output of every helper, all with one batch digest.

    ``entries``: distinct (batch_id, helper, batch_digest) triples of all outputs given."""
    by_helper: dict[int, set] = {h: set() for h in range(num_helpers)}
    digests: dict[str, set] = {}
    for batch, helper, digest in entries:
        if not 0 <= int(helper) < num_helpers:
            raise LarkInputError(f"batch {batch!r}: helper index {helper} outside "
                                 f"0..{num_helpers - 1}")
        by_helper[int(helper)].add(batch)
        digests.setdefault(batch, set()).add(digest)
    silent = [h for h in range(num_helpers) if not by_helper[h]]
    if silent and len(silent) < num_helpers:
        raise LarkInputError(f"no output from helper(s) {silent}: every helper's share is needed "
                             "to decode (give each helper's released files)")
    for batch in sorted(digests):
        missing = [h for h in range(num_helpers) if batch not in by_helper[h]]
        if missing:
            raise LarkInputError(
                f"batch {batch!r}: output of helper(s) {missing} is missing; the helpers' batch "
                f"ids do not match (" + "; ".join(f"helper {h}: {sorted(by_helper[h])[:5]}"
                                                  for h in range(num_helpers))
                + "): every helper's share of a batch is needed to decode")
        if len(digests[batch]) != 1:
            raise LarkInputError(f"batch {batch!r}: the helpers summed different sets of reports "
                                 "(batch digests differ): shares from different batches cannot "
                                 "be combined")


def _check_consistency(table: pa.Table, key_column: str, num_helpers: int,
                       expected_digest: str) -> None:
    digests = set(table.column("params_digest").to_pylist())
    if digests != {expected_digest}:
        raise LarkInputError("helper outputs were made under other public parameters (or another "
                             "model) than the ones given to the combine step: refusing to combine")
    claimed = set(table.column("num_helpers").to_pylist())
    if claimed != {num_helpers}:
        raise LarkInputError(f"helper outputs claim {sorted(claimed)} helpers; the parameters "
                             f"declare {num_helpers}")
    helpers = np.asarray(table.column("helper").to_numpy())
    if helpers.size and (helpers.min() < 0 or helpers.max() >= num_helpers):
        raise LarkInputError(f"helper index outside 0..{num_helpers - 1}")
    batches = np.asarray(table.column("batch_id").to_pylist(), dtype=object)
    digests_col = np.asarray(table.column("batch_digest").to_pylist(), dtype=object)
    keys = np.asarray(table.column(key_column).to_pylist(), dtype=object)
    check_batches(set(zip(batches.tolist(), helpers.tolist(), digests_col.tolist())), num_helpers)
    for batch in sorted(set(batches.tolist())):
        rows = batches == batch
        key_sets = []
        for h in range(num_helpers):
            hk = keys[rows & (helpers == h)].tolist()
            if len(hk) != len(set(hk)):
                raise LarkInputError(f"batch {batch!r}: helper {h}'s output is given more than "
                                     "once")
            key_sets.append(set(hk))
        if any(s != key_sets[0] for s in key_sets[1:]):
            raise LarkInputError(f"batch {batch!r}: the helpers released different keys; their "
                                 "outputs cannot be combined")


def _ring_sums(table: pa.Table, group_columns: Sequence[str], value_columns: Sequence[str]):
    # numpy sort by the group columns, then wrap-around sums (Arrow's sum kernels are not
    # documented to wrap; numpy uint64 addition does by definition).
    order_table = table.sort_by([(c, "ascending") for c in group_columns])
    groups = [np.asarray(order_table.column(c).to_pylist(), dtype=object) for c in group_columns]
    n = order_table.num_rows
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
        for g in groups:
            change[1:] |= g[1:] != g[:-1]
    starts = np.flatnonzero(change)
    sums = {c: np.add.reduceat(order_table.column(c).to_numpy(), starts, dtype=np.uint64)
            if n else np.zeros(0, np.uint64) for c in value_columns}
    return [g[starts] for g in groups], sums


def combine_aggregation(tables: Sequence[pa.Table], params: AggregationParams) -> pa.Table:
    """Decoded noisy sums per (batch_id, key) from every helper's output, sorted by both."""
    table = _concat(tables, aggregation_output_schema(params.value_columns), "aggregation")
    _check_consistency(table, "key", params.num_helpers, params.digest())
    share_cols = [share_column(c) for c in params.value_columns]
    (batches, keys), sums = _ring_sums(table, ["batch_id", "key"], share_cols)
    codec = FixedPoint(fraction_bits=params.fraction_bits)
    columns = {"batch_id": pa.array(batches.tolist(), pa.string()),
               "key": pa.array(keys.tolist(), pa.string())}
    for col, share_col in zip(params.value_columns, share_cols):
        if params.fraction_bits == 0:
            columns[col] = pa.array(codec.decode_units(sums[share_col]))
        else:
            columns[col] = pa.array(codec.decode(sums[share_col]))
    return pa.table(columns)


def combine_gradients(tables: Sequence[pa.Table], params: GradientParams,
                      expected_digest: str) -> pa.Table:
    """Decoded noisy gradient sums per (batch_id, coordinate); ``expected_digest`` is
    :func:`transforms.lark.helper.gradient_params_digest` of the parameters and model sent."""
    table = _concat(tables, gradient_output_schema(), "gradients")
    _check_consistency(table, "coordinate", params.num_helpers, expected_digest)
    (batches, coords), sums = _ring_sums(table, ["batch_id", "coordinate"], ["share"])
    codec = FixedPoint(fraction_bits=params.fraction_bits)
    return pa.table({"batch_id": pa.array(batches.tolist(), pa.string()),
                     "coordinate": pa.array(coords.astype(np.int32)),
                     "gradient": pa.array(codec.decode(sums["share"]))})


def gradient_vector(combined: pa.Table, batch_id: str, dimension: int) -> np.ndarray:
    """One batch's decoded gradient sum as a vector (coordinates 0..dimension-1)."""
    rows = combined.filter(pc.equal(combined.column("batch_id"), batch_id))
    coords = rows.column("coordinate").to_numpy()
    if sorted(coords.tolist()) != list(range(dimension)):
        raise LarkInputError(f"batch {batch_id!r}: expected {dimension} gradient coordinates")
    out = np.empty(dimension)
    out[coords] = rows.column("gradient").to_numpy()
    return out
