"""Realistic synthetic CentralNotice inputs: campaigns configuration, impressions and clicks.

Files written by :func:`generate_dataset` (``--format parquet`` or ``csv``):

``impressions.{parquet,csv}`` -- pre-aggregated, one row per key (seed 001_4177a0bca025ff82.txt)
    ``campaign_id`` string, ``banner_id`` string, ``country`` string (ISO 3166-1 alpha-2),
    ``project`` string (e.g. ``de.wikipedia``), ``date`` date32 (CSV: ``YYYY-MM-DD``),
    ``impressions`` int64 (heavy-tailed: log-normal around a popularity-driven mean, so most
    keys have tens to thousands and a few have millions). Rows exist only for keys where the
    banner was actually shown, including countries on the protection list (the raw data has
    them; the release drops them through the keyset). With ``bad_rows > 0`` some rows are made
    faulty (missing, negative or fractional impressions) and some keys duplicated, to exercise
    :func:`pipelines.centralnotice.impressions.clean_impressions`; the column is then float64 (CSV:
    empty cells for missing values).
``clicks.{parquet,csv}`` -- one row per click
    the same five key columns plus ``user_id`` string (``acct-<n>`` for logged-in users,
    ``anon-<hex>`` for IP + user-agent identifiers). Clicks fall on keys in proportion to their
    impressions; users are heavy-tailed (Zipf): most click once, a few click dozens of times,
    mostly on banners of their own (campaign, country, project).
``campaigns.json`` -- the configuration (schema: ``pipelines/centralnotice/config.schema.json``,
:mod:`pipelines.centralnotice.config`): per
    campaign banners, countries, projects, dates (the public keyset), privacy settings, budget
    and schedule. Budgets are set so that the whole schedule fits (with 10 % headroom).
``protected_countries.txt`` -- an illustrative country protection list (see the file).

Everything is vectorised with numpy/pyarrow: 2M impression rows and 1M clicks take a few
seconds. ``python -m pipelines.centralnotice.data --help`` for the command line; the bundled
sample ``pipelines/sample_data/centralnotice/`` is ``python -m pipelines.centralnotice.data
--sample`` (fixed seed).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.calibration import NoiseKind, calibrate, calibrate_zcdp
from pipelines.centralnotice.config import (ISO_3166_ALPHA2, KEY_COLUMNS, CentralNoticeConfig,
                                            parse_config)

SAMPLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample_data", "centralnotice")
SAMPLE_SEED = 20231101

#: ISO 3166-1 alpha-2 codes used by the generator (officially assigned codes plus XK), from
#: :data:`pipelines.centralnotice.config.ISO_3166_ALPHA2`.
COUNTRIES = ISO_3166_ALPHA2

#: Countries with the most Wikipedia traffic first (a rough order; the rest follow in ISO order).
_TOP_COUNTRIES = ("US", "IN", "GB", "DE", "JP", "FR", "RU", "CA", "IT", "ES", "BR", "AU", "PL",
                  "NL", "MX", "ID", "PH", "TR", "KR", "UA", "SE", "CN", "TW", "AR", "IR", "CH",
                  "BE", "AT", "PK", "ZA", "NG", "EG", "CO", "VN", "TH", "MY", "SG", "IE", "NZ",
                  "PT", "CZ", "GR", "IL", "FI", "NO", "DK", "HU", "RO", "CL", "PE", "BD", "SA")
COUNTRY_ORDER = _TOP_COUNTRIES + tuple(c for c in COUNTRIES if c not in _TOP_COUNTRIES)

#: Illustrative protection list written to protected_countries.txt. The authoritative list is
#: the Wikimedia Foundation's Legal:Country_and_Territory_Protection_List; always use that one.
PROTECTED_COUNTRIES = ("AF", "BY", "CN", "CU", "ER", "IR", "KP", "MM", "RU", "SA", "SY", "TM",
                       "VN")

#: Wikipedia languages roughly by size (all have a Wikipedia; the first ones also have sister
#: projects below). 160 languages.
LANGUAGES = tuple("""
en de fr ja es ru pt it zh fa pl ar nl uk he id tr cs sv ko vi fi hu ca th no hi bn el ro sr da
bg ms az et sk hr lt sl uz eu hy ka lv ta ur kk be ml gl sq mk te is mr af la kn bs sw cy ne tl
my mn pa si ga km gu jv br ky tt oc an lb ast zh-yue io tg ceb war su sco yo ckb ha am ps sa ba
mg ht cv fy sd nds lmo pms bar vec ku qu mzn als nap scn ia ie li wa so ig gd os xh zu sn ny rw
ln kg wo lg ti om or as bo dz dv ug yi gn ay tn st ss ts ve ff bm ee tw ak ki kab rm sc co fo kl
hsb dsb csb szl rue lez ce av inh tyv sah bxr xal krc kbd ady
""".split())
#: Sister projects and the number of (top) languages that have one in the generator.
_FAMILIES = (("wikipedia", len(LANGUAGES), 1.0), ("wiktionary", 40, 0.08), ("wikisource", 25, 0.03),
             ("wikiquote", 25, 0.02), ("wikivoyage", 15, 0.02), ("wikibooks", 20, 0.01),
             ("wikinews", 10, 0.01))
_GLOBAL_PROJECTS = (("commons.wikimedia", 0.15), ("www.wikidata", 0.05), ("meta.wikimedia", 0.005),
                    ("species.wikimedia", 0.002), ("incubator.wikimedia", 0.001))


def project_catalogue() -> tuple[np.ndarray, np.ndarray]:
    """All generator projects (several hundred) and their relative traffic weights."""
    names, weights = [], []
    for family, n_langs, family_weight in _FAMILIES:
        for rank, lang in enumerate(LANGUAGES[:n_langs]):
            names.append(f"{lang}.{family}")
            weights.append(family_weight / (rank + 1) ** 1.1)
    for name, weight in _GLOBAL_PROJECTS:
        names.append(name)
        weights.append(weight)
    return np.array(names), np.array(weights)


def _country_weights() -> np.ndarray:
    return 1.0 / (np.arange(len(COUNTRY_ORDER)) + 2.0) ** 1.2


# --------------------------------------------------------------------------- configuration

#: Release thresholds of generated configurations: at most this many noise-only values (a key
#: without data whose noise alone passes) expected per measure and release, whatever its keyset.
SPURIOUS_PER_RELEASE = 1.0


def release_threshold(spec, keys_per_release: int, spurious: float = SPURIOUS_PER_RELEASE) -> float:
    """The threshold a generated configuration states for a measure with noise ``spec``.

    A key without data passes it with probability at most ``spurious / keys_per_release`` (the
    noise's upper tail), so a release of any keyset size publishes at most ``spurious``
    noise-only values per measure in expectation. Thresholds are post-processing of the noisy
    values: they shape utility (which values are shown, which are null = suppressed), never the
    privacy guarantee.
    """
    tail = min(spurious / max(int(keys_per_release), 1), 0.25)
    return float(spec.ci_halfwidth(1 - 2 * tail))


def _privacy(rng: np.random.Generator, n_releases: int, n_days: int, keys_per_release: int) -> dict:
    k = int(rng.choice([10, 50, 100, 200]))
    imp_eps = float(rng.choice([0.25, 0.5, 1.0]))
    impressions = {"k": k, "epsilon": imp_eps, "noise": "discrete_laplace",
                   "neighbouring": "period" if rng.random() < 0.7 else "campaign",
                   }
    imp_spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=imp_eps, l1_sensitivity=k)
    impressions["release_threshold"] = release_threshold(imp_spec, keys_per_release)
    if rng.random() < 0.5:  # user-DP Gaussian clicks under zCDP
        # Most users click once, a few several times (seed 001): a per-user bound of a few clicks
        # keeps nearly every click and the noise (sigma = m / sqrt(2 rho)) small.
        m = int(rng.choice([2, 3, 5]))
        rho = float(rng.choice([0.005, 0.01, 0.02]))
        clicks = {"noise": "discrete_gaussian", "rho": rho, "delta": 1e-9, "neighbouring": "user",
                  # bounding per campaign needs the whole campaign in one release
                  "max_clicks_per_user": m,
                  "bound_per": "campaign" if n_releases == 1 and rng.random() < 0.4 else "period"}
        spec = calibrate_zcdp(NoiseKind.DISCRETE_GAUSSIAN, rho=rho, l2_sensitivity=m, l0=m,
                              delta_for_reporting=1e-9, l1_sensitivity=m)
    else:  # row-DP Laplace clicks
        eps = float(rng.choice([0.25, 0.5, 1.0]))
        clicks = {"noise": "discrete_laplace", "epsilon": eps, "neighbouring": "row"}
        spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=eps, l1_sensitivity=1)
    clicks["release_threshold"] = float(math.ceil(release_threshold(spec, keys_per_release)))
    per_release_eps = imp_spec.epsilon + spec.epsilon
    per_release_delta = imp_spec.delta + spec.delta

    def rounded_up(x, digits=3):  # 3 significant digits, never below x
        if x == 0:
            return 0.0
        step = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
        return float(f"{math.ceil(x / step * (1 - 1e-12)) * step:.{digits}g}")

    budget = {  # 10 % headroom, so the whole schedule fits
        "campaign_total": {"epsilon": rounded_up(per_release_eps * n_releases * 1.1),
                           "delta": rounded_up(per_release_delta * n_releases * 1.1)},
        "per_period": {"epsilon": rounded_up(per_release_eps * 1.1),
                       "delta": rounded_up(per_release_delta * 1.1)},
    }
    return {"impressions": impressions, "clicks": clicks, "budget": budget}


def generate_campaigns(rng: np.random.Generator, *, target_keys: int, start_date: _dt.date,
                       min_campaigns: int = 3, max_campaigns: Optional[int] = None,
                       max_banners: int = 4, max_countries: int = 80, max_projects: int = 60,
                       max_days: int = 21, protected_share: float = 0.5) -> list[dict]:
    """Campaign configurations (JSON dicts) until their keysets reach ``target_keys`` in total;
    a share ``protected_share`` of them also targets two countries of the protection list."""
    projects, project_w = project_catalogue()
    country_w = _country_weights()
    campaigns, total = [], 0
    while (len(campaigns) < min_campaigns or total < target_keys) and \
            (max_campaigns is None or len(campaigns) < max_campaigns):
        i = len(campaigns)
        n_banners = int(rng.integers(1, max_banners + 1))
        n_countries = int(rng.integers(min(5, max_countries), max_countries + 1))
        n_projects = int(rng.integers(min(3, max_projects), max_projects + 1))
        n_days = int(rng.integers(min(3, max_days), max_days + 1))
        countries = rng.choice(len(COUNTRY_ORDER), size=n_countries, replace=False,
                               p=country_w / country_w.sum())
        # Global campaigns also target countries on the protection list (drawn for every
        # campaign, so protected_share does not change the other draws).
        extra = rng.choice(len(PROTECTED_COUNTRIES), size=min(2, len(PROTECTED_COUNTRIES)),
                           replace=False)
        if rng.random() < protected_share:
            countries = np.union1d(countries, [COUNTRY_ORDER.index(PROTECTED_COUNTRIES[e])
                                               for e in extra])
        chosen = rng.choice(len(projects), size=n_projects, replace=False, p=project_w / project_w.sum())
        start = start_date + _dt.timedelta(days=int(rng.integers(0, 30)))
        end = start + _dt.timedelta(days=n_days - 1)
        cid = f"C{start.year}_{i:03d}_{['fr', 'ed', 'wlm', 'survey'][i % 4]}"
        schedule = "daily" if rng.random() < 0.75 else "campaign"
        n_releases = n_days if schedule == "daily" else 1
        campaigns.append({
            "campaign_id": cid,
            "banners": [f"{cid}_b{j}_{['dsk', 'mob', 'ipd', 'app'][j % 4]}" for j in range(n_banners)],
            "countries": [COUNTRY_ORDER[c] for c in sorted(countries)],
            "projects": [str(projects[p]) for p in sorted(chosen)],
            "start_date": start.isoformat(), "end_date": end.isoformat(),
            "schedule": schedule,
            "privacy": _privacy(rng, n_releases, n_days, keys_per_release=n_banners * len(
                [c for c in countries if COUNTRY_ORDER[c] not in PROTECTED_COUNTRIES])
                * n_projects * (1 if schedule == "daily" else n_days)),
        })
        total += n_banners * n_countries * n_projects * n_days
    return campaigns


def protected_countries_text(codes: Sequence[str] = PROTECTED_COUNTRIES) -> str:
    return ("# Country protection list: data from these countries is never released.\n"
            "# ILLUSTRATIVE ONLY. The authoritative list is the Wikimedia Foundation's\n"
            "# Legal:Country_and_Territory_Protection_List; copy it here before a real release.\n"
            "# One ISO 3166-1 alpha-2 code per line; '#' starts a comment.\n"
            + "".join(f"{code}\n" for code in codes))


def make_config(campaigns: list[dict], accountant: str = "basic") -> dict:
    return {"version": 1, "accountant": accountant,
            "protected_countries_file": "protected_countries.txt", "campaigns": campaigns}


# --------------------------------------------------------------------------- impressions

def _take(values: Sequence, index: np.ndarray, typ=pa.string()) -> pa.Array:
    return pa.array(list(values), typ).take(pa.array(index.astype(np.int32, copy=False)))


def _draw(cdf: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` indices drawn with probabilities given by the cumulative ``cdf`` (inverse CDF)."""
    return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"), len(cdf) - 1)


def generate_impressions(config: CentralNoticeConfig, n_rows: int, rng: np.random.Generator,
                         sigma: float = 1.6, reach_log10: tuple = (5.5, 7.5)) -> pa.Table:
    """About ``n_rows`` impression rows over the campaigns' keysets (protected countries included).

    Keys are drawn from popularity marginals (countries and projects Zipf-like, mobile banners
    and weekdays a bit more) and de-duplicated, so popular keys are nearly always present and
    rare ones seldom. impressions = floor(exp(log mean + sigma * N(0,1))): heavy-tailed.
    """
    projects, project_w = project_catalogue()
    project_weight = dict(zip(projects.tolist(), project_w.tolist()))
    country_weight = dict(zip(COUNTRY_ORDER, _country_weights().tolist()))
    sizes = np.array([len(c.banners) * len(c.countries) * len(c.projects) * len(c.dates())
                      for c in config.campaigns], dtype=np.float64)
    quota = np.floor(n_rows * sizes / sizes.sum()).astype(np.int64)
    quota[: n_rows - int(quota.sum())] += 1
    parts = []
    for campaign, want in zip(config.campaigns, quota):
        axes = [len(campaign.banners), len(campaign.countries), len(campaign.projects),
                len(campaign.dates())]
        size = int(np.prod(axes))
        want = int(min(want, size))
        if want == 0:
            continue
        cw = np.array([country_weight[c] for c in campaign.countries])
        pw = np.array([project_weight.get(p, 1e-3) for p in campaign.projects])
        bw = np.linspace(1.0, 0.6, axes[0])
        dw = 1.0 + 0.15 * np.cos(np.arange(axes[3]) * 2 * np.pi / 7)
        marginals = [bw / bw.sum(), cw / cw.sum(), pw / pw.sum(), dw / dw.sum()]
        cdfs = [np.cumsum(m) for m in marginals]
        codes = np.empty(0, dtype=np.int64)
        draws = want
        for _ in range(8):  # draw until enough distinct keys (popular keys repeat)
            idx = [_draw(cdf, int(1.5 * draws), rng) for cdf in cdfs]
            new = ((idx[0] * axes[1] + idx[1]) * axes[2] + idx[2]) * axes[3] + idx[3]
            codes = np.unique(np.concatenate([codes, new]))
            if codes.size >= want:
                break
            draws *= 2
        if codes.size < want:  # tiny keyset: take the rest uniformly
            rest = np.setdiff1d(np.arange(size, dtype=np.int64), codes)
            codes = np.concatenate([codes, rng.choice(rest, size=want - codes.size, replace=False)])
        codes = np.sort(rng.choice(codes, size=want, replace=False))
        d = codes % axes[3]
        p = (codes // axes[3]) % axes[2]
        c = (codes // (axes[3] * axes[2])) % axes[1]
        b = codes // (axes[3] * axes[2] * axes[1])
        scale = 10 ** rng.uniform(*reach_log10)  # campaign reach
        log_mean = (np.log(scale) + np.log(marginals[1][c]) + 0.8 * np.log(marginals[2][p])
                    + np.log(marginals[0][b] * axes[0]) - np.log(axes[3]))
        impressions = np.floor(np.exp(log_mean + sigma * rng.standard_normal(want))).astype(np.int64)
        dates = [campaign.start_date + _dt.timedelta(days=i) for i in range(axes[3])]
        parts.append(pa.table({
            "campaign_id": _take([campaign.campaign_id], np.zeros(want, np.int64)),
            "banner_id": _take(campaign.banners, b),
            "country": _take(campaign.countries, c),
            "project": _take(campaign.projects, p),
            "date": _take(dates, d, pa.date32()),
            "impressions": pa.array(impressions, pa.int64()),
        }))
    return pa.concat_tables(parts)


def inject_bad_rows(table: pa.Table, n_bad: int, rng: np.random.Generator) -> pa.Table:
    """Make ``n_bad`` rows faulty (missing / negative / fractional impressions, in turn) and
    append ``n_bad`` duplicates of existing keys (which the pipeline sums)."""
    if n_bad <= 0:
        return table
    n_bad = min(n_bad, table.num_rows)
    values = table.column("impressions").to_numpy().astype(np.float64)
    mask = np.zeros(len(values), dtype=bool)
    rows = rng.choice(len(values), size=n_bad, replace=False)
    for i, row in enumerate(rows):
        kind = i % 3
        if kind == 0:
            mask[row] = True
        elif kind == 1:
            values[row] = -float(rng.integers(1, 1000))
        else:
            values[row] = values[row] + 0.5
    column = pa.array(values, pa.float64(), mask=mask)
    table = table.set_column(table.schema.get_field_index("impressions"), "impressions", column)
    dup_rows = rng.choice(table.num_rows, size=n_bad, replace=False)
    dups = table.take(pa.array(dup_rows))
    extra = pa.array(rng.integers(1, 1000, size=n_bad).astype(np.float64))
    dups = dups.set_column(dups.schema.get_field_index("impressions"), "impressions", extra)
    return pa.concat_tables([table, dups])


# --------------------------------------------------------------------------- clicks

def _user_ids(n_users: int, rng: np.random.Generator) -> pa.Array:
    logged_in = rng.random(n_users) < 0.3
    account = pc.binary_join_element_wise(
        "acct-", pc.cast(pa.array(rng.permutation(n_users) + 1000), pa.string()), "")
    anon_bits = rng.integers(0, 2 ** 63 - 1, size=n_users, dtype=np.int64)
    # 16 hex digits per anonymous id, vectorised through a fixed-width byte view.
    hex_digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    nibbles = (anon_bits[:, None] >> (np.arange(15, -1, -1) * 4)) & 0xF
    raw = hex_digits[nibbles].astype(np.uint8).tobytes()
    offsets = pa.array(np.arange(0, 16 * n_users + 1, 16, dtype=np.int32))
    anon_hex = pa.StringArray.from_buffers(n_users, offsets.buffers()[1], pa.py_buffer(raw))
    anon = pc.binary_join_element_wise("anon-", anon_hex, "")
    return pc.if_else(pa.array(logged_in), account, anon)


def generate_clicks(impressions: pa.Table, n_clicks: int, rng: np.random.Generator,
                    zipf_a: float = 2.3, max_clicks_per_user: int = 300,
                    home_share: float = 0.75) -> pa.Table:
    """``n_clicks`` click rows on the impression keys; heavy-tailed clicks per user.

    Clicks per user ~ Zipf(``zipf_a``) capped at ``max_clicks_per_user`` (most users click once).
    Each user has a home key drawn in proportion to impressions; a share ``home_share`` of a
    repeat clicker's clicks land on keys of the home key's (campaign, country, project), the
    rest anywhere (again in proportion to impressions).
    """
    if n_clicks <= 0:
        return pa.table({name: pa.array([], impressions.schema.field(name).type)
                         for name in KEY_COLUMNS}
                        | {"user_id": pa.array([], pa.string())})
    weights = pc.fill_null(pc.cast(impressions.column("impressions"), pa.float64()), 0.0).to_numpy()
    weights = np.clip(weights, 0.0, None)
    cdf = np.cumsum(weights)

    def by_impressions(size):
        return _draw(cdf, size, rng)

    per_user = np.minimum(rng.zipf(zipf_a, size=n_clicks), max_clicks_per_user)
    n_users = int(np.searchsorted(np.cumsum(per_user), n_clicks) + 1)
    per_user = per_user[:n_users]
    per_user[-1] -= int(per_user.sum()) - n_clicks
    user = np.repeat(np.arange(n_users), per_user)
    first = np.concatenate([[True], user[1:] != user[:-1]])
    home = by_impressions(n_users)
    # Group rows by (campaign, country, project): a sort order and each group's span.
    group_keys = impressions.select(["campaign_id", "country", "project"])
    group_id = np.asarray(pc.dictionary_encode(pc.binary_join_element_wise(
        group_keys.column(0), group_keys.column(1), group_keys.column(2), "\x1f")).combine_chunks()
        .indices, dtype=np.int64) if impressions.num_rows else np.zeros(0, np.int64)
    order = np.argsort(group_id, kind="stable")
    starts = np.searchsorted(group_id[order], group_id, side="left")
    ends = np.searchsorted(group_id[order], group_id, side="right")
    home_row = home[user]
    in_home_group = rng.random(n_clicks) < home_share
    within = order[starts[home_row] + (rng.random(n_clicks) * (ends[home_row] - starts[home_row]))
                   .astype(np.int64)]
    row = np.where(first, home_row, np.where(in_home_group, within, by_impressions(n_clicks)))
    shuffle = rng.permutation(n_clicks)
    row, user = row[shuffle], user[shuffle]
    keys = impressions.select(list(KEY_COLUMNS)) \
        .take(pa.array(row))
    return keys.append_column("user_id", _user_ids(n_users, rng).take(pa.array(user)))


# --------------------------------------------------------------------------- writing

def write_table(table: pa.Table, path: str) -> None:
    if path.endswith(".parquet"):
        from transforms import parquet_files

        parquet_files.write_table(table, path, compression="zstd")
    elif path.endswith(".csv"):
        from pyarrow import csv

        csv.write_csv(table, path, csv.WriteOptions(quoting_style="needed"))
    else:
        raise ValueError(f"output must end in .parquet or .csv, got {path!r}")


def generate_dataset(out_dir: str, *, impression_rows: int, clicks: int, seed: int,
                     fmt: str = "parquet", start_date: _dt.date = _dt.date(2026, 11, 1),
                     bad_rows: int = 0, min_campaigns: int = 3, max_campaigns: Optional[int] = None,
                     max_banners: int = 4, max_countries: int = 80, max_projects: int = 60,
                     max_days: int = 21, accountant: str = "basic",
                     reach_log10: tuple = (5.5, 7.5), impression_sigma: float = 1.6,
                     click_through_rate: Optional[float] = None,
                     protected_share: float = 0.5, schema_ref: Optional[str] = None) -> dict:
    """Write a synthetic dataset to ``out_dir``; returns the paths and row counts.

    ``schema_ref``: the configuration's ``"$schema"`` (where an editor finds
    ``pipelines/centralnotice/config.schema.json`` from ``out_dir``), if any.

    ``reach_log10``: each campaign's reach (the scale of its impressions) is 10 ** uniform(lo,
    hi); ``impression_sigma``: the spread of the log-normal impressions per key;
    ``protected_share``: the share of campaigns that also target protected countries. ``click_through_rate``: when given, the number of clicks is Binomial(all impressions,
    rate) instead of ``clicks`` (clicks still fall on keys in proportion to impressions).
    """
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"fmt must be 'parquet' or 'csv', got {fmt!r}")
    if impression_rows < 1 or clicks < 0:
        raise ValueError("impression_rows must be >= 1 and clicks >= 0")
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    campaigns = generate_campaigns(
        rng, target_keys=int(2.5 * impression_rows), start_date=start_date,
        min_campaigns=min_campaigns, max_campaigns=max_campaigns, max_banners=max_banners,
        max_countries=max_countries, max_projects=max_projects, max_days=max_days,
        protected_share=protected_share)
    config_dict = make_config(campaigns, accountant)
    if schema_ref:
        config_dict = {"$schema": schema_ref, **config_dict}
    protected_path = os.path.join(out_dir, "protected_countries.txt")
    with open(protected_path, "w") as handle:
        handle.write(protected_countries_text())
    config_path = os.path.join(out_dir, "campaigns.json")
    with open(config_path, "w") as handle:
        json.dump(config_dict, handle, indent=1)
        handle.write("\n")
    config = parse_config(config_dict, config_path)  # the generated configuration must be valid
    impressions = generate_impressions(config, impression_rows, rng, sigma=impression_sigma,
                                       reach_log10=reach_log10)
    if click_through_rate is not None:
        clicks = int(rng.binomial(int(pc.sum(impressions.column("impressions")).as_py()),
                                  click_through_rate))
    click_table = generate_clicks(impressions, clicks, rng)
    impressions = inject_bad_rows(impressions, bad_rows, rng)
    paths = {"config": config_path, "protected_countries": protected_path,
             "impressions": os.path.join(out_dir, f"impressions.{fmt}"),
             "clicks": os.path.join(out_dir, f"clicks.{fmt}")}
    write_table(impressions, paths["impressions"])
    write_table(click_table, paths["clicks"])
    return {"paths": paths, "campaigns": len(campaigns), "impression_rows": impressions.num_rows,
            "click_rows": click_table.num_rows,
            "users": len(pc.unique(click_table.column("user_id"))) if clicks else 0}


#: The bundled sample's click-through rate: clicks / impressions. The seed's example rows show
#: 0.03 % (desktop) and 0.44 % (mobile); the sample takes the desktop rate, the low end, so that
#: its one-row-per-click file stays small.
SAMPLE_CLICK_THROUGH_RATE = 3e-4


#: The bundled sample's ``"$schema"``: the published schema, relative to the sample's folder.
SAMPLE_SCHEMA_REF = "../../centralnotice/config.schema.json"


def generate_sample(out_dir: str = SAMPLE_DIR) -> dict:
    """The small bundled sample (CSV, fixed seed, 4 faulty rows and 4 duplicate keys).

    Three campaigns of a few days over a few countries and projects (each also targeting two
    protected countries, whose rows the release excludes), with campaign reach of
    10^5..10^7 impressions and clicks at :data:`SAMPLE_CLICK_THROUGH_RATE`: small enough to
    bundle (< 400 kB), with keys busy enough that a release shows clicks where they are clearly
    above the noise (and null -- suppressed -- where they are not).
    """
    return generate_dataset(out_dir, impression_rows=300, clicks=0, seed=SAMPLE_SEED, fmt="csv",
                            bad_rows=4, min_campaigns=3, max_campaigns=3, max_banners=1,
                            max_countries=6, max_projects=4, max_days=3, reach_log10=(5.0, 7.0),
                            click_through_rate=SAMPLE_CLICK_THROUGH_RATE, protected_share=1.0,
                            schema_ref=SAMPLE_SCHEMA_REF)


class _Parser(argparse.ArgumentParser):
    """Beam's flag style: underscores, no abbreviations; an old dashed spelling of a flag is
    refused naming the flag to use (exit 2), like any unknown flag."""

    def parse_args(self, args=None, namespace=None):
        known = {o for action in self._actions for o in action.option_strings}
        for arg in sys.argv[1:] if args is None else args:
            name = arg.split("=", 1)[0]
            if name.startswith("--") and "-" in name[2:] and name not in known and \
                    "--" + name[2:].replace("-", "_") in known:
                self.error(f"unrecognized argument {name}: flags are spelt with underscores "
                           f"(Beam style): use --{name[2:].replace('-', '_')}")
        return super().parse_args(args, namespace)


def _shown(result: dict) -> dict:
    """The summary with its file paths relative to the working folder when they are inside it
    (the bundled sample's summary is then the same on every machine)."""
    here = os.getcwd()

    def rel(path: str) -> str:
        inside = os.path.commonpath([here, os.path.abspath(path)]) == here
        return os.path.relpath(path, here) if inside else path
    return {**result, "paths": {k: rel(v) for k, v in result["paths"].items()}}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _Parser(
        prog="python -m pipelines.centralnotice.data", allow_abbrev=False,
        description="Generate synthetic CentralNotice inputs: campaigns.json, "
                    "protected_countries.txt, impressions and clicks tables.")
    parser.add_argument("--out", help="output directory (required unless --sample)")
    parser.add_argument("--impression_rows", type=int, default=2_000_000)
    parser.add_argument("--clicks", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    parser.add_argument("--start_date", type=_dt.date.fromisoformat, default=_dt.date(2026, 11, 1))
    parser.add_argument("--bad_rows", type=int, default=0,
                        help="faulty impressions rows to inject (and as many duplicate keys)")
    parser.add_argument("--max_campaigns", type=int, default=None)
    parser.add_argument("--max_countries", type=int, default=80)
    parser.add_argument("--max_projects", type=int, default=60)
    parser.add_argument("--max_days", type=int, default=21)
    parser.add_argument("--accountant", choices=("basic", "zcdp"), default="basic")
    parser.add_argument("--sample", action="store_true",
                        help="regenerate the bundled sample in pipelines/sample_data/centralnotice/ "
                             "(ignores other options)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.sample:
        result = generate_sample(args.out or SAMPLE_DIR)
    else:
        if not args.out:
            parser.error("--out is required (or --sample)")
        result = generate_dataset(args.out, impression_rows=args.impression_rows, clicks=args.clicks,
                                  seed=args.seed, fmt=args.format, start_date=args.start_date,
                                  bad_rows=args.bad_rows, max_campaigns=args.max_campaigns,
                                  max_countries=args.max_countries, max_projects=args.max_projects,
                                  max_days=args.max_days, accountant=args.accountant)
    result["seconds"] = round(time.perf_counter() - started, 2)
    json.dump(_shown(result), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
