"""Masked LARk training driver: logistic regression by gradient descent on masked helper gradients.

    python -m pipelines.masked_lark.train --model_id m1 \\
        --input pipelines/sample_data/masked_lark/train.csv \\
        --params pipelines/sample_data/masked_lark/gradient_params.json \\
        --model pipelines/sample_data/masked_lark/model.json --epochs 5 --batch_size 100 \\
        --output out/train --ledger private/ledger.json --key_store private/keys

The whole workflow of Masked LARk (seed 004, Section 4 and Algorithm 3) in one run, for
simulation and evaluation: browsers share each record once (real and fake labels, masks,
blinding; optional local feature noise), then for every step the ad server picks a public
minibatch, each helper computes its noisy masked gradient sum with a key of its own (reserved in
the ledger as ``helper-<h>``; every step derives a fresh sub-key), the server combines and takes
a descent step. In production each step is a ``pipelines.masked_lark.helper`` run per helper
with ``--model`` and a ``pipelines.masked_lark.combine`` run; this driver runs the same
functions in process (the records are held in memory: a training set, not a log).

Input (CSV or Parquet): record_id, x_0..x_{d-1} (bytes 0..255), label (0/1). Rows are put in
record_id order first, so the result does not depend on how the files were read. Each record is
shared once: every copy of a ``record_id`` that appears twice is removed, counted (its copies
would get fresh report ids and count twice in every step that draws them; which records are
shared then depends on their public identities only, never on a value). A record
whose features or label are missing, not numbers or outside their domain is neutralised, never
refused (one record must not decide whether a model is released): it is shared as a strictly
fake record (adding nothing to any gradient; the number of reports, which decides the steps and
k-anonymity, stays public) and counted as ``records.dropped.<reason>``; a record without an id
is removed and counted (transforms/lark/browser.py, "Faults"; pipelines/masked_lark/share.py).
``--model``: the initial model (its feature_scale/feature_offset standardise the features).

Output: release ``masked_lark_train/<model_id>``: ``model.csv`` (coordinate, parameter
w_0..w_{d-1}, bias; the trained values) and ``training.csv`` (per epoch: steps taken and steps
suppressed by k-anonymity -- both public: they depend on the number of records only). In testing
mode with ``--test_input`` also ``comparison.csv``: test accuracy of the same descent trained
centrally on the clear data, centrally with DP noise (a trusted curator: clipping and Laplace
noise with the same epsilon per step), and with masked helpers -- the paper's Figures 3 and 5 as
one row each (``benchmarks/masked_lark.py`` sweeps epsilon and psi). Central clear training is
not DP, so that table is never part of a release.

Privacy: per step each helper adds discrete Laplace noise of scale 2 psi / epsilon (replace one
report's features and labels); the minibatches of an epoch are disjoint, so a report costs
epsilon per epoch: epochs x epsilon in all (basic composition, adaptively chosen models
included), plus d x local_noise_epsilon for its features when local noise is on.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.budget import PrivacyBudget
from accounting.ledger import Scope
from accounting.measures import Measure
from pipelines.masked_lark.config import (LarkPrepared, load_model, params_to_json,
                                          prepare_lark, record_ids_once,
                                          remove_repeated_records)
from pipelines.masked_lark.share import LOCAL_NEIGHBOURING, CountRecordFaults, record_check
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, ReleaseOptions,
                               ReleaseRefused, cli)
from pipelines.release import run as run_release
from transforms.counting import Counted
from transforms.lark.local_dp import LocalFeatureNoise
from transforms.lark.params import MECHANISM, AggregationParams
from transforms.lark.reports import feature_columns

NAME = "masked_lark_train"
MODEL = "model.csv"
TRAINING = "training.csv"
COMPARISON = "comparison.csv"

#: Why the model's parameters have no error columns (the model output's errors statement).
MODEL_ERROR = ("no error columns: the parameters result from training on noisy gradient sums (each "
               "step's noise is stated in its measure), and their error depends on the data "
               "through every later step; no interval follows from the stated noise alone")
MODEL_SCHEMA = pa.schema([("coordinate", pa.int32()), ("parameter", pa.string()),
                          ("value", pa.float64())])
TRAINING_SCHEMA = pa.schema([("epoch", pa.int32()), ("steps", pa.int32()),
                             ("suppressed_steps", pa.int32())])
COMPARISON_SCHEMA = pa.schema([("method", pa.string()), ("epsilon_per_step", pa.float64()),
                               ("clip_norm", pa.float64()), ("test_accuracy", pa.float64())])


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    """One training run (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "training records: paths, globs or folders, "
                                           "comma-separated (local or gs://)"})
    params: str = field(metadata={"help": "gradient parameters JSON (epsilon per step and "
                                          "helper, k, clip_norm psi, ...)"})
    model: str = field(metadata={"help": "the initial model JSON (weights, bias, "
                                         "feature_scale, feature_offset)"})
    model_id: str = field(metadata={"help": "release id masked_lark_train/MODEL_ID"})
    epochs: int = field(default=5, metadata={"help": "passes over the records"})
    batch_size: int = field(default=100, metadata={"help": "records per step (must exceed k)"})
    learning_rate: float = field(default=0.5, metadata={"help": "step size (per record mean)"})
    minibatch_seed: int = field(default=0, metadata={
        "help": "public seed of the ad server's minibatch assignment"})
    local_noise_epsilon: Optional[float] = field(default=None, metadata={
        "help": "local DP epsilon per byte feature (Section 4.2.3)"})
    input_format: Optional[str] = field(default=None, metadata={
        "choices": ["csv", "parquet"], "help": "default: from the file names"})
    test_input: Optional[str] = field(default=None, metadata={
        "help": "testing mode only: held-out records for comparison.csv"})
    options: ReleaseOptions = field(metadata={"cli": False})


def _config(request, params, model):
    from transforms.lark.training import TrainingConfig

    local = (None if request.local_noise_epsilon is None
             else LocalFeatureNoise(epsilon_per_feature=request.local_noise_epsilon))
    return TrainingConfig(epochs=request.epochs, batch_size=request.batch_size,
                          learning_rate=request.learning_rate, clip_norm=params.clip_norm,
                          epsilon=params.epsilon, k=params.k, fraction_bits=params.fraction_bits,
                          num_helpers=params.num_helpers, feature_scale=model.feature_scale,
                          feature_offset=model.feature_offset, local_noise=local,
                          seed=request.minibatch_seed)


def _matrix(table: pa.Table, num_features: int):
    """(features uint8, labels int64, faulty bool) of the records that have an id, in record_id
    order; faulty records (transforms/lark/browser.py, "Faults") have features and label 0 and
    are shared neutralised (strictly fake) by the training."""
    from transforms.lark.browser import check_gradient_records

    ids = pc.cast(table.column("record_id"), pa.string())
    table = table.take(pc.sort_indices(pa.table({"id": ids}), [("id", "ascending")]))
    checked = check_gradient_records(table, num_features=num_features)
    values = checked.values
    return (values[:, :num_features].astype(np.uint8), values[:, -1].astype(np.int64),
            checked.neutralised)


class _Train:
    def __init__(self, config, params, model, keys, testing: bool, test_tables):
        self.config, self.params, self.model = config, params, model
        self.keys, self.testing, self.test_tables = keys, testing, test_tables

    def __call__(self, tables):
        from transforms.lark.randomness import BrowserRandomness
        from transforms.lark.training import train_central, train_central_dp, train_masked

        d = self.params.num_features
        features, labels, faulty = _matrix(_as_text(tables, d), d)
        if len(labels) == 0:
            raise ReleaseRefused("--input holds no records")
        config = self.config
        helper_keys = [self.keys[f"helper-{h}"] for h in range(self.params.num_helpers)]
        # Keyed by the release key (see pipelines.masked_lark.share): re-runs reproduce.
        randomness = BrowserRandomness.keyed(self.keys["release"])
        steps_per_epoch = len(labels) // config.batch_size
        result = train_masked(features, labels, config,
                              helper_keys=None if config.epsilon is None else helper_keys,
                              randomness=randomness, start=self.model, faulty=faulty)
        out = {MODEL: _model_table(result.model),
               TRAINING: pa.table({
                   "epoch": pa.array(np.arange(config.epochs, dtype=np.int32)),
                   "steps": pa.array([steps_per_epoch - s for s in result.suppressed_by_epoch],
                                     pa.int32()),
                   "suppressed_steps": pa.array(result.suppressed_by_epoch, pa.int32())},
                   schema=TRAINING_SCHEMA)}
        if self.test_tables is not None:
            x_test, y_test = self.test_tables
            clear = train_central(features, labels, config, start=self.model,
                                  faulty=faulty).model
            rows = [("central_clear", None, clear),
                    ("masked_helpers", config.epsilon, result.model)]
            if config.epsilon is not None:
                central_dp = train_central_dp(features, labels, config,
                                              release_key=self.keys["release"],
                                              start=self.model, faulty=faulty).model
                rows.insert(1, ("central_dp", config.epsilon, central_dp))
            out[COMPARISON] = pa.table({
                "method": [r[0] for r in rows], "epsilon_per_step": [r[1] for r in rows],
                "clip_norm": [None if r[0] == "central_clear" else config.clip_norm
                              for r in rows],
                "test_accuracy": [r[2].accuracy(x_test, y_test) for r in rows]},
                schema=COMPARISON_SCHEMA)
        return out


def _as_text(tables, num_features: int) -> pa.Table:
    names = ["record_id", *feature_columns(num_features), "label"]
    schema = pa.schema([(c, pa.string()) for c in names])
    parts = [t.select(names).cast(schema) for t in tables if t.num_rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _read_records(spec, num_features: int) -> pa.Table:
    """Every file of an input (preflighted) as text columns, read as the pipeline reads them."""
    from pipelines.release.consumption import read_columns
    from pipelines.release.inputs import preflight

    names = ["record_id", *feature_columns(num_features), "label"]
    return _as_text(list(read_columns(preflight(spec), names)), num_features)


def _model_table(model) -> pa.Table:
    names = [f"w_{j}" for j in range(model.num_features)] + ["bias"]
    return pa.table({"coordinate": pa.array(np.arange(model.dimension, dtype=np.int32)),
                     "parameter": names, "value": pa.array(model.vector())},
                    schema=MODEL_SCHEMA)


@dataclass(frozen=True, kw_only=True)
class TrainPrepared(LarkPrepared):
    """Gradient parameters, the initial model and the training configuration, read once."""

    training: object  # transforms.lark.training.TrainingConfig


class TrainJob(Job):
    name = NAME
    request_type = TrainRequest
    description = __doc__.split("\n\n")[0]

    def prepare(self, request) -> TrainPrepared:
        base = prepare_lark(request, run_id=request.model_id, flag="--model_id", model=False)
        if isinstance(base.params, AggregationParams):
            raise ReleaseRefused("--params: training needs gradient parameters (kind gradient)")
        model = load_model(request.model, base.params)
        try:
            training = _config(request, base.params, model)
        except ValueError as err:
            raise ReleaseRefused(str(err))
        if request.test_input is not None and not request.options.testing:
            raise ReleaseRefused("--test_input (the comparison with non-private training) is "
                                 "for testing mode only: give --testing_seed")
        return TrainPrepared(request=request, params=base.params, model=model, training=training)

    def check(self, prepared: TrainPrepared) -> None:
        # The records are held in memory by the driver anyway: count them before any charge
        # (records without an id are removed; faulty values are neutralised, not refused).
        d = prepared.params.num_features
        for spec in self.inputs(prepared):
            _, labels, _ = _matrix(_read_records(spec, d), d)
            if spec.name == "records" and len(labels) < prepared.request.batch_size:
                raise ReleaseRefused(f"--input has fewer records than --batch_size: no step "
                                     "would be taken")

    def inputs(self, prepared: TrainPrepared):
        request, d = prepared.request, prepared.params.num_features
        columns = {"record_id": "any", **{c: "number" for c in feature_columns(d)},
                   "label": "number"}
        specs = [InputSpec(name="records", paths=request.input, format=request.input_format,
                           columns=columns, flag="--input")]
        if request.test_input:
            specs.append(InputSpec(name="test", paths=(request.test_input,),
                                   format=request.input_format, columns=columns,
                                   flag="--test_input"))
        return specs

    def _measures(self, prepared: TrainPrepared):
        request, params, config = prepared.request, prepared.params, prepared.training
        measures = []
        if params.epsilon is not None:
            measures = [Measure.of_noise(
                f"epoch-{e}/helper-noise", params.noise_spec(), params.sensitivities(),
                neighbouring=params.relation,
                description=f"{MECHANISM}; noise in fixed-point units of "
                            f"2^-{params.fraction_bits}; the epoch's steps use disjoint "
                            "minibatches (parallel composition)") for e in range(config.epochs)]
        if config.local_noise is not None:
            measures.append(Measure(
                name="local_feature_noise", mechanism="discrete_laplace (local, per feature)",
                epsilon=config.local_noise.vector_epsilon(params.num_features),
                neighbouring=LOCAL_NEIGHBOURING,
                description=f"{params.num_features} byte features, each discrete Laplace scale "
                            f"255/{request.local_noise_epsilon:g}"))
        return measures

    def consumes(self, prepared: TrainPrepared, planned, inputs):
        return record_ids_once(NAME, inputs)

    def plan(self, prepared: TrainPrepared):
        request, params, model = prepared.request, prepared.params, prepared.model
        measures = self._measures(prepared)
        total = sum(m.epsilon for m in measures)
        outputs = [OutputSpec(name=MODEL, sort_by=["coordinate"], schema=MODEL_SCHEMA,
                              noisy=["value"], errors={"value": MODEL_ERROR},
                              description="the trained model"),
                   OutputSpec(name=TRAINING, sort_by=["epoch"], schema=TRAINING_SCHEMA,
                              description="steps per epoch (public: from the record count)")]
        if request.test_input:
            outputs.append(OutputSpec(name=COMPARISON, sort_by=["method"],
                                      schema=COMPARISON_SCHEMA, noisy=["test_accuracy"],
                                      description="testing only: accuracy of the baselines"))
        return [PlannedRelease(
            release_id=f"{NAME}/{request.model_id}", measures=measures,
            scopes=[Scope(name=f"masked-lark-training:{request.model_id}",
                          budget=PrivacyBudget(epsilon=total),
                          description="every report of the training set")] if measures else [],
            key_names=("release",) + tuple(f"helper-{h}" for h in range(params.num_helpers)),
            outputs=outputs,
            config={"params": params_to_json(params), "model": model.to_json(),
                    "epochs": request.epochs, "batch_size": request.batch_size,
                    "learning_rate": request.learning_rate,
                    "minibatch_seed": request.minibatch_seed,
                    "local_noise_epsilon": request.local_noise_epsilon},
            parameters={"params_digest": params.digest(), "initial_model": model.digest(),
                        "epochs": request.epochs, "batch_size": request.batch_size,
                        "learning_rate": request.learning_rate,
                        "epsilon_per_step": params.epsilon, "clip_norm": params.clip_norm,
                        "k": params.k, "local_noise_epsilon": request.local_noise_epsilon},
            spends_nothing="" if measures else "testing only: exact gradients (epsilon null)",
            guarantee_covers="every report of the training set: epochs x epsilon "
                             "(+ local feature noise)")]

    def build(self, pipeline, prepared: TrainPrepared, inputs, release):
        request, params, model = prepared.request, prepared.params, prepared.model
        check = record_check(params)
        test = None
        if request.test_input:
            test = (inputs["test"]
                    | release.label("TestFaults") >> Counted(CountRecordFaults(
                        check, release.counters(NAME, "test")))
                    | release.label("TestRecords") >> beam.combiners.ToList())
        records = remove_repeated_records(NAME, inputs["records"], pipeline, release)
        trained = (records
                   | release.label("Faults") >> Counted(CountRecordFaults(
                       check, release.counters(NAME, "records")))
                   | release.label("Records") >> beam.combiners.ToList()
                   | release.label("Train") >> beam.Map(
                       _train_with_test, _Train(prepared.training, params, model,
                                                dict(release.keys), release.testing, None),
                       beam.pvalue.AsSingleton(test) if test is not None else None))
        names = [MODEL, TRAINING] + ([COMPARISON] if request.test_input else [])
        return {name: trained | release.label(f"Out[{name}]") >> beam.Map(
            lambda out, n=name: out[n]) for name in names}


def _train_with_test(tables, train: _Train, test_tables):
    if test_tables is not None:
        d = train.params.num_features
        features, labels, faulty = _matrix(_as_text(test_tables, d), d)
        train.test_tables = (features[~faulty], labels[~faulty])  # evaluated on whole records
    return train(tables)


JOB = TrainJob()


def run(request: TrainRequest):
    """Train one model (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
