"""The Masked LARk ad server's combine: each helper's release of a batch in, decoded noisy sums.

    python -m pipelines.masked_lark.combine --batch_id b1 \\
        --helper_outputs out/h0/.../helper_0.parquet,out/h1/.../helper_1.parquet \\
        --params pipelines/sample_data/masked_lark/aggregation_params.json \\
        --output out/server --ledger server/ledger.json --key_store server/keys

``--helper_outputs``: one entry per helper, in helper order (a file, glob or folder of that
helper's ``masked_lark_helper`` release). The helpers' ring elements are added mod 2^64 and
decoded from fixed point (transforms/lark/combine.py). Before anything is recorded the outputs
are read and refused, naming the batch and helpers, when a helper's output is missing, batch ids
or batch digests differ between helpers (shares of different report sets), an output was made
under other parameters or another model, or one is given twice.

Output: release ``masked_lark_combine/<batch_id>``:
  aggregation  ``aggregates.csv``: batch_id, key, one decoded column per value column, sorted
               by key (only the keys the helpers released: more than k reports)
  gradient     ``gradient.csv``: batch_id, coordinate, the decoded noisy gradient sum (the
               model's weights, then its bias), sorted by coordinate

Each decoded value ``<v>`` is followed by its error columns ``<v>_ci95_low``, ``<v>_ci95_high``
and ``<v>_std`` (:mod:`transforms.error_columns`): the noise of every helper's stated discrete
Laplace measure summed (:func:`noise_error`; an interval by a union bound), public.

Privacy: combining is post-processing of the helpers' releases -- it spends nothing (its
guarantee is compose([]) = (0, 0)); the decoded sums are epsilon-DP by each helper's full noise
(with one honest helper). What the ad server learns is exactly the sum of the true values and
every helper's noise (see transforms/lark/__init__.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.masked_lark.config import LarkPrepared, params_to_json, prepare_lark
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, ReleaseOptions,
                               ReleaseRefused, cli)
from pipelines.release import run as run_release
from transforms import error_columns
from transforms.lark import combine
from transforms.lark.beam import CombineHelperOutputs
from transforms.lark.helper import gradient_params_digest
from transforms.lark.params import AggregationParams
from transforms.lark.reports import (AGGREGATION_OUTPUT_FIXED, GRADIENT_OUTPUT_COLUMNS,
                                     LarkInputError, share_column)

NAME = "masked_lark_combine"
AGGREGATES = "aggregates.csv"
GRADIENT = "gradient.csv"


def _values(params) -> tuple:
    return tuple(params.value_columns) if isinstance(params, AggregationParams) else ("gradient",)


def noise_error(params):
    """The error of a decoded sum: every helper's discrete Laplace noise (each the full scale,
    independent), in fixed-point units of 2^-f; None without noise (tests)."""
    spec = params.noise_spec()
    if spec is None:
        return None
    return error_columns.combination(spec, [2.0 ** -params.fraction_bits] * params.num_helpers)


def output_spec(params) -> OutputSpec:
    """The released table: each decoded value followed by its error columns."""
    error = noise_error(params)
    values = _values(params)
    head = ([("batch_id", pa.string()), ("key", pa.string())]
            if isinstance(params, AggregationParams) else
            [("batch_id", pa.string()), ("coordinate", pa.int32())])
    schema = pa.schema(head + [column for c in values for column in
                               [(c, pa.float64())] + [(n, pa.float64()) for n in error_columns.names(c)]])
    errors = {c: "no noise (epsilon unset: a test configuration)" if error is None else error.describe(
        c, f"the sum of the {params.num_helpers} helpers' discrete Laplace noise (each the full "
           "scale of the stated measure, independent; a union bound of their 97.5% intervals), "
           "assuming every helper added its noise (with fewer honest helpers the guarantee holds "
           "and the error is smaller)") for c in values}
    if isinstance(params, AggregationParams):
        return OutputSpec(name=AGGREGATES, sort_by=["batch_id", "key"], schema=schema,
                          noisy=list(values), errors=errors,
                          description="decoded noisy sums of the released keys")
    return OutputSpec(name=GRADIENT, sort_by=["batch_id", "coordinate"], schema=schema,
                      noisy=["gradient"], errors=errors,
                      description="decoded noisy masked gradient sum")


def with_errors(table: pa.Table, params) -> pa.Table:
    """A combined table with each value's error columns (public: the stated noise only)."""
    error = noise_error(params)
    std, half = (0.0, 0.0) if error is None else (error.std, error.halfwidth)
    columns = {name: table.column(name) for name in table.column_names}
    for c in _values(params):
        values = table.column(c).to_numpy(zero_copy_only=False).astype("float64")
        for name, array in zip(error_columns.names(c), error_columns.arrays(values, std, half)):
            columns[name] = pa.array(array, pa.float64())
    schema = output_spec(params).schema
    return pa.table({name: columns[name].cast(schema.field(name).type) for name in schema.names},
                    schema=schema)


@dataclass(frozen=True, kw_only=True)
class CombineRequest:
    """The ad server's combine of one batch (the CLI flags are these fields)."""

    helper_outputs: tuple = field(metadata={
        "help": "each helper's released file (or glob/folder), comma-separated, in helper order"})
    params: str = field(metadata={"help": "the public parameters JSON the helpers used"})
    batch_id: str = field(metadata={"help": "the batch to combine (release id "
                                            "masked_lark_combine/BATCH_ID)"})
    model: Optional[str] = field(default=None, metadata={
        "help": "gradients: the model JSON sent to the helpers for this batch"})
    options: ReleaseOptions = field(metadata={"cli": False})


def _input_name(helper: int) -> str:
    return f"helper_{helper}"


def _only_batch(table: pa.Table, batch_id: str):
    kept = table.filter(pc.fill_null(pc.equal(table.column("batch_id").cast(pa.string()),
                                              batch_id), False))
    if kept.num_rows:
        yield kept


class CombineJob(Job):
    name = NAME
    request_type = CombineRequest
    description = __doc__.split("\n\n")[0]

    def prepare(self, request) -> LarkPrepared:
        prepared = prepare_lark(request, run_id=request.batch_id, flag="--batch_id")
        params = prepared.params
        if isinstance(params, AggregationParams):
            clash = {"batch_id", "key"} & set(params.value_columns)
            if clash:
                raise ReleaseRefused(f"--params: value column(s) {sorted(clash)} clash with the "
                                     "output's batch_id/key columns")
        if len(request.helper_outputs) != params.num_helpers:
            raise ReleaseRefused(f"--helper_outputs: {len(request.helper_outputs)} entries, "
                                 f"--params declares {params.num_helpers} helpers (one entry "
                                 "per helper, in helper order)")
        return prepared

    def check(self, prepared: LarkPrepared) -> None:
        """Read the helpers' (small) outputs and combine them before anything is recorded, so
        that mismatched outputs are refused (exit 2), naming batch and helpers."""
        from pipelines.release.inputs import open_input, preflight

        request, params = prepared.request, prepared.params
        tables = []
        for h, spec in enumerate(self.inputs(prepared)):
            resolved = preflight(spec)
            for path in resolved.files:
                try:
                    table = _read(path, resolved, open_input)
                except (pa.ArrowException, UnicodeDecodeError, OSError, EOFError) as err:
                    raise ReleaseRefused(f"--helper_outputs {path} could not be read "
                                         f"({type(err).__name__})")
                helpers = set(pc.unique(table.column("helper").cast(pa.int64())).to_pylist())
                if helpers - {h}:
                    raise ReleaseRefused(f"--helper_outputs {path}: entry {h} must hold helper "
                                         f"{h}'s output (it holds another helper's)")
                tables.extend(_only_batch(table, request.batch_id))
        if not tables:
            raise ReleaseRefused(f"--helper_outputs hold no output of batch {request.batch_id!r} "
                                 "(a batch below k, or another batch id)")
        try:
            if isinstance(params, AggregationParams):
                combine.combine_aggregation(tables, params)
            else:
                combine.combine_gradients(tables, params,
                                          gradient_params_digest(params, prepared.model))
        except LarkInputError as err:
            raise ReleaseRefused(f"--helper_outputs: {err}")

    def inputs(self, prepared: LarkPrepared):
        request, params = prepared.request, prepared.params
        names = (list(AGGREGATION_OUTPUT_FIXED) + [share_column(c) for c in params.value_columns]
                 if isinstance(params, AggregationParams) else list(GRADIENT_OUTPUT_COLUMNS))
        return [InputSpec(name=_input_name(h), paths=(path,), format="parquet",
                          columns={c: "any" for c in names}, flag="--helper_outputs")
                for h, path in enumerate(request.helper_outputs)]

    def plan(self, prepared: LarkPrepared):
        request, params, model = prepared.request, prepared.params, prepared.model
        return [PlannedRelease(
            release_id=f"{NAME}/{request.batch_id}", measures=[], scopes=[],
            outputs=[output_spec(params)],
            config={"params": params_to_json(params), "batch_id": request.batch_id,
                    "model": None if model is None else model.to_json()},
            parameters={"params_digest": params.digest(), "num_helpers": params.num_helpers,
                        "epsilon_per_helper": params.epsilon, "k": params.k,
                        "model_digest": None if model is None else model.digest()},
            spends_nothing="post-processing of the helpers' releases: their sum is decoded; "
                           "each helper's release states and charges its own guarantee")]

    def build(self, pipeline, prepared: LarkPrepared, inputs, release):
        request, params, model = prepared.request, prepared.params, prepared.model
        outputs = ([inputs[_input_name(h)]
                    | release.label(f"Batch{h}") >> beam.FlatMap(_only_batch, request.batch_id)
                    for h in range(params.num_helpers)]
                   | release.label("AllHelpers") >> beam.Flatten())
        combined = (outputs
                    | release.label("Combine") >> CombineHelperOutputs(params, model=model)
                    | release.label("ErrorColumns") >> beam.Map(with_errors, params))
        return {output_spec(params).name: combined}


def _read(path, resolved, open_input) -> pa.Table:
    from transforms import parquet_files

    with open_input(path) as handle:
        return parquet_files.read_table(handle, columns=list(resolved.spec.columns),
                                        use_threads=False)


JOB = CombineJob()


def run(request: CombineRequest):
    """Combine one batch's helper outputs (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
