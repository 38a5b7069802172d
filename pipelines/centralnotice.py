"""CentralNotice banner statistics, released under differential privacy.

    python -m pipelines.centralnotice --config campaigns.json --impressions 'imp/*.parquet' \\
        --clicks 'clicks/*.parquet' --release C2026_en/2026-11-26 --output gs://bucket/releases \\
        --ledger gs://bucket/ledger.json --key-store gs://secure-bucket/keys [Beam options]

One run makes one scheduled release (a campaign and a day, or a whole campaign; see the
configuration's ``schedule``) and writes ``<output>/<release>/centralnotice.parquet`` (or
``.csv``) with one row per released key -- campaign_id, banner_id, country, project, date,
impressions, clicks -- plus ``report.json`` / ``report.txt`` next to it.

Mechanisms (reference.md section 1; seed 001):

* impressions, Algorithm 1: each pre-aggregated row is split into blocks of k (compactly:
  full-block count and remainder, never one element per block); per key, the sum of the blocks
  clamped to [0, k] plus noise calibrated to sensitivity k -- (Geo, Project, k)-DP per period,
  or (Geo, Project, Campaign, k)-DP when the campaign's budget is shared by its days.
* clicks, Algorithm 2: per key, the count of click rows plus noise of sensitivity 1 (row-DP), or
  after bounding each user to m clicks per period or per campaign (user-DP, sensitivity m).
  Laplace kinds under pure DP, or Gaussian kinds under zCDP; the report states the release's
  single (epsilon, delta) combining both measures.
* Keys: the configured keyset (banners x countries x projects x dates), minus the country
  protection list; nothing else can appear. A measure whose noisy value is not above its release
  threshold is suppressed (null); a key with both suppressed is not released.

Releases go through the budget ledger (``accounting.ledger``): charged before any output is
written, refused beyond the campaign's or the period's budget, and idempotent -- re-running a
release id on unchanged input reuses its stored key and rewrites identical bytes; changed input
is refused unless ``--new-release``.

Row rules (counted in Beam metrics, namespace ``centralnotice``; never released): impression
rows with missing, negative, fractional or unparseable counts are dropped (see
``transforms.impressions_split``); duplicate impression rows of a key are summed; click rows
without a user id (user-DP) are dropped; rows of other campaigns or dates belong to other
releases and are skipped; rows whose banner, country or project is outside the configuration,
or whose country is protected, are dropped; malformed CSV lines are skipped and counted.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import io
import json
import logging
import os
import sys
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from pyarrow import csv as pacsv

from accounting.budget import Measure
from accounting.composition import combine_zcdp_and_pure, sequential
from accounting.ledger import BudgetLedger, ChangedInputError, LedgerError, input_digest
from accounting.sensitivity import ContributionBounds, Neighbouring, Sensitivities, count_sensitivity
from accounting.validation import check_positive_int
from pipelines.centralnotice_config import KEY_COLUMNS, CampaignConfig, ConfigError, load_config
from runners.profiles import build_options
from transforms.aggregate import BoundedKeyPartials, BoundingConfig
from transforms.impressions_split import clean_impressions, per_key_contribution
from transforms.keyset import PublicKeyset
from accounting.keys import ReleaseKey
from transforms.release import NoisyMeasure, NoisyRelease, OutputColumn

NAMESPACE = "centralnotice"
SAMPLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sample_data", "centralnotice")
KEYS = list(KEY_COLUMNS)
_LOG = logging.getLogger(__name__)


def _count(name: str, amount) -> None:
    if amount:
        Metrics.counter(NAMESPACE, name).inc(int(amount))


# --------------------------------------------------------------------------- reading

def expand_paths(pattern: str) -> list[str]:
    """Files matching a local or gs:// path or glob (a directory means every file in it)."""
    if not FileSystems.get_scheme(pattern) and os.path.isdir(pattern):
        pattern = os.path.join(pattern, "*")
    matches = FileSystems.match([pattern])[0].metadata_list
    return sorted(m.path for m in matches)


def _format_of(path: str, explicit: Optional[str]) -> str:
    if explicit:
        return explicit
    return "parquet" if path.endswith(".parquet") or path.endswith(".pq") else "csv"


def check_input(paths: Sequence[str], fmt: str, required: Sequence[str], what: str) -> None:
    """Before any work: the files exist and have the required columns."""
    if not paths:
        raise ValueError(f"--{what}: no input files match")
    for path in paths:
        with FileSystems.open(path) as handle:
            if fmt == "parquet":
                names = pq.ParquetFile(handle).schema_arrow.names
            else:
                header = handle.readline().decode("utf-8-sig").strip()  # Arrow skips a BOM too
                names = [n.strip().strip('"') for n in header.split(",")]
        missing = [c for c in required if c not in names]
        if missing:
            raise ValueError(f"--{what}: {path} has no column {missing[0]!r} (columns: {names})")


class ReadTables(beam.DoFn):
    """One file -> Arrow tables of ``columns`` (every CSV column read as text, cast later)."""

    def __init__(self, fmt: str, columns: Sequence[str], what: str):
        self._fmt = fmt
        self._columns = list(columns)
        self._what = what

    def process(self, path: str):
        with FileSystems.open(path) as handle:
            if self._fmt == "parquet":
                parquet = pq.ParquetFile(handle)
                for group in range(parquet.num_row_groups):
                    yield parquet.read_row_group(group, columns=self._columns)
                return
            malformed = []
            options = pacsv.ParseOptions(invalid_row_handler=lambda row: malformed.append(1) or "skip")
            # Only an empty field is missing: Arrow's default null markers include "NA" (Namibia).
            convert = pacsv.ConvertOptions(include_columns=self._columns,
                                           column_types={c: pa.string() for c in self._columns},
                                           null_values=[""], strings_can_be_null=True)
            # Streams the file in blocks: a large CSV is never read whole.
            reader = pacsv.open_csv(handle, parse_options=options, convert_options=convert,
                                    read_options=pacsv.ReadOptions(block_size=8 << 20))
            for batch in reader:
                yield pa.Table.from_batches([batch])
        _count(f"{self._what}_malformed_csv_lines", len(malformed))


def _typed_keys(table: pa.Table) -> pa.Table:
    """Key columns as the keyset types (text; date32). Unparseable dates become null."""
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if name == "date":
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                column = pc.strptime(column, format="%Y-%m-%d", unit="s", error_is_null=True)
            if not pa.types.is_date32(column.type):
                column = pc.cast(column, pa.date32())
        elif name in KEYS and not pa.types.is_string(column.type):
            column = pc.cast(column, pa.string())
        columns[name] = column
    return pa.table(columns)


class _ReleaseFilter:
    """Which rows belong to this release, and which are inside the configured keyset."""

    def __init__(self, campaign: CampaignConfig, dates: Sequence[_dt.date]):
        self.campaign_id = campaign.campaign_id
        self.dates = pa.array(list(dates), pa.date32())
        self.banners = pa.array(list(campaign.banners))
        self.countries = pa.array(list(campaign.countries))
        self.protected = pa.array(sorted(campaign.protected_countries), pa.string())
        self.projects = pa.array(list(campaign.projects))

    def apply(self, table: pa.Table, what: str) -> pa.Table:
        def mask(expr):
            return pc.fill_null(expr, False).to_numpy(zero_copy_only=False)

        ours = mask(pc.equal(table.column("campaign_id"), self.campaign_id)) & \
            mask(pc.is_in(table.column("date"), value_set=self.dates))
        _count(f"{what}_rows_other_releases", (~ours).sum())
        known = mask(pc.is_in(table.column("banner_id"), value_set=self.banners)) & \
            mask(pc.is_in(table.column("country"), value_set=self.countries)) & \
            mask(pc.is_in(table.column("project"), value_set=self.projects))
        _count(f"{what}_rows_outside_keyset", (ours & ~known).sum())
        protected = mask(pc.is_in(table.column("country"), value_set=self.protected))
        _count(f"{what}_rows_protected_country", (ours & known & protected).sum())
        return table.filter(pa.array(ours & known & ~protected))


class ImpressionPartials(beam.DoFn):
    """Clean rows, keep this release's keys, split into blocks of k: per-key block sums."""

    def __init__(self, release_filter: _ReleaseFilter, k: int):
        self._filter = release_filter
        self._k = k

    def process(self, table: pa.Table):
        _count("impressions_rows_read", table.num_rows)
        typed = _typed_keys(table)
        clean, dropped = clean_impressions(typed, KEYS)
        for reason, n in dropped.items():
            _count(f"impressions_dropped_{reason}", n)
        clean = self._filter.apply(clean, "impressions")
        if clean.num_rows:
            partial = per_key_contribution(clean.select(KEYS), clean.column("impressions").to_numpy(),
                                           self._k, KEYS)
            yield partial.append_column("clicks", pa.array(np.zeros(partial.num_rows, dtype=np.int64)))


class ClickRows(beam.DoFn):
    """Typed click rows of this release (null user ids dropped and counted)."""

    def __init__(self, release_filter: _ReleaseFilter):
        self._filter = release_filter

    def process(self, table: pa.Table):
        _count("clicks_rows_read", table.num_rows)
        typed = _typed_keys(table)
        valid = np.ones(typed.num_rows, dtype=bool)
        for name in KEYS:
            valid &= typed.column(name).is_valid().to_numpy(zero_copy_only=False)
        _count("clicks_dropped_missing_key", (~valid).sum())
        typed = typed.filter(pa.array(valid))
        if "user_id" in typed.column_names:
            users = typed.column("user_id")
            if pa.types.is_string(users.type) or pa.types.is_large_string(users.type):
                has_user = pc.fill_null(pc.not_equal(pc.utf8_trim_whitespace(users), ""), False) \
                    .to_numpy(zero_copy_only=False)
            else:  # e.g. integer ids from Parquet: only a null is missing
                has_user = users.is_valid().to_numpy(zero_copy_only=False)
            _count("clicks_dropped_missing_user", (~has_user).sum())
            typed = typed.filter(pa.array(has_user))
        typed = self._filter.apply(typed, "clicks")
        if typed.num_rows:
            yield typed


def _row_click_partials(table: pa.Table) -> pa.Table:
    grouped = table.group_by(KEYS, use_threads=False).aggregate([([], "count_all")])
    return pa.table({**{k: grouped.column(k) for k in KEYS},
                     "impressions": pa.array(np.zeros(grouped.num_rows, dtype=np.int64)),
                     "clicks": grouped.column("count_all").cast(pa.int64())})


def _user_click_partials(partials: pa.Table) -> pa.Table:
    return pa.table({**{k: partials.column(k) for k in KEYS},
                     "impressions": pa.array(np.zeros(partials.num_rows, dtype=np.int64)),
                     "clicks": partials.column("count")})


# --------------------------------------------------------------------------- the release

def release_measures(campaign: CampaignConfig) -> list[Measure]:
    """The two measures of one release, with neighbouring relations and sensitivities stated."""
    imp, clk = campaign.impressions, campaign.clicks
    specs = campaign.noise_specs()
    k = float(imp.k)
    relation = ("(Geo, Project, k)-DP: add/remove k impressions of one (geo, project) per period"
                if imp.neighbouring == "period" else
                "(Geo, Project, Campaign, k)-DP: add/remove k impressions over the campaign")
    measures = [Measure("impressions", specs["impressions"], Sensitivities(1, k, k, k),
                        neighbouring=Neighbouring.ADD_REMOVE.value,
                        description=f"Algorithm 1, blocks of k={imp.k}; {relation}")]
    if clk.neighbouring == "row":
        sens = Sensitivities(1, 1.0, 1.0, 1.0)
        text = "Algorithm 2, row-DP: add/remove one click"
    else:
        m = clk.max_clicks_per_user
        sens = count_sensitivity(ContributionBounds(m, m, max_contributions=m))
        text = f"Algorithm 2, user-DP: add/remove one user's clicks, at most {m} per {clk.bound_per}"
    measures.append(Measure("clicks", specs["clicks"], sens, neighbouring=Neighbouring.ADD_REMOVE.value,
                            description=text))
    return measures


def release_guarantee(measures: Sequence[Measure], delta: float):
    """One (epsilon, delta) for the release: zCDP clicks converted and combined with pure DP."""
    pure = [m.noise.epsilon for m in measures if m.is_pure and m.noise.delta == 0]
    approx = [(m.noise.epsilon, m.noise.delta) for m in measures
              if not (m.is_pure and m.noise.delta == 0) and m.noise.rho is None]
    rho = sum(m.noise.rho for m in measures if m.noise.rho is not None)
    if rho:
        return combine_zcdp_and_pure(rho, pure, delta, approximate=approx)
    return sequential([(e, 0.0) for e in pure] + approx)


class CentralNoticeRelease(beam.PTransform):
    """Impression tables + click tables -> released Arrow tables for one scheduled release."""

    def __init__(self, campaign: CampaignConfig, dates: Sequence[_dt.date], release_key: ReleaseKey,
                 *, testing: bool = False, num_shards: int = 16):
        super().__init__()
        self.check_plan(campaign)
        self.campaign = campaign
        self.dates = list(dates)
        self.release_key = release_key
        self.testing = testing
        self.num_shards = num_shards
        self.measures = release_measures(campaign)

    @staticmethod
    def check_plan(campaign: CampaignConfig) -> None:
        """Refuse a campaign whose releases cannot keep its stated guarantee (before any work)."""
        if campaign.clicks.neighbouring == "user" and campaign.clicks.bound_per == "campaign" \
                and campaign.schedule == "daily":
            raise ValueError(f"campaign {campaign.campaign_id!r}: user-DP clicks bounded per campaign "
                             "need the whole campaign in one release (schedule 'campaign'); a daily "
                             "release cannot bound a user across days it does not see")

    def keyset(self) -> PublicKeyset:
        c = self.campaign
        return PublicKeyset.cross_product({
            "campaign_id": [c.campaign_id], "banner_id": list(c.banners),
            "country": list(c.released_countries()), "project": list(c.projects),
            "date": pa.array(self.dates, pa.date32())})

    def expand(self, inputs):
        impressions, clicks = inputs
        c = self.campaign
        release_filter = _ReleaseFilter(c, self.dates)
        imp = impressions | "ImpressionPartials" >> beam.ParDo(
            ImpressionPartials(release_filter, c.impressions.k)).with_output_types(pa.Table)
        click_rows = clicks | "ClickRows" >> beam.ParDo(ClickRows(release_filter)).with_output_types(pa.Table)
        if c.clicks.neighbouring == "row":
            clk = click_rows | "RowClickPartials" >> beam.Map(_row_click_partials).with_output_types(pa.Table)
        else:
            m = c.clicks.max_clicks_per_user
            bounding = BoundingConfig(unit="user_id", keys=KEYS, value=None,
                                      bounds=ContributionBounds(m, m, max_contributions=m),
                                      release_key=self.release_key, num_shards=self.num_shards)
            clk = (click_rows
                   | "BoundUsers" >> BoundedKeyPartials(bounding)
                   | "UserClickPartials" >> beam.Map(_user_click_partials).with_output_types(pa.Table))
        specs = {m.name: m.noise for m in self.measures}
        purpose = f"centralnotice/{c.campaign_id}"
        measures = [NoisyMeasure(name=f"{purpose}/impressions", partial="impressions", spec=specs["impressions"]),
                    NoisyMeasure(name=f"{purpose}/clicks", partial="clicks", spec=specs["clicks"])]
        outputs = [OutputColumn(name="impressions", measure=measures[0].name, threshold=c.impressions.release_threshold),
                   OutputColumn(name="clicks", measure=measures[1].name, threshold=c.clicks.release_threshold)]
        return ((imp, clk)
                | "Partials" >> beam.Flatten()
                | "Release" >> NoisyRelease(keys=KEYS, measures=measures, outputs=outputs,
                                            partial_types={"impressions": pa.int64(), "clicks": pa.int64()},
                                            release_key=self.release_key, keyset=self.keyset(),
                                            testing=self.testing, num_shards=self.num_shards,
                                            threshold_mode="value"))


def _empty_output() -> pa.Table:
    return pa.table({"campaign_id": pa.array([], pa.string()), "banner_id": pa.array([], pa.string()),
                     "country": pa.array([], pa.string()), "project": pa.array([], pa.string()),
                     "date": pa.array([], pa.date32()), "impressions": pa.array([], pa.int64()),
                     "clicks": pa.array([], pa.int64())})


def encode_output(tables: Sequence[pa.Table], fmt: str) -> bytes:
    """The released rows sorted by key, as Parquet or CSV bytes (deterministic)."""
    table = pa.concat_tables(list(tables) + [_empty_output()], promote_options="permissive") \
        .select(KEYS + ["impressions", "clicks"]) \
        .sort_by([(k, "ascending") for k in KEYS])
    sink = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, sink, compression="zstd")
    else:
        pacsv.write_csv(table, sink)
    return sink.getvalue()


class WriteOutput(beam.DoFn):
    """Write all released rows as one file: a temporary object, then the final name."""

    def __init__(self, path: str, fmt: str):
        self._path = path
        self._fmt = fmt

    def process(self, tables):
        data = encode_output(tables, self._fmt)
        temporary = self._path + ".incomplete"
        with FileSystems.create(temporary) as handle:
            handle.write(data)
        if FileSystems.exists(self._path):  # a re-run rewrites the same bytes
            FileSystems.delete([self._path])
        FileSystems.rename([temporary], [self._path])
        yield self._path


# --------------------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.centralnotice", description=__doc__.split("\n\n")[0] +
        " Other arguments go to Beam (e.g. --runner FlinkRunner; default: the DirectRunner's "
        "in-process engine).", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", help="campaign configuration JSON (local or gs://)")
    parser.add_argument("--impressions", help="impressions files: path, glob or directory (local or gs://)")
    parser.add_argument("--clicks", help="click files: path, glob or directory (local or gs://)")
    parser.add_argument("--input-format", choices=["parquet", "csv"], help="default: from the file names")
    parser.add_argument("--release", help="release id, CAMPAIGN/DATE (daily) or "
                                          "CAMPAIGN/START_END (per campaign); see --list-releases")
    parser.add_argument("--campaign", help="with --date: the release of this campaign and day")
    parser.add_argument("--date", help="with --campaign (YYYY-MM-DD)")
    parser.add_argument("--list-releases", action="store_true", help="print the schedule and exit")
    parser.add_argument("--output", help="output directory (local or gs://); the release goes to "
                                         "OUTPUT/<campaign>/<period>/")
    parser.add_argument("--output-format", choices=["parquet", "csv"], default="parquet")
    parser.add_argument("--ledger", help="budget ledger file (local or gs://)")
    parser.add_argument("--key-store", help="where release keys are kept (local dir or gs:// prefix)")
    parser.add_argument("--new-release", action="store_true",
                        help="input changed since this release was made: charge a new version with a fresh key")
    parser.add_argument("--testing-seed", type=int, help="NOT A RELEASE: non-secret key from a seed, "
                                                         "no ledger (for tests and demos of the mechanics)")
    parser.add_argument("--num-shards", type=int, default=16)
    parser.add_argument("--demo", action="store_true",
                        help="release every campaign's first scheduled release of the bundled sample "
                             "data (ledger and keys under --output)")
    return parser


def _select_release(config, args):
    if args.release:
        for campaign in config.campaigns:
            for release in campaign.releases():
                if release.release_id == args.release:
                    return campaign, release
        raise ValueError(f"--release {args.release!r} is not scheduled by {config.source} "
                         "(see --list-releases)")
    if args.campaign and args.date:
        campaign = config.campaign(args.campaign)
        day = _dt.date.fromisoformat(args.date)
        for release in campaign.releases():
            if day in release.dates:
                return campaign, release
        raise ValueError(f"--date {args.date} is outside campaign {args.campaign!r}")
    raise ValueError("name the release: --release ID, or --campaign and --date")


def run_release(args, beam_argv, campaign: CampaignConfig, release, config) -> dict:
    """Check inputs, charge the ledger, run the pipeline, write the output and the report."""
    CentralNoticeRelease.check_plan(campaign)
    check_positive_int(args.num_shards, "--num-shards")
    imp_paths, clk_paths = expand_paths(args.impressions), expand_paths(args.clicks)
    imp_fmt = _format_of(imp_paths[0] if imp_paths else "", args.input_format)
    clk_fmt = _format_of(clk_paths[0] if clk_paths else "", args.input_format)
    check_input(imp_paths, imp_fmt, KEYS + ["impressions"], "impressions")
    need_user = campaign.clicks.neighbouring == "user"
    check_input(clk_paths, clk_fmt, KEYS + (["user_id"] if need_user else []), "clicks")
    out_dir = "/".join([args.output.rstrip("/"), *release.release_id.split("/")])
    out_path = f"{out_dir}/centralnotice.{args.output_format}"
    options = build_options(beam_argv)  # Beam option errors too come before the ledger charges
    all_options = options.get_all_options()
    translate_only = bool(all_options.get("dry_run")) or bool(all_options.get("template_location"))
    if translate_only and args.testing_seed is None:
        raise ValueError("--dry_run and --template_location only translate the job: give --testing-seed. "
                         "A release is never a template: a template would hold one release's key and "
                         "could be run again on other data without a charge")
    ledger = reservation = None
    if args.testing_seed is not None:
        key, testing_note = ReleaseKey.for_testing(args.testing_seed), "NOT A RELEASE (testing seed)"
    else:
        if not (args.ledger and args.key_store):
            raise ValueError("a release needs --ledger and --key-store (or --testing-seed for a non-release)")
        ledger = BudgetLedger(args.ledger, args.key_store, accountant=config.accountant)
        digest = input_digest(imp_paths + clk_paths, config={"campaign": _campaign_raw(config, campaign),
                                                              "release": release.release_id})
        reservation = ledger.begin(release.release_id, campaign.charges(), digest,
                                   campaign=campaign.campaign_id, periods=list(release.periods),
                                   budget=campaign.campaign_budget(), new_release=args.new_release)
        key, testing_note = reservation.key, None
        if reservation.version > 1:  # a new version never overwrites the files of an earlier one
            out_dir = f"{out_dir}/v{reservation.version}"
            out_path = f"{out_dir}/centralnotice.{args.output_format}"
    transform = CentralNoticeRelease(campaign, release.dates, key, num_shards=args.num_shards)
    with beam.Pipeline(options=options) as p:
        impressions = (p | "ImpressionFiles" >> beam.Create(imp_paths) | "ReshuffleImp" >> beam.Reshuffle()
                       | "ReadImpressions" >> beam.ParDo(ReadTables(imp_fmt, KEYS + ["impressions"], "impressions"))
                       .with_output_types(pa.Table))
        click_columns = KEYS + (["user_id"] if need_user else [])
        clicks = (p | "ClickFiles" >> beam.Create(clk_paths) | "ReshuffleClk" >> beam.Reshuffle()
                  | "ReadClicks" >> beam.ParDo(ReadTables(clk_fmt, click_columns, "clicks"))
                  .with_output_types(pa.Table))
        ((impressions, clicks) | "Release" >> transform
         | "Gather" >> beam.combiners.ToList()
         | "Write" >> beam.ParDo(WriteOutput(out_path, args.output_format)))
    if translate_only:  # nothing ran: no output to report on
        return {"release_id": release.release_id, "status": "translated only (dry run or template)",
                "output": None}
    if ledger is not None:
        ledger.commit(reservation, out_path)
    report = release_report(campaign, release, transform.measures, out_path, args.output_format,
                            ledger, reservation, testing_note)
    _write_text(f"{out_dir}/report.json", json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")
    _write_text(f"{out_dir}/report.txt", format_report(report))
    return report


def _campaign_raw(config, campaign):
    for raw in config.raw.get("campaigns", []):
        if raw.get("campaign_id") == campaign.campaign_id:
            return {"campaign": raw, "protected_countries": sorted(campaign.protected_countries)}
    return {}


def _write_text(path: str, text: str) -> None:
    with FileSystems.create(path) as handle:
        handle.write(text.encode("utf-8"))


def release_report(campaign, release, measures, out_path, fmt, ledger, reservation,
                   testing_note) -> dict:
    """Parameters, budget spent and remaining, keys released and suppressed (all public)."""
    with FileSystems.open(out_path) as handle:
        data = handle.read()
    table = pq.read_table(io.BytesIO(data)) if fmt == "parquet" else \
        pacsv.read_csv(io.BytesIO(data))
    keyset_size = campaign.keyset_size(release.dates)
    delta = max(m.noise.delta for m in measures) or 1e-9
    guarantee = release_guarantee(measures, delta)
    report = {
        "release_id": release.release_id if reservation is None else reservation.versioned_id,
        "campaign_id": campaign.campaign_id, "dates": [d.isoformat() for d in release.dates],
        "output": out_path, "status": testing_note or "released",
        "measures": [m.to_dict() for m in measures],
        "release_guarantee": {"epsilon": guarantee.epsilon, "delta": guarantee.delta},
        "thresholds": {"impressions": campaign.impressions.release_threshold,
                       "clicks": campaign.clicks.release_threshold},
        "keys": {"keyset": keyset_size, "released": table.num_rows,
                 "suppressed": keyset_size - table.num_rows,
                 "impressions_suppressed": int(table.column("impressions").null_count),
                 "clicks_suppressed": int(table.column("clicks").null_count)},
        "protected_countries_excluded": sorted(set(campaign.countries) & set(campaign.protected_countries)),
    }
    if ledger is not None:
        budget = campaign.campaign_budget()
        spent = ledger.spent(campaign.campaign_id)
        report["budget"] = {
            "accountant": ledger.accountant_name,
            "campaign_total": budget.total.to_json(),
            "campaign_spent": {"epsilon": spent.epsilon, "delta": spent.delta},
            "campaign_remaining": {"epsilon": max(budget.total.epsilon - spent.epsilon, 0.0),
                                   "delta": max(budget.total.delta - spent.delta, 0.0)},
            "key_fingerprint": reservation.key_ref.fingerprint, "resumed_or_rerun": bool(reservation.resumed),
        }
        if budget.per_period is not None:
            report["budget"]["per_period"] = budget.per_period.to_json()
    return report


def format_report(report: dict) -> str:
    lines = [f"CentralNotice release {report['release_id']} ({report['status']})",
             f"  dates: {', '.join(report['dates'])}", f"  output: {report['output']}",
             f"  guarantee of this release: epsilon={report['release_guarantee']['epsilon']:.4g}, "
             f"delta={report['release_guarantee']['delta']:.3g}"]
    for m in report["measures"]:
        lines.append(f"  {m['name']}: {m['mechanism']}, scale {m['noise_scale']:.4g}, std {m['std']:.4g}, "
                     f"95% +/-{m['ci95_halfwidth']:.4g}; {m['description']}")
    keys = report["keys"]
    lines.append(f"  keys: {keys['released']} released of {keys['keyset']} "
                 f"({keys['suppressed']} suppressed; impressions suppressed {keys['impressions_suppressed']}, "
                 f"clicks suppressed {keys['clicks_suppressed']})")
    if "budget" in report:
        b = report["budget"]
        lines.append(f"  campaign budget ({b['accountant']}): spent epsilon={b['campaign_spent']['epsilon']:.4g} "
                     f"of {b['campaign_total']['epsilon']:g}, remaining {b['campaign_remaining']['epsilon']:.4g}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))
    args, beam_argv = build_parser().parse_known_args(argv)
    try:
        if args.demo:
            if not args.output:
                raise ValueError("--demo needs --output")
            args.config = args.config or os.path.join(SAMPLE_DIR, "campaigns.json")
            args.impressions = args.impressions or os.path.join(SAMPLE_DIR, "impressions.csv")
            args.clicks = args.clicks or os.path.join(SAMPLE_DIR, "clicks.csv")
            args.ledger = args.ledger or os.path.join(args.output, "ledger.json")
            args.key_store = args.key_store or os.path.join(args.output, "keys")
        if not args.config:
            raise ValueError("--config is required")
        config = load_config(args.config)
        if args.list_releases:
            for campaign in config.campaigns:
                for release in campaign.releases():
                    print(release.release_id)
            return 0
        for name in ("impressions", "clicks", "output"):
            if not getattr(args, name):
                raise ValueError(f"--{name} is required")
        if args.demo:
            targets = [(c, c.releases()[0]) for c in config.campaigns]
        else:
            targets = [_select_release(config, args)]
        for campaign, release in targets:
            report = run_release(args, beam_argv, campaign, release, config)
            print(format_report(report) if report.get("output") else
                  f"CentralNotice release {report['release_id']}: {report['status']}\n", end="")
    except (ConfigError, LedgerError, ValueError, KeyError, FileNotFoundError) as err:
        hint = " (on the command line: --new-release)" if isinstance(err, ChangedInputError) else ""
        print(f"centralnotice: error: {err}{hint}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
