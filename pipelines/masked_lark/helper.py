"""One Masked LARk helper's release: its stream of reports in, noisy ring sums of one batch out.

    python -m pipelines.masked_lark.helper --helper 0 --batch_id b1 \\
        --input reports_helper_0.parquet \\
        --params pipelines/sample_data/masked_lark/aggregation_params.json \\
        --output out/helper0 --ledger helper0/ledger.json --key_store helper0/keys

Each helper is its own run, with its own ledger, key store and output (non-colluding parties
share nothing): nothing in this run reads another helper's reports, and reports addressed to
another helper are refused. Input: this helper's reports (the wire format of
transforms/lark/reports.py, as ``pipelines.masked_lark.share`` writes them; Parquet or CSV).
Reports of other batches than ``--batch_id`` are skipped (counted for the operator).

  aggregation (``--params`` kind aggregation; Algorithm 2 of Masked LARk, seed 004): per key
      with more than k reports, the helper's ring sum of shares plus discrete Laplace noise of
      scale d (U - L) / epsilon (in units of 2^-f); keys with at most k reports are suppressed.
  gradient (kind gradient, ``--model``; Algorithm 3): when the batch has more than k reports,
      the helper's masked, clipped (L1 norm psi) gradient sum plus discrete Laplace noise of
      scale 2 psi / epsilon per coordinate.

Output: release ``masked_lark_helper/<batch_id>/helper-<h>`` with ``helper_<h>.parquet``:
batch_id, batch_digest (hash of the batch's report ids, which the ad server knows),
params_digest, helper, num_helpers and the noisy ring elements, sorted by (batch_id, key) or
(batch_id, coordinate). Alone, a helper's output is uniform (its sums are of uniform shares).

Privacy (see transforms/lark/__init__.py for the full argument): each helper adds the *full*
noise with a key of its own reserved in its ledger (key name ``helper-<h>``), so the sum the ad
server decodes is epsilon-DP even if every other helper colludes with it. Neighbouring: replace
one report's values (aggregation) or features and labels (gradients) -- the batch's reports,
keys and counts are fixed; k-anonymity is per report and costs nothing under that relation.
A batch's report set (with the model, for gradients) is released once per helper ledger under
any batch id; duplicate report ids and overflowing batches are refused.
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.budget import PrivacyBudget
from accounting.ledger import Scope
from accounting.measures import Measure
from pipelines.masked_lark.config import LarkPrepared, params_to_json, prepare_lark
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, ReleaseOptions,
                               ReleaseRefused, cli)
from pipelines.release import run as run_release
from transforms.counting import Counted, Counters, CountingDoFn
from transforms.lark.beam import NAMESPACE, HelperAggregate, HelperGradient
from transforms.lark.params import MECHANISM, AggregationParams
from transforms.lark.reports import (aggregation_output_schema, aggregation_report_columns,
                                     gradient_output_schema, gradient_report_columns, hex_to_ids,
                                     int_column)

#: Why a helper's ring sums have no error columns (its output's errors statement).
SHARE_ERROR = ("no error columns: a helper's ring sum is uniformly random on its own and is no "
               "estimate of anything; the ad server's combine (masked_lark_combine) decodes the "
               "helpers' sums and releases each decoded value with its error columns")
NAME = "masked_lark_helper"


def output_name(helper: int) -> str:
    return f"helper_{helper}.parquet"


def key_name(helper: int) -> str:
    return f"helper-{helper}"


@dataclass(frozen=True, kw_only=True)
class HelperRequest:
    """One helper's release of one batch (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "this helper's reports: paths, globs or folders, "
                                           "comma-separated (local or gs://)"})
    params: str = field(metadata={"help": "the public parameters JSON (see "
                                          "pipelines/masked_lark/config.py)"})
    helper: int = field(metadata={"help": "this helper's index h (0 <= h < num_helpers)"})
    batch_id: str = field(metadata={"help": "the batch to release (release id "
                                            "masked_lark_helper/BATCH_ID/helper-H)"})
    model: Optional[str] = field(default=None, metadata={
        "help": "gradients: the model JSON the ad server sent for this batch"})
    input_format: Optional[str] = field(default=None, metadata={
        "choices": ["csv", "parquet"], "help": "default: from the file names"})
    budget_scope: Optional[str] = field(default=None, metadata={
        "help": "ledger scope charged (default masked-lark-batch:BATCH_ID/helper-H; give one "
                "scope per report set to track reports reused over training epochs)"})
    budget_epsilon: Optional[float] = field(default=None, metadata={
        "help": "the scope's total epsilon (default: the release's epsilon)"})
    options: ReleaseOptions = field(metadata={"cli": False})


class _ThisBatch(CountingDoFn):
    """Report tables -> the rows of this batch; rows of other batches skipped and counted."""

    def __init__(self, batch_id: str):
        self._batch_id = batch_id
        self._counters = Counters(NAMESPACE)

    def process(self, table: pa.Table):
        mine = pc.fill_null(pc.equal(table.column("batch_id").cast(pa.string()), self._batch_id),
                            False)
        other = table.num_rows - pc.sum(mine.cast(pa.int64())).as_py() if table.num_rows else 0
        self._counters.inc("reports_skipped_other_batch", other)
        kept = table.filter(mine)
        if kept.num_rows:
            yield kept


class HelperJob(Job):
    name = NAME
    request_type = HelperRequest
    description = __doc__.split("\n\n")[0]
    counter_namespaces = (NAMESPACE,)

    def prepare(self, request) -> LarkPrepared:
        prepared = prepare_lark(request, run_id=request.batch_id, flag="--batch_id")
        params = prepared.params
        if isinstance(request.helper, bool) or not isinstance(request.helper, int) or \
                not 0 <= request.helper < params.num_helpers:
            raise ReleaseRefused(f"--helper must be in [0, {params.num_helpers}) "
                                 f"(num_helpers of --params)")
        if request.budget_scope is not None and not request.budget_scope.strip():
            raise ReleaseRefused("--budget_scope must not be empty")
        if request.budget_epsilon is not None and params.epsilon is not None and \
                not request.budget_epsilon >= params.epsilon:
            raise ReleaseRefused(f"--budget_epsilon must be at least the release's epsilon "
                                 f"({params.epsilon:g})")
        return prepared

    def inputs(self, prepared: LarkPrepared):
        request, params = prepared.request, prepared.params
        if isinstance(params, AggregationParams):
            names = aggregation_report_columns(params.value_columns)
        else:
            names = gradient_report_columns(params.num_features)
        # Ring elements are uint64 (Parquet) or decimal text (CSV): typed by the parser.
        columns = {c: "any" for c in names}
        return [InputSpec(name="reports", paths=request.input, format=request.input_format,
                          columns=columns, flag="--input")]

    def _measures(self, request, params):
        if params.epsilon is None:
            return []
        kind = "aggregation" if isinstance(params, AggregationParams) else "gradient"
        return [Measure.of_noise(f"helper-{request.helper}/{kind}", params.noise_spec(),
                                 params.sensitivities(), neighbouring=params.relation,
                                 description=f"{MECHANISM}; noise in fixed-point units "
                                             f"of 2^-{params.fraction_bits}; per released "
                                             f"{'key' if kind == 'aggregation' else 'batch'}: "
                                             f"{params.dimension} coordinate(s)")]

    def plan(self, prepared: LarkPrepared):
        request, params, model = prepared.request, prepared.params, prepared.model
        measures = self._measures(request, params)
        aggregation = isinstance(params, AggregationParams)
        schema = (aggregation_output_schema(params.value_columns) if aggregation
                  else gradient_output_schema())
        scope = (request.budget_scope
                 or f"masked-lark-batch:{request.batch_id}/{key_name(request.helper)}")
        scopes = [Scope(name=scope, budget=PrivacyBudget(
            epsilon=request.budget_epsilon or params.epsilon),
            description="this helper's spend on the batch's reports")] if measures else []
        return [PlannedRelease(
            release_id=f"{NAME}/{request.batch_id}/{key_name(request.helper)}",
            measures=measures, scopes=scopes, key_names=(key_name(request.helper),),
            outputs=[OutputSpec(name=output_name(request.helper),
                                sort_by=["batch_id", "key" if aggregation else "coordinate"],
                                schema=schema, noisy=[c for c in schema.names
                                                      if c.startswith("share")],
                                errors={c: SHARE_ERROR for c in schema.names if c.startswith("share")},
                                description="this helper's noisy ring sums (uniform alone)")],
            config={"params": params_to_json(params), "helper": request.helper,
                    "batch_id": request.batch_id,
                    "model": None if model is None else model.to_json()},
            parameters={"helper": request.helper, "params_digest": params.digest(),
                        "model_digest": None if model is None else model.digest(),
                        "epsilon": params.epsilon, "k": params.k,
                        "noise_scale_per_helper": None if params.epsilon is None else
                        params.noise_spec().scale * 2.0 ** -params.fraction_bits,
                        "num_helpers": params.num_helpers},
            spends_nothing="" if measures else
            "testing only: exact sums (epsilon null), never a release",
            guarantee_covers="the batch: every released key's (or coordinate's) noisy sum; "
                             "epsilon-DP for the decoded sum with this helper honest")]

    def content_key(self, prepared: LarkPrepared, planned, inputs):
        """The batch's report-id set at this helper (and the model, for gradients): released
        once per ledger under any batch id. Read before any charge, refusing duplicate report
        ids and reports addressed to another helper (messages name the file, never content)."""
        request, params = prepared.request, prepared.params
        ids = _scan_reports(inputs["reports"], request.batch_id, request.helper)
        model = prepared.model.digest() if request.model else ""
        if len(ids) == 0:
            raise ReleaseRefused(f"--input has no reports of batch {request.batch_id!r}; "
                                 "nothing was charged")
        words = _sorted_id_words(ids)
        if bool(np.any(words[1:] == words[:-1])) and _has_duplicate(ids):
            raise ReleaseRefused(f"--input: batch {request.batch_id!r} holds a report id twice "
                                 "(a replayed report); nothing was charged")
        if not params.batch_fits(len(ids)):
            raise ReleaseRefused(f"--input: batch {request.batch_id!r} has {len(ids)} reports, "
                                 "more than the ring holds with these bounds and noise; split it "
                                 "(nothing was charged)")
        if not isinstance(params, AggregationParams) and len(ids) <= params.k:
            raise ReleaseRefused(f"--input: batch {request.batch_id!r} has {len(ids)} reports, "
                                 f"at most k = {params.k}: nothing would be released (nothing "
                                 "was charged)")
        digest = hashlib.sha256(words.tobytes() + model.encode()).hexdigest()
        return f"masked-lark-reports:helper-{request.helper}:{digest}"

    def build(self, pipeline, prepared: LarkPrepared, inputs, release):
        request, params = prepared.request, prepared.params
        key = release.keys[key_name(request.helper)]
        if params.epsilon is None:
            key = None
        if isinstance(params, AggregationParams):
            transform = HelperAggregate(params, helper=request.helper, release_key=key)
        else:
            transform = HelperGradient(params, prepared.model,
                                       helper=request.helper, release_key=key)
        table = (inputs["reports"]
                 | release.label("ThisBatch") >> Counted(_ThisBatch(request.batch_id))
                 | release.label("Helper") >> transform)
        return {output_name(request.helper): table}

    def dropped_rows(self, prepared, counters: Mapping[str, int]) -> Mapping[str, dict]:
        """Reports of the batch are eligible; malformed ones are dropped (a dropped report
        makes this helper's batch digest differ, so the ad server refuses to combine)."""
        read = counters.get(f"{NAMESPACE}.reports_read", 0)
        dropped = counters.get(f"{NAMESPACE}.reports_malformed", 0)
        reasons = {k: v for k, v in counters.items()
                   if k.startswith(f"{NAMESPACE}.reports_dropped_") and v}
        return {"reports": {"eligible": read, "dropped": dropped,
                            "share": dropped / read if read else 0.0, "reasons": reasons}}


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _sorted_id_words(ids: np.ndarray) -> np.ndarray:
    """One 64-bit word per report id (n, 2) -- high ^ (low * an odd constant), a bijection of
    the low word mixed into the high -- sorted: the order-independent identity of the report
    set (equal sets give equal words; distinct ids collide with probability ~n^2 / 2^65)."""
    with np.errstate(over="ignore"):
        words = ids[:, 0] ^ (ids[:, 1] * _MIX)
    return np.sort(words)


def _has_duplicate(ids: np.ndarray) -> bool:
    """Exact check (run only when two mixed words tie)."""
    ordered = ids[np.lexsort((ids[:, 1], ids[:, 0]))]
    return bool(np.any(np.all(ordered[1:] == ordered[:-1], axis=1)))


def _scan_reports(resolved, batch_id: str, helper: int) -> np.ndarray:
    """Report ids (n, 2) uint64 of ``batch_id`` in every file of the input."""
    from pipelines.release.inputs import open_input

    found = []
    for path in resolved.files:
        try:
            for table in _id_tables(path, resolved, open_input):
                mine = np.asarray(pc.fill_null(pc.equal(
                    table.column("batch_id").cast(pa.string()), batch_id), False))
                if not mine.any():
                    continue
                table = table.filter(pa.array(mine))
                helpers, ok = int_column(table.column("helper"), 0, 1 << 20)
                if np.any(ok & (helpers != helper)):
                    raise ReleaseRefused(f"--input {path}: reports addressed to another helper "
                                         f"(this is helper {helper}); nothing was charged")
                ids, ok = hex_to_ids(table.column("report_id"))
                found.append(ids[ok])
        except (pa.ArrowException, UnicodeDecodeError, OSError, EOFError) as err:
            raise ReleaseRefused(f"--input {path} could not be read ({type(err).__name__}); "
                                 "nothing was charged")
    return np.concatenate(found) if found else np.zeros((0, 2), dtype=np.uint64)


def _id_tables(path, resolved, open_input):
    columns = ["batch_id", "report_id", "helper"]
    if resolved.formats[path] == "parquet":
        from transforms import parquet_files

        with open_input(path) as handle:
            for batch in parquet_files.open_file(handle).iter_batches(
                    batch_size=1 << 18, columns=columns, use_threads=False):
                yield pa.Table.from_batches([batch])
        return
    from pyarrow import csv as pacsv

    with open_input(path, resolved.compression[path]) as handle:
        reader = pacsv.open_csv(handle, read_options=pacsv.ReadOptions(use_threads=False),
                                convert_options=pacsv.ConvertOptions(
                                    include_columns=columns,
                                    column_types={c: pa.string() for c in columns}))
        for batch in reader:
            yield pa.Table.from_batches([batch])


JOB = HelperJob()


def run(request: HelperRequest):
    """Release one helper's sums of one batch (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
