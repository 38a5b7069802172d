"""CentralNotice banner statistics, released under differential privacy.

    python -m pipelines.centralnotice --config campaigns.json --impressions 'imp/*.parquet' \\
        --clicks 'clicks/*.parquet' --release C2026_en/2026-11-26 --output gs://bucket/releases \\
        --ledger gs://private/ledger.json --key_store gs://private/keys [Beam options]

One run makes one scheduled release (a campaign and a day, or a whole campaign; see the
configuration's ``schedule`` and ``--list_releases``), published by the release layer
(:mod:`pipelines.release`) as ``<output>/<campaign>/<period>/v<version>/centralnotice.parquet``
(or ``.csv``): one row per released key -- campaign_id, banner_id, country, project, date,
impressions, clicks, each value followed by its error columns ``<value>_ci95_low``,
``<value>_ci95_high`` and ``<value>_std`` (the noise's 95% interval around the value and its
standard deviation, from the measure's stated noise: :mod:`transforms.error_columns`; null where
the value is) -- sorted by the key columns, with ``RELEASE.json`` beside it.

Mechanisms (seed 001, the Wikimedia CentralNotice feasibility report):

* impressions, Algorithm 1: each pre-aggregated row is split into blocks of k (compactly:
  full-block count and remainder, never one element per block); per key, the sum of the blocks
  clamped to [0, k] plus noise calibrated to sensitivity k -- (Geo, Project, k)-DP per period,
  or (Geo, Project, Campaign, k)-DP when the campaign's budget is shared by its days.
* clicks, Algorithm 2: per key, the count of click rows plus noise of sensitivity 1 (row-DP), or
  after bounding each user to m clicks per period or per campaign (user-DP, sensitivity m).
  Laplace kinds under pure DP, or Gaussian kinds under zCDP; the release states one guarantee
  composed by the configuration's accountant (accounting.guarantee). With a campaign's
  ``privacy.target`` both measures are calibrated together to it by that accountant, and the
  release states the target and the multiplier (config.py, "A joint target").
* Keys: the configured keyset (banners x countries x projects x dates), minus the country
  protection list; nothing else can appear. A measure whose noisy value is not above its release
  threshold is suppressed (null: "suppressed", not zero); a key with both suppressed is not
  released.

Row rules (counted for the operator, never released; see pipelines.release.counters):
impression rows with missing, negative, fractional or unparseable counts are dropped (see
``pipelines.centralnotice.impressions``); duplicate impression rows of a key are summed; click rows
without a user id (user-DP) are dropped; rows whose key does not parse (e.g. a date not in
YYYY-MM-DD) are dropped; rows of other campaigns or dates belong to other releases and are
skipped; rows whose banner, country or project is outside the configuration are dropped; rows of
a protected country are excluded; malformed CSV lines are dropped. Kept impression rows are
also counted per country and project (``impressions.coverage.<column>.<value>``) for the
catalog's coverage alarms (``python -m pipelines.catalog --operator``).
"""
from __future__ import annotations

import datetime as _dt
import os
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from pipelines.centralnotice.config import (KEY_COLUMNS, KEY_SCHEMA, CampaignConfig,
                                            CentralNoticeConfig, ConfigError, load_config)
from pipelines.centralnotice.impressions import clean_impressions, per_key_contribution
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, Prepared,
                               ReleaseContext, ReleaseOptions, ReleaseRefused, cli)
from pipelines.release import run as run_release
from transforms import error_columns
from transforms.bounding_stage import BoundedKeyPartials, BoundingConfig
from transforms.counting import Counted, CountingDoFn
from transforms.keyset import KEYSET_POSITION, PublicKeyset
from transforms.release import NoisedPartial, NoisyRelease, OutputColumn

NAME = "centralnotice"
SAMPLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_data", "centralnotice")
KEYS = list(KEY_COLUMNS)
#: The released values, each followed by its error columns (transforms.error_columns).
VALUES = ("impressions", "clicks")
OUTPUT_SCHEMA = pa.schema(list(KEY_SCHEMA) + [
    column for value in VALUES
    for column in [(value, pa.int64())] + [(name, pa.float64()) for name in error_columns.names(value)]])


# --------------------------------------------------------------------------- row handling

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

    def apply(self, table: pa.Table, counters) -> pa.Table:
        def mask(expr):
            return pc.fill_null(expr, False).to_numpy(zero_copy_only=False)

        ours = mask(pc.equal(table.column("campaign_id"), self.campaign_id)) & \
            mask(pc.is_in(table.column("date"), value_set=self.dates))
        counters.skipped("other_release", (~ours).sum())
        known = mask(pc.is_in(table.column("banner_id"), value_set=self.banners)) & \
            mask(pc.is_in(table.column("country"), value_set=self.countries)) & \
            mask(pc.is_in(table.column("project"), value_set=self.projects))
        counters.dropped("outside_keyset", (ours & ~known).sum())
        protected = mask(pc.is_in(table.column("country"), value_set=self.protected))
        counters.excluded("protected_country", (ours & known & protected).sum())
        return table.filter(pa.array(ours & known & ~protected))


def _count_coverage(table: pa.Table, counters) -> None:
    """Kept impression rows per country and project, as operator counters
    ``impressions.coverage.<column>.<value>`` (the catalog's coverage alarms: a country whose rows
    stop arriving). Counted after the keyset filter: only configured values name a counter."""
    for column in ("country", "project"):
        for item in pc.value_counts(table.column(column)).to_pylist():
            counters.other(f"coverage.{column}.{item['values']}", item["counts"])


class ImpressionPartials(CountingDoFn):
    """Clean rows, keep this release's keys, split into blocks of k: per-key block sums."""

    def __init__(self, release_filter: _ReleaseFilter, k: int, counters):
        self._filter = release_filter
        self._k = k
        self._counters = counters

    def process(self, table: pa.Table):
        typed = _typed_keys(table)
        clean, dropped = clean_impressions(typed, KEYS)
        for reason, n in dropped.items():
            self._counters.dropped(reason, n)
        clean = self._filter.apply(clean, self._counters)
        _count_coverage(clean, self._counters)
        if clean.num_rows:
            partial = per_key_contribution(clean.select(KEYS), clean.column("impressions").to_numpy(),
                                           self._k, KEYS)
            yield partial.append_column("clicks", pa.array(np.zeros(partial.num_rows, dtype=np.int64)))


class ClickRows(CountingDoFn):
    """Typed click rows of this release (null user ids dropped and counted)."""

    def __init__(self, release_filter: _ReleaseFilter, counters):
        self._filter = release_filter
        self._counters = counters

    def process(self, table: pa.Table):
        typed = _typed_keys(table)
        valid = np.ones(typed.num_rows, dtype=bool)
        for name in KEYS:
            valid &= typed.column(name).is_valid().to_numpy(zero_copy_only=False)
        self._counters.dropped("missing_or_unparseable_key", (~valid).sum())
        typed = typed.filter(pa.array(valid))
        if "user_id" in typed.column_names:
            users = typed.column("user_id")
            if pa.types.is_string(users.type) or pa.types.is_large_string(users.type):
                has_user = pc.fill_null(pc.not_equal(pc.utf8_trim_whitespace(users), ""), False) \
                    .to_numpy(zero_copy_only=False)
            else:  # e.g. integer ids from Parquet: only a null is missing
                has_user = users.is_valid().to_numpy(zero_copy_only=False)
            self._counters.dropped("missing_user", (~has_user).sum())
            typed = typed.filter(pa.array(has_user))
        typed = self._filter.apply(typed, self._counters)
        if typed.num_rows:
            yield typed


def _row_click_partials(table: pa.Table) -> pa.Table:
    grouped = table.group_by(KEYS, use_threads=False).aggregate([([], "count_all")])
    return pa.table({**{k: grouped.column(k) for k in KEYS},
                     "impressions": pa.array(np.zeros(grouped.num_rows, dtype=np.int64)),
                     "clicks": grouped.column("count_all").cast(pa.int64())})


def _user_click_partials(partials: pa.Table) -> pa.Table:
    """Bounded click partials, keyed by the key's position in the public keyset (the bounding
    was given the keyset: rows carry one int64 instead of five key columns through the shuffle)."""
    return pa.table({KEYSET_POSITION: partials.column(KEYSET_POSITION),
                     "impressions": pa.array(np.zeros(partials.num_rows, dtype=np.int64)),
                     "clicks": partials.column("count")})



# --------------------------------------------------------------------------- the release transform

class CentralNoticeRelease(beam.PTransform):
    """Impression tables + click tables -> released Arrow tables for one scheduled release."""

    def __init__(self, campaign: CampaignConfig, dates: Sequence[_dt.date], release_key: ReleaseKey,
                 *, impressions_counters, clicks_counters, num_shards: int = 16):
        super().__init__()
        self.check_plan(campaign)
        self.campaign = campaign
        self.dates = list(dates)
        self.release_key = release_key
        self.num_shards = num_shards
        self.measures = campaign.measures()
        self._counters = (impressions_counters, clicks_counters)

    @staticmethod
    def check_plan(campaign: CampaignConfig) -> None:
        """Refuse a campaign whose releases cannot keep its stated guarantee (before any work)."""
        if campaign.clicks.neighbouring == "user" and campaign.clicks.bound_per == "campaign" \
                and campaign.schedule == "daily":
            raise ValueError(f"campaign {campaign.campaign_id!r}: user-DP clicks bounded per campaign "
                             "need the whole campaign in one release (schedule 'campaign'); a daily "
                             "release cannot bound a user across days it does not see")

    def keyset(self) -> PublicKeyset:
        return self.campaign.public_keyset(self.dates)

    def expand(self, inputs):
        impressions, clicks = inputs
        c = self.campaign
        keyset = self.keyset()
        release_filter = _ReleaseFilter(c, self.dates)
        imp = impressions | "ImpressionPartials" >> Counted(
            ImpressionPartials(release_filter, c.impressions.k, self._counters[0]),
            output_type=pa.Table)
        click_rows = clicks | "ClickRows" >> Counted(
            ClickRows(release_filter, self._counters[1]), output_type=pa.Table)
        if c.clicks.neighbouring == "row":
            clk = click_rows | "RowClickPartials" >> beam.Map(_row_click_partials).with_output_types(pa.Table)
        else:
            m = c.clicks.max_clicks_per_user
            # The release filter keeps exactly the keyset's rows; given the keyset, bounding
            # keys its rows by keyset position (the same rows are kept: priorities are of the
            # key's values).
            bounding = BoundingConfig(unit="user_id", keys=KEYS, value=None,
                                      bounds=ContributionBounds(
                                          max_partitions=m, max_contributions_per_partition=m,
                                          max_contributions=m),
                                      release_key=self.release_key, keyset=keyset,
                                      num_shards=self.num_shards)
            clk = (click_rows
                   | "BoundUsers" >> BoundedKeyPartials(bounding, by_position=True)
                   | "UserClickPartials" >> beam.Map(_user_click_partials).with_output_types(pa.Table))
        specs = {m.name: m.noise for m in self.measures}
        purpose = f"centralnotice/{c.campaign_id}"
        measures = [NoisedPartial(name=f"{purpose}/impressions", partial="impressions",
                                  spec=specs["impressions"]),
                    NoisedPartial(name=f"{purpose}/clicks", partial="clicks", spec=specs["clicks"])]
        outputs = []
        for value, measure, threshold in zip(VALUES, measures, (c.impressions.release_threshold,
                                                                c.clicks.release_threshold)):
            outputs.append(OutputColumn(name=value, measure=measure.name, threshold=threshold))
            outputs += error_columns.output_columns(outputs[-1], error_columns.NoiseError.of(measure.spec))
        # Both sides keyed by keyset position before they meet: the runner may hold a side
        # whole before the Flatten, and a position is 8 bytes where the key columns are ~60.
        imp = imp | "ImpressionPositions" >> beam.Map(keyset.keyed_by_position).with_output_types(pa.Table)
        clk = clk | "ClickPositions" >> beam.Map(keyset.keyed_by_position).with_output_types(pa.Table)
        return ((imp, clk)
                | "Partials" >> beam.Flatten()
                | "Release" >> NoisyRelease(keys=KEYS, measures=measures, outputs=outputs,
                                            partial_types={"impressions": pa.int64(), "clicks": pa.int64()},
                                            release_key=self.release_key, keyset=keyset,
                                            num_shards=self.num_shards,
                                            threshold_mode="value"))




# --------------------------------------------------------------------------- the job

@dataclass(frozen=True, kw_only=True)
class CentralNoticeRequest:
    """One CentralNotice run (the CLI flags are these fields)."""

    config: str = field(metadata={"help": "campaign configuration JSON (local or gs://); schema: "
                                          "pipelines/centralnotice/config.py"})
    impressions: tuple = field(default=(), metadata={
        "help": "impressions files: paths, globs or folders, comma-separated (local or gs://)"})
    clicks: tuple = field(default=(), metadata={
        "help": "click files: paths, globs or folders, comma-separated (local or gs://)"})
    release: Optional[str] = field(default=None, metadata={
        "help": "release id, CAMPAIGN/DATE (daily) or CAMPAIGN/START_END (per campaign); see "
                "--list_releases"})
    campaign: Optional[str] = field(default=None, metadata={"help": "with --date: that release"})
    date: Optional[str] = field(default=None, metadata={"help": "with --campaign (YYYY-MM-DD)"})
    first_releases: bool = field(default=False, metadata={
        "help": "make every campaign's first scheduled release in one run"})
    demo: bool = field(default=False, metadata={
        "help": "the bundled sample: every campaign's first release, with the ledger, keys and "
                "reports under --output and the releases under OUTPUT/releases"})
    list_releases: bool = field(default=False, metadata={
        "help": "print the schedule of --config and exit"})
    input_format: Optional[str] = field(default=None, metadata={
        "help": "csv or parquet (default: from the file names)", "choices": ["csv", "parquet"]})
    output_format: str = field(default="parquet", metadata={"choices": ["parquet", "csv"],
                                                           "help": "released file format"})
    num_shards: int = field(default=16, metadata={"help": "key shards of the release stage"})
    options: ReleaseOptions = field(metadata={"cli": False})


@dataclass(frozen=True, kw_only=True)
class CentralNoticePrepared(Prepared):
    """The configuration, read once per run, and the scheduled releases the request names."""

    config: CentralNoticeConfig
    targets: tuple  # ((CampaignConfig, ScheduledRelease), ...) in the request's order

    def target(self, release_id: str):
        return next((c, r) for c, r in self.targets if r.release_id == release_id)


def _output_spec(request, campaign: CampaignConfig) -> OutputSpec:
    """The released table, with each value's error statement (its noise spec's std and 95%
    interval: public, the same for every key of the release)."""
    specs = campaign.noise_specs()
    errors = {value: error_columns.NoiseError.of(specs[value]).describe(
        value, f"the {specs[value].kind.value} noise of the {value} measure")
        for value in VALUES}
    return OutputSpec(name=f"centralnotice.{request.output_format}", sort_by=KEYS,
                      schema=OUTPUT_SCHEMA, noisy=list(VALUES), errors=errors,
                      description="one row per released key; null = suppressed by the release "
                                  "threshold (not zero), and so are its error columns")


def _targets(request, config: CentralNoticeConfig) -> list:
    if request.first_releases or request.demo:
        return [(c, c.releases()[0]) for c in config.campaigns]
    if request.release:
        for campaign in config.campaigns:
            for release in campaign.releases():
                if release.release_id == request.release:
                    return [(campaign, release)]
        raise ReleaseRefused(f"--release {request.release!r} is not scheduled by "
                             f"{config.source} (see --list_releases)")
    if request.campaign and request.date:
        try:
            campaign = config.campaign(request.campaign)
            day = _dt.date.fromisoformat(request.date)
        except (KeyError, ValueError) as err:
            raise ReleaseRefused(f"--campaign/--date: {err}")
        for release in campaign.releases():
            if day in release.dates:
                return [(campaign, release)]
        raise ReleaseRefused(f"--date {request.date} is outside campaign {request.campaign!r}")
    raise ReleaseRefused("name the release: --release ID, or --campaign and --date "
                         "(--list_releases shows the schedule)")


class CentralNoticeJob(Job):
    name = NAME
    request_type = CentralNoticeRequest
    description = __doc__.split("\n\n")[0]

    def prepare(self, request) -> CentralNoticePrepared:
        if request.num_shards < 1:
            raise ReleaseRefused("--num_shards must be >= 1")
        try:
            config = load_config(request.config)
        except ConfigError as err:
            raise ReleaseRefused(str(err))
        targets = _targets(request, config)
        for campaign, _ in targets:
            try:
                CentralNoticeRelease.check_plan(campaign)
            except ValueError as err:
                raise ReleaseRefused(str(err))
        return CentralNoticePrepared(request=request, config=config, targets=tuple(targets))

    def check(self, prepared: CentralNoticePrepared) -> None:
        if not prepared.request.impressions or not prepared.request.clicks:
            raise ReleaseRefused("--impressions and --clicks are required")

    def inputs(self, prepared: CentralNoticePrepared):
        request = prepared.request
        user_dp = any(c.clicks.neighbouring == "user" for c, _ in prepared.targets)
        keys = {f.name: "date" if pa.types.is_date(f.type) else "text" for f in KEY_SCHEMA}
        clicks = dict(keys, **({"user_id": "id"} if user_dp else {}))
        return [InputSpec(name="impressions", paths=request.impressions, format=request.input_format,
                          columns=dict(keys, impressions="number"), flag="--impressions"),
                InputSpec(name="clicks", paths=request.clicks, format=request.input_format,
                          columns=clicks, flag="--clicks")]

    def plan(self, prepared: CentralNoticePrepared):
        config = prepared.config
        return [PlannedRelease(
            release_id=release.release_id, budget=campaign.shared_budget(config.accountant),
            scopes=campaign.scopes(release), outputs=[_output_spec(prepared.request, campaign)],
            config=_release_config(config, campaign), parameters=_parameters(campaign, release),
            guarantee_covers=_covers(campaign, campaign.guarantee_scopes(release)))
            for campaign, release in prepared.targets]

    def build(self, pipeline, prepared: CentralNoticePrepared, inputs, release: ReleaseContext):
        campaign, scheduled = prepared.target(release.release_id)
        transform = CentralNoticeRelease(
            campaign, scheduled.dates, release.key,
            impressions_counters=release.counters(NAME, "impressions"),
            clicks_counters=release.counters(NAME, "clicks"),
            num_shards=prepared.request.num_shards)
        released = (inputs["impressions"], inputs["clicks"]) | release.label("Release") >> transform
        return {release.planned.outputs[0].name: released}

    def public_summary(self, prepared: CentralNoticePrepared, planned, tables):
        table = next(iter(tables.values()))
        size = planned.parameters["keyset"]["size"]
        campaign, release = prepared.target(planned.release_id)
        return {"keys": {"keyset": size, "released": table.num_rows,
                         "not_released": size - table.num_rows,
                         "impressions_suppressed": int(table.column("impressions").null_count),
                         "clicks_suppressed": int(table.column("clicks").null_count),
                         "thresholds": {"impressions": campaign.impressions.release_threshold,
                                        "clicks": campaign.clicks.release_threshold}},
                "guarantee_scopes": campaign.guarantee_scopes(release)}

    def report_lines(self, summary):
        lines = []
        keys = summary.get("keys")
        if keys:
            thresholds = keys.get("thresholds", {})

            def column(name):
                limit = f" (threshold {thresholds[name]:g})" if name in thresholds else ""
                return f"{name} {keys[name + '_suppressed']} of {keys['released']}{limit}"

            lines.append(
                f"  keys: {keys['released']} released of {keys['keyset']} ({keys['not_released']} "
                f"not released: both values below their thresholds); suppressed values (null) per "
                f"column: {column('impressions')}, {column('clicks')}")
            if keys["impressions_suppressed"] or keys["clicks_suppressed"]:
                lines.append("  a null value means SUPPRESSED, not zero: its noisy value was not above the "
                             "column's release threshold in the campaign configuration (thresholds keep "
                             "values of keys without data from being published by noise alone; they are "
                             "post-processing and do not change the privacy guarantee)")
        for scope in summary.get("guarantee_scopes", ()):
            bound = scope["budget"]
            where = f" [{', '.join(scope['ledger_scopes'])}]" if scope["ledger_scopes"] else ""
            limit = f" <= epsilon {bound['epsilon']:g}, delta {bound['delta']:g}" if bound else ""
            lines.append(f"  scope {scope['scope']}{limit}{where}: {scope['means']}")
        return lines


def _release_config(config: CentralNoticeConfig, campaign: CampaignConfig) -> dict:
    """What shapes one release (hashed into the digest its keys are bound to)."""
    raw = next((r for r in config.raw.get("campaigns", [])
                if r.get("campaign_id") == campaign.campaign_id), {})
    return {"campaign": raw, "protected_countries": sorted(campaign.protected_countries),
            "unit_budget_per_period": config.raw.get("unit_budget_per_period"),
            "accountant": config.accountant}


def _parameters(campaign: CampaignConfig, release) -> dict:
    """The public parameters stated in the release's marker."""
    return {"campaign_id": campaign.campaign_id,
            "dates": [d.isoformat() for d in release.dates],
            "impressions": {"k": campaign.impressions.k,
                            "release_threshold": campaign.impressions.release_threshold,
                            "neighbouring": campaign.impressions.neighbouring},
            "clicks": {"neighbouring": campaign.clicks.neighbouring,
                       "max_clicks_per_user": campaign.clicks.max_clicks_per_user,
                       "bound_per": campaign.clicks.bound_per,
                       "release_threshold": campaign.clicks.release_threshold},
            "keyset": {"banners": list(campaign.banners),
                       "countries": list(campaign.released_countries()),
                       "projects": list(campaign.projects),
                       "size": campaign.keyset_size(release.dates)},
            "protected_countries_excluded": sorted(
                set(campaign.countries) & set(campaign.protected_countries)),
            **({} if campaign.target is None else {"target": _target(campaign)})}


def _target(campaign: CampaignConfig) -> dict:
    """A release calibrated to a target: the target, the accountant that calibrated it, the
    common multiplier and the weights (public: the configuration's)."""
    joint = campaign.joint_calibration()
    parts = {"impressions": campaign.impressions, "clicks": campaign.clicks}
    return {"epsilon": campaign.target.epsilon, "delta": campaign.target.delta,
            "accountant": joint.accountant, "multiplier": joint.multiplier,
            "composed": {"epsilon": joint.stated.epsilon, "delta": joint.stated.delta,
                         "accountant": joint.stated.accountant},
            "weights": {name: {"epsilon": p.budget.epsilon,
                               "delta": p.budget.delta if p.noise.is_gaussian else None}
                        for name, p in parts.items()}}


def _covers(campaign: CampaignConfig, scopes) -> str:
    """The guarantee's one-line statement of the per-person scopes it is held to."""
    held = [s["scope"] for s in scopes if s["configured"]]
    missing = [s["scope"] for s in scopes if not s["configured"]]
    joint = "" if campaign.target is None else (
        f" (calibrated jointly to the target epsilon={campaign.target.epsilon:g}, "
        f"delta={campaign.target.delta:g} by the {campaign.accountant} accountant)")
    return ("one release: impressions and clicks of the release's keys, composed" + joint
            + "; the ledger bounds one person's loss per " + ", per ".join(held)
            + ("; NOT configured: " + ", ".join(missing) if missing else ""))


JOB = CentralNoticeJob()


def run(request: CentralNoticeRequest):
    """Make the release(s) a request asks for (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def _flag_value(argv, name):
    for i, token in enumerate(argv):
        for spelling in (f"--{name}", f"--{name.replace('_', '-')}"):
            if token == spelling and i + 1 < len(argv):
                return argv[i + 1]
            if token.startswith(spelling + "="):
                return token.split("=", 1)[1]
    return None


def demo_arguments(argv: Sequence[str]) -> list[str]:
    """``--demo --output OUT``: the bundled sample, every campaign's first release, with the
    ledger, keys and reports under OUT and the releases under OUT/releases."""
    argv = [a for a in argv if a != "--demo"]
    out = _flag_value(argv, "output")
    if not out:
        raise ReleaseRefused("--demo needs --output")
    argv = [a for i, a in enumerate(argv) if a not in ("--output",) and not a.startswith("--output=")
            and not (i > 0 and argv[i - 1] == "--output")]
    defaults = {"config": os.path.join(SAMPLE_DIR, "campaigns.json"),
                "impressions": os.path.join(SAMPLE_DIR, "impressions.csv"),
                "clicks": os.path.join(SAMPLE_DIR, "clicks.csv"),
                "ledger": os.path.join(out, "ledger.json"), "key_store": os.path.join(out, "keys"),
                "report_dir": os.path.join(out, "reports")}
    for name, value in defaults.items():
        if _flag_value(argv, name) is None:
            argv += [f"--{name}", value]
    return argv + ["--output", os.path.join(out, "releases"), "--first_releases"]


def _cell(value) -> str:
    return "null" if value is None else str(value)


def demo_summary(out: str, rows: int = 8) -> str:
    """What ``--demo`` ends with: the first rows of a released table (one with a suppressed value,
    if any) and where everything was written."""
    import glob

    from pipelines.release.arrow_files import read_table

    tables = sorted(glob.glob(os.path.join(out, "releases", "*", "*", "v*", "centralnotice.parquet")))
    if not tables:
        return f"nothing was published under {out}/releases"
    read = [(path, read_table(path)) for path in tables]
    path, table = next(((p, t) for p, t in read if t.column("clicks").null_count
                        or t.column("impressions").null_count), read[0])
    shown = table.slice(0, rows).to_pylist()
    header = table.column_names
    widths = [max([len(name)] + [len(_cell(r[name])) for r in shown]) for name in header]
    line = lambda cells: "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    lines = [f"The first {len(shown)} of {table.num_rows} rows of {path}:",
             line(header)] + [line([_cell(r[name]) for name in header]) for r in shown]
    lines += ["  null = SUPPRESSED, not zero: the noisy value was not above the column's release "
              "threshold (campaigns.json); a key with both values suppressed has no row.",
              "  Open it: python -c \"import pyarrow.parquet as pq; "
              f"print(pq.read_table('{path}').to_pylist())\"",
              "",
              f"Written under {out}/:",
              "  releases/CAMPAIGN/PERIOD/v1/  the published releases: centralnotice.parquet and "
              "RELEASE.json (guarantee, measures, key fingerprints)",
              "  reports/CAMPAIGN/PERIOD/v1/   the operator reports: report.txt, report.json (row "
              "counts: for the operator only, never published)",
              "  ledger.json                   the budget ledger: what each campaign and day has spent",
              "  keys/                         the release keys (secret): kept, so that a re-run "
              "reproduces the same bytes",
              f"Run it again: every release is reproduced byte for byte and nothing more is spent "
              f"(delete {out} to start afresh: a new ledger, new keys, new noise)."]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    demo_out = None
    try:
        if "--demo" in argv:
            demo_out = _flag_value(argv, "output")
            argv = demo_arguments(argv)
        if "--list_releases" in argv or "--list-releases" in argv:
            config = load_config(_flag_value(argv, "config") or "")
            for campaign in config.campaigns:
                for release in campaign.releases():
                    print(release.release_id)
            return 0
    except (ReleaseRefused, ConfigError) as err:
        print(f"{NAME}: error: {err}", file=sys.stderr)
        return ReleaseRefused.exit_code
    code = cli.main(JOB, argv)
    if demo_out and code == 0:
        print("\n" + demo_summary(demo_out))
    return code


if __name__ == "__main__":
    sys.exit(main())
