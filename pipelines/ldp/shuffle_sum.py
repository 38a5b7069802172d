"""Shuffle-model summation: the sum of client values from split-and-mix shares.

    python -m pipelines.ldp.shuffle_sum --input shares.parquet --num_clients 1000 --value_bound 10 \\
        --epsilon 1 --delta 1e-6 --collection_id 2026-11-23 --output out/shuffle \\
        --ledger private/ledger.json --key_store private/keys

Seed ``000_015430204a1d6d17.txt`` ("Summation in Shuffle DP Model", split-and-mix). Each client
added its share of Binomial noise to its value in [0, B], split the result into m shares mod q
and sent them to a shuffler; the input is the shuffler's output (a ``share`` column, any order).
The protocol parameters are the job's flags; they must match the ``ldp.split_and_mix`` metadata of
the share files, and the files' row counts must be exactly ``--num_clients`` whole clients: all
checked before the charge. Fewer clients would carry less noise than planned; more cannot be told
apart from a replayed batch (the shuffler hides who sent a share, so shares carry no client id):
a client's shares counted twice would move the sum by 2B against noise planned for B. So plan
``--num_clients`` as the clients whose shares the collection holds. A missing share, or one
outside [0, q), is refused before the charge too (exit 2, naming the file and how many): no
client following the protocol sends one, whatever its value, so the refusal is the same for
every pair of neighbouring collections -- a protocol violation, not one client's value -- and,
unlike a faulty row of the other jobs, a share cannot be dropped and counted: it is one additive
piece of its client's noisy value, and the sum without it is garbage (transforms/ldp/shuffle.py,
"Malformed shares").

Output: release ``shuffle_sum/<collection_id>`` (``sum.csv``): one row ``estimate,
estimate_ci95_low, estimate_ci95_high, estimate_std, clients, messages`` (the estimated sum, the
95% interval and standard deviation of its summed Binomial noise -- public: from the protocol's
parameters, :func:`transforms.error_columns.binomial` -- and the client and message counts,
which the shuffler sees anyway).

Privacy (``transforms/ldp/shuffle.py``): (epsilon, delta)-DP against the analyzer for replacing
one client's value within [0, B], in the shuffle model. The guarantee composes the exact
hockey-stick delta of the summed Binomial noise with the secure-summation error of the shuffled
shares (Ishai, Kushilevitz, Ostrovsky & Sahai, "Cryptography from Anonymity", FOCS 2006; analysis
of Balle, Bell, Gascon & Nissim, "Improved Summation from Shuffling", 2019). Assumptions, stated
in the release metadata: the shuffler is trusted and hides which share came from whom; every
planned client added its noise share (plan ``--num_clients`` with the honest clients you can
count on); the shares are uniformly random mod q given their sum (statistical security sigma).
The same epsilon in the local model (every client randomizing alone) is set beside it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import pyarrow as pa

from accounting.budget import PrivacyBudget
from accounting.ledger import Scope
from accounting.measures import Measure
from pipelines.ldp import collection as ldp_release
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, Prepared,
                               ReleaseOptions, ReleaseRefused, cli)
from pipelines.release import run as run_release
from pipelines.release.names import check_segment

NAME = "shuffle_sum"
OUTPUT = "sum.csv"
SCHEMA = pa.schema([("estimate", pa.float64()), ("estimate_ci95_low", pa.float64()),
                    ("estimate_ci95_high", pa.float64()), ("estimate_std", pa.float64()),
                    ("clients", pa.int64()), ("messages", pa.int64())])
SOURCES = ("Ishai, Kushilevitz, Ostrovsky & Sahai, 'Cryptography from Anonymity', FOCS 2006 "
           "(split-and-mix); Balle, Bell, Gascon & Nissim, 'Improved Summation from Shuffling', "
           "2019 (messages per client for statistical security sigma)")
ASSUMPTIONS = ("a trusted shuffler hides which share came from which client and the analyzer "
               "sees only the multiset of shares; every one of the planned clients added its "
               "Binomial noise share; shares are uniform mod q given their sum (2^-sigma)")


@dataclass(frozen=True, kw_only=True)
class ShuffleSumRequest:
    """One split-and-mix summation (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "Parquet files of shuffled shares (a share column): "
                                           "paths, globs or folders, comma-separated"})
    num_clients: int = field(metadata={"help": "n: clients the noise was split over (the "
                                               "protocol's planned, honest clients)"})
    value_bound: int = field(metadata={"help": "B: each client's value is in [0, B]"})
    epsilon: float = field(metadata={"help": "the protocol's central epsilon"})
    delta: float = field(metadata={"help": "the protocol's target delta"})
    collection_id: str = field(metadata={
        "help": "the share collection (release id shuffle_sum/COLLECTION_ID; ledger scope "
                "shuffle-collection:COLLECTION_ID)"})
    sigma: float = field(default=40.0, metadata={
        "help": "statistical security of the secure summation, in bits"})
    options: ReleaseOptions = field(metadata={"cli": False})


def spec_of(request):
    from transforms.ldp.shuffle import SplitAndMix

    try:
        return SplitAndMix(num_clients=request.num_clients, value_bound=request.value_bound,
                           epsilon=request.epsilon, delta=request.delta, sigma=request.sigma)
    except (ValueError, TypeError) as err:
        raise ReleaseRefused(f"split-and-mix parameters: {err}")


@dataclass(frozen=True, kw_only=True)
class ShuffleSumPrepared(Prepared):
    """The split-and-mix protocol the flags declare."""

    spec: object  # transforms.ldp.shuffle.SplitAndMix


class ShuffleSumJob(Job):
    name = NAME
    request_type = ShuffleSumRequest
    description = __doc__.split("\n\n")[0]

    def prepare(self, request) -> ShuffleSumPrepared:
        try:
            check_segment(request.collection_id, "--collection_id")
        except ValueError as err:
            raise ReleaseRefused(str(err))
        return ShuffleSumPrepared(request=request, spec=spec_of(request))

    def check(self, prepared: ShuffleSumPrepared) -> None:
        from transforms.ldp.shuffle import check_shares_schema

        spec = prepared.spec
        files = ldp_release.check_files(self.inputs(prepared)[0],
                                        lambda s: check_shares_schema(spec, s))
        messages = sum(rows for _, rows in files.values())
        if messages % spec.messages:
            raise ReleaseRefused(f"--input: {messages} shares is not a whole number of clients "
                                 f"({spec.messages} shares each); nothing was charged")
        if messages // spec.messages < spec.num_clients:
            raise ReleaseRefused(f"--input: shares of {messages // spec.messages} clients, but "
                                 f"the noise is split over --num_clients {spec.num_clients}: the "
                                 "sum would carry less noise than planned; nothing was charged")
        if messages // spec.messages > spec.num_clients:
            raise ReleaseRefused(f"--input: shares of {messages // spec.messages} clients, more "
                                 f"than --num_clients {spec.num_clients} allows: a replayed or "
                                 "repeated batch would count clients twice (shares carry no "
                                 "client id to tell); give exactly the collection's shares. "
                                 "Nothing was charged")
        for path in files:
            _refuse_malformed_shares(spec, path)

    def inputs(self, prepared: ShuffleSumPrepared):
        from transforms.ldp.shuffle import SHARE_COLUMN

        return [InputSpec(name="shares", paths=prepared.request.input, format="parquet",
                          columns={SHARE_COLUMN: "integer"}, flag="--input")]

    def plan(self, prepared: ShuffleSumPrepared):
        from transforms.ldp.shuffle import compare_models

        request, spec = prepared.request, prepared.spec
        measure = Measure(
            name="shuffled_sum", mechanism="split-and-mix with distributed Binomial noise",
            epsilon=spec.epsilon, delta=spec.total_delta,
            neighbouring=(f"replace one client's value within [0, {spec.value_bound}] (shuffle "
                          f"model; amplification source: {SOURCES}; assumptions: {ASSUMPTIONS})"),
            description=(f"Binomial({spec.noise_trials_per_client}, {spec.noise_probability:.6g}) "
                         f"noise per client, {spec.messages} shares per client mod "
                         f"2^{spec.modulus_bits}; delta = noise {spec.noise_delta:.3g} + secure "
                         f"summation {spec.total_delta - spec.noise_delta:.3g}"))
        models = compare_models(spec.num_clients, spec.value_bound, spec.epsilon, spec.delta,
                                spec.sigma)
        return [PlannedRelease(
            release_id=f"{NAME}/{request.collection_id}", measures=[measure],
            scopes=[Scope(name=f"shuffle-collection:{request.collection_id}",
                          budget=PrivacyBudget(epsilon=spec.epsilon, delta=spec.total_delta),
                          description="one collection of shuffled shares (summed once)")],
            outputs=[OutputSpec(name=OUTPUT, sort_by=[], schema=SCHEMA, noisy=["estimate"],
                                errors={"estimate": _error(spec).describe(
                                    "estimate", f"the summed Binomial({spec.noise_trials}, "
                                    f"{spec.noise_probability:.6g}) noise of the planned clients, "
                                    "centred")},
                                description="the estimated sum (one row)")],
            config={"split_and_mix": spec.metadata()},
            parameters={"protocol": spec.describe(), "amplification_source": SOURCES,
                        "assumptions": ASSUMPTIONS,
                        "error_by_trust_model": [{k: (None if v != v else v) for k, v in row.items()}
                                                 for row in models]},
            guarantee_covers="the clients' values summed in this collection (shuffle model)")]

    def public_summary(self, prepared, planned, tables):
        """Rows released, and the error of each trust model at this epsilon (public: from the
        protocol's parameters only)."""
        out = super().public_summary(prepared, planned, tables)
        out["error_by_trust_model"] = planned.parameters["error_by_trust_model"]
        return out

    def report_lines(self, summary):
        lines = ["  error of the sum at this epsilon, by trust model (RMSE):"]
        for row in summary.get("error_by_trust_model", []):
            rmse = "n/a" if row.get("rmse") is None else f"{row['rmse']:.4g}"
            lines.append(f"    {row['model']}: {rmse} ({row['mechanism']})")
        return lines

    def build(self, pipeline, prepared: ShuffleSumPrepared, inputs, release):
        from transforms.ldp.beam import ShuffleSum

        return {OUTPUT: inputs["shares"] | release.label("ShuffleSum") >> ShuffleSum(
            prepared.spec)}


def _error(spec):
    from transforms import error_columns

    return error_columns.binomial(spec.noise_trials, spec.noise_probability)


def _refuse_malformed_shares(spec, path: str) -> None:
    """Refuse a file holding a share no honest client sends (missing, or outside [0, q)): a
    protocol violation, the same in every neighbouring collection -- never one client's value
    (module docstring; transforms/ldp/shuffle.py, "Malformed shares"). Read row group by row
    group, the share column only; the message counts, never shows, the shares."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    from transforms import parquet_files
    from transforms.ldp.shuffle import SHARE_COLUMN, share_faults

    missing = outside = 0
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            parquet = parquet_files.open_file(handle)
            for group in range(parquet.num_row_groups):
                column = parquet.read_row_group(group, columns=[SHARE_COLUMN],
                                                use_threads=False).column(SHARE_COLUMN)
                m, o = share_faults(spec, column)
                missing, outside = missing + m, outside + o
    except (pa.ArrowException, OSError, EOFError) as err:
        raise ReleaseRefused(f"--input: {path} could not be read ({type(err).__name__}); "
                             "nothing was charged") from None
    if missing or outside:
        raise ReleaseRefused(
            f"--input: {path} holds {missing} missing share(s) and {outside} outside [0, "
            f"2^{spec.modulus_bits}): no client following the protocol sends such a share (a "
            "corrupt or foreign file, or shares made with other parameters), and a share cannot "
            "be dropped without garbling its client's value; nothing was charged")


JOB = ShuffleSumJob()


def run(request: ShuffleSumRequest):
    """Sum one collection of shuffled shares (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
