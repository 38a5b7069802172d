"""Cross-publisher reach and frequency from impression logs with LiquidLegions sketches.

Input: impression rows (publisher, campaign, virtual person id), Parquet or CSV, local paths or
gs:// patterns. Output: JSON lines, one per campaign and scope (each declared publisher and the
union of all publishers): the noisy reach, the frequency distribution 1..K (the last bin is
"K or more"), k-reach and k+ reach.

    python -m pipelines.reach_frequency \\
        --input 'pipelines/sample_data/reach_frequency/impressions.csv' \\
        --output /tmp/reach_frequency.jsonl \\
        --campaigns c1,c2 --publishers pub_a,pub_b,pub_c --epsilon 1.0986

Privacy: the privacy unit is a virtual person of a campaign; ``--epsilon`` is the total for one
campaign, split over its (publishers + 1) scopes x (reach, frequency) by sequential composition
(see transforms/sketches/dp.py for the sensitivities). The released campaigns and publishers are
the declared ones, never read from the data. Noise comes from a fresh secret release key unless
``--release_key_file`` names a stored one; ``--testing_seed`` (non-secret) is for tests only.
With ``--ledger``/``--key_store`` every campaign is charged in the budget ledger
(accounting.ledger) before any output and its noise comes from the ledger's key for it, so a
re-run on the same input reproduces the release and spends nothing. Any extra arguments are Beam pipeline options (default: the DirectRunner profile, see runners/).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys

import apache_beam as beam
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

from accounting.calibration import NoiseKind
from accounting.ledger import (Budget, BudgetLedger, CampaignBudget, Charge, LedgerError,
                               input_digest)
from accounting.sensitivity import Neighbouring
from runners.profiles import pipeline_options_for
from accounting.keys import ReleaseKey
from transforms.sketches.beam import PUBLISHER, UNION, ReachFrequency
from transforms.sketches.dp import ReachFrequencyBudget
from transforms.sketches.impressions import IdType, ImpressionColumns
from transforms.sketches.liquid_legions import SketchConfig

_LOG = logging.getLogger(__name__)
_CSV_BLOCK_BYTES = 8 << 20


class ReachFrequencyOptions:
    """Job flags of the reach and frequency release (``--help`` lists them).

    A plain argparse group, deliberately not a ``PipelineOptions`` subclass: Beam adds the flags
    of every subclass to one parser, so generic job flags (``--input``, ``--output``) of two
    pipelines imported in one process would conflict. Everything not parsed here goes to Beam.
    """

    @classmethod
    def _add_argparse_args(cls, parser):
        io = parser.add_argument_group("input and output (--input, --output required)")
        io.add_argument("--input",
                        help="file pattern of impression logs (local path or gs://...)")
        io.add_argument("--input_format", choices=["parquet", "csv"], default=None,
                        help="default: from the file extension of --input")
        io.add_argument("--output",
                        help="output file (JSON lines; local path or gs://...)")
        io.add_argument("--publisher_column", default="publisher")
        io.add_argument("--campaign_column", default="campaign")
        io.add_argument("--id_column", default="vid", help="virtual person id column")
        io.add_argument("--id_type", choices=[t.value for t in IdType], default="int",
                        help="int: 64-bit integer ids (rows whose id is not an integer are "
                             "dropped and counted); string: the id's text")
        domain = parser.add_argument_group("released keys (public, never read from data)")
        domain.add_argument("--campaigns", help="comma-separated campaign ids (required)")
        domain.add_argument("--publishers",
                            help="comma-separated publisher ids (required; each gets its own "
                                 "release, also when it has no rows)")
        sketch = parser.add_argument_group("sketch")
        sketch.add_argument("--num_registers", type=int, default=100_000, help="m")
        sketch.add_argument("--decay_rate", type=float, default=10.0,
                            help="a (0: uniform registers, a one-hash Bloom filter with counts)")
        sketch.add_argument("--max_frequency", type=int, default=10,
                            help="K: frequencies 1..K are released, the last bin is 'K or more'")
        sketch.add_argument("--sketch_salt", default="",
                            help="secret shared by the publishers, mixed into every campaign's "
                                 "fingerprint salt (at most 64 bytes)")
        privacy = parser.add_argument_group("privacy")
        privacy.add_argument("--epsilon", type=float,
                             help="total epsilon per campaign, all scopes and measures (required)")
        privacy.add_argument("--delta", type=float, default=0.0,
                             help="total delta per campaign (discrete_gaussian only)")
        privacy.add_argument("--noise_kind", default="discrete_laplace",
                             choices=["discrete_laplace", "discrete_gaussian"])
        privacy.add_argument("--reach_budget_fraction", type=float, default=0.5,
                             help="share of each scope's budget spent on reach (rest: frequency)")
        privacy.add_argument("--neighbouring", default="add_remove",
                             choices=["add_remove", "substitute"],
                             help="add/remove one person, or replace one (doubles sensitivity)")
        privacy.add_argument("--num_helpers", type=int, default=0,
                             help="0: global noise; n >= 1: n simulated helper stages each add "
                                  "a Polya-difference share (discrete_laplace only)")
        privacy.add_argument("--release_key_file", default=None,
                             help="stored secret release key (default: a fresh secret key)")
        privacy.add_argument("--save_release_key", default=None,
                             help="store the fresh secret key in this new file (owner-only), "
                                  "so that a re-run reproduces the same release")
        privacy.add_argument("--testing_seed", type=int, default=None,
                             help="NON-SECRET key from a seed, for tests and demos only")
        ledger = parser.add_argument_group(
            "budget ledger (optional): each campaign's release is charged in "
            "accounting.ledger.BudgetLedger before any output, and its noise comes from the key "
            "the ledger stores for it")
        ledger.add_argument("--ledger", default=None, help="ledger file (local or gs://)")
        ledger.add_argument("--key_store", default=None,
                            help="where the ledger keeps release keys (required with --ledger)")
        ledger.add_argument("--release_id", default="reach_frequency",
                            help="ledger id prefix: campaign c is charged as <release_id>/<c>")
        ledger.add_argument("--campaign_budget_epsilon", type=float, default=None,
                            help="each campaign's total budget in the ledger (default: --epsilon)")
        ledger.add_argument("--campaign_budget_delta", type=float, default=None,
                            help="each campaign's total delta in the ledger (default: --delta)")
        ledger.add_argument("--periods", default="flight",
                            help="comma-separated periods the impressions cover")
        ledger.add_argument("--new_release", action="store_true",
                            help="charge a new version (fresh key) when the input changed")


def _csv_list(text: str, name: str) -> list[str]:
    values = [v.strip() for v in (text or "").split(",") if v.strip()]
    if not values:
        raise ValueError(f"--{name}: give at least one name")
    return values


def _input_format(opts) -> str:
    if opts.input_format:
        return opts.input_format
    lowered = opts.input.lower().rstrip("*")
    if ".parquet" in lowered or lowered.endswith(".pq"):
        return "parquet"
    if ".csv" in lowered:
        return "csv"
    raise ValueError("--input_format: cannot tell from --input; pass parquet or csv")


def check_input(pattern: str, fmt: str, columns: ImpressionColumns) -> list[str]:
    """Fail before any work when no file matches or the first file lacks a column."""
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise ValueError(f"--input: no files match {pattern!r}")
    first = sorted(m.path for m in matches)[0]
    with FileSystems.open(first) as handle:
        if fmt == "parquet":
            names = pq.read_schema(handle).names
        else:
            names = pacsv.open_csv(handle).schema.names
    missing = [c for c in columns.names() if c not in names]
    if missing:
        raise ValueError(f"--input: {first} has no column(s) {missing} (columns: {names}); "
                         f"set --publisher_column/--campaign_column/--id_column")
    return [m.path for m in matches]


class _CsvBatches(beam.DoFn):
    """A matched CSV file -> pyarrow RecordBatches of the three columns, read as text."""

    def __init__(self, columns: list[str]):
        self._columns = columns

    def process(self, readable_file):
        # Only an empty field is missing: Arrow's default null markers include "NA" and "null".
        convert = pacsv.ConvertOptions(column_types={c: pa.string() for c in self._columns},
                                       include_columns=self._columns, null_values=[""],
                                       strings_can_be_null=True)
        with readable_file.open() as handle:
            reader = pacsv.open_csv(handle, read_options=pacsv.ReadOptions(
                block_size=_CSV_BLOCK_BYTES), convert_options=convert)
            for batch in reader:
                if batch.num_rows:
                    yield batch


class ReadImpressionBatches(beam.PTransform):
    """File pattern -> PCollection of Arrow tables/batches holding the three columns."""

    def __init__(self, pattern: str, fmt: str, columns: ImpressionColumns):
        super().__init__()
        self._pattern, self._fmt, self._columns = pattern, fmt, columns

    def expand(self, pbegin):
        names = self._columns.names()
        if self._fmt == "parquet":
            return pbegin | "ReadParquet" >> beam.io.ReadFromParquetBatched(self._pattern,
                                                                            columns=names)
        return (pbegin
                | "MatchCsv" >> fileio.MatchFiles(self._pattern)
                | "OpenCsv" >> fileio.ReadMatches()
                | "ReadCsv" >> beam.ParDo(_CsvBatches(names)))


def _release_key(opts) -> ReleaseKey:
    sources = [opts.release_key_file, opts.save_release_key, opts.testing_seed, opts.ledger]
    if sum(s is not None for s in sources) > 1:
        raise ValueError("--release_key_file, --save_release_key, --testing_seed, --ledger: "
                         "give at most one")
    if opts.testing_seed is not None:
        _LOG.warning("using a NON-SECRET testing release key (--testing_seed); not for releases")
        return ReleaseKey.for_testing(opts.testing_seed)
    if opts.release_key_file:
        return ReleaseKey.load(opts.release_key_file)
    key = ReleaseKey.generate()
    if opts.save_release_key:
        if os.path.exists(opts.save_release_key):
            raise ValueError(f"--save_release_key: {opts.save_release_key} exists; not "
                             f"overwriting a release secret")
        key.save(opts.save_release_key)
    return key


def _ledger_config(opts, config, budget, campaigns, publishers) -> dict:
    """Everything that shapes the release, hashed into the ledger's input digest."""
    return {"pipeline": "reach_frequency", "num_registers": config.num_registers,
            "decay_rate": config.decay_rate, "max_frequency": opts.max_frequency,
            "campaigns": campaigns, "publishers": sorted(set(publishers)),
            "columns": [opts.publisher_column, opts.campaign_column, opts.id_column],
            "id_type": opts.id_type, "noise_kind": budget.kind.value,
            "num_helpers": opts.num_helpers, "neighbouring": budget.neighbouring.name,
            "reach_fraction": budget.reach_fraction,
            "sketch_salt": hashlib.sha256(opts.sketch_salt.encode()).hexdigest()}


def _charge_ledger(opts, files, config, budget, campaigns, publishers):
    """One ledger reservation per campaign; returns (ledger, {campaign: reservation})."""
    if not opts.key_store:
        raise ValueError("--key_store: required with --ledger")
    periods = _csv_list(opts.periods, "periods")
    campaign_budget = CampaignBudget(Budget(
        opts.epsilon if opts.campaign_budget_epsilon is None else opts.campaign_budget_epsilon,
        opts.delta if opts.campaign_budget_delta is None else opts.campaign_budget_delta))
    scopes = [UNION] + [f"{PUBLISHER}:{p}" for p in sorted(set(publishers))]
    charges = [Charge.from_spec(spec, f"{scope}/{measure}") for scope in scopes
               for measure, spec in (("reach", budget.reach_spec()),
                                     ("frequency", budget.histogram_spec()))]
    digest = input_digest(files, _ledger_config(opts, config, budget, campaigns, publishers))
    ledger = BudgetLedger(opts.ledger, opts.key_store)
    reservations = {}
    for campaign in campaigns:
        reservations[campaign] = ledger.begin(
            f"{opts.release_id}/{campaign}", charges, digest, campaign=campaign,
            periods=periods, budget=campaign_budget, new_release=opts.new_release,
            metadata={"pipeline": "reach_frequency"})
    return ledger, reservations


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.reach_frequency",
        description=__doc__.split("\n\n")[0] + " Extra arguments go to Beam (e.g. --runner).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ReachFrequencyOptions._add_argparse_args(parser)
    return parser


def run(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts, beam_argv = build_parser().parse_known_args(argv)  # --help and errors before Beam
    pipeline_options = pipeline_options_for(beam_argv)  # runner profiles (DirectRunner -> FnApiRunner)
    # Validate everything before reading data.
    for name in ("input", "output", "campaigns", "publishers", "epsilon"):
        if getattr(opts, name) is None:
            raise ValueError(f"--{name} is required")
    columns = ImpressionColumns(opts.publisher_column, opts.campaign_column, opts.id_column)
    campaigns = _csv_list(opts.campaigns, "campaigns")
    publishers = _csv_list(opts.publishers, "publishers")
    config = SketchConfig(opts.num_registers, opts.decay_rate)
    budget = ReachFrequencyBudget(
        epsilon=opts.epsilon, num_publishers=len(set(publishers)),
        reach_fraction=opts.reach_budget_fraction, delta=opts.delta,
        kind=NoiseKind.parse(opts.noise_kind),
        neighbouring=Neighbouring.ADD_REMOVE if opts.neighbouring == "add_remove"
        else Neighbouring.SUBSTITUTE)
    if len(opts.sketch_salt.encode()) > 64:
        raise ValueError("--sketch_salt: at most 64 bytes")
    if opts.max_frequency < 1:
        raise ValueError(f"--max_frequency: must be >= 1, got {opts.max_frequency}")
    if opts.num_helpers < 0 or (opts.num_helpers and budget.kind is not
                                NoiseKind.DISCRETE_LAPLACE):
        raise ValueError("--num_helpers: must be >= 0, and > 0 only with discrete_laplace noise")
    fmt = _input_format(opts)
    files = check_input(opts.input, fmt, columns)
    # Last step before work: a saved key or a ledger charge is never left by a failed start.
    key = _release_key(opts)
    ledger, reservations = None, {}
    if opts.ledger:
        ledger, reservations = _charge_ledger(opts, files, config, budget, campaigns, publishers)
        key = {c: r.key for c, r in reservations.items()}
    transform = ReachFrequency(config, budget, key, max_frequency=opts.max_frequency,
                               num_helpers=opts.num_helpers, columns=columns,
                               id_type=opts.id_type, campaigns=campaigns, publishers=publishers,
                               shared_secret=opts.sketch_salt.encode())
    _LOG.info("reach_frequency: %d input file(s); per scope reach %s, frequency %s; campaign "
              "total %s", len(files), budget.reach_spec().describe(),
              budget.histogram_spec().describe(), budget.total())

    with beam.Pipeline(options=pipeline_options) as p:
        (p
         | "ReadImpressions" >> ReadImpressionBatches(opts.input, fmt, columns)
         | "ReachFrequency" >> transform
         | "AllRows" >> beam.combiners.ToList()
         | "Sorted" >> beam.FlatMap(lambda rows: sorted(
             rows, key=lambda r: (r["campaign"], r["scope"] != "union", r["publisher"] or "")))
         | "ToJson" >> beam.Map(json.dumps)
         | "Write" >> beam.io.WriteToText(opts.output, shard_name_template="", num_shards=1))
    for reservation in reservations.values():
        ledger.commit(reservation, opts.output)


def main(argv=None) -> int:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))
    try:
        run(argv)
    except (ValueError, LedgerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
