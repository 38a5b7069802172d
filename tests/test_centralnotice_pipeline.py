"""The CentralNotice release pipeline end to end (FnApiRunner): exactness in testing mode, the
ledger (idempotent re-runs, changed input, budget refusals), thresholds, row rules with their
Beam counters, job-level errors before any work, gs:// through the storage emulator, user-DP
bounding."""
from __future__ import annotations

import collections
import copy
import datetime as dt
import json
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.csv  # noqa: F401  (pa.csv)
import pyarrow.parquet as pq
import pytest
from gcs_emulator import storage_emulator

from accounting import gcs
from accounting.keystore import KeyRef
from accounting.ledger import BudgetLedger
from pipelines.centralnotice import (KEYS, CentralNoticeRelease, ReadTables, WriteOutput,
                                     main)
from pipelines.centralnotice_config import parse_config
from accounting.keys import ReleaseKey

CAMPAIGN = "C1"
DAY1, DAY2 = dt.date(2026, 11, 1), dt.date(2026, 11, 2)
RELEASE1 = f"{CAMPAIGN}/{DAY1.isoformat()}"
BANNERS = ["C1_dsk", "C1_mob"]
COUNTRIES = ["DE", "FR", "RU"]  # RU is on the protection list
RELEASED_COUNTRIES = ["DE", "FR"]
PROJECTS = ["de.wikipedia", "fr.wikipedia"]


def keyset(dates):
    return [(b, c, p, d.isoformat()) for b in BANNERS for c in RELEASED_COUNTRIES for p in PROJECTS
            for d in dates]


KEYSET_DAY1 = keyset([DAY1])
LOW = -1e9  # a threshold that suppresses nothing

IMP_HEADER = ["campaign_id", "banner_id", "country", "project", "date", "impressions"]
CLK_HEADER = ["campaign_id", "banner_id", "country", "project", "date", "user_id"]


def campaign_dict(*, clicks=None, budget=None, impressions=None, end=DAY2, schedule="daily",
                  countries=COUNTRIES):
    return {
        "campaign_id": CAMPAIGN, "banners": list(BANNERS), "countries": list(countries),
        "projects": list(PROJECTS), "start_date": DAY1.isoformat(), "end_date": end.isoformat(),
        "schedule": schedule,
        "privacy": {
            "impressions": {"k": 10, "epsilon": 1.0, "noise": "discrete_laplace",
                            "neighbouring": "period", "release_threshold": LOW,
                            **(impressions or {})},
            "clicks": clicks or {"noise": "discrete_laplace", "epsilon": 1.0, "neighbouring": "row",
                                 "release_threshold": LOW},
            "budget": budget or {"campaign_total": {"epsilon": 8.0}, "per_period": {"epsilon": 4.0}},
        },
    }


def config_dict(**campaign):
    return {"version": 1, "protected_countries": ["RU"], "campaigns": [campaign_dict(**campaign)]}


USER_CLICKS = {"noise": "discrete_laplace", "epsilon": 1.0, "neighbouring": "user",
               "max_clicks_per_user": 3, "bound_per": "period", "release_threshold": LOW}


def write_config(tmp_path, data, name="campaigns.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def write_csv(path, header, rows) -> str:
    """Rows as CSV text; a row given as a str is written verbatim (malformed lines)."""
    lines = [",".join(header)]
    for row in rows:
        lines.append(row if isinstance(row, str) else ",".join("" if v is None else str(v) for v in row))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def released(path) -> dict:
    """{(banner, country, project, date): (impressions, clicks)} of an output Parquet file."""
    table = pq.read_table(str(path))
    assert table.column_names == KEYS + ["impressions", "clicks"]
    rows = table.to_pylist()
    assert all(r["campaign_id"] == CAMPAIGN for r in rows)
    return {(r["banner_id"], r["country"], r["project"], r["date"].isoformat()):
            (r["impressions"], r["clicks"]) for r in rows}


def run_transform(campaign, dates, imp_paths, clk_paths, out, *, fmt="csv", testing=True, key=None):
    """The pipeline of ``run_release`` around CentralNoticeRelease (no ledger); returns the
    released rows and the Beam counters {(namespace, name): total}."""
    need_user = campaign.clicks.neighbouring == "user"
    transform = CentralNoticeRelease(campaign, dates, key or ReleaseKey.for_testing(1), testing=testing,
                                     num_shards=2)
    p = beam.Pipeline(runner="FnApiRunner")
    imp = (p | "ImpFiles" >> beam.Create(imp_paths)
           | "ReadImp" >> beam.ParDo(ReadTables(fmt, KEYS + ["impressions"], "impressions")))
    clk = (p | "ClkFiles" >> beam.Create(clk_paths)
           | "ReadClk" >> beam.ParDo(ReadTables(fmt, KEYS + (["user_id"] if need_user else []), "clicks")))
    ((imp, clk) | "Release" >> transform | "Gather" >> beam.combiners.ToList()
     | "Write" >> beam.ParDo(WriteOutput(str(out), "parquet")))
    result = p.run()
    result.wait_until_finish()
    counters = collections.Counter()
    for metric in result.metrics().query()["counters"]:
        counters[(metric.key.metric.namespace, metric.key.metric.name)] += metric.committed
    return released(out), counters


def random_rows(rng, n, *, value):
    """Rows over a superset of the configured keys: other campaigns, days, banners, countries."""
    campaigns = rng.choice(["C1", "C1", "C1", "C2"], n)
    banners = rng.choice(BANNERS + ["C1_xx"], n, p=[0.45, 0.45, 0.1])
    countries = rng.choice(["DE", "FR", "RU", "US"], n, p=[0.4, 0.35, 0.15, 0.1])
    projects = rng.choice(PROJECTS + ["en.wikipedia"], n, p=[0.45, 0.45, 0.1])
    dates = rng.choice([DAY1.isoformat(), DAY1.isoformat(), DAY2.isoformat(), "2026-12-25"], n)
    rows = [(c, b, g, p, d, value(i)) for i, (c, b, g, p, d) in
            enumerate(zip(campaigns, banners, countries, projects, dates))]
    # One key of the keyset never has data: it must be released as 0, not be absent.
    return [r for r in rows if r[1:5] != ("C1_mob", "FR", "fr.wikipedia", DAY1.isoformat())]


def in_release(row, dates=(DAY1,)) -> bool:
    campaign, banner, country, project, date = row[:5]
    return (campaign == CAMPAIGN and date in [d.isoformat() for d in dates] and banner in BANNERS
            and country in RELEASED_COUNTRIES and project in PROJECTS)


# --------------------------------------------------------------------------- command line

def test_help_and_schedule(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--config", "--impressions", "--clicks", "--release", "--output", "--ledger",
                   "--key-store", "--new-release", "--testing-seed"):
        assert option in text
    config = write_config(tmp_path, config_dict())
    assert main(["--config", config, "--list-releases"]) == 0
    assert capsys.readouterr().out.split() == [RELEASE1, f"{CAMPAIGN}/{DAY2.isoformat()}"]


# --------------------------------------------------------------------------- exactness (testing mode)

@pytest.mark.parametrize("fmt, dates", [("csv", [DAY1]), ("parquet", [DAY1]), ("csv", [DAY1, DAY2])])
def test_testing_mode_releases_exact_per_key_sums_and_counts(tmp_path, fmt, dates):
    """One day (daily schedule) or the whole campaign (schedule "campaign")."""
    rng = np.random.default_rng(5)
    imp_rows = random_rows(rng, 400, value=lambda i: int(rng.integers(0, 5000)))
    imp_rows.append(("C1", "C1_dsk", "DE", "de.wikipedia", DAY1.isoformat(), 10 ** 12))  # stays exact
    clk_rows = random_rows(rng, 600, value=lambda i: f"u{i}")
    campaign = parse_config(config_dict(schedule="daily" if len(dates) == 1 else "campaign")).campaigns[0]
    assert list(campaign.releases()[0].dates) == dates
    if fmt == "csv":
        imp = [write_csv(tmp_path / "imp.csv", IMP_HEADER, imp_rows[:200]),
               write_csv(tmp_path / "imp2.csv", IMP_HEADER, imp_rows[200:])]
        clk = [write_csv(tmp_path / "clk.csv", CLK_HEADER, clk_rows)]
    else:
        def table(rows, header, typ):
            cols = list(zip(*rows))
            data = {h: pa.array(list(c)) for h, c in zip(header[:4], cols[:4])}
            data["date"] = pa.array([dt.date.fromisoformat(d) for d in cols[4]], pa.date32())
            data[header[5]] = pa.array(list(cols[5]), typ)
            return pa.table(data)
        pq.write_table(table(imp_rows, IMP_HEADER, pa.int64()), tmp_path / "imp.parquet", row_group_size=150)
        pq.write_table(table(clk_rows, CLK_HEADER, pa.string()), tmp_path / "clk.parquet")
        imp, clk = [str(tmp_path / "imp.parquet")], [str(tmp_path / "clk.parquet")]
    got, counters = run_transform(campaign, dates, imp, clk, tmp_path / "out.parquet", fmt=fmt)

    want_imp, want_clk = collections.Counter(), collections.Counter()
    for row in imp_rows:
        if in_release(row, dates):
            want_imp[row[1:5]] += row[5]
    for row in clk_rows:
        if in_release(row, dates):
            want_clk[row[1:5]] += 1
    assert sorted(got) == sorted(keyset(dates))  # every keyset key; nothing protected or outside
    assert got == {key: (want_imp[key], want_clk[key]) for key in keyset(dates)}
    empty = ("C1_mob", "FR", "fr.wikipedia", DAY1.isoformat())
    assert got[empty] == (0, 0)
    assert got[("C1_dsk", "DE", "de.wikipedia", DAY1.isoformat())][0] > 10 ** 12
    # Rows were really there to be filtered out (the test data covers every rule).
    assert counters[("centralnotice", "impressions_rows_other_releases")] > 0
    assert counters[("centralnotice", "impressions_rows_outside_keyset")] > 0
    assert counters[("centralnotice", "impressions_rows_protected_country")] > 0
    assert counters[("centralnotice", "clicks_rows_protected_country")] > 0
    assert counters[("centralnotice", "impressions_rows_read")] == len(imp_rows)
    assert counters[("centralnotice", "clicks_rows_read")] == len(clk_rows)
    assert counters[("dp_release", "keys_released")] == len(keyset(dates))


@pytest.mark.parametrize("bound_per, dates", [("period", [DAY1]), ("campaign", [DAY1, DAY2])])
def test_user_dp_bounds_each_user_to_m_clicks(tmp_path, bound_per, dates):
    """Testing mode, user-DP with m = 3: users within the bound are counted exactly, a user with
    50 clicks on one key adds m, a user spread over 4 keys (over both days of a per-campaign
    release) adds m in total. Integer user ids and null user ids in Parquet."""
    m = USER_CLICKS["max_clicks_per_user"]
    campaign = parse_config(config_dict(clicks={**USER_CLICKS, "bound_per": bound_per},
                                        schedule="daily" if len(dates) == 1 else "campaign")).campaigns[0]
    assert list(campaign.releases()[0].dates) == dates
    rng = np.random.default_rng(3)
    keys = [("C1",) + key for key in keyset(dates)]
    rows, want = [], collections.Counter()
    for user in range(40):  # 1..m clicks each, on random keys of the release
        for _ in range(int(rng.integers(1, m + 1))):
            key = keys[int(rng.integers(0, len(keys)))]
            rows.append(key + (user,))
            want[key[1:]] += 1
    heavy = keys[0]
    rows += [heavy + (1000,)] * 50
    want[heavy[1:]] += m
    spread = keys[1:5]
    rows += [key + (2000,) for key in spread for _ in range(2)]
    rows += [keys[5] + (None,)] * 7  # no user id: dropped and counted
    cols = list(zip(*rows))
    table = pa.table({"campaign_id": list(cols[0]), "banner_id": list(cols[1]), "country": list(cols[2]),
                      "project": list(cols[3]),
                      "date": pa.array([dt.date.fromisoformat(d) for d in cols[4]], pa.date32()),
                      "user_id": pa.array(list(cols[5]), pa.int64())})
    pq.write_table(table, tmp_path / "clicks.parquet")
    pq.write_table(pa.table({"campaign_id": ["C1"], "banner_id": ["C1_dsk"], "country": ["DE"],
                             "project": ["de.wikipedia"], "date": pa.array([DAY1], pa.date32()),
                             "impressions": [5]}), tmp_path / "imp.parquet")
    got, counters = run_transform(campaign, dates, [str(tmp_path / "imp.parquet")],
                                  [str(tmp_path / "clicks.parquet")], tmp_path / "out.parquet",
                                  fmt="parquet")
    assert sorted(got) == sorted(keyset(dates))
    clicks = {key: value[1] for key, value in got.items()}
    assert clicks[heavy[1:]] == want[heavy[1:]]  # the heavy user adds exactly m, not 50
    excess = {key[1:]: clicks[key[1:]] - want[key[1:]] for key in spread}
    assert all(0 <= e <= 2 for e in excess.values()) and sum(excess.values()) == m
    assert len({key[4] for key in spread}) == len(dates)  # the spread user covers every day
    others = [k for k in keyset(dates) if k not in excess]
    assert {k: clicks[k] for k in others} == {k: want[k] for k in others}
    assert counters[("centralnotice", "clicks_dropped_missing_user")] == 7


def _wide_campaign(n_banners, n_countries, n_projects, **kw):
    """A campaign with a large keyset (for looking at the noise across keys)."""
    from pipelines.centralnotice_config import ISO_3166_ALPHA2

    data = config_dict(**kw)
    raw = data["campaigns"][0]
    raw["banners"] = [f"C1_b{i}" for i in range(n_banners)]
    raw["countries"] = [c for c in ISO_3166_ALPHA2 if c != "RU"][:n_countries]
    raw["projects"] = [f"p{i}.wikipedia" for i in range(n_projects)]
    return parse_config(data).campaigns[0]


def discrete_laplace_std(scale):
    t = 1.0 / scale
    return float(np.sqrt(2 * np.exp(-t)) / (1 - np.exp(-t)))


def test_noise_scale_follows_the_sensitivities(tmp_path):
    """No data, real noise from a (testing) key over 2,000 keys: impressions noise has the spread
    of discrete Laplace(k / epsilon) = (10), user-DP clicks of discrete Laplace(m / epsilon) = (3),
    both centred, and the two measures draw independent noise."""
    campaign = _wide_campaign(8, 25, 10, clicks=USER_CLICKS)
    imp = write_csv(tmp_path / "imp.csv", IMP_HEADER, [])
    clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, [])
    got, _ = run_transform(campaign, [DAY1], [imp], [clk], tmp_path / "o.parquet", testing=False,
                           key=ReleaseKey.for_testing(11))
    assert len(got) == campaign.keyset_size([DAY1]) == 2000
    noise = np.array(list(got.values()), dtype=float)
    for column, scale in ((0, 10 / 1.0), (1, 3 / 1.0)):
        values = noise[:, column]
        assert np.all(values == np.round(values))  # integer noise for integer counts
        assert abs(values.mean()) < 5 * discrete_laplace_std(scale) / np.sqrt(len(values))
        assert values.std() == pytest.approx(discrete_laplace_std(scale), rel=0.12)
    assert abs(np.corrcoef(noise[:, 0], noise[:, 1])[0, 1]) < 0.1


def _ks_distance(values, pmf, support):
    """Largest gap between the empirical CDF of integer ``values`` and the CDF of ``pmf``."""
    cdf = np.cumsum(pmf(support))
    empirical = np.searchsorted(np.sort(values), support, side="right") / len(values)
    return float(np.abs(empirical - cdf).max())


@pytest.mark.slow
def test_noise_distributions_over_100k_keys(tmp_path):
    """Impressions: discrete Laplace(k / epsilon); clicks (zCDP, user-DP): discrete Gaussian with
    sigma = m / sqrt(2 rho). 100,000 keys, no data; Kolmogorov-Smirnov distance below the 1 %
    critical value 1.63 / sqrt(n) (conservative for discrete laws), while the laws of the wrong
    sensitivity (1 instead of k or m) are far."""
    rho, m, k = 0.02, USER_CLICKS["max_clicks_per_user"], 10
    clicks = {"noise": "discrete_gaussian", "rho": rho, "delta": 1e-9, "neighbouring": "user",
              "max_clicks_per_user": m, "bound_per": "period", "release_threshold": LOW}
    campaign = _wide_campaign(25, 100, 40, clicks=clicks,
                              budget={"campaign_total": {"epsilon": 20.0, "delta": 1e-6}})
    imp = write_csv(tmp_path / "imp.csv", IMP_HEADER, [])
    clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, [])
    got, _ = run_transform(campaign, [DAY1], [imp], [clk], tmp_path / "o.parquet", testing=False,
                           key=ReleaseKey.for_testing(12))
    assert len(got) == 100_000
    noise = np.array(list(got.values()), dtype=np.int64)
    critical = 1.63 / np.sqrt(len(noise))
    support = np.arange(-400, 401)

    def laplace(scale):
        t = 1.0 / scale
        return lambda x: (1 - np.exp(-t)) / (1 + np.exp(-t)) * np.exp(-t * np.abs(x))

    def gaussian(sigma):
        weights = np.exp(-support.astype(float) ** 2 / (2 * sigma ** 2))
        return lambda x: np.exp(-x.astype(float) ** 2 / (2 * sigma ** 2)) / weights.sum()

    assert _ks_distance(noise[:, 0], laplace(k / 1.0), support) < critical
    assert _ks_distance(noise[:, 0], laplace(1 / 1.0), support) > 10 * critical
    assert _ks_distance(noise[:, 1], gaussian(m / np.sqrt(2 * rho)), support) < critical
    assert _ks_distance(noise[:, 1], gaussian(1 / np.sqrt(2 * rho)), support) > 10 * critical


# --------------------------------------------------------------------------- thresholds

def test_values_not_above_threshold_are_null_and_keys_with_both_null_are_not_released(tmp_path):
    campaign = parse_config(config_dict(impressions={"release_threshold": 100},
                                        clicks={"noise": "discrete_laplace", "epsilon": 1.0,
                                                "neighbouring": "row", "release_threshold": 5}
                                        )).campaigns[0]
    d = DAY1.isoformat()
    a, b, c, e = KEYSET_DAY1[:4]  # the other keys have no data: (0, 0), both suppressed
    imp = [("C1",) + a + (101,), ("C1",) + b + (100,), ("C1",) + c + (500,), ("C1",) + e + (50,)]
    clk = [("C1",) + a + ("u",)] * 6 + [("C1",) + b + ("u",)] * 9 + [("C1",) + c + ("u",)] * 5 \
        + [("C1",) + e + ("u",)] * 2
    got, counters = run_transform(campaign, [DAY1], [write_csv(tmp_path / "i.csv", IMP_HEADER, imp)],
                                  [write_csv(tmp_path / "c.csv", CLK_HEADER, clk)], tmp_path / "o.parquet")
    assert got == {a: (101, 6), b: (None, 9), c: (500, None)}
    assert all(key[3] == d for key in got)
    assert counters[("dp_release", "keys_suppressed_by_threshold")] == len(KEYSET_DAY1) - 3
    assert counters[("dp_release", "keys_released")] == 3


# --------------------------------------------------------------------------- bad input

def test_row_level_faults_follow_the_rules_and_are_counted(tmp_path):
    campaign = parse_config(config_dict(clicks=USER_CLICKS)).campaigns[0]
    d, d2 = DAY1.isoformat(), DAY2.isoformat()
    key = ("C1", "C1_dsk", "DE", "de.wikipedia", d)
    other = ("C1", "C1_mob", "FR", "de.wikipedia", d)
    imp = [
        key + (40,), key + (2,),                                  # duplicates: summed
        other + (7,),
        other + (-3,), other + (2.5,), other + ("",), other + ("lots",),  # dropped
        ("C1", "", "DE", "de.wikipedia", d, 9),                   # missing banner
        ("C1", "C1_dsk", "DE", "de.wikipedia", "2026-13-45", 9),  # unparseable date
        ("C1", "C1_dsk", "DE", "de.wikipedia", "2026-12-25", 9),  # outside the campaign
        ("C1", "C1_dsk", "DE", "de.wikipedia", d2, 9),            # another day's release
        ("C9", "C1_dsk", "DE", "de.wikipedia", d, 9),             # unknown campaign
        ("C1", "C9_dsk", "DE", "de.wikipedia", d, 9),             # unknown banner
        ("C1", "C1_dsk", "RU", "de.wikipedia", d, 9),             # protected country
        "C1,C1_dsk,DE,de.wikipedia",                              # malformed: too few fields
        f"C1,C1_dsk,DE,de.wikipedia,{d},5,extra",                 # malformed: too many fields
    ]
    clk = [key + ("u1",), key + ("u2",), other + ("u1",),
           key + ("",), key + ("",),                              # no user id
           ("C1", "C9_dsk", "DE", "de.wikipedia", d, "u3"),       # unknown banner
           ("C1", "C1_dsk", "", "de.wikipedia", d, "u3"),         # missing country
           ("C1", "C1_dsk", "DE", "de.wikipedia", "2026-12-25", "u3"),
           f"C1,C1_dsk,DE,de.wikipedia,{d},u4,extra"]             # malformed
    got, counters = run_transform(campaign, [DAY1], [write_csv(tmp_path / "i.csv", IMP_HEADER, imp)],
                                  [write_csv(tmp_path / "c.csv", CLK_HEADER, clk)], tmp_path / "o.parquet")
    want = {k: (0, 0) for k in KEYSET_DAY1}
    want[key[1:]] = (42, 2)
    want[other[1:]] = (7, 1)
    assert got == want
    cn = {name: n for (ns, name), n in counters.items() if ns == "centralnotice"}
    assert cn == {
        "impressions_rows_read": 14, "impressions_malformed_csv_lines": 2,
        "impressions_dropped_negative": 1, "impressions_dropped_fractional": 1,
        "impressions_dropped_missing": 1, "impressions_dropped_unparseable": 1,
        "impressions_dropped_missing_key": 2, "impressions_rows_other_releases": 3,
        "impressions_rows_outside_keyset": 1, "impressions_rows_protected_country": 1,
        "clicks_rows_read": 8, "clicks_malformed_csv_lines": 1, "clicks_dropped_missing_user": 2,
        "clicks_dropped_missing_key": 1,
        "clicks_rows_other_releases": 1, "clicks_rows_outside_keyset": 1,
    }


def test_csv_values_that_look_like_null_markers_are_data(tmp_path):
    """Namibia is "NA"; a user may be called "null": only an empty field is missing in CSV."""
    campaign = parse_config(config_dict(countries=["NA", "DE"], clicks=USER_CLICKS)).campaigns[0]
    d = DAY1.isoformat()
    namibia = ("C1", "C1_dsk", "NA", "de.wikipedia", d)
    imp = [namibia + (120,), namibia + ("",), namibia + ("NaN",)]
    clk = [namibia + ("NA",), namibia + ("null",), namibia + ("nan",), namibia + ("",)]
    got, counters = run_transform(campaign, [DAY1], [write_csv(tmp_path / "i.csv", IMP_HEADER, imp)],
                                  [write_csv(tmp_path / "c.csv", CLK_HEADER, clk)], tmp_path / "o.parquet")
    assert got[namibia[1:]] == (120, 3)
    assert len(got) == len(BANNERS) * 2 * len(PROJECTS)
    assert counters[("centralnotice", "impressions_dropped_missing")] == 1
    assert counters[("centralnotice", "impressions_dropped_unparseable")] == 1
    assert counters[("centralnotice", "clicks_dropped_missing_user")] == 1


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_header_only_inputs_release_pure_noise(tmp_path, capsys, fmt):
    """Empty inputs are not an error: every keyset key is released with noise only. (The CSV
    impressions header starts with a UTF-8 byte-order mark, as spreadsheet exports write it.)"""
    config = write_config(tmp_path, config_dict())
    if fmt == "csv":
        imp = write_csv(tmp_path / "imp.csv", ["\ufeff" + IMP_HEADER[0]] + IMP_HEADER[1:], [])
        assert (tmp_path / "imp.csv").read_bytes().startswith(b"\xef\xbb\xbfcampaign_id,")
        clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, [])
    else:
        imp, clk = str(tmp_path / "imp.parquet"), str(tmp_path / "clk.parquet")
        keys = {name: pa.array([], pa.date32() if name == "date" else pa.string()) for name in KEYS}
        pq.write_table(pa.table({**keys, "impressions": pa.array([], pa.int64())}), imp)
        pq.write_table(pa.table({**keys, "user_id": pa.array([], pa.string())}), clk)
    out = tmp_path / "out"
    assert main(["--config", config, "--impressions", imp, "--clicks", clk, "--release", RELEASE1,
                 "--output", str(out), "--testing-seed", "3"]) == 0
    got = released(out / CAMPAIGN / DAY1.isoformat() / "centralnotice.parquet")
    assert sorted(got) == sorted(KEYSET_DAY1)
    values = np.array(list(got.values()), dtype=float)
    assert np.any(values != 0)  # noise was drawn for every key, none of it from data
    report = json.loads((out / CAMPAIGN / DAY1.isoformat() / "report.json").read_text())
    assert report["status"].startswith("NOT A RELEASE")
    assert report["keys"] == {"keyset": 8, "released": 8, "suppressed": 0,
                              "impressions_suppressed": 0, "clicks_suppressed": 0}


@pytest.mark.parametrize("args, message", [
    (["--release", "C1/2026-12-01"], "not scheduled"),
    (["--campaign", "C1", "--date", "2026-12-01"], "outside campaign"),
    (["--campaign", "C9", "--date", "2026-11-01"], "no campaign 'C9'"),
    ([], "name the release"),
    (["--release", RELEASE1, "--ledger", "LEDGER"], "--key-store"),
    (["--release", RELEASE1, "--impressions", "NOWHERE/*.csv"], "no input files match"),
])
def test_bad_invocation_fails_before_any_work(tmp_path, capsys, args, message):
    config = write_config(tmp_path, config_dict())
    imp = write_csv(tmp_path / "imp.csv", IMP_HEADER, [])
    clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, [])
    args = [str(tmp_path / a) if a in ("LEDGER", "NOWHERE/*.csv") else a for a in args]
    argv = ["--config", config, "--impressions", imp, "--clicks", clk, "--output", str(tmp_path / "out")]
    assert main(argv + args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "LEDGER").exists()


def _with_path(data, path, value):
    data = copy.deepcopy(data)
    node = data
    for part in path[:-1]:
        node = node[part]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize("change, message", [
    ((("campaigns", 0, "privacy", "impressions", "k"), 0), "campaigns[0].privacy.impressions.k"),
    ((("campaigns", 0, "privacy", "clicks", "neighbouring"), "user"),
     "campaigns[0].privacy.clicks.max_clicks_per_user"),
    ((("campaigns", 0, "countries", 1), "UK"), "campaigns[0].countries[1]"),
    ((("campaigns", 0, "schedule"), ...), "campaigns[0].schedule"),
    (None, "not valid JSON"),
])
def test_bad_config_fails_before_any_work(tmp_path, capsys, change, message):
    if change is None:
        (tmp_path / "campaigns.json").write_text('{"version": 1, "campaigns": [}')
        config = str(tmp_path / "campaigns.json")
    else:
        config = write_config(tmp_path, _with_path(config_dict(), *change))
    imp = write_csv(tmp_path / "imp.csv", IMP_HEADER, [("C1",) + KEYSET_DAY1[0] + (5,)])
    clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, [])
    out = tmp_path / "out"
    assert main(["--config", config, "--impressions", imp, "--clicks", clk, "--release", RELEASE1,
                 "--output", str(out), "--ledger", str(tmp_path / "ledger.json"),
                 "--key-store", str(tmp_path / "keys")]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "ledger.json").exists() and not (tmp_path / "keys").exists()


@pytest.mark.parametrize("clicks, beam_args, message", [
    ({**USER_CLICKS, "bound_per": "campaign"}, [], "cannot bound a user"),  # daily release
    (None, ["--runner", "DataflowRunner", "--project", "p", "--region", "r"], "temp_location"),
    (None, ["--num-shards", "-1"], "--num-shards"),
])
def test_impossible_run_is_refused_before_the_ledger_charges(tmp_path, capsys, clicks, beam_args, message):
    """A plan that cannot keep its guarantee, or Beam options that cannot run, are refused before
    any budget is spent or key stored."""
    config = write_config(tmp_path, config_dict(clicks=clicks))
    imp, clk = _inputs(tmp_path)
    out = tmp_path / "out"
    assert main(_release_args(config, imp, clk, out, tmp_path, *beam_args)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "keys").exists()
    assert not (tmp_path / "ledger.json").exists()


@pytest.mark.parametrize("which, column, user_dp", [
    ("impressions", "impressions", False), ("impressions", "date", False),
    ("clicks", "user_id", True), ("clicks", "country", False),
])
def test_missing_column_fails_before_any_work(tmp_path, capsys, which, column, user_dp):
    config = write_config(tmp_path, config_dict(clicks=USER_CLICKS) if user_dp else config_dict())
    headers = {"impressions": list(IMP_HEADER), "clicks": list(CLK_HEADER)}
    headers[which].remove(column)
    imp = write_csv(tmp_path / "imp.csv", headers["impressions"], [])
    clk = write_csv(tmp_path / "clk.csv", headers["clicks"], [])
    out = tmp_path / "out"
    assert main(["--config", config, "--impressions", imp, "--clicks", clk, "--release", RELEASE1,
                 "--output", str(out), "--ledger", str(tmp_path / "ledger.json"),
                 "--key-store", str(tmp_path / "keys")]) == 2
    err = capsys.readouterr().err
    assert f"--{which}" in err and repr(column) in err
    assert not out.exists() and not (tmp_path / "ledger.json").exists()


# --------------------------------------------------------------------------- ledger: noise, re-runs, budget

def _release_args(config, imp, clk, out, tmp_path, *extra):
    return ["--config", config, "--impressions", imp, "--clicks", clk, "--release", RELEASE1,
            "--output", str(out), "--ledger", str(tmp_path / "ledger.json"),
            "--key-store", str(tmp_path / "keys"), *extra]


def _inputs(tmp_path, extra_impressions=0):
    d = DAY1.isoformat()
    imp = [("C1",) + key + (1000 + 10 * i,) for i, key in enumerate(KEYSET_DAY1)]
    if extra_impressions:
        imp.append(("C1",) + KEYSET_DAY1[0] + (extra_impressions,))
    clk = [("C1",) + key + (f"u{i}",) for i, key in enumerate(KEYSET_DAY1) for _ in range(i)]
    assert all(r[4] == d for r in imp)
    return (write_csv(tmp_path / "imp.csv", IMP_HEADER, imp),
            write_csv(tmp_path / "clk.csv", CLK_HEADER, clk))


def test_release_rerun_changed_input_and_new_release(tmp_path, capsys):
    config = write_config(tmp_path, config_dict())
    imp, clk = _inputs(tmp_path)
    out = tmp_path / "out"
    output = out / CAMPAIGN / DAY1.isoformat() / "centralnotice.parquet"
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))

    assert main(_release_args(config, imp, clk, out, tmp_path)) == 0
    first = output.read_bytes()
    spent = ledger.spent(CAMPAIGN)
    assert spent.epsilon == pytest.approx(2.0)
    report = json.loads((output.parent / "report.json").read_text())
    fingerprint = report["budget"]["key_fingerprint"]
    exact = {key: (1000 + 10 * i, i) for i, key in enumerate(KEYSET_DAY1)}
    noisy = released(output)
    assert sorted(noisy) == sorted(exact) and noisy != exact  # real noise, same keys
    assert report["release_guarantee"] == {"epsilon": pytest.approx(2.0), "delta": 0.0}

    # Unchanged input: the same key, identical bytes, nothing more spent (however it is sharded).
    assert main(_release_args(config, imp, clk, out, tmp_path, "--num-shards", "5")) == 0
    assert output.read_bytes() == first
    assert ledger.spent(CAMPAIGN) == spent
    assert ledger.get(RELEASE1)["runs"] == 2
    assert json.loads((output.parent / "report.json").read_text())["budget"]["key_fingerprint"] == fingerprint

    # Changed input: refused, nothing written, nothing spent.
    imp, clk = _inputs(tmp_path, extra_impressions=5)
    ledger_bytes = (tmp_path / "ledger.json").read_bytes()
    capsys.readouterr()
    assert main(_release_args(config, imp, clk, out, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "changed" in err.lower() or "input is now" in err
    assert "--new-release" in err
    assert output.read_bytes() == first and (tmp_path / "ledger.json").read_bytes() == ledger_bytes
    assert not (output.parent / "centralnotice.parquet.incomplete").exists()

    # --new-release: a new version with a fresh key, charged afresh.
    assert main(_release_args(config, imp, clk, out, tmp_path, "--new-release")) == 0
    version2 = output.parent / "v2" / output.name
    report = json.loads((version2.parent / "report.json").read_text())
    assert report["release_id"] == RELEASE1 + "#2"
    assert report["budget"]["key_fingerprint"] != fingerprint
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(4.0)
    assert version2.read_bytes() != first
    assert output.read_bytes() == first  # version 1's published files are left as they were
    assert ledger.get(RELEASE1)["output_path"] == str(version2)


@pytest.mark.parametrize("budget, scope", [
    ({"campaign_total": {"epsilon": 2.0}}, "campaign budget"),
    ({"campaign_total": {"epsilon": 10.0}, "per_period": {"epsilon": 2.0}}, "per-period budget"),
])
def test_release_beyond_the_budget_is_refused_before_any_output(tmp_path, capsys, budget, scope):
    # One-day campaign whose budget pays for exactly one release (each costs epsilon 1 + 1).
    config = write_config(tmp_path, config_dict(budget=budget, end=DAY1))
    imp, clk = _inputs(tmp_path)
    assert main(_release_args(config, imp, clk, tmp_path / "out", tmp_path)) == 0
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))
    spent = ledger.spent(CAMPAIGN)
    keys_before = sorted(os.listdir(tmp_path / "keys"))
    imp, clk = _inputs(tmp_path, extra_impressions=7)
    capsys.readouterr()
    assert main(_release_args(config, imp, clk, tmp_path / "out2", tmp_path, "--new-release")) == 2
    assert scope in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()
    assert ledger.spent(CAMPAIGN) == spent
    assert sorted(os.listdir(tmp_path / "keys")) == keys_before


# --------------------------------------------------------------------------- gs://

def test_release_on_gcs_through_the_storage_emulator(tmp_path):
    """Config, inputs (a Parquet "directory" and a CSV glob), output, ledger and keys on gs://."""
    pytest.importorskip("gcp_storage_emulator.server")

    config = write_config(tmp_path, config_dict())
    imp, clk = _inputs(tmp_path)
    imp_table = pa.csv.read_csv(imp, convert_options=pa.csv.ConvertOptions(
        column_types={"date": pa.date32(), "impressions": pa.int64()}))
    pq.write_table(imp_table, tmp_path / "imp.parquet")
    with storage_emulator("cn-release") as bucket:
        for name, path in (("in/campaigns.json", config), ("in/imp/part-0.parquet", tmp_path / "imp.parquet"),
                           ("in/clk-0.csv", clk)):
            gcs.blob(f"gs://{bucket}/{name}").upload_from_filename(str(path))
        args = ["--config", f"gs://{bucket}/in/campaigns.json", "--impressions", f"gs://{bucket}/in/imp/",
                "--clicks", f"gs://{bucket}/in/clk-*.csv", "--release", RELEASE1,
                "--output", f"gs://{bucket}/releases", "--ledger", f"gs://{bucket}/ledger.json",
                "--key-store", f"gs://{bucket}/keys"]
        assert main(args) == 0
        name = f"gs://{bucket}/releases/{RELEASE1}/centralnotice.parquet"
        first = gcs.blob(name).download_as_bytes()
        report = json.loads(gcs.blob(f"gs://{bucket}/releases/{RELEASE1}/report.json").download_as_bytes())
        assert report["keys"]["keyset"] == len(KEYSET_DAY1) and report["budget"]["key_fingerprint"]
        ledger = BudgetLedger(f"gs://{bucket}/ledger.json", f"gs://{bucket}/keys")
        assert ledger.get(RELEASE1)["state"] == "committed" and ledger.get(RELEASE1)["output_path"] == name
        spent = ledger.spent(CAMPAIGN)
        assert spent.epsilon == pytest.approx(2.0)
        assert main(args) == 0
        assert gcs.blob(name).download_as_bytes() == first
        assert ledger.spent(CAMPAIGN) == spent and ledger.get(RELEASE1)["runs"] == 2
        assert not gcs.blob(name + ".incomplete").exists()
        release_key = ledger.key_store.load(KeyRef.from_json(ledger.get(RELEASE1)["key_ref"]))
    (tmp_path / "gcs.parquet").write_bytes(first)
    got = released(tmp_path / "gcs.parquet")
    assert sorted(got) == sorted(KEYSET_DAY1)
    exact = {key: (1000 + 10 * i, i) for i, key in enumerate(KEYSET_DAY1)}
    assert got != exact  # noisy
    # The local CSV copies released with the stored key give the same bytes: every gs:// input
    # was read, and nothing else.
    campaign = parse_config(config_dict()).campaigns[0]
    run_transform(campaign, [DAY1], [imp], [clk], tmp_path / "local.parquet", testing=False,
                  key=release_key)
    assert (tmp_path / "local.parquet").read_bytes() == first
