"""CentralNotice release configuration: schema, strict validation and the public keyset.

The configuration is one JSON document (local path or ``gs://``), validated completely before
any data is read, against the published JSON Schema ``pipelines/centralnotice/config.schema.json``
(:data:`SCHEMA_FILE`, through :mod:`pipelines.release.config_schema`; give a file
``"$schema": "<path to>/config.schema.json"`` and an editor checks it as it is typed). Every
error names the file and the offending field, never its value, e.g. ``--config c.json:
campaigns[1].privacy.clicks: missing max_clicks_per_user (required when neighbouring is
"user")``. Unknown fields are errors too (a misspelt field must not silently fall back to a
default). What a schema cannot state is checked here after it, and only that (see "parsing"
below): an end date before its start, a campaign id given twice, every country on the
protection list, a schedule that does not fit its budget.

In short (the schema file is the reference; all fields required unless marked optional)::

    {
      "version": 1,
      "accountant": "basic" | "zcdp" | "pld",    # optional, default "basic" (accounting.guarantee)
      "unit_budget_per_period": {"epsilon": 2, "delta": 1e-6},   # optional: see below
      "protected_countries_file": "protected_countries.txt",  # optional; relative to this file
      "protected_countries": ["XX", ...],        # optional; merged with the file
      "campaigns": [{
        "campaign_id": "C2026_en_fundraising",   # [A-Za-z0-9_.-]+
        "banners": ["..._dsk", "..._mob"],
        "countries": ["US", "GB", ...],          # ISO 3166-1 alpha-2 (plus XK)
        "projects": ["en.wikipedia", "commons.wikimedia", ...],
        "start_date": "2026-11-01", "end_date": "2026-11-14",   # inclusive
        "schedule": "daily" | "campaign",        # one release per day, or one for the campaign
        "privacy": {
          "impressions": {"k": 100, "epsilon": 0.5, "delta": 0 (optional),
                          "noise": "discrete_laplace",
                          "neighbouring": "period" | "campaign",
                          "release_threshold": 500},
          "clicks": {"noise": "discrete_gaussian", "rho": 0.005   # or "epsilon": 0.5
                     "delta": 1e-9 (optional; with rho: the delta at which rho is also charged
                                    as (epsilon, delta)),
                     "neighbouring": "row" | "user",
                     "max_clicks_per_user": 5,    # required for "user", forbidden for "row"
                     "bound_per": "period" | "campaign",   # required for "user"
                     "release_threshold": 20},
          "target": {"epsilon": 1, "delta": 1e-7},   # optional: see "A joint target" below
          "budget": {"campaign_total": {"epsilon": 8, "delta": 1e-6},
                     "per_period": {"epsilon": 1, "delta": 1e-7}}   # per_period optional
        }
      }]
    }

Meaning (the Wikimedia CentralNotice feasibility report, seed
001_4177a0bca025ff82.txt): impressions use Algorithm 1 -- blocks of ``k`` impressions are
the privacy unit, sensitivity ``k`` (L1 = L2: a block touches one key); ``neighbouring``
"period" is (Geo, Project, k)-DP per release period, "campaign" is (Geo, Project, Campaign,
k)-DP. Clicks are counted with sensitivity 1 (row-DP) or ``max_clicks_per_user`` (user-DP after
bounding each user per period or per campaign). A user's m clicks can fall on up to m keys, so
user-DP discrete Gaussian clicks are calibrated for L0 = L1 = L2 = m, never on the one-key discrete
Gaussian curve: an (epsilon, delta) target gets the smallest sigma meeting it for every way the m
clicks can fall on keys (each split's exact privacy loss distribution, composed by
``dp_accounting``), and a rho keeps sigma = m / sqrt(2 rho) and states the epsilon of the worst
split at its delta; either is stated by the zCDP conversion where that is smaller, and the
figure names its accountant (``pld`` or ``zcdp``: :mod:`accounting.calibration`, "Multi-key
changes"). The keyset -- banners x countries (minus the
protection list) x projects x dates -- is public, fixed by the configuration, never by data.

A joint target (``privacy.target``, optional): without it each measure is calibrated from its
own budget, and a release spends what the two compose to -- less than the sum of the two budgets
under ``pld`` as soon as delta > 0, so the noise is larger than the stated total needs. With
``"target": {"epsilon": E, "delta": D}`` the impressions and clicks of each release are calibrated
*together* to (E, D) by the configuration's ``accountant``
(:func:`accounting.target.calibrate_to_target`): the measures' epsilons are read as weights
(each measure's share of E), a Gaussian measure's delta as its weight in D (pure kinds use
none), and every share is scaled by the largest common multiplier m >= 1 whose composition
still fits (E, D). ``pld`` gives the least noise: m > 1 whenever the measures compose below
the sum of their epsilons (a Gaussian measure beside another at delta > 0; user-DP clicks over
several keys through the PLD dominating their shift patterns), so both get less noise than
their separate calibration. ``basic`` gives m = 1, the separate calibration. Clicks give ``epsilon`` (a weight),
not ``rho``; a Gaussian measure needs the target's delta > 0; ``"accountant": "zcdp"`` cannot
calibrate a target. The release states the target, the accountant and m (``--explain``,
``RELEASE.json``'s ``parameters.target``, each measure's description in the ledger), and is
charged what the jointly calibrated measures compose to -- the charge the schedule check below
composes. For example, Laplace impressions and row-DP Gaussian clicks of 0.5 each, with
``"target": {"epsilon": 1, "delta": 1e-7}`` and ``"accountant": "pld"``, keep the 1:1 split
and spend the whole (1, 1e-7) on slightly less noise for both.

The whole schedule must fit the budget: every release is charged both measures, and the
configuration is refused if the campaign total (composed with the chosen accountant) or a
period's budget cannot pay for all scheduled releases. The ledger charges each release to the
scopes ``campaign:<id>`` (the campaign total) and ``period:<id>:<day>`` (per_period) and, when
``unit_budget_per_period`` is set, ``unit-period:<day>`` for every day it covers: one budget for
a person's loss on a day across *all* campaigns (a user clicking banners of two campaigns on
one day is in both releases, whose losses compose). Guarantees are composed by
:func:`accounting.guarantee.compose` everywhere (this check, the ledger and the reports).
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pyarrow as pa

from accounting import gcs, guarantee
from accounting.budget import PrivacyBudget
from accounting.calibration import NoiseKind, NoiseSpec, calibrate, calibrate_zcdp
from accounting.ledger import Scope
from accounting.measures import Measure
from accounting.shared_budget import SharedBudget
from accounting.sensitivity import ContributionBounds, Sensitivities, count_sensitivity
from accounting.target import JointCalibration, MeasureRequest, calibrate_to_target
from pipelines.release import config_schema, textfiles
from transforms.keyset import PublicKeyset

#: The CentralNotice key: columns and Arrow types (inputs, keyset and released table share it).
KEY_SCHEMA = pa.schema([("campaign_id", pa.string()), ("banner_id", pa.string()),
                        ("country", pa.string()), ("project", pa.string()), ("date", pa.date32())])
KEY_COLUMNS = tuple(KEY_SCHEMA.names)

#: The published schema (JSON Schema 2020-12) every configuration is checked against first:
#: editors validate a file as it is typed with it (``"$schema": ".../config.schema.json"``).
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.schema.json")

#: The one budget part of a release calibrated to a target (both measures spend it).
JOINT_PART = "impressions+clicks"


def _schema() -> Mapping:
    with open(SCHEMA_FILE, encoding="utf-8") as handle:
        return json.load(handle)


#: ISO 3166-1 alpha-2 codes (officially assigned, 249) plus XK (Kosovo, user-assigned but
#: used by Wikimedia and most geolocation databases): the schema's list, stated once.
ISO_3166_ALPHA2 = tuple(_schema()["$defs"]["country"]["enum"])
_ISO = frozenset(ISO_3166_ALPHA2)


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the configuration file (``source``,
    when read from one) and the offending field's path."""

    def __init__(self, path: str, message: str, source: Optional[str] = None):
        super().__init__(f"{source}: {path}: {message}" if source else f"{path}: {message}")
        self.path, self.message, self.source = path, message, source


# --------------------------------------------------------------------------- the schema

@dataclass(frozen=True, kw_only=True)
class ImpressionsPrivacy:
    """Algorithm 1: blocks of ``k`` impressions are the privacy unit (sensitivity k).

    ``budget``: what the impressions measure may spend, an (epsilon, delta) PrivacyBudget."""

    k: int
    budget: PrivacyBudget
    noise: NoiseKind
    neighbouring: str  # "period" or "campaign"
    release_threshold: float

    @property
    def sensitivity(self) -> int:
        return self.k

    def noise_spec(self) -> NoiseSpec:
        return calibrate(self.noise, epsilon=self.budget.epsilon, delta=self.budget.delta,
                         l1_sensitivity=self.k, l2_sensitivity=self.k)


@dataclass(frozen=True, kw_only=True)
class ClicksPrivacy:
    """Algorithm 2: one click row (row-DP) or one user's bounded clicks (user-DP) per key count.

    ``budget``: what the clicks measure may spend: (epsilon, delta), or rho-zCDP reported at
    its delta (Gaussian kinds only)."""

    noise: NoiseKind
    budget: PrivacyBudget
    neighbouring: str  # "row" or "user"
    max_clicks_per_user: Optional[int]
    bound_per: Optional[str]  # "period" or "campaign" (user-DP only)
    release_threshold: float

    @property
    def sensitivity(self) -> int:
        """L1 (= L2 bound) sensitivity of the per-key click counts: 1 row or m clicks of one user."""
        return 1 if self.neighbouring == "row" else int(self.max_clicks_per_user)

    @property
    def l0(self) -> int:
        """Keys one neighbour changes: one row touches one key; one user's m clicks up to m."""
        return self.sensitivity

    def noise_spec(self) -> NoiseSpec:
        """The clicks' noise. User-DP is calibrated for a change of up to m clicks spread
        over up to m keys (L1 = L2 = m: the worst split's privacy loss distribution, or the
        zCDP bound where smaller; :mod:`accounting.calibration`, "Multi-key changes"), never on
        the one-key discrete Gaussian curve."""
        if self.budget.is_zcdp:
            return calibrate_zcdp(self.noise, rho=self.budget.rho, l2_sensitivity=self.sensitivity,
                                  l0=self.l0, delta_for_reporting=self.budget.delta,
                                  l1_sensitivity=self.sensitivity)
        return calibrate(self.noise, epsilon=self.budget.epsilon, delta=self.budget.delta,
                         l1_sensitivity=self.sensitivity, l2_sensitivity=self.sensitivity, l0=self.l0)


@dataclass(frozen=True, kw_only=True)
class ScheduledRelease:
    """One scheduled release: its ledger id, the periods it charges and the dates it covers."""

    release_id: str
    campaign_id: str
    periods: tuple[str, ...]
    dates: tuple[_dt.date, ...]


@dataclass(frozen=True, kw_only=True)
class CampaignConfig:
    campaign_id: str
    banners: tuple[str, ...]
    countries: tuple[str, ...]
    projects: tuple[str, ...]
    start_date: _dt.date
    end_date: _dt.date
    schedule: str  # "daily" or "campaign"
    impressions: ImpressionsPrivacy
    clicks: ClicksPrivacy
    campaign_total: PrivacyBudget
    per_period: Optional[PrivacyBudget]
    protected_countries: frozenset = field(default_factory=frozenset)
    unit_per_period: Optional[PrivacyBudget] = None
    #: One (epsilon, delta) both measures of a release are calibrated to together (None: each
    #: from its own budget); ``accountant``: the configuration's, which calibrates the target.
    target: Optional[PrivacyBudget] = None
    accountant: str = "basic"

    def dates(self) -> list[_dt.date]:
        days = (self.end_date - self.start_date).days + 1
        return [self.start_date + _dt.timedelta(days=i) for i in range(days)]

    def released_countries(self) -> tuple[str, ...]:
        """The campaign's countries minus the country protection list (never released)."""
        return tuple(c for c in self.countries if c not in self.protected_countries)

    def keyset_size(self, dates: Optional[Sequence[_dt.date]] = None) -> int:
        n_dates = len(self.dates() if dates is None else dates)
        return len(self.banners) * len(self.released_countries()) * len(self.projects) * n_dates

    def public_keyset(self, dates: Optional[Sequence[_dt.date]] = None) -> PublicKeyset:
        """The public keyset: banners x released countries x projects x dates, as the project's
        one cross-product keyset (:meth:`transforms.keyset.PublicKeyset.cross_product`; row-major,
        dates fastest). ``dates`` restricts it to some of the campaign's dates (one daily release).
        """
        dates = self.dates() if dates is None else list(dates)
        outside = [d for d in dates if not self.start_date <= d <= self.end_date]
        if outside:
            raise ValueError(f"dates {outside[:3]} are outside campaign {self.campaign_id!r} "
                             f"({self.start_date}..{self.end_date})")
        axes = [[self.campaign_id], self.banners, self.released_countries(), self.projects, dates]
        return PublicKeyset.cross_product({f.name: pa.array(list(axis), f.type)
                                           for f, axis in zip(KEY_SCHEMA, axes)})

    def keyset(self, dates: Optional[Sequence[_dt.date]] = None) -> pa.Table:
        """:meth:`public_keyset` materialised (``date`` is date32)."""
        return self.public_keyset(dates).to_table().combine_chunks()

    def noise_specs(self) -> dict[str, NoiseSpec]:
        """Each measure's noise: from its own budget, or calibrated jointly to the target."""
        if self.target is not None:
            return {m.name: m.noise for m in self.joint_calibration().measures}
        return {"impressions": self.impressions.noise_spec(), "clicks": self.clicks.noise_spec()}

    def _queries(self) -> list[tuple[str, Sensitivities, str, str]]:
        """(measure, sensitivities, neighbouring relation, description) of both measures."""
        imp, clk = self.impressions, self.clicks
        k = float(imp.k)
        relation = ("(Geo, Project, k)-DP: add/remove k impressions of one (geo, project) per period"
                    if imp.neighbouring == "period" else
                    "(Geo, Project, Campaign, k)-DP: add/remove k impressions over the campaign")
        out = [("impressions", Sensitivities(l0=1, linf=k, l1=k, l2=k), relation,
                f"Algorithm 1, blocks of k={imp.k}")]
        if clk.neighbouring == "row":
            sens = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)
            relation, text = "add/remove one click", "Algorithm 2, row-DP"
        else:
            m = clk.max_clicks_per_user
            sens = count_sensitivity(ContributionBounds(
                max_partitions=m, max_contributions_per_partition=m, max_contributions=m))
            relation = f"add/remove one user's clicks (at most {m} per {clk.bound_per})"
            text = "Algorithm 2, user-DP"
        return out + [("clicks", sens, relation, text)]

    def measures(self) -> list[Measure]:
        """What one release of this campaign spends: both measures, with their neighbouring
        relations and sensitivities stated (the ledger charges exactly these); calibrated
        jointly to the target when there is one (:meth:`joint_calibration`)."""
        if self.target is not None:
            return list(self.joint_calibration().measures)
        specs = self.noise_specs()
        return [Measure.of_noise(name, specs[name], sens, neighbouring=relation, description=text)
                for name, sens, relation, text in self._queries()]

    @functools.cached_property
    def _joint(self) -> JointCalibration:
        t, parts = self.target, {"impressions": self.impressions, "clicks": self.clicks}
        requests = []
        for name, sens, relation, text in self._queries():
            budget, kind = parts[name].budget, parts[name].noise
            other = "clicks" if name == "impressions" else "impressions"
            requests.append(MeasureRequest(
                name=name, kind=kind, sensitivities=sens, weight=budget.epsilon,
                delta_weight=budget.delta if kind.is_gaussian else None, neighbouring=relation,
                description=f"{text}; calibrated jointly with the {other} to the release's target "
                            f"(epsilon={t.epsilon:g}, delta={t.delta:g}) by the {self.accountant} "
                            "accountant (accounting.target)"))
        return calibrate_to_target(requests, epsilon=t.epsilon, delta=t.delta,
                                   accountant=self.accountant)

    def joint_calibration(self) -> JointCalibration:
        """Both measures calibrated together to :attr:`target` by :attr:`accountant` (see the
        module docstring, "A joint target"); computed once per configuration."""
        if self.target is None:
            raise ValueError(f"campaign {self.campaign_id!r} has no target")
        return self._joint

    def part_budgets(self) -> dict[str, PrivacyBudget]:
        """Each measure's part of a release's budget, as configured: impressions (epsilon,
        delta); clicks (epsilon, delta) or zCDP rho (with the delta it is also stated at).
        Under a target these are the weights of the joint calibration, not budgets."""
        return {"impressions": self.impressions.budget, "clicks": self.clicks.budget}

    def release_budget(self) -> PrivacyBudget:
        """The budget one release must fit: the tightest configured per-period budget (a release
        is charged to each period it covers), else the campaign total."""
        per_release = [b for b in (self.per_period, self.unit_per_period) if b is not None]
        if not per_release:
            return self.campaign_total
        return min(per_release, key=lambda b: (b.epsilon, b.delta))

    def shared_budget(self, accountant: Optional[str] = None) -> SharedBudget:
        """One release's budget split between its two measures (explicit parts, as configured)
        and spent by them: its ``guarantee()`` and ``explain()`` are the release's (see
        :class:`accounting.shared_budget.SharedBudget`). Each measure draws its noise from its
        own named stream of the release key (``centralnotice/<campaign>/<measure>``).

        Under a target the budget is the target, in one part (:data:`JOINT_PART`) spent by both
        measures, checked by the accountant that calibrated them; ``accountant`` (default: the
        configuration's) must then be that one."""
        accountant = accountant or self.accountant
        if self.target is not None:
            if accountant != self.accountant:
                raise ValueError(f"campaign {self.campaign_id!r}: its target is calibrated by the "
                                 f"{self.accountant!r} accountant, not {accountant!r}")
            shared = SharedBudget(self.target, budgets={JOINT_PART: self.target},
                                  accountant=accountant)
            self.joint_calibration().spend(shared.part(JOINT_PART))
            return shared
        shared = SharedBudget(self.release_budget(), budgets=self.part_budgets(),
                              accountant=accountant)
        for measure in self.measures():
            shared.part(measure.name).spend([measure])
        return shared

    def scopes(self, release: "ScheduledRelease") -> list[Scope]:
        """The ledger budgets one release is charged to (see the module docstring)."""
        out = [Scope(name=f"campaign:{self.campaign_id}", budget=self.campaign_total,
                     description="the campaign's total")]
        if self.per_period is not None:
            out += [Scope(name=f"period:{self.campaign_id}:{p}", budget=self.per_period,
                          description="one period of the campaign") for p in release.periods]
        if self.unit_per_period is not None:
            out += [Scope(name=f"unit-period:{p}", budget=self.unit_per_period,
                          description="one person's loss on this day across all campaigns")
                    for p in release.periods]
        return out

    def guarantee_scopes(self, release: "ScheduledRelease") -> list[dict]:
        """Which per-person bounds the guarantee of ``release`` is held to, each scope stated as
        configured or NOT configured with what that means (public: the configuration only).

        Used by every CentralNotice report (the release marker, ``report.json`` and the CLI
        summary): a reader must see whether one person's loss is bounded per campaign, per
        campaign-day, and across campaigns per day.
        """
        def budget(b):
            return None if b is None else {"epsilon": b.epsilon, "delta": b.delta}

        days = list(release.periods)
        return [
            {"scope": "campaign total", "configured": True,
             "ledger_scopes": [f"campaign:{self.campaign_id}"], "budget": budget(self.campaign_total),
             "means": "one person's loss over all releases of this campaign, composed"},
            {"scope": "campaign-day", "configured": self.per_period is not None,
             "ledger_scopes": [f"period:{self.campaign_id}:{d}" for d in days]
             if self.per_period is not None else [],
             "budget": budget(self.per_period),
             "means": ("one person's loss from this campaign on each day" if self.per_period
                       is not None else "NOT configured: a day of this campaign is bounded only "
                       "by the campaign total")},
            {"scope": "person-day across campaigns", "configured": self.unit_per_period is not None,
             "ledger_scopes": [f"unit-period:{d}" for d in days]
             if self.unit_per_period is not None else [],
             "budget": budget(self.unit_per_period),
             "means": ("one person's loss on each day summed over every campaign charged to this "
                       "ledger" if self.unit_per_period is not None else
                       "NOT configured: a person seen by several campaigns on one day is bounded "
                       "per campaign only; that day's losses add up across campaigns (set "
                       "unit_budget_per_period to bound them)")},
        ]

    def releases(self) -> list[ScheduledRelease]:
        """The release schedule: one per date (``daily``) or one for the whole campaign."""
        if self.schedule == "daily":
            return [ScheduledRelease(release_id=f"{self.campaign_id}/{d.isoformat()}",
                                     campaign_id=self.campaign_id, periods=(d.isoformat(),),
                                     dates=(d,)) for d in self.dates()]
        dates = tuple(self.dates())
        return [ScheduledRelease(release_id=f"{self.campaign_id}/{self.start_date}_{self.end_date}",
                                 campaign_id=self.campaign_id,
                                 periods=tuple(d.isoformat() for d in dates), dates=dates)]


@dataclass(frozen=True, kw_only=True)
class CentralNoticeConfig:
    campaigns: tuple[CampaignConfig, ...]
    protected_countries: frozenset
    accountant: str
    source: str
    raw: dict = field(repr=False)

    def campaign(self, campaign_id: str) -> CampaignConfig:
        for campaign in self.campaigns:
            if campaign.campaign_id == campaign_id:
                return campaign
        raise KeyError(f"no campaign {campaign_id!r} in {self.source}; "
                       f"known: {[c.campaign_id for c in self.campaigns]}")


# --------------------------------------------------------------------------- parsing
#
# A configuration is checked against the schema first (every field's type, range, pattern and
# the rules between fields of one object: exactly one of epsilon and rho, a Gaussian kind's
# delta, user-DP's bounds). What follows builds the objects from a valid document, and checks
# what a schema cannot state: an end date before its start (a comparison of two values), a
# campaign id given twice (uniqueness of one field across objects), every country on the
# protection list (which may come from a file), and a schedule that does not fit its budget
# (composition, calibration).

def _budget(data: Mapping) -> PrivacyBudget:
    return PrivacyBudget(epsilon=float(data["epsilon"]), delta=float(data.get("delta", 0.0)))


def _impressions(data: Mapping) -> ImpressionsPrivacy:
    return ImpressionsPrivacy(
        k=int(data["k"]), budget=_budget(data), noise=NoiseKind(data["noise"]),
        neighbouring=data["neighbouring"], release_threshold=float(data["release_threshold"]))


def _clicks(data: Mapping) -> ClicksPrivacy:
    if "rho" in data:
        budget = PrivacyBudget(rho=float(data["rho"]), delta=float(data.get("delta", 1e-9)))
    else:
        budget = _budget(data)
    user = data["neighbouring"] == "user"
    return ClicksPrivacy(noise=NoiseKind(data["noise"]), budget=budget,
                         neighbouring=data["neighbouring"],
                         max_clicks_per_user=int(data["max_clicks_per_user"]) if user else None,
                         bound_per=data["bound_per"] if user else None,
                         release_threshold=float(data["release_threshold"]))


def _campaign(data: Mapping, path: str, protected: frozenset, accountant: str,
              unit_per_period: Optional[PrivacyBudget]) -> CampaignConfig:
    start = _dt.date.fromisoformat(data["start_date"])
    end = _dt.date.fromisoformat(data["end_date"])
    if end < start:
        raise ConfigError(f"{path}.end_date", "is before start_date")
    privacy = data["privacy"]
    per_period = privacy["budget"].get("per_period")
    target = privacy.get("target")
    campaign = CampaignConfig(
        campaign_id=data["campaign_id"], banners=tuple(data["banners"]),
        countries=tuple(data["countries"]), projects=tuple(data["projects"]),
        start_date=start, end_date=end, schedule=data["schedule"],
        impressions=_impressions(privacy["impressions"]), clicks=_clicks(privacy["clicks"]),
        campaign_total=_budget(privacy["budget"]["campaign_total"]),
        per_period=None if per_period is None else _budget(per_period),
        protected_countries=protected, unit_per_period=unit_per_period,
        target=None if target is None else _budget(target), accountant=accountant)
    if not campaign.released_countries():
        raise ConfigError(f"{path}.countries", "every country is on the country protection list: "
                                               "nothing could be released")
    _check_schedule_fits(campaign, path, accountant)
    return campaign


def _check_schedule_fits(campaign: CampaignConfig, path: str, accountant: str) -> None:
    """Refuse a configuration whose own schedule would run out of budget (composed exactly as
    the ledger will compose it: accounting.guarantee.fits with the config's accountant)."""
    try:
        measures = campaign.measures()
    except ValueError as err:
        where = f"{path}.privacy" + (".target" if campaign.target is not None else "")
        raise ConfigError(where, f"cannot calibrate noise: {err}")
    releases = campaign.releases()
    checks = [("campaign_total", campaign.campaign_total, measures * len(releases),
               f"{len(releases)} scheduled release(s) spend")]
    if campaign.per_period is not None:
        checks.append(("per_period", campaign.per_period, measures, "one release spends"))
    if campaign.unit_per_period is not None:
        checks.append(("unit_budget_per_period", campaign.unit_per_period, measures,
                       "one release spends"))
    for name, budget, charged, what in checks:
        where = name if name == "unit_budget_per_period" else f"{path}.privacy.budget.{name}"
        try:
            ok, spent = guarantee.fits(charged, budget.epsilon, budget.delta, accountant)
        except (ValueError, ArithmeticError) as err:
            raise ConfigError(where, f"{what} an amount that cannot be composed: {err}")
        if not ok:
            asked = "" if campaign.target is None else (
                f"; each release is calibrated to {path}.privacy.target (epsilon="
                f"{campaign.target.epsilon:g}, delta={campaign.target.delta:g})")
            raise ConfigError(where, f"{what} (epsilon={spent.epsilon:.6g}, delta={spent.delta:.3g}) "
                                     f"with the {accountant!r} accountant, more than "
                                     f"(epsilon={budget.epsilon:g}, delta={budget.delta:g}){asked}")
    try:
        campaign.shared_budget(accountant)
    except ValueError as err:
        raise ConfigError(f"{path}.privacy", f"one release's budget cannot be split between its "
                                             f"measures: {err}")


def _join(base: str, relative: str) -> str:
    if gcs.is_gcs(relative) or os.path.isabs(relative):
        return relative
    if gcs.is_gcs(base):
        return base.rsplit("/", 1)[0] + "/" + relative
    return os.path.join(os.path.dirname(os.path.abspath(base)), relative)


def parse_protected_countries(text: str, source: str = "protected countries") -> frozenset:
    """One ISO code per line; ``#`` starts a comment; blank lines ignored. A bad line is named
    by file and number, never quoted (the file may be the wrong one: a key, a secret)."""
    codes = set()
    for number, code in textfiles.TextFile(path=source, what="protected_countries_file",
                                             text=text).lines():
        if code not in _ISO:
            hint = " (the United Kingdom is GB)" if code == "UK" else ""
            raise ConfigError(f"{source}:{number}", "must be an ISO 3166-1 alpha-2 country code, "
                                                    f"one per line{hint}")
        codes.add(code)
    return frozenset(codes)


def parse_config(data: Any, source: str = "<config>") -> CentralNoticeConfig:
    """Validate a parsed JSON configuration (``source`` names it in messages and resolves a
    relative protection-list file): against :data:`SCHEMA_FILE`, then the rules a schema
    cannot state (see "parsing" above)."""
    try:
        config_schema.validate(data, SCHEMA_FILE, source)
    except config_schema.ConfigSchemaError as err:
        (first, problem), rest = err.problems[0], err.problems[1:]
        listed = rest[:config_schema.MAX_LISTED - 1]
        message = problem + "".join(f"; {where}: {why}" for where, why in listed)
        if len(rest) > len(listed):
            message += f" (and {len(rest) - len(listed)} more)"
        raise ConfigError(first, f"{message} (schema {err.schema})") from None
    accountant = data.get("accountant", "basic")
    unit = data.get("unit_budget_per_period")
    unit = None if unit is None else _budget(unit)
    protected = set(data.get("protected_countries", []))
    if "protected_countries_file" in data:
        path = _join(source, data["protected_countries_file"])
        try:
            listed = textfiles.read(path, "protected_countries_file")
        except textfiles.TextFileError as err:
            raise ConfigError("protected_countries_file", f"cannot read {err.where}: {err.reason}")
        protected |= parse_protected_countries(listed.text, listed.path)
    protected = frozenset(protected)
    seen: set = set()
    campaigns = []
    for i, item in enumerate(data["campaigns"]):
        if item["campaign_id"] in seen:
            raise ConfigError(f"campaigns[{i}].campaign_id", "the same campaign id as an earlier "
                                                              "campaign")
        seen.add(item["campaign_id"])
        campaigns.append(_campaign(item, f"campaigns[{i}]", protected, accountant, unit))
    return CentralNoticeConfig(campaigns=tuple(campaigns), protected_countries=protected,
                               accountant=accountant, source=source, raw=dict(data))


def load_config(path: str) -> CentralNoticeConfig:
    """Read and validate a configuration from a local path or ``gs://`` URI (see module doc)."""
    try:
        data = textfiles.read(path, "--config").json()
    except textfiles.TextFileError as err:
        raise ConfigError("<file>", f"cannot read configuration {err.where}: {err.reason}")
    try:
        return parse_config(data, path)
    except ConfigError as err:  # name the file too
        raise ConfigError(err.path, err.message, source=f"--config {path}") from None
