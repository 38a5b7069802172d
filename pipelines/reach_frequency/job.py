"""Cross-publisher reach and frequency from impression logs with LiquidLegions sketches.

    python -m pipelines.reach_frequency \\
        --input pipelines/sample_data/reach_frequency/impressions.csv \\
        --campaigns c1,c2 --publishers pub_a,pub_b,pub_c --epsilon 1.0986 \\
        --output out/rf --ledger private/ledger.json --key_store private/keys

Input: impression rows (publisher, campaign, virtual person id), Parquet or CSV, local or gs://.
Each declared campaign is its own release ``<release_prefix>/<campaign>``, published by the
release layer (:mod:`pipelines.release`) as ``reach_frequency.jsonl``: one JSON object per scope
-- each declared publisher and the union of all publishers -- with the noisy reach, the
frequency distribution 1..K (the last bin is "K or more"), k-reach and k+ reach, sorted by
(scope, publisher). All campaigns of a run are charged in one ledger transaction (all or
nothing) and computed in one pass over the rows.

Privacy: the privacy unit is a virtual person of a campaign; ``--epsilon`` is the total for one
campaign, split over its (publishers + 1) scopes x (reach, frequency) by sequential composition
(see transforms/sketches/dp.py for the sensitivities). Released campaigns and publishers are
the declared ones, never read from the data. Distributed noise (``--num_helpers n``): n helper
stages each add a Polya share drawn from a key of its own (no party holds every share).

Row rules (operator counters): rows with a missing or non-integer id (``--id_type int``), or a
missing publisher or campaign, are dropped; rows of undeclared publishers are dropped; rows of
undeclared campaigns are skipped (they belong to no release of this run).
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import apache_beam as beam
import pyarrow as pa

from accounting.budget import PrivacyBudget
from accounting.calibration import NoiseKind
from accounting.ledger import Scope
from accounting.measures import Measure
from accounting.shared_budget import SharedBudget
from accounting.sensitivity import Neighbouring
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, Prepared,
                               ReleaseOptions, ReleaseRefused, cli)
from pipelines.release import run as run_release
from pipelines.release.names import check_release_id, check_segment
from transforms.sketches.beam import (PUBLISHER, UNION, BuildSketches, ReleaseReachFrequency,
                                      UnionAcrossPublishers)
from transforms.sketches.dp import (HISTOGRAM_SENSITIVITY, REACH_SENSITIVITY,
                                    ReachFrequencyNoise)
from transforms.sketches.impressions import IdType, ImpressionColumns
from transforms.sketches.liquid_legions import SketchConfig

NAME = "reach_frequency"
#: Why reach and frequency have no error columns (the output's errors statement).
SKETCH_ERROR = ("no error columns: the noise is added to each sketch's active-register count and "
                "register histogram (the measures' scales, in RELEASE.json), and reach is the "
                "LiquidLegions estimate from the noisy count (a nonlinear function), frequency, "
                "k-reach and k+ reach derived from it and the noisy histogram; their error "
                "depends on the true reach and frequencies (and on sketch collisions), so no std "
                "or 95% interval follows from the stated noise alone")
OUTPUT = "reach_frequency.jsonl"


def output_schema() -> pa.Schema:
    return pa.schema([("campaign", pa.string()), ("scope", pa.string()),
                      ("publisher", pa.string()), ("reach", pa.float64()),
                      ("max_frequency", pa.int64()), ("frequency", pa.list_(pa.float64())),
                      ("k_reach", pa.list_(pa.float64())), ("k_plus_reach", pa.list_(pa.float64())),
                      ("noise", pa.string()), ("epsilon_reach", pa.float64()),
                      ("epsilon_frequency", pa.float64())])


@dataclass(frozen=True, kw_only=True)
class ReachFrequencyRequest:
    """One reach & frequency run (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "impression logs: paths, globs or folders, "
                                           "comma-separated (local or gs://)"})
    campaigns: tuple = field(metadata={"help": "comma-separated campaign ids (public: each is a "
                                               "release, also without rows)"})
    publishers: tuple = field(metadata={"help": "comma-separated publisher ids (public: each gets "
                                                "its own scope, also without rows)"})
    epsilon: float = field(metadata={"help": "total epsilon per campaign, all scopes and measures"})
    input_format: Optional[str] = field(default=None, metadata={
        "help": "csv or parquet (default: from the file names)", "choices": ["csv", "parquet"]})
    publisher_column: str = field(default="publisher", metadata={"help": "publisher column"})
    campaign_column: str = field(default="campaign", metadata={"help": "campaign column"})
    id_column: str = field(default="vid", metadata={"help": "virtual person id column"})
    id_type: str = field(default="int", metadata={
        "choices": [t.value for t in IdType],
        "help": "int: 64-bit integer ids (7, 7.0 and \"7\" are one person; other rows dropped); "
                "string: the id's canonical text"})
    num_registers: int = field(default=100_000, metadata={"help": "sketch registers m"})
    decay_rate: float = field(default=10.0, metadata={
        "help": "a (0: uniform registers, a one-hash Bloom filter with counts)"})
    max_frequency: int = field(default=10, metadata={
        "help": "K: frequencies 1..K are released, the last bin is 'K or more'"})
    sketch_salt: str = field(default="", metadata={
        "help": "secret shared by the publishers, mixed into every campaign's fingerprint salt "
                "(at most 64 bytes)"})
    delta: float = field(default=0.0, metadata={"help": "total delta per campaign "
                                                       "(discrete_gaussian only)"})
    noise_kind: str = field(default="discrete_laplace", metadata={
        "choices": ["discrete_laplace", "discrete_gaussian"], "help": "noise of every statistic"})
    reach_budget_fraction: float = field(default=0.5, metadata={
        "help": "share of each scope's budget spent on reach (rest: frequency)"})
    neighbouring: str = field(default="add_remove", metadata={
        "choices": ["add_remove", "substitute"],
        "help": "add/remove one person, or replace one (doubles the histograms' sensitivity; the reach's stays 1)"})
    num_helpers: int = field(default=0, metadata={
        "help": "0: global noise; n >= 1: n helper stages each add a Polya share from a key of "
                "its own (discrete_laplace only)"})
    release_prefix: str = field(default="reach_frequency", metadata={
        "help": "release ids are PREFIX/<campaign>"})
    campaign_budget_epsilon: Optional[float] = field(default=None, metadata={
        "help": "each campaign's total budget in the ledger (default: --epsilon)"})
    campaign_budget_delta: Optional[float] = field(default=None, metadata={
        "help": "each campaign's total delta in the ledger (default: --delta, plus distributed "
                "noise's sampler slack with --num_helpers)"})
    options: ReleaseOptions = field(metadata={"cli": False})


def _noise(request) -> ReachFrequencyNoise:
    return ReachFrequencyNoise(
        budget=PrivacyBudget(epsilon=request.epsilon, delta=request.delta),
        num_publishers=len(set(request.publishers)), reach_fraction=request.reach_budget_fraction,
        kind=NoiseKind.parse(request.noise_kind),
        neighbouring=Neighbouring.ADD_REMOVE if request.neighbouring == "add_remove"
        else Neighbouring.SUBSTITUTE)


def _measures(request, noise: ReachFrequencyNoise) -> list[Measure]:
    relation = Neighbouring.ADD_REMOVE if request.neighbouring == "add_remove" else \
        Neighbouring.SUBSTITUTE
    factor = relation.factor
    # Distributed noise charges its sampler's total-variation slack as extra delta per statistic.
    specs = noise.charged_specs(request.num_helpers, request.max_frequency)
    out = []
    for scope in [UNION] + [f"{PUBLISHER}:{p}" for p in sorted(set(request.publishers))]:
        out.append(Measure.of_noise(f"{scope}/reach", specs["reach"],
                                    REACH_SENSITIVITY.scaled(factor), neighbouring=relation,
                                    description="active registers of the scope's sketch"))
        out.append(Measure.of_noise(f"{scope}/frequency", specs["frequency"],
                                    HISTOGRAM_SENSITIVITY.scaled(factor), neighbouring=relation,
                                    description="frequency histogram of the scope's sketch"))
    return out


def _shared_budget(request, noise: ReachFrequencyNoise) -> SharedBudget:
    """One campaign's declared total (``--epsilon``, with distributed noise's delta) split
    between its 2 (P + 1) statistics, each part spent by its measure: the release's guarantee
    and explain (accounting.shared_budget). Each statistic draws its noise from its own lanes of
    the release key (campaign, scope, statistic, bin)."""
    measures = _measures(request, noise)
    total = PrivacyBudget(epsilon=request.epsilon,
                          delta=noise.total(request.num_helpers, request.max_frequency).delta)
    shared = SharedBudget(total, budgets={m.name: PrivacyBudget(epsilon=m.epsilon, delta=m.delta)
                                          for m in measures}, accountant="basic")
    for measure in measures:
        shared.part(measure.name).spend([measure])
    return shared


@dataclass(frozen=True, kw_only=True)
class ReachFrequencyPrepared(Prepared):
    """The sketch configuration and the noise of every statistic the flags declare."""

    sketch: SketchConfig
    noise: ReachFrequencyNoise


#: The largest --max_frequency: the frequency histogram has one noisy bucket per frequency
#: (and 1..k frequencies are what reach-and-frequency reports show).
MAX_FREQUENCY = 1000


class ReachFrequencyJob(Job):
    name = NAME
    request_type = ReachFrequencyRequest
    description = __doc__.split("\n\n")[0]

    def prepare(self, request) -> ReachFrequencyPrepared:
        try:
            for campaign in request.campaigns:
                check_segment(campaign, "campaign")
            check_release_id(request.release_prefix, "--release_prefix")
            if not request.campaigns or not request.publishers:
                raise ValueError("--campaigns and --publishers need at least one name each")
            if len(request.sketch_salt.encode()) > 64:
                raise ValueError("--sketch_salt: at most 64 bytes")
            if not 1 <= request.max_frequency <= MAX_FREQUENCY:
                raise ValueError(f"--max_frequency must be in [1, {MAX_FREQUENCY}] (one noisy "
                                 f"count per frequency), got {request.max_frequency}")
            if request.num_helpers < 0 or (request.num_helpers and
                                           request.noise_kind != "discrete_laplace"):
                raise ValueError("--num_helpers must be >= 0, and > 0 only with discrete_laplace")
            sketch = SketchConfig(num_registers=request.num_registers,
                                  decay_rate=request.decay_rate)
            noise = _noise(request)
        except ValueError as err:
            raise ReleaseRefused(str(err))
        return ReachFrequencyPrepared(request=request, sketch=sketch, noise=noise)

    def inputs(self, prepared: ReachFrequencyPrepared):
        request = prepared.request
        columns = {request.publisher_column: "text", request.campaign_column: "text",
                   request.id_column: "id"}
        return [InputSpec(name="impressions", paths=request.input, format=request.input_format,
                          columns=columns, flag="--input")]

    def plan(self, prepared: ReachFrequencyPrepared):
        request, noise = prepared.request, prepared.noise
        total = PrivacyBudget(
            epsilon=request.epsilon if request.campaign_budget_epsilon is None
            else request.campaign_budget_epsilon,
            delta=noise.total(request.num_helpers, request.max_frequency).delta
            if request.campaign_budget_delta is None else request.campaign_budget_delta)
        config = {"num_registers": request.num_registers, "decay_rate": request.decay_rate,
                  "max_frequency": request.max_frequency, "publishers": sorted(set(request.publishers)),
                  "columns": [request.publisher_column, request.campaign_column, request.id_column],
                  "id_type": request.id_type, "noise_kind": request.noise_kind,
                  "num_helpers": request.num_helpers, "neighbouring": request.neighbouring,
                  "reach_fraction": request.reach_budget_fraction, "epsilon": request.epsilon,
                  "delta": request.delta,
                  "sketch_salt": hashlib.sha256(request.sketch_salt.encode()).hexdigest()}
        output = OutputSpec(name=OUTPUT, sort_by=["scope", "publisher"], schema=output_schema(),
                            noisy=["reach", "frequency", "k_reach", "k_plus_reach"],
                            errors={c: SKETCH_ERROR for c in ("reach", "frequency", "k_reach",
                                                              "k_plus_reach")},
                            description="one row per scope: the union and each declared publisher")
        keys = ("release",) + tuple(f"helper-{i}" for i in range(request.num_helpers))
        return [PlannedRelease(
            release_id=f"{request.release_prefix}/{campaign}", budget=_shared_budget(request, noise),
            scopes=[Scope(name=f"campaign:{campaign}", budget=total,
                          description="the campaign's total")],
            outputs=[output], key_names=keys,
            config={**config, "campaign": campaign},
            parameters={"campaign": campaign, **{k: v for k, v in config.items()
                                                 if k != "sketch_salt"}},
            guarantee_covers="one campaign: every scope's reach and frequency, composed")
            for campaign in sorted(set(request.campaigns))]

    def build_all(self, pipeline, prepared: ReachFrequencyPrepared, inputs, releases):
        by_campaign = {r.planned.config["campaign"]: r for r in releases}
        request, config, noise = prepared.request, prepared.sketch, prepared.noise
        campaigns = sorted(by_campaign)
        scoped = (inputs["impressions"]
                  | "BuildSketches" >> BuildSketches(
                      config, columns=ImpressionColumns(publisher=request.publisher_column,
                                                        campaign=request.campaign_column,
                                                        person=request.id_column),
                      id_type=request.id_type, campaigns=campaigns, publishers=request.publishers,
                      shared_secret=request.sketch_salt.encode())
                  | "UnionAcrossPublishers" >> UnionAcrossPublishers())
        if not request.num_helpers:
            rows = scoped | "Release" >> ReleaseReachFrequency(
                config, noise, {c: by_campaign[c].key for c in campaigns},
                max_frequency=request.max_frequency)
        else:
            # Each campaign is its own release with its own helper keys (reserved in the ledger
            # as helper-0..n-1): one helper chain per campaign, each stage holding one key.
            rows = [scoped
                    | by_campaign[c].label("Sketches") >> beam.Filter(
                        lambda kv, c=c: kv[0][0] == c)
                    | by_campaign[c].label("Release") >> ReleaseReachFrequency(
                        config, noise, {c: by_campaign[c].key},
                        max_frequency=request.max_frequency, num_helpers=request.num_helpers,
                        helper_keys={name: key for name, key in by_campaign[c].keys.items()
                                     if name.startswith("helper-")})
                    for c in campaigns] | "AllCampaigns" >> beam.Flatten()
        out = {}
        for campaign, release in by_campaign.items():
            out[release.release_id] = {OUTPUT: (
                rows
                | release.label("Rows") >> beam.Filter(lambda r, c=campaign: r["campaign"] == c)
                | release.label("Table") >> beam.combiners.ToList()
                | release.label("Arrow") >> beam.Map(
                    lambda rows: pa.Table.from_pylist(rows, schema=output_schema())))}
        return out

    def dropped_rows(self, prepared, counters: Mapping[str, int]) -> Mapping[str, dict]:
        read = counters.get("rows_read", 0)
        reasons = {name: counters[name] for name in ("rows_missing_id", "rows_missing_key")
                   if counters.get(name)}
        dropped = sum(reasons.values())
        return {"impressions": {"eligible": read, "dropped": dropped,
                                "share": dropped / read if read else 0.0, "reasons": reasons}}


JOB = ReachFrequencyJob()


def run(request: ReachFrequencyRequest):
    """Make one release per declared campaign (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
