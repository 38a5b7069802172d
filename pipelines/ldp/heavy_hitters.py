"""Local-DP heavy hitters with PEM (prefix extending method) over client reports.

    python -m pipelines.ldp.heavy_hitters --input pem_reports.parquet --oracle olh --epsilon 4 \\
        --value_bits 16 --top_k 9 --collection_id 2026-11-23 --output out/ldp \\
        --ledger private/ledger.json --key_store private/keys

Seed ``002_8efe61bb3e32549d.txt``; Wang, Li, Jha, "Locally Differentially Private Heavy Hitter
Identification" (PEM). Each client was assigned to one of g groups independently of its value and
reported the length-s_r prefix of its m-bit value with GRR or OLH at the local epsilon (the
``group`` column says which round); see ``transforms/ldp/pem.py``.

Input: Parquet PEM report files (their ``ldp.pem`` metadata must match the declared plan:
``--oracle``, ``--epsilon``, ``--value_bits``, ``--top_k``, ``--bits_per_round``,
``--start_bits``). Checked before the charge.

Output: release ``ldp_heavy_hitters/<collection_id>``:

* ``heavy_hitters.csv`` -- the top-k values of the last round, sorted by ``rank`` (the order of
  their estimates; ties: smaller value first): ``rank, value, estimate, frequency,
  estimate_ci95_low, estimate_ci95_high, estimate_std, round`` (the interval is approximate:
  plug-in variance, normal approximation, ``transforms.ldp.estimators.APPROXIMATE_INTERVAL``);
* ``rounds.csv`` -- every round's candidate prefixes and estimates, sorted by ``round, value``.

Estimates are scaled from a round's group to the whole population. Round r's candidates are
round r-1's top-k prefixes extended, so they depend only on reports (post-processing).
Privacy: each client sends one report in one group: the clients' local epsilon, charged to the
collection's ledger scope (see :mod:`pipelines.ldp.collection`). A client's report is counted once
per collection (its ``--id_column``; a replayed report is refused, or removed with
``--skip_consumed``: :mod:`pipelines.ldp.collection`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import pyarrow as pa

from pipelines.ldp import collection as ldp_release
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, Prepared,
                               ReleaseOptions, ReleaseRefused, cli)
from pipelines.release import run as run_release
from pipelines.release.consumption import SKIP_HELP
from pipelines.release.names import check_segment
from transforms import error_columns
from transforms.ldp.estimators import APPROXIMATE_INTERVAL

NAME = "ldp_heavy_hitters"
HEAVY_HITTERS = "heavy_hitters.csv"
ROUNDS = "rounds.csv"
_ESTIMATES = [("value", pa.uint64()), ("estimate", pa.float64()), ("frequency", pa.float64()),
              *[(c, pa.float64()) for c in error_columns.names("estimate")], ("round", pa.uint16())]
HEAVY_HITTERS_SCHEMA = pa.schema([("rank", pa.uint32())] + _ESTIMATES)
#: What the top-k's intervals do not cover (appended to their errors statement).
SELECTED = ("; the top-k rows are chosen by these same estimates, so their intervals do not "
            "account for the selection (a value ranked in by a high estimate tends to be "
            "over-estimated)")
ROUNDS_SCHEMA = pa.schema(_ESTIMATES)


@dataclass(frozen=True, kw_only=True)
class HeavyHittersRequest:
    """One PEM heavy-hitter aggregation (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "Parquet PEM report files (with a group column): "
                                           "paths, globs or folders, comma-separated"})
    epsilon: float = field(metadata={"help": "the clients' local epsilon"})
    value_bits: int = field(metadata={"help": "m: values are m-bit integers"})
    top_k: int = field(metadata={"help": "k: heavy hitters released"})
    collection_id: str = field(metadata={
        "help": "the report collection (release id ldp_heavy_hitters/COLLECTION_ID; ledger "
                "scope ldp-collection:COLLECTION_ID)"})
    oracle: str = field(default="olh", metadata={"choices": ["grr", "olh"],
                                                 "help": "the clients' oracle"})
    bits_per_round: int = field(default=4, metadata={"help": "eta: prefix bits added per round"})
    start_bits: Optional[int] = field(default=None, metadata={
        "help": "s_0: bits before round 0 (default ceil(log2 top_k))"})
    id_column: str = field(default="client_id", metadata={"help": ldp_release.ID_HELP})
    skip_consumed: bool = field(default=False, metadata={"help": SKIP_HELP})
    options: ReleaseOptions = field(metadata={"cli": False})


def plan_of(request):
    from transforms.ldp.pem import PEMPlan

    try:
        return PEMPlan(oracle=request.oracle, epsilon=request.epsilon,
                       value_bits=request.value_bits, top_k=request.top_k,
                       bits_per_round=request.bits_per_round, start_bits=request.start_bits)
    except (ValueError, TypeError) as err:
        raise ReleaseRefused(f"PEM plan: {err}")


def _check_schema(plan, schema) -> None:
    from transforms.ldp.pem import check_pem_schema
    from transforms.ldp.reports import check_schema

    check_pem_schema(plan, schema)
    check_schema(plan.oracle_for_round(plan.rounds - 1), schema.remove_metadata())


@dataclass(frozen=True, kw_only=True)
class HeavyHittersPrepared(Prepared):
    """The PEM plan (rounds, oracle, prefix bits) the flags declare."""

    pem: object  # transforms.ldp.pem.PEMPlan


class HeavyHittersJob(Job):
    name = NAME
    request_type = HeavyHittersRequest
    description = __doc__.split("\n\n")[0]
    counter_namespaces = ("ldp",)

    def prepare(self, request) -> HeavyHittersPrepared:
        try:
            check_segment(request.collection_id, "--collection_id")
        except ValueError as err:
            raise ReleaseRefused(str(err))
        return HeavyHittersPrepared(request=request, pem=plan_of(request))

    def check(self, prepared: HeavyHittersPrepared) -> None:
        ldp_release.check_files(self.inputs(prepared)[0],
                                lambda s: _check_schema(prepared.pem, s))

    def inputs(self, prepared: HeavyHittersPrepared):
        from transforms.ldp.pem import GROUP_COLUMN

        request = prepared.request
        columns = {f.name: "any" for f in prepared.pem.report_schema()}
        columns[GROUP_COLUMN] = "integer"
        ids, optional = ldp_release.id_columns(request)
        return [InputSpec(name="reports", paths=request.input, format="parquet",
                          columns={**columns, **ids}, optional=optional, flag="--input")]

    def consumes(self, prepared, planned, inputs):
        return ldp_release.client_consumes(NAME, prepared.request, inputs)

    def dropped_rows(self, prepared, counters):
        return ldp_release.dropped_reports(counters, "reports")

    def plan(self, prepared: HeavyHittersPrepared):
        request, plan = prepared.request, prepared.pem
        described = plan.describe()
        epsilon = described["realised_epsilon"]
        measure = ldp_release.local_measure(
            "client_reports", f"PEM ({plan.oracle})", epsilon,
            f"PEM heavy hitters, {plan.rounds} groups, one report per client; "
            f"{ldp_release.LOCAL_MODEL}")
        return [PlannedRelease(
            release_id=f"{NAME}/{request.collection_id}", measures=[measure],
            scopes=[ldp_release.collection_scope(request.collection_id, epsilon)],
            outputs=[OutputSpec(name=HEAVY_HITTERS, sort_by=["rank"], schema=HEAVY_HITTERS_SCHEMA,
                                noisy=["rank", "value", "estimate", "frequency",
                                       *error_columns.names("estimate")],
                                errors={"estimate": APPROXIMATE_INTERVAL + SELECTED},
                                description="top-k values of the last round"),
                     OutputSpec(name=ROUNDS, sort_by=["round", "value"], schema=ROUNDS_SCHEMA,
                                noisy=["value", "estimate", "frequency",
                                       *error_columns.names("estimate")],
                                errors={"estimate": APPROXIMATE_INTERVAL},
                                description="every round's candidate prefixes and estimates")],
            config={"plan": plan.metadata(),
                    **({"skip_consumed": True} if request.skip_consumed else {})},
            parameters={"model": ldp_release.LOCAL_MODEL, "pem": described},
            guarantee_covers="the clients' reports of this collection (local model)")]

    def build(self, pipeline, prepared: HeavyHittersPrepared, inputs, release):
        from transforms.ldp.beam import PEMHeavyHitters

        reports = ldp_release.remove_replayed(inputs["reports"], pipeline, release, NAME,
                                              prepared.request)
        out = reports | release.label("PEM") >> PEMHeavyHitters(prepared.pem)
        return {HEAVY_HITTERS: out["heavy_hitters"], ROUNDS: out["rounds"]}


JOB = HeavyHittersJob()


def run(request: HeavyHittersRequest):
    """Find one collection's heavy hitters (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
