"""CentralNotice release configuration: schema, strict validation and the public keyset.

The configuration is one JSON document (local path or ``gs://``), validated completely before
any data is read; every error names the offending field, e.g.
``campaigns[1].privacy.clicks.max_clicks_per_user: required when neighbouring is "user"``.
Unknown fields are errors too (a misspelt field must not silently fall back to a default).

Schema (all fields required unless marked optional)::

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
import math
import numbers
import os
import re
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
from pipelines.release import textfiles
from pipelines.release.names import check_segment
from pipelines.release.textfiles import shown
from transforms.keyset import PublicKeyset

CONFIG_VERSION = 1
#: The CentralNotice key: columns and Arrow types (inputs, keyset and released table share it).
KEY_SCHEMA = pa.schema([("campaign_id", pa.string()), ("banner_id", pa.string()),
                        ("country", pa.string()), ("project", pa.string()), ("date", pa.date32())])
KEY_COLUMNS = tuple(KEY_SCHEMA.names)

#: ISO 3166-1 alpha-2 codes (officially assigned, 249) plus XK (Kosovo, user-assigned but
#: used by Wikimedia and most geolocation databases).
ISO_3166_ALPHA2 = tuple("""
AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS
BT BV BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE
EG EH ER ES ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM
HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN KP KR KW KY KZ LA LB LC
LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT MU MV MW MX MY MZ NA
NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW
SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO
TR TT TV TW TZ UA UG UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW XK
""".split())
_ISO = frozenset(ISO_3166_ALPHA2)
_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_PROJECT = re.compile(r"^[a-z0-9-]+(\.[a-z0-9-]+)+$")


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the configuration file (``source``,
    when read from one) and the offending field's path."""

    def __init__(self, path: str, message: str, source: Optional[str] = None):
        super().__init__(f"{source}: {path}: {message}" if source else f"{path}: {message}")
        self.path, self.message, self.source = path, message, source


# --------------------------------------------------------------------------- field readers

def _obj(value, path: str, required: Sequence[str], optional: Sequence[str] = ()) -> Mapping:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - set(required) - set(optional))
    if unknown:
        raise ConfigError(path, f"unknown field(s) {unknown}; allowed: {sorted(set(required) | set(optional))}")
    missing = [name for name in required if name not in value]
    if missing:
        raise ConfigError(f"{path}.{missing[0]}" if path else missing[0], "required field is missing")
    return value


def _real(value, path: str, *, positive=False, allow_zero=True, below_one=False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(path, f"must be a finite number, got {shown(value)}")
    value = float(value)
    if positive and value <= 0:
        raise ConfigError(path, f"must be > 0, got {shown(value)}")
    if not allow_zero and value == 0:
        raise ConfigError(path, "must not be 0")
    if value < 0 and (positive or below_one):
        raise ConfigError(path, f"must not be negative, got {shown(value)}")
    if below_one and value >= 1:
        raise ConfigError(path, f"must be < 1, got {shown(value)}")
    return value


def _pos_int(value, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(path, f"must be a positive integer, got {shown(value)}")
    return int(value)


def _choice(value, path: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(path, f"must be one of {list(choices)}, got {shown(value)}")
    return value


def _ident(value, path: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise ConfigError(path, f"must be a non-empty identifier of letters, digits, '_', '.', '-', got {shown(value)}")
    return value


def _list(value, path: str, item, *, non_empty=True) -> tuple:
    if not isinstance(value, list):
        raise ConfigError(path, f"must be a JSON array, got {type(value).__name__}")
    if non_empty and not value:
        raise ConfigError(path, "must not be empty")
    items = tuple(item(v, f"{path}[{i}]") for i, v in enumerate(value))
    seen = set()
    for i, v in enumerate(items):
        if v in seen:
            raise ConfigError(f"{path}[{i}]", f"duplicate entry {shown(v)}")
        seen.add(v)
    return items


def _country(value, path: str) -> str:
    if not isinstance(value, str) or value not in _ISO:
        hint = " (the United Kingdom is GB)" if value == "UK" else ""
        raise ConfigError(path, f"must be an ISO 3166-1 alpha-2 country code, got {shown(value)}{hint}")
    return value


def _project(value, path: str) -> str:
    if not isinstance(value, str) or not _PROJECT.match(value):
        raise ConfigError(path, f"must be a project name like 'en.wikipedia', got {shown(value)}")
    return value


def _date(value, path: str) -> _dt.date:
    if not isinstance(value, str):
        raise ConfigError(path, f"must be an ISO date string YYYY-MM-DD, got {shown(value)}")
    try:
        return _dt.date.fromisoformat(value)
    except ValueError:
        raise ConfigError(path, f"must be an ISO date YYYY-MM-DD, got {shown(value)}")


def _noise(value, path: str) -> NoiseKind:
    try:
        return NoiseKind.parse(value)
    except ValueError as err:
        raise ConfigError(path, str(err))


def _budget(value, path: str) -> PrivacyBudget:
    data = _obj(value, path, ["epsilon"], ["delta"])
    return PrivacyBudget(epsilon=_real(data["epsilon"], f"{path}.epsilon", positive=True),
                         delta=_real(data.get("delta", 0.0), f"{path}.delta", below_one=True))


def _segment(value, path: str) -> str:
    try:
        return check_segment(value, "campaign id")
    except ValueError as err:
        raise ConfigError(path, str(err))


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
        return {"impressions": self.impressions.noise_spec(), "clicks": self.clicks.noise_spec()}

    def measures(self) -> list[Measure]:
        """What one release of this campaign spends: both measures, with their neighbouring
        relations and sensitivities stated (the ledger charges exactly these)."""
        imp, clk = self.impressions, self.clicks
        specs = self.noise_specs()
        k = float(imp.k)
        relation = ("(Geo, Project, k)-DP: add/remove k impressions of one (geo, project) per period"
                    if imp.neighbouring == "period" else
                    "(Geo, Project, Campaign, k)-DP: add/remove k impressions over the campaign")
        measures = [Measure.of_noise("impressions", specs["impressions"],
                                     Sensitivities(l0=1, linf=k, l1=k, l2=k), neighbouring=relation,
                                     description=f"Algorithm 1, blocks of k={imp.k}")]
        if clk.neighbouring == "row":
            sens = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)
            relation, text = "add/remove one click", "Algorithm 2, row-DP"
        else:
            m = clk.max_clicks_per_user
            sens = count_sensitivity(ContributionBounds(
                max_partitions=m, max_contributions_per_partition=m, max_contributions=m))
            relation = f"add/remove one user's clicks (at most {m} per {clk.bound_per})"
            text = "Algorithm 2, user-DP"
        measures.append(Measure.of_noise("clicks", specs["clicks"], sens, neighbouring=relation,
                                         description=text))
        return measures

    def part_budgets(self) -> dict[str, PrivacyBudget]:
        """Each measure's part of a release's budget, as configured: impressions (epsilon,
        delta); clicks (epsilon, delta) or zCDP rho (with the delta it is also stated at)."""
        return {"impressions": self.impressions.budget, "clicks": self.clicks.budget}

    def release_budget(self) -> PrivacyBudget:
        """The budget one release must fit: the tightest configured per-period budget (a release
        is charged to each period it covers), else the campaign total."""
        per_release = [b for b in (self.per_period, self.unit_per_period) if b is not None]
        if not per_release:
            return self.campaign_total
        return min(per_release, key=lambda b: (b.epsilon, b.delta))

    def shared_budget(self, accountant: str) -> SharedBudget:
        """One release's budget split between its two measures (explicit parts, as configured)
        and spent by them: its ``guarantee()`` and ``explain()`` are the release's (see
        :class:`accounting.shared_budget.SharedBudget`). Each measure draws its noise from its
        own named stream of the release key (``centralnotice/<campaign>/<measure>``)."""
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

def _impressions(value, path: str) -> ImpressionsPrivacy:
    data = _obj(value, path, ["k", "epsilon", "noise", "neighbouring", "release_threshold"], ["delta"])
    noise = _noise(data["noise"], f"{path}.noise")
    delta = _real(data.get("delta", 0.0), f"{path}.delta", below_one=True)
    if noise.is_gaussian and delta == 0:
        raise ConfigError(f"{path}.delta", f"must be > 0 for {noise.value} noise")
    return ImpressionsPrivacy(
        k=_pos_int(data["k"], f"{path}.k"),
        budget=PrivacyBudget(epsilon=_real(data["epsilon"], f"{path}.epsilon", positive=True),
                             delta=delta),
        noise=noise,
        neighbouring=_choice(data["neighbouring"], f"{path}.neighbouring", ("period", "campaign")),
        release_threshold=_real(data["release_threshold"], f"{path}.release_threshold"))


def _clicks(value, path: str) -> ClicksPrivacy:
    data = _obj(value, path, ["noise", "neighbouring", "release_threshold"],
                ["epsilon", "rho", "delta", "max_clicks_per_user", "bound_per"])
    noise = _noise(data["noise"], f"{path}.noise")
    if ("epsilon" in data) == ("rho" in data):
        raise ConfigError(path, "give exactly one of 'epsilon' and 'rho'")
    if "rho" in data:
        rho = _real(data["rho"], f"{path}.rho", positive=True)
        if not noise.is_gaussian:
            raise ConfigError(f"{path}.noise", f"rho (zCDP) needs a Gaussian kind, got {noise.value}")
        delta = _real(data.get("delta", 1e-9), f"{path}.delta", below_one=True)
        if delta == 0:
            raise ConfigError(f"{path}.delta", "must be > 0 (the delta at which rho is also charged)")
        budget = PrivacyBudget(rho=rho, delta=delta)
    else:
        epsilon = _real(data["epsilon"], f"{path}.epsilon", positive=True)
        delta = _real(data.get("delta", 0.0), f"{path}.delta", below_one=True)
        if noise.is_gaussian and delta == 0:
            raise ConfigError(f"{path}.delta", f"must be > 0 for {noise.value} noise")
        budget = PrivacyBudget(epsilon=epsilon, delta=delta)
    neighbouring = _choice(data["neighbouring"], f"{path}.neighbouring", ("row", "user"))
    m = bound_per = None
    if neighbouring == "user":
        for name in ("max_clicks_per_user", "bound_per"):
            if name not in data:
                raise ConfigError(f"{path}.{name}", 'required when neighbouring is "user"')
        m = _pos_int(data["max_clicks_per_user"], f"{path}.max_clicks_per_user")
        bound_per = _choice(data["bound_per"], f"{path}.bound_per", ("period", "campaign"))
    else:
        for name in ("max_clicks_per_user", "bound_per"):
            if name in data:
                raise ConfigError(f"{path}.{name}", 'only allowed when neighbouring is "user"')
    return ClicksPrivacy(noise=noise, budget=budget,
                         neighbouring=neighbouring, max_clicks_per_user=m, bound_per=bound_per,
                         release_threshold=_real(data["release_threshold"], f"{path}.release_threshold"))


def _campaign(value, path: str, protected: frozenset, accountant: str,
              unit_per_period: Optional[PrivacyBudget]) -> CampaignConfig:
    data = _obj(value, path, ["campaign_id", "banners", "countries", "projects", "start_date",
                              "end_date", "schedule", "privacy"])
    start = _date(data["start_date"], f"{path}.start_date")
    end = _date(data["end_date"], f"{path}.end_date")
    if end < start:
        raise ConfigError(f"{path}.end_date", f"{end} is before start_date {start}")
    privacy = _obj(data["privacy"], f"{path}.privacy", ["impressions", "clicks", "budget"])
    budget = _obj(privacy["budget"], f"{path}.privacy.budget", ["campaign_total"], ["per_period"])
    per_period = None if budget.get("per_period") is None else \
        _budget(budget["per_period"], f"{path}.privacy.budget.per_period")
    impressions = _impressions(privacy["impressions"], f"{path}.privacy.impressions")
    clicks = _clicks(privacy["clicks"], f"{path}.privacy.clicks")
    campaign = CampaignConfig(
        campaign_id=_segment(data["campaign_id"], f"{path}.campaign_id"),
        banners=_list(data["banners"], f"{path}.banners", _ident),
        countries=_list(data["countries"], f"{path}.countries", _country),
        projects=_list(data["projects"], f"{path}.projects", _project),
        start_date=start, end_date=end,
        schedule=_choice(data["schedule"], f"{path}.schedule", ("daily", "campaign")),
        impressions=impressions, clicks=clicks,
        campaign_total=_budget(budget["campaign_total"], f"{path}.privacy.budget.campaign_total"),
        per_period=per_period, protected_countries=protected, unit_per_period=unit_per_period)
    if clicks.bound_per == "campaign" and campaign.schedule == "daily":
        raise ConfigError(f"{path}.privacy.clicks.bound_per",
                          '"campaign" needs schedule "campaign": a daily release sees one day and '
                          "cannot bound a user's clicks across the days it does not see")
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
        raise ConfigError(f"{path}.privacy", f"cannot calibrate noise: {err}")
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
            raise ConfigError(where, f"{what} (epsilon={spent.epsilon:.6g}, delta={spent.delta:.3g}) "
                                     f"with the {accountant!r} accountant, more than "
                                     f"(epsilon={budget.epsilon:g}, delta={budget.delta:g})")
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
    """Validate a parsed JSON configuration (``source`` resolves a relative protection-list file)."""
    top = _obj(data, "", ["version", "campaigns"],
               ["accountant", "protected_countries_file", "protected_countries",
                "unit_budget_per_period"])
    if top["version"] != CONFIG_VERSION:
        raise ConfigError("version", f"must be {CONFIG_VERSION}, got {top['version']!r}")
    accountant = _choice(top.get("accountant", "basic"), "accountant", guarantee.ACCOUNTANTS)
    unit = None if top.get("unit_budget_per_period") is None else \
        _budget(top["unit_budget_per_period"], "unit_budget_per_period")
    protected = set(_list(top.get("protected_countries", []), "protected_countries", _country,
                          non_empty=False))
    if "protected_countries_file" in top:
        name = top["protected_countries_file"]
        if not isinstance(name, str) or not name:
            raise ConfigError("protected_countries_file", f"must be a path, got {shown(name)}")
        path = _join(source, name)
        try:
            listed = textfiles.read(path, "protected_countries_file")
        except textfiles.TextFileError as err:
            raise ConfigError("protected_countries_file", f"cannot read {err.where}: {err.reason}")
        protected |= parse_protected_countries(listed.text, listed.path)
    protected = frozenset(protected)
    campaigns = _list(top["campaigns"], "campaigns", lambda v, p: _campaign(v, p, protected, accountant, unit))
    ids = [c.campaign_id for c in campaigns]
    for i, cid in enumerate(ids):
        if cid in ids[:i]:
            raise ConfigError(f"campaigns[{i}].campaign_id", f"duplicate campaign id {cid!r}")
    return CentralNoticeConfig(campaigns=campaigns, protected_countries=protected,
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
