"""Label-DP training export: K-ary randomized response on a label column, with what a trainer
needs to debias.

    python -m pipelines.ldp.label_dp --input training.csv --labels no,yes --epsilon 2 \\
        --features feature_1,feature_2 --dataset_id train-2026-11 --output out/label_dp \\
        --ledger private/ledger.json --key_store private/keys

Seed ``000_015430204a1d6d17.txt`` (label DP); Ghazi, Golowich, Kumar, Manurangsi & Zhang, "Deep
Learning with Label Differential Privacy" (NeurIPS 2021): RR and RR-with-prior
(``transforms/ldp/labels.py``).

Input (CSV or Parquet): ``--id_column`` (example id; canonical form of
``transforms/privacy_units.py``), ``--label_column`` and the ``--features`` columns (numbers).
Every example's label is randomized independently among the public ``--labels``, its randomness
keyed by the release key and the example id (not by batching or runner). A null or undeclared
label (labels are compared exactly: ``YES`` is not ``yes``) keeps its row (dropping it would
depend on the label) and gets a uniform label from the randomized-among set; its label is lost,
so it counts as a dropped row for the operator (``rows.dropped.undeclared_label``,
``rows.dropped.missing_label``) and the dropped-rows rule. A row without an example id is
dropped (counted; independent of the label).

Output: release ``label_dp/<dataset_id>``:

* ``dataset.parquet`` -- ``example_id`` (canonical text), the features (float64), the randomized
  label, and (plain RR) ``label_unbiased``: the unbiased estimate of "label is the second label"
  for two labels, or the unbiased one-hot vector for more; sorted by ``example_id``;
* ``debias.jsonl`` -- one row per label: its transition-matrix column, the debias matrix row
  (plain RR) and the estimated class count with its approximate 95% interval and std
  (``estimated_count_ci95_low``, ``estimated_count_ci95_high``, ``estimated_count_std``: plug-in
  variance at the estimate, normal approximation, clipped to [0, n]; its coverage is
  approximate, as :data:`ESTIMATE_ERROR` states in ``RELEASE.json``); sorted by ``label_index``.

Privacy: epsilon-label-DP -- neighbouring datasets differ in one example's label (ids and
features are public to the trainer); charged to the dataset's ledger scope (``label-dp:<id>``).
A person with several examples: bound examples per person first, or spend epsilon / K (group
privacy). The same labels under another ``--dataset_id`` are refused (the ledger records a digest
of the (example id, label) set).

Across exports: **an example's label is randomized once, ever** (per ``--label_column``). The
ledger records every export's example ids (keyed hashes; ``pipelines/release/consumption.py``):
an export that includes an example an earlier export (or an earlier version of this one)
randomized is refused before the charge -- its label would be randomized again with an
independent key, epsilon twice -- naming how many and which exports hold them; with
``--skip_consumed`` those examples are removed (counter ``label_dp.rows_removed_already_consumed``)
and the new ones exported: a trainer reuses the earlier export's randomized labels. An example id
repeated within one export has every row removed (``label_dp.rows_removed_repeated_in_batch``),
alike or not: its id is public and its label private, so whether two copies agree must not
decide what is exported,
and a row whose id has no canonical form (``"1e999"``) is dropped
(``label_dp.rows_dropped_id_without_canonical_form``): one row never decides whether an export
is published (which rows are kept depends on the public ids only).
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from accounting.budget import PrivacyBudget
from accounting.ledger import Scope
from accounting.measures import Measure
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, Prepared,
                               ReleaseOptions, ReleaseRefused, cli)
from pipelines.release import run as run_release
from pipelines.release.consumption import SKIP_HELP, Consumes, canonical_ids, remove_consumed
from pipelines.release.names import check_segment
from transforms import error_columns
from transforms.counting import Counted, CountingDoFn

NAME = "label_dp"
DATASET = "dataset.parquet"
DEBIAS = "debias.jsonl"
UNBIASED = "label_unbiased"


@dataclass(frozen=True, kw_only=True)
class LabelDPRequest:
    """One label-randomized export (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "training rows (CSV or Parquet): paths, globs or "
                                           "folders, comma-separated"})
    labels: tuple = field(metadata={"help": "the public label set, comma-separated (every "
                                            "other value is randomized as undeclared)"})
    epsilon: float = field(metadata={"help": "label-DP epsilon (per example's label)"})
    dataset_id: str = field(metadata={"help": "the export (release id label_dp/DATASET_ID; "
                                              "ledger scope label-dp:DATASET_ID)"})
    features: tuple = field(default=(), metadata={
        "help": "numeric feature columns exported as they are, comma-separated"})
    id_column: str = field(default="example_id", metadata={"help": "example id column"})
    label_column: str = field(default="label", metadata={"help": "label column"})
    prior: tuple = field(default=(), metadata={
        "help": "RR-with-prior: a PUBLIC prior weight per label (e.g. from an earlier DP "
                "release), comma-separated; default plain RR"})
    skip_consumed: bool = field(default=False, metadata={"help": SKIP_HELP})
    options: ReleaseOptions = field(metadata={"cli": False})


def randomizer_of(request):
    from transforms.ldp.labels import LabelRandomizer

    try:
        prior = tuple(float(x) for x in request.prior) if request.prior else None
        return LabelRandomizer(epsilon=request.epsilon, labels=tuple(request.labels), prior=prior)
    except (ValueError, TypeError) as err:
        raise ReleaseRefused(f"--labels/--epsilon/--prior: {err}")


#: The released values' error statements (the outputs' ``errors``): randomized response adds no
#: noise of a fixed distribution, so no value has an interval of guaranteed coverage; the class
#: counts' interval is the approximate plug-in one (transforms.error_columns).
LABEL_ERROR = ("a randomized label: its error is the transition matrix (debias.jsonl, public); "
               "no error columns: a label is not a number")
UNBIASED_ERROR = ("no error columns: the unbiased estimate of one example's label (the debias "
                  "matrix row of its randomized label); its error depends on the true label")
COUNT_ERROR = ("randomized_count counts the randomized labels (no added noise): its deviation "
               "from the true class count depends on the true counts; estimated_count debiases it")
ESTIMATE_ERROR = error_columns.approximate_statement(
    "estimated_count",
    std="the exact standard deviation of the unbiased count estimator evaluated at the released "
        "estimate clipped to [0, n] (the plug-in variance; the true variance depends on the true "
        "counts)",
    assumptions="many examples (the estimate is a linear function of the randomized counts of n "
                "independent examples, close to normal by the central limit theorem) and a "
                "plug-in variance close to the variance at the true count",
    clipped_to="[0, n] (n: the exported examples)")


def dataset_schema(request, randomizer) -> pa.Schema:
    fields = [("example_id", pa.string())] + [(f, pa.float64()) for f in request.features]
    fields.append((request.label_column, pa.string()))
    if randomizer.debias_matrix() is not None:
        fields.append((UNBIASED, pa.float64() if randomizer.num_labels == 2
                       else pa.list_(pa.float64(), randomizer.num_labels)))
    return pa.schema(fields)


def debias_schema(randomizer) -> pa.Schema:
    K = randomizer.num_labels
    fields = [("label", pa.string()), ("label_index", pa.int32()),
              ("randomized_count", pa.int64()),
              ("transition_from_label", pa.list_(pa.float64(), K))]
    if randomizer.debias_matrix() is not None:
        fields += [("debias_row", pa.list_(pa.float64(), K)), ("estimated_count", pa.float64()),
                   *[(c, pa.float64()) for c in error_columns.names("estimated_count")]]
    return pa.schema(fields)


def _numbers(column) -> pa.Array:
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_null(column.type):
        return pa.nulls(len(column), pa.float64())
    try:
        return pc.cast(column, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        out = []
        for value in column.to_pylist():
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = None
            out.append(number if number is None or np.isfinite(number) else None)
        return pa.array(out, pa.float64())


class _Prepare(CountingDoFn):
    """Training rows -> canonical example ids, numeric features, text labels; rows without an
    example id are dropped (counted: the rule depends on the id only, never on the label).
    Kept rows whose label is null or not one of ``--labels`` are counted as dropped (their label
    becomes a uniform draw) but stay: the rows released depend on the ids only."""

    def __init__(self, request, counters):
        self._id, self._label = request.id_column, request.label_column
        self._features = tuple(request.features)
        self._labels = tuple(request.labels)
        self._counters = counters

    def process(self, table: pa.Table):
        import pyarrow.compute as pc

        from transforms.privacy_units import unit_ids_and_faults

        # an id without a canonical form was dropped and counted before (remove_consumed)
        ids = unit_ids_and_faults(table.column(self._id), self._id)[0]
        keep = ids.is_valid()
        missing = len(ids) - pc.sum(keep.cast(pa.int64())).as_py() if len(ids) else 0
        self._counters.dropped("missing_example_id", missing)
        labels = table.column(self._label)
        labels = labels.combine_chunks() if isinstance(labels, pa.ChunkedArray) else labels
        if not pa.types.is_string(labels.type):
            labels = pc.cast(labels, pa.string())
        columns = {"example_id": ids, **{f: _numbers(table.column(f)) for f in self._features},
                   self._label: labels}
        out = pa.table(columns)
        out = out.filter(keep) if missing else out
        kept = out.column(self._label)
        declared = pc.is_in(kept, value_set=pa.array(self._labels, pa.string()))
        self._counters.dropped("missing_label", kept.null_count)
        self._counters.dropped("undeclared_label", len(kept) - kept.null_count
                               - pc.sum(declared.cast(pa.int64())).as_py() if len(kept) else 0)
        yield out


def _content_digest(request, resolved) -> str:
    """An order-independent digest of the (canonical example id, label) set: the sum mod 2^256
    of each pair's SHA-256 -- file names, order and format do not change it."""
    import pyarrow.compute as pc

    from pipelines.release.inputs import open_input
    from transforms.privacy_units import unit_ids_and_faults

    total = 0
    wanted = [request.id_column, request.label_column]
    for inp in resolved:
        for path in inp.files:
            try:
                for table in _tables(path, inp, wanted, open_input):
                    ids = unit_ids_and_faults(table.column(request.id_column),
                                              request.id_column)[0]
                    labels = pc.cast(table.column(request.label_column), pa.string())
                    for i, label in zip(ids.to_pylist(), labels.to_pylist()):
                        if i is not None:
                            pair = f"{len(i)}:{i}|{label}".encode()
                            total += int.from_bytes(hashlib.sha256(pair).digest(), "big")
            except (pa.ArrowException, UnicodeDecodeError, OSError, ValueError) as err:
                raise ReleaseRefused(f"{inp.spec.label}: {path} could not be read "
                                     f"({type(err).__name__}); nothing was charged")
    return f"multiset-sha256:labels:{total % (1 << 256):064x}"


def _tables(path, inp, columns, open_input):
    from pipelines.release.inputs import text_not_utf8_as_missing

    if inp.formats[path] == "parquet":
        from transforms import parquet_files

        with open_input(path) as handle:
            for batch in parquet_files.open_file(handle).iter_batches(
                    batch_size=65536, columns=columns, use_threads=False):
                yield pa.Table.from_batches([batch])
        return
    from pyarrow import csv as pacsv

    with open_input(path, inp.compression[path]) as handle:
        reader = pacsv.open_csv(handle, read_options=pacsv.ReadOptions(use_threads=False),
                                parse_options=pacsv.ParseOptions(
                                    invalid_row_handler=lambda row: "skip"),
                                convert_options=pacsv.ConvertOptions(
                                    include_columns=columns,
                                    column_types={c: pa.string() for c in columns},
                                    null_values=[""], strings_can_be_null=True,
                                    check_utf8=False))
        for batch in reader:
            # a value whose bytes are not UTF-8 is missing, as the pipeline reads it
            # (pipelines.release.inputs), never a reason to refuse the export
            yield text_not_utf8_as_missing(pa.Table.from_batches([batch]))[0]


@dataclass(frozen=True, kw_only=True)
class LabelDPPrepared(Prepared):
    """The label randomizer the flags declare."""

    randomizer: object  # transforms.ldp.labels.LabelRandomizer


class LabelDPJob(Job):
    name = NAME
    request_type = LabelDPRequest
    description = __doc__.split("\n\n")[0]
    counter_namespaces = ("ldp",)

    def prepare(self, request) -> LabelDPPrepared:
        try:
            check_segment(request.dataset_id, "--dataset_id")
        except ValueError as err:
            raise ReleaseRefused(str(err))
        randomizer = randomizer_of(request)
        names = [request.id_column, request.label_column, *request.features]
        if len(set(names)) != len(names) or "example_id" in request.features \
                or UNBIASED in names:
            raise ReleaseRefused("--id_column, --label_column and --features must name distinct "
                                 f"columns (and none may be named example_id or {UNBIASED})")
        return LabelDPPrepared(request=request, randomizer=randomizer)

    def inputs(self, prepared: LabelDPPrepared):
        request = prepared.request
        columns = {request.id_column: "id", request.label_column: "any",
                   **{f: "number" for f in request.features}}
        return [InputSpec(name="rows", paths=request.input, columns=columns, flag="--input")]

    def plan(self, prepared: LabelDPPrepared):
        request, randomizer = prepared.request, prepared.randomizer
        described = randomizer.describe()
        measure = Measure(
            name="labels", mechanism=described["mechanism"],
            epsilon=randomizer.realised_epsilon, delta=0.0,
            neighbouring=("change one example's label (label-DP: example ids and features are "
                          "public to the trainer; each label is randomized independently)"),
            description=described["privacy"])
        return [PlannedRelease(
            release_id=f"{NAME}/{request.dataset_id}", measures=[measure],
            scopes=[Scope(name=f"label-dp:{request.dataset_id}",
                          budget=PrivacyBudget(epsilon=randomizer.realised_epsilon),
                          description="one training export (its labels randomized once)")],
            outputs=[OutputSpec(name=DATASET, sort_by=["example_id"],
                                schema=dataset_schema(request, randomizer),
                                noisy=[request.label_column] + (
                                    [UNBIASED] if randomizer.debias_matrix() is not None else []),
                                errors={request.label_column: LABEL_ERROR, **(
                                    {UNBIASED: UNBIASED_ERROR}
                                    if randomizer.debias_matrix() is not None else {})},
                                description="the training rows with randomized labels"),
                     OutputSpec(name=DEBIAS, sort_by=["label_index"],
                                schema=debias_schema(randomizer),
                                noisy=["randomized_count"] + (
                                    ["estimated_count", *error_columns.names("estimated_count")]
                                    if randomizer.debias_matrix() is not None else []),
                                errors={"randomized_count": COUNT_ERROR, **(
                                    {"estimated_count": ESTIMATE_ERROR}
                                    if randomizer.debias_matrix() is not None else {})},
                                description="what a trainer needs to debias")],
            config={"labels": list(request.labels), "epsilon": request.epsilon,
                    "prior": list(request.prior), "id_column": request.id_column,
                    "label_column": request.label_column, "features": list(request.features),
                    **({"skip_consumed": True} if request.skip_consumed else {})},
            parameters={"randomizer": {k: v for k, v in described.items()
                                       if k not in ("transition_matrix", "debias_matrix")},
                        "examples_per_person": "one (bound examples per person before export)"},
            guarantee_covers="every example's label in this export (label-DP)")]

    def content_key(self, prepared, planned, inputs):
        return _content_digest(prepared.request, [inputs[name] for name in sorted(inputs)])

    def consumes(self, prepared: LabelDPPrepared, planned, inputs):
        """The examples whose labels the export randomizes: once, ever (module docstring)."""
        request = prepared.request
        # No content digest: an example's ids are public and its label is private, so whether
        # two copies agree must not decide what is exported -- every copy of a repeated
        # example is removed (rule 1 of pipelines.release.consumption, public-identity jobs).
        ids, faults = canonical_ids(inputs["rows"], request.id_column)
        return [Consumes(namespace=f"{NAME}/{request.label_column}/example", ids=ids,
                         noun="examples", label="--input", skip=request.skip_consumed,
                         faults=faults)]

    def build(self, pipeline, prepared: LabelDPPrepared, inputs, release):
        from transforms.ldp.beam import RandomizeLabels

        request, randomizer = prepared.request, prepared.randomizer
        kept = remove_consumed(inputs["rows"], pipeline, release,
                               f"{NAME}/{request.label_column}/example", request.id_column,
                               counter=(NAME, "rows"), label="examples")
        rows = kept | release.label("Prepare") >> Counted(
            _Prepare(request, release.counters(NAME, "rows")))
        out = rows | release.label("RandomizeLabels") >> RandomizeLabels(
            randomizer, label_column=request.label_column, id_column="example_id",
            release_key=release.key,
            unbiased_column=UNBIASED if randomizer.debias_matrix() is not None else None)
        return {DATASET: out["dataset"], DEBIAS: out["debias"]}


JOB = LabelDPJob()


def run(request: LabelDPRequest):
    """Export one label-randomized dataset (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
