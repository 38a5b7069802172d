"""The CentralNotice job end to end on the release layer (in-process engine): exact per-key sums
and counts in testing mode (the public testing key's noise regenerated and subtracted), user-DP
bounding, noise scale vs sensitivities, thresholds and null semantics, row rules with their
counters, header-only inputs, job-level refusals before any charge, the ledger (identical
re-runs, changed input, --new_release, budget refusals), gs:// through the storage emulator."""
from __future__ import annotations

import collections
import copy
import datetime as dt
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv  # noqa: F401  (pa.csv)
import pyarrow.parquet as pq
import pytest

from gcs_emulator import storage_emulator
from release_testkit import (CN_CLK_HEADER as CLK_HEADER, CN_IMP_HEADER as IMP_HEADER, LOW,
                             cn_config as config_dict, read_json, write_csv)

from accounting import gcs
from accounting.keys import ReleaseKey
from accounting.ledger import BudgetLedger
from pipelines.centralnotice.job import KEYS, CentralNoticeRequest, main, run
from pipelines.centralnotice.config import parse_config
from pipelines.release import ReleaseOptions
from transforms import error_columns
from transforms.noise import RandomStreams, add_noise

CAMPAIGN = "C1"
DAY1, DAY2 = dt.date(2026, 11, 1), dt.date(2026, 11, 2)
RELEASE1 = f"{CAMPAIGN}/{DAY1.isoformat()}"
BANNERS = ["C1_dsk", "C1_mob"]
RELEASED_COUNTRIES = ["DE", "FR"]
PROJECTS = ["de.wikipedia", "fr.wikipedia"]
SEED = 17
USER_CLICKS = {"noise": "discrete_laplace", "epsilon": 1.0, "neighbouring": "user",
               "max_clicks_per_user": 3, "bound_per": "period", "release_threshold": LOW}


def keyset(dates):
    return [(b, c, p, d.isoformat()) for b in BANNERS for c in RELEASED_COUNTRIES for p in PROJECTS
            for d in dates]


KEYSET_DAY1 = keyset([DAY1])


def write_config(tmp_path, data, name="campaigns.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def make_request(config, imp, clk, out, *, release=None, seed=SEED, **options):
    return CentralNoticeRequest(
        config=config, impressions=tuple(imp if isinstance(imp, list) else [imp]),
        clicks=tuple(clk if isinstance(clk, list) else [clk]), release=release,
        first_releases=release is None, num_shards=2,
        options=ReleaseOptions(output=str(out), testing_seed=seed, **options))


def released_table(outcome) -> pa.Table:
    table = pq.read_table(os.path.join(outcome.folder, "centralnotice.parquet"))
    assert table.column_names == KEYS + [c for v in ("impressions", "clicks")
                                         for c in (v, *error_columns.names(v))]
    return table


def test_error_columns_are_the_stated_noise_and_null_where_the_value_is(tmp_path):
    """Each value's error columns: its measure's stated std and 95% half-width (the noise spec's,
    public), the same for every key, around the released value; null where a threshold
    suppressed the value; and RELEASE.json states each value's error."""
    rng = np.random.default_rng(5)
    imp = write_csv(tmp_path / "imp.csv", IMP_HEADER,
                    random_rows(rng, 400, value=lambda i: int(rng.integers(0, 30))))
    clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, random_rows(rng, 40, value=lambda i: f"u{i}"))
    data = config_dict(clicks={"noise": "discrete_laplace", "epsilon": 1.0, "neighbouring": "row",
                               "release_threshold": 3})
    (outcome,) = run(make_request(write_config(tmp_path, data), imp, clk, tmp_path / "out",
                                  release=RELEASE1)).releases
    table = released_table(outcome)
    specs = parse_config(data).campaigns[0].noise_specs()
    marker = json.load(open(os.path.join(outcome.folder, "RELEASE.json")))
    assert set(marker["outputs"]["centralnotice.parquet"]["errors"]) == {"impressions", "clicks"}
    suppressed = 0
    for value in ("impressions", "clicks"):
        half, std = specs[value].ci_halfwidth(0.95), specs[value].std
        low, high, sd = (table.column(c).to_pylist() for c in error_columns.names(value))
        for v, lo, hi, s in zip(table.column(value).to_pylist(), low, high, sd):
            if v is None:
                suppressed += 1
                assert lo is None and hi is None and s is None
            else:
                assert (v - lo, hi - v, s) == (half, half, pytest.approx(std))
    assert suppressed  # the rule is exercised: some clicks were below the threshold


def noise_of(campaign, table_keys: pa.Table, seed=SEED) -> dict:
    """The noise the public testing key draws for each measure at these keys (regenerated:
    anyone can, which is why a testing run is never a release)."""
    key = ReleaseKey.for_testing(seed)
    specs = {m.name: m.noise for m in campaign.measures()}
    zeros = np.zeros(table_keys.num_rows, dtype=np.int64)
    return {name: add_noise(specs[name], zeros, RandomStreams.for_keys(
        key, f"centralnotice/{campaign.campaign_id}/{name}", table_keys)) for name in specs}


def denoised(outcome, campaign, seed=SEED) -> dict:
    """{(banner, country, project, date): (impressions, clicks)} with the testing noise removed."""
    table = released_table(outcome)
    assert set(table.column("campaign_id").to_pylist()) == {campaign.campaign_id}
    noise = noise_of(campaign, table.select(KEYS), seed)
    imp = table.column("impressions").to_numpy() - noise["impressions"]
    clk = table.column("clicks").to_numpy() - noise["clicks"]
    rows = table.select(KEYS[1:]).to_pylist()
    return {(r["banner_id"], r["country"], r["project"], r["date"].isoformat()): (int(i), int(c))
            for r, i, c in zip(rows, imp, clk)}


def counters_of(result) -> dict:
    (outcome,) = result.releases
    return {k: v for k, v in outcome.report["counters"].items() if v}


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
                   "--key_store", "--new_release", "--testing_seed", "--list_releases",
                   "--alert_exit_code", "--max_dropped_fraction", "Exit codes"):
        assert option in text
    config = write_config(tmp_path, config_dict())
    for flag in ("--list_releases", "--list-releases"):
        assert main(["--config", config, flag]) == 0
        assert capsys.readouterr().out.split() == [RELEASE1, f"{CAMPAIGN}/{DAY2.isoformat()}"]


# --------------------------------------------------------------------------- exactness (testing mode)

@pytest.mark.parametrize("fmt, dates", [("csv", [DAY1]), ("parquet", [DAY1]), ("csv", [DAY1, DAY2])])
def test_testing_mode_releases_exact_per_key_sums_and_counts(tmp_path, fmt, dates):
    """One day (daily schedule) or the whole campaign (schedule "campaign"): with the public
    testing key's noise subtracted, every keyset key holds its exact sum and count."""
    rng = np.random.default_rng(5)
    imp_rows = random_rows(rng, 400, value=lambda i: int(rng.integers(0, 5000)))
    imp_rows.append(("C1", "C1_dsk", "DE", "de.wikipedia", DAY1.isoformat(), 10 ** 12))  # stays exact
    clk_rows = random_rows(rng, 600, value=lambda i: f"u{i}")
    data = config_dict(schedule="daily" if len(dates) == 1 else "campaign")
    campaign = parse_config(data).campaigns[0]
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
    result = run(make_request(write_config(tmp_path, data), imp, clk, tmp_path / "out"))
    (outcome,) = result.releases
    assert outcome.status == "testing"
    assert outcome.folder.startswith(str(tmp_path / "out" / "testing-not-a-release"))
    assert read_json(os.path.join(outcome.folder, "RELEASE.json"))["testing"] is True
    got = denoised(outcome, campaign)

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
    counters = counters_of(result)
    assert counters["impressions.skipped.other_release"] > 0
    assert counters["impressions.dropped.outside_keyset"] > 0
    assert counters["impressions.excluded.protected_country"] > 0
    assert counters["clicks.excluded.protected_country"] > 0
    assert counters["impressions.read"] == len(imp_rows)
    assert counters["clicks.read"] == len(clk_rows)
    assert outcome.marker["summary"]["keys"]["released"] == len(keyset(dates))


@pytest.mark.parametrize("bound_per, dates", [("period", [DAY1]), ("campaign", [DAY1, DAY2])])
def test_user_dp_bounds_each_user_to_m_clicks(tmp_path, bound_per, dates):
    """User-DP with m = 3: users within the bound are counted exactly, a user with 50 clicks on
    one key adds m, a user spread over 4 keys (over both days of a per-campaign release) adds m
    in total. Integer user ids and null user ids in Parquet."""
    m = USER_CLICKS["max_clicks_per_user"]
    data = config_dict(clicks={**USER_CLICKS, "bound_per": bound_per},
                       schedule="daily" if len(dates) == 1 else "campaign")
    campaign = parse_config(data).campaigns[0]
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
    result = run(make_request(write_config(tmp_path, data), str(tmp_path / "imp.parquet"),
                                 str(tmp_path / "clicks.parquet"), tmp_path / "out"))
    got = denoised(result.releases[0], campaign)
    assert sorted(got) == sorted(keyset(dates))
    clicks = {key: value[1] for key, value in got.items()}
    assert clicks[heavy[1:]] == want[heavy[1:]]  # the heavy user adds exactly m, not 50
    excess = {key[1:]: clicks[key[1:]] - want[key[1:]] for key in spread}
    assert all(0 <= e <= 2 for e in excess.values()) and sum(excess.values()) == m
    assert len({key[4] for key in spread}) == len(dates)  # the spread user covers every day
    others = [k for k in keyset(dates) if k not in excess]
    assert {k: clicks[k] for k in others} == {k: want[k] for k in others}
    assert counters_of(result)["clicks.dropped.missing_user"] == 7


def _wide_config(n_banners, n_countries, n_projects, **kw):
    """A campaign with a large keyset (for looking at the noise across keys)."""
    from pipelines.centralnotice.config import ISO_3166_ALPHA2

    data = config_dict(**kw)
    raw = data["campaigns"][0]
    raw["banners"] = [f"C1_b{i}" for i in range(n_banners)]
    raw["countries"] = [c for c in ISO_3166_ALPHA2 if c != "RU"][:n_countries]
    raw["projects"] = [f"p{i}.wikipedia" for i in range(n_projects)]
    return data


def discrete_laplace_std(scale):
    t = 1.0 / scale
    return float(np.sqrt(2 * np.exp(-t)) / (1 - np.exp(-t)))


def _pure_noise(tmp_path, data, seed):
    imp = write_csv(tmp_path / "imp.csv", IMP_HEADER, [])
    clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, [])
    result = run(make_request(write_config(tmp_path, data), imp, clk, tmp_path / "o",
                                 release=RELEASE1, seed=seed))
    table = released_table(result.releases[0])
    return parse_config(data).campaigns[0], table


def test_noise_scale_follows_the_sensitivities(tmp_path):
    """No data, real noise from a (testing) key over 2,000 keys: impressions noise has the spread
    of discrete Laplace(k / epsilon) = (10), user-DP clicks of discrete Laplace(m / epsilon) = (3),
    both centred, and the two measures draw independent noise."""
    campaign, table = _pure_noise(tmp_path, _wide_config(8, 25, 10, clicks=USER_CLICKS), 11)
    assert table.num_rows == campaign.keyset_size([DAY1]) == 2000
    noise = np.stack([table.column("impressions").to_numpy(),
                      table.column("clicks").to_numpy()], axis=1).astype(float)
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
    sigma = m / sqrt(2 rho). 100,000 keys, no data; Kolmogorov-Smirnov distance below the 0.1 %
    critical value 1.95 / sqrt(n) (conservative for discrete laws; one of the slow suite's many
    statistical checks, so a 1 % level would fail one run in a hundred of a correct sampler),
    while the laws of the wrong sensitivity (1 instead of k or m) are far."""
    rho, m, k = 0.02, USER_CLICKS["max_clicks_per_user"], 10
    clicks = {"noise": "discrete_gaussian", "rho": rho, "delta": 1e-9, "neighbouring": "user",
              "max_clicks_per_user": m, "bound_per": "period", "release_threshold": LOW}
    data = _wide_config(25, 100, 40, clicks=clicks,
                        budget={"campaign_total": {"epsilon": 20.0, "delta": 1e-6}})
    _, table = _pure_noise(tmp_path, data, 12)
    assert table.num_rows == 100_000
    noise = np.stack([table.column("impressions").to_numpy(),
                      table.column("clicks").to_numpy()], axis=1).astype(np.int64)
    critical = 1.95 / np.sqrt(len(noise))
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
    data = config_dict(impressions={"release_threshold": 100},
                       clicks={"noise": "discrete_laplace", "epsilon": 1.0, "neighbouring": "row",
                               "release_threshold": 5})
    campaign = parse_config(data).campaigns[0]
    a, b, c, e = KEYSET_DAY1[:4]
    imp = [("C1",) + a + (1010,), ("C1",) + b + (60,), ("C1",) + c + (500,), ("C1",) + e + (50,)]
    clk = [("C1",) + a + ("u",)] * 30 + [("C1",) + b + ("u",)] * 40 + [("C1",) + e + ("u",)] * 2
    result = run(make_request(write_config(tmp_path, data),
                                 write_csv(tmp_path / "i.csv", IMP_HEADER, imp),
                                 write_csv(tmp_path / "c.csv", CLK_HEADER, clk), tmp_path / "o",
                                 release=RELEASE1))
    exact = {key: (0, 0) for key in KEYSET_DAY1}
    exact.update({a: (1010, 30), b: (60, 40), c: (500, 0), e: (50, 2)})
    keys = pa.table({"campaign_id": ["C1"] * len(KEYSET_DAY1),
                     **{name: [k[i] for k in KEYSET_DAY1] for i, name in enumerate(KEYS[1:4])},
                     "date": pa.array([DAY1] * len(KEYSET_DAY1), pa.date32())})
    noise = noise_of(campaign, keys)
    want = {}
    for i, key in enumerate(KEYSET_DAY1):
        imp_value = exact[key][0] + int(noise["impressions"][i])
        clk_value = exact[key][1] + int(noise["clicks"][i])
        row = (imp_value if imp_value > 100 else None, clk_value if clk_value > 5 else None)
        if row != (None, None):  # a key with both values suppressed is not released
            want[key] = row
    table = released_table(result.releases[0])
    got = {(r["banner_id"], r["country"], r["project"], r["date"].isoformat()):
           (r["impressions"], r["clicks"]) for r in table.to_pylist()}
    assert got == want
    assert {a, b, c} <= set(got) and got[a][0] is not None and got[b][0] is None  # a null, not 0
    assert got[c][1] is None
    summary = result.releases[0].marker["summary"]["keys"]
    assert summary["released"] == len(want) and summary["not_released"] == 8 - len(want)
    assert summary["impressions_suppressed"] == sum(v[0] is None for v in want.values())


# --------------------------------------------------------------------------- bad input

def test_row_level_faults_follow_the_rules_and_are_counted(tmp_path):
    data = config_dict(clicks=USER_CLICKS)
    campaign = parse_config(data).campaigns[0]
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
    # More than half of the eligible impression rows are faulty: published, the operator alerted.
    result = run(make_request(write_config(tmp_path, data),
                                 write_csv(tmp_path / "i.csv", IMP_HEADER, imp),
                                 write_csv(tmp_path / "c.csv", CLK_HEADER, clk), tmp_path / "o",
                                 release=RELEASE1))
    want = {k: (0, 0) for k in KEYSET_DAY1}
    want[key[1:]] = (42, 2)
    want[other[1:]] = (7, 1)
    assert denoised(result.releases[0], campaign) == want
    assert counters_of(result) == {
        "impressions.read": 14, "impressions.dropped.malformed_csv_line": 2,
        "impressions.dropped.negative": 1, "impressions.dropped.fractional": 1,
        "impressions.dropped.missing": 1, "impressions.dropped.unparseable": 1,
        "impressions.dropped.missing_key": 2, "impressions.skipped.other_release": 3,
        "impressions.dropped.outside_keyset": 1, "impressions.excluded.protected_country": 1,
        # kept rows per configured country and project (the catalog's coverage alarms)
        "impressions.coverage.country.DE": 2, "impressions.coverage.country.FR": 1,
        "impressions.coverage.project.de.wikipedia": 3,
        "clicks.read": 8, "clicks.dropped.malformed_csv_line": 1,
        "clicks.dropped.missing_user": 2, "clicks.dropped.missing_or_unparseable_key": 1,
        "clicks.skipped.other_release": 1, "clicks.dropped.outside_keyset": 1,
    }
    report = result.releases[0].report
    reasons = ", ".join(f"impressions.dropped.{r}={n}" for r, n in [
        ("fractional", 1), ("malformed_csv_line", 2), ("missing", 1), ("missing_key", 2),
        ("negative", 1), ("outside_keyset", 1), ("unparseable", 1)])
    clicks = ", ".join(f"clicks.dropped.{r}={n}" for r, n in [
        ("malformed_csv_line", 1), ("missing_or_unparseable_key", 1), ("missing_user", 2),
        ("outside_keyset", 1)])
    assert report["alerts"] == [
        f"clicks: 5 of 8 eligible rows dropped (more than 50%); by {clicks}",
        f"impressions: 9 of 13 eligible rows dropped (more than 50%); by {reasons}"]
    assert report["dropped_rows"]["impressions"]["eligible"] == 14 - 3 + 2
    assert report["dropped_rows"]["impressions"]["dropped"] == 9
    assert result.alerts == tuple(f"{RELEASE1}: {alert}" for alert in report["alerts"])
    text = open(os.path.join(os.path.dirname(result.releases[0].report_path), "report.txt")).read()
    assert "ALERT (operator only; the release is published): impressions: 9 of 13" in text
    assert "impressions.dropped.unparseable=1" in text
    # Raw-data facts stay with the operator: the released marker has none of them.
    assert "dropped" not in json.dumps(result.releases[0].marker)


def test_csv_values_that_look_like_null_markers_are_data(tmp_path):
    """Namibia is "NA"; a user may be called "null": only an empty field is missing in CSV."""
    data = config_dict(countries=["NA", "DE"], clicks=USER_CLICKS)
    campaign = parse_config(data).campaigns[0]
    d = DAY1.isoformat()
    namibia = ("C1", "C1_dsk", "NA", "de.wikipedia", d)
    imp = [namibia + (120,), namibia + ("",), namibia + ("NaN",)] + [namibia + (1,)] * 3
    clk = [namibia + ("NA",), namibia + ("null",), namibia + ("nan",), namibia + ("",)]
    result = run(make_request(write_config(tmp_path, data),
                                 write_csv(tmp_path / "i.csv", IMP_HEADER, imp),
                                 write_csv(tmp_path / "c.csv", CLK_HEADER, clk), tmp_path / "o",
                                 release=RELEASE1))
    got = denoised(result.releases[0], campaign)
    assert got[namibia[1:]] == (123, 3)
    assert len(got) == len(BANNERS) * 2 * len(PROJECTS)
    counters = counters_of(result)
    assert counters["impressions.dropped.missing"] == 1
    assert counters["impressions.dropped.unparseable"] == 1
    assert counters["clicks.dropped.missing_user"] == 1


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_header_only_inputs_release_pure_noise(tmp_path, capsys, fmt):
    """Empty inputs are not an error (no eligible row, so nothing was dropped): every keyset key
    is released with noise only. (The CSV impressions header starts with a UTF-8 byte-order
    mark, as spreadsheet exports write it.)"""
    data = config_dict()
    campaign = parse_config(data).campaigns[0]
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
    assert main(["--config", write_config(tmp_path, data), "--impressions", imp, "--clicks", clk,
                 "--release", RELEASE1, "--output", str(out), "--testing_seed", str(SEED)]) == 0
    assert "(testing)" in capsys.readouterr().out
    folder = out / "testing-not-a-release" / CAMPAIGN / DAY1.isoformat()
    table = pq.read_table(folder / "centralnotice.parquet")
    assert table.num_rows == len(KEYSET_DAY1)
    noise = noise_of(campaign, table.select(KEYS))
    assert table.column("impressions").to_numpy().tolist() == noise["impressions"].tolist()
    assert table.column("clicks").to_numpy().tolist() == noise["clicks"].tolist()
    assert np.any(noise["impressions"] != 0)  # noise was drawn for every key, none of it data
    marker = read_json(folder / "RELEASE.json")
    assert marker["status"].startswith("TESTING - NOT A RELEASE")
    assert marker["summary"]["keys"] == {"keyset": 8, "released": 8, "not_released": 0,
                                         "impressions_suppressed": 0, "clicks_suppressed": 0,
                                         "thresholds": {"impressions": -1e9, "clicks": -1e9}}


@pytest.mark.parametrize("args, message", [
    (["--release", "C1/2026-12-01"], "not scheduled"),
    (["--campaign", "C1", "--date", "2026-12-01"], "outside campaign"),
    (["--campaign", "C9", "--date", "2026-11-01"], "C9"),
    ([], "name the release"),
    (["--release", RELEASE1, "--ledger", "LEDGER"], "--key_store"),
    (["--release", RELEASE1, "--impressions", "NOWHERE/*.csv"], "matches no file"),
    (["--release", RELEASE1, "--num_shards", "0"], "--num_shards"),
])
def test_bad_invocation_fails_before_any_work(tmp_path, capsys, args, message):
    config = write_config(tmp_path, config_dict())
    imp = write_csv(tmp_path / "imp.csv", IMP_HEADER, [])
    clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, [])
    args = [str(tmp_path / a) if a in ("LEDGER", "NOWHERE/*.csv") else a for a in args]
    argv = ["--config", config, "--impressions", imp, "--clicks", clk, "--output", str(tmp_path / "out")]
    if "--ledger" not in args:  # a testing run: refused for the invocation itself
        argv += ["--testing_seed", "1"]
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
     "campaigns[0].privacy.clicks: missing max_clicks_per_user"),
    ((("campaigns", 0, "countries", 1), "UK"), "campaigns[0].countries[1]"),
    ((("campaigns", 0, "schedule"), ...), "campaigns[0]: missing schedule"),
    ((("campaigns", 0, "campaign_id"), ".."), "campaigns[0].campaign_id"),
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
                 "--key_store", str(tmp_path / "keys")]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "ledger.json").exists() and not (tmp_path / "keys").exists()


@pytest.mark.parametrize("clicks, beam_args, message", [
    ({**USER_CLICKS, "bound_per": "campaign"}, [], "cannot bound a user"),  # daily release
    (None, ["--runner", "DataflowRunner", "--project", "p", "--region", "r"], "temp_location"),
    (None, ["--dry_run", "True"], "--testing_seed"),  # a release is never only translated
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
    assert main(_release_args(config, imp, clk, out, tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"--{which}" in err and repr(column) in err
    assert not out.exists() and not (tmp_path / "ledger.json").exists()


# --------------------------------------------------------------------------- ledger: noise, re-runs, budget

def _release_args(config, imp, clk, out, tmp_path, *extra):
    return ["--config", config, "--impressions", imp, "--clicks", clk, "--release", RELEASE1,
            "--output", str(out), "--ledger", str(tmp_path / "ledger.json"),
            "--key_store", str(tmp_path / "keys"), "--num_shards", "2", *extra]


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
    folder = out / CAMPAIGN / DAY1.isoformat() / "v1"
    output = folder / "centralnotice.parquet"
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))

    assert main(_release_args(config, imp, clk, out, tmp_path)) == 0
    first = output.read_bytes()
    spent = ledger.spent(f"campaign:{CAMPAIGN}")
    assert spent.epsilon == pytest.approx(2.0)
    marker = read_json(folder / "RELEASE.json")
    fingerprints = marker["key_fingerprints"]
    assert marker["guarantee"]["epsilon"] == pytest.approx(2.0) and marker["guarantee"]["delta"] == 0
    assert marker["ledger_id"] == ledger.ledger_id() and marker["version"] == 1
    assert ledger.get(RELEASE1)["state"] == "committed"
    exact = {key: (1000 + 10 * i, i) for i, key in enumerate(KEYSET_DAY1)}
    table = pq.read_table(output)
    noisy = {(r["banner_id"], r["country"], r["project"], r["date"].isoformat()):
             (r["impressions"], r["clicks"]) for r in table.to_pylist()}
    assert sorted(noisy) == sorted(exact) and noisy != exact  # real noise, same keys
    report = read_json(tmp_path / "reports" / CAMPAIGN / DAY1.isoformat() / "v1" / "report.json")
    assert report["status"] == "released" and report["counters"]["impressions.read"] == 8
    assert {s["name"]: s["spent"]["epsilon"] for s in report["ledger"]["scopes"]} == {
        f"campaign:{CAMPAIGN}": pytest.approx(2.0), f"period:{CAMPAIGN}:{DAY1}": pytest.approx(2.0)}

    # Unchanged input: the same key, identical bytes, nothing more spent (however it is sharded).
    capsys.readouterr()
    assert main(_release_args(config, imp, clk, out, tmp_path, "--num_shards", "5")) == 0
    assert "(reproduced)" in capsys.readouterr().out
    assert output.read_bytes() == first
    assert ledger.spent(f"campaign:{CAMPAIGN}") == spent
    assert ledger.get(RELEASE1)["runs"] == 2

    # Changed input: refused, nothing written, nothing spent.
    imp, clk = _inputs(tmp_path, extra_impressions=5)
    ledger_bytes = (tmp_path / "ledger.json").read_bytes()
    assert main(_release_args(config, imp, clk, out, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "input is now" in err and "new_release" in err
    assert output.read_bytes() == first and (tmp_path / "ledger.json").read_bytes() == ledger_bytes
    assert not (out / CAMPAIGN / DAY1.isoformat() / "v2").exists()

    # --new_release: a new version with a fresh key, charged afresh.
    assert main(_release_args(config, imp, clk, out, tmp_path, "--new_release")) == 0
    version2 = out / CAMPAIGN / DAY1.isoformat() / "v2"
    marker2 = read_json(version2 / "RELEASE.json")
    assert marker2["versioned_id"] == RELEASE1 + "#2" and marker2["version"] == 2
    assert marker2["key_fingerprints"] != fingerprints
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(4.0)
    assert (version2 / "centralnotice.parquet").read_bytes() != first
    assert output.read_bytes() == first  # version 1's published files are left as they were
    assert ledger.get(RELEASE1)["output_path"] == str(version2)


@pytest.mark.parametrize("budget, scope", [
    ({"campaign_total": {"epsilon": 2.0}}, f"campaign:{CAMPAIGN}"),
    ({"campaign_total": {"epsilon": 10.0}, "per_period": {"epsilon": 2.0}},
     f"period:{CAMPAIGN}:{DAY1.isoformat()}"),
])
def test_release_beyond_the_budget_is_refused_before_any_output(tmp_path, capsys, budget, scope):
    # One-day campaign whose budget pays for exactly one release (each costs epsilon 1 + 1).
    config = write_config(tmp_path, config_dict(budget=budget, end=DAY1.isoformat()))
    imp, clk = _inputs(tmp_path)
    assert main(_release_args(config, imp, clk, tmp_path / "out", tmp_path)) == 0
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))
    ledger_bytes = (tmp_path / "ledger.json").read_bytes()
    keys_before = sorted(os.listdir(tmp_path / "keys"))
    imp, clk = _inputs(tmp_path, extra_impressions=7)
    capsys.readouterr()
    assert main(_release_args(config, imp, clk, tmp_path / "out", tmp_path, "--new_release")) == 2
    err = capsys.readouterr().err
    assert scope in err and "over its budget" in err and "Nothing was charged" in err
    assert not (tmp_path / "out" / CAMPAIGN / DAY1.isoformat() / "v2").exists()
    assert (tmp_path / "ledger.json").read_bytes() == ledger_bytes
    assert sorted(os.listdir(tmp_path / "keys")) == keys_before


# --------------------------------------------------------------------------- gs://

def test_release_on_gcs_through_the_storage_emulator(tmp_path):
    """Config, inputs (a Parquet "directory" and a CSV glob), output, ledger and keys on gs://:
    a release, an identical re-run, and a testing run giving the same bytes as the local files."""
    pytest.importorskip("gcp_storage_emulator.server")

    config = write_config(tmp_path, config_dict())
    imp, clk = _inputs(tmp_path)
    imp_table = pa.csv.read_csv(imp, convert_options=pa.csv.ConvertOptions(
        column_types={"date": pa.date32(), "impressions": pa.int64()}))
    pq.write_table(imp_table.slice(0, 5), tmp_path / "imp-0.parquet")
    pq.write_table(imp_table.slice(5), tmp_path / "imp-1.parquet")
    with storage_emulator("cn-release") as bucket:
        for name, path in (("in/campaigns.json", config), ("in/imp/a/part-0.parquet", tmp_path / "imp-0.parquet"),
                           ("in/imp/part-1.parquet", tmp_path / "imp-1.parquet"),
                           ("in/imp/_SUCCESS", config), ("in/clk-0.csv", clk)):
            gcs.blob(f"gs://{bucket}/{name}").upload_from_filename(str(path))
        args = ["--config", f"gs://{bucket}/in/campaigns.json", "--impressions", f"gs://{bucket}/in/imp/",
                "--clicks", f"gs://{bucket}/in/clk-*.csv", "--release", RELEASE1,
                "--output", f"gs://{bucket}/releases", "--num_shards", "2"]
        real = args + ["--ledger", f"gs://{bucket}/private/ledger.json",
                       "--key_store", f"gs://{bucket}/private/keys"]
        assert main(real) == 0
        folder = f"gs://{bucket}/releases/{RELEASE1}/v1"
        first = gcs.blob(f"{folder}/centralnotice.parquet").download_as_bytes()
        marker = json.loads(gcs.blob(f"{folder}/RELEASE.json").download_as_bytes())
        assert marker["summary"]["keys"]["keyset"] == len(KEYSET_DAY1)
        ledger = BudgetLedger(f"gs://{bucket}/private/ledger.json", f"gs://{bucket}/private/keys")
        assert ledger.get(RELEASE1)["state"] == "committed" and ledger.get(RELEASE1)["output_path"] == folder
        spent = ledger.spent(f"campaign:{CAMPAIGN}")
        assert spent.epsilon == pytest.approx(2.0)
        report = json.loads(gcs.blob(f"gs://{bucket}/private/reports/{RELEASE1}/v1/report.json")
                            .download_as_bytes())
        assert report["counters"]["impressions.read"] == 8 and report["counters"]["clicks.read"] == 28
        assert main(real) == 0
        assert gcs.blob(f"{folder}/centralnotice.parquet").download_as_bytes() == first
        assert ledger.spent(f"campaign:{CAMPAIGN}") == spent and ledger.get(RELEASE1)["runs"] == 2
        assert main(args + ["--testing_seed", str(SEED)]) == 0
        testing = gcs.blob(f"gs://{bucket}/releases/testing-not-a-release/{RELEASE1}/centralnotice.parquet"
                           ).download_as_bytes()
    # Every gs:// input was read, and nothing else: the local files give the same testing bytes.
    local = make_request(config, imp, clk, tmp_path / "local", release=RELEASE1)
    (outcome,) = run(local).releases
    with open(os.path.join(outcome.folder, "centralnotice.parquet"), "rb") as handle:
        assert handle.read() == testing
    assert pq.read_table(pa.BufferReader(first)).num_rows == len(KEYSET_DAY1)


@pytest.mark.parametrize("unit_budget", [None, {"epsilon": 3.0}])
def test_every_report_states_the_scopes_its_guarantee_covers(tmp_path, capsys, unit_budget):
    """Campaign total, campaign-day, and one person's day across campaigns (or that it is NOT
    configured, and what that means) in the CLI summary, report.json and the release marker."""
    data = config_dict(budget={"campaign_total": {"epsilon": 8.0}})  # no per_period budget
    if unit_budget is not None:
        data["unit_budget_per_period"] = unit_budget
    config = write_config(tmp_path, data)
    imp, clk = _inputs(tmp_path)
    out = tmp_path / "out"
    assert main(_release_args(config, imp, clk, out, tmp_path)) == 0
    text = capsys.readouterr().out
    report = read_json(tmp_path / "reports" / CAMPAIGN / DAY1.isoformat() / "v1" / "report.json")
    marker = read_json(out / CAMPAIGN / DAY1.isoformat() / "v1" / "RELEASE.json")
    assert report["marker"] == marker
    scopes = {s["scope"]: s for s in marker["summary"]["guarantee_scopes"]}
    assert scopes["campaign total"]["ledger_scopes"] == [f"campaign:{CAMPAIGN}"]
    assert not scopes["campaign-day"]["configured"]
    assert "scope campaign total <= epsilon 8" in text
    assert "scope campaign-day: NOT configured" in text
    day_scope = f"unit-period:{DAY1.isoformat()}"
    cross = scopes["person-day across campaigns"]
    if unit_budget is None:
        assert not cross["configured"] and "NOT configured" in cross["means"]
        assert "scope person-day across campaigns: NOT configured" in text
        assert "NOT configured: campaign-day, person-day across campaigns" in marker["guarantee"]["covers"]
    else:
        assert cross["configured"] and cross["ledger_scopes"] == [day_scope]
        assert f"scope person-day across campaigns <= epsilon 3, delta 0 [{day_scope}]" in text
        assert "per person-day across campaigns" in marker["guarantee"]["covers"]
        assert day_scope in {s["name"] for s in report["ledger"]["scopes"]}
    # report.txt is the CLI summary.
    report_txt = (tmp_path / "reports" / CAMPAIGN / DAY1.isoformat() / "v1" / "report.txt").read_text()
    assert all(line in text for line in report_txt.splitlines() if line.startswith("  scope "))


def test_impressions_that_would_wrap_int64_fail_clearly_and_publish_nothing(tmp_path, capsys):
    """1024 rows of 2^53 impressions (each accepted) sum to 2^63 on one key: refused, not wrapped."""
    config = write_config(tmp_path, config_dict())
    key = ("C1",) + KEYSET_DAY1[0]
    imp = write_csv(tmp_path / "imp.csv", IMP_HEADER, [key + (2 ** 53,)] * 1024)
    clk = write_csv(tmp_path / "clk.csv", CLK_HEADER, [])
    out = tmp_path / "out"
    assert main(["--config", config, "--impressions", imp, "--clicks", clk, "--release", RELEASE1,
                 "--output", str(out), "--testing_seed", "1", "--num_shards", "2"]) == 3
    err = capsys.readouterr().err
    assert "'impressions'" in err and "outside the int64 range" in err and "nothing was published" in err
    assert not list(out.rglob("*.parquet"))


def test_a_run_of_three_releases_reads_its_configuration_once(tmp_path, monkeypatch, capsys):
    """Job.prepare reads the configuration once per run and every hook reads what it prepared:
    one read for a run of three releases (the bundled sample's first releases), and one for
    --explain."""
    from pipelines.release import textfiles

    sample = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                          "pipelines", "sample_data", "centralnotice")
    config = os.path.join(sample, "campaigns.json")
    real, reads = textfiles.read, []

    def counting(path, what):
        reads.append(path)
        return real(path, what)

    monkeypatch.setattr(textfiles, "read", counting)
    result = run(CentralNoticeRequest(
        config=config, impressions=(os.path.join(sample, "impressions.csv"),),
        clicks=(os.path.join(sample, "clicks.csv"),), first_releases=True, num_shards=2,
        options=ReleaseOptions(output=str(tmp_path / "out"), testing_seed=SEED)))
    assert len(result.releases) == 3
    assert reads.count(config) == 1
    reads.clear()
    assert main(["--config", config, "--first_releases", "--explain"]) == 0
    assert reads.count(config) == 1 and capsys.readouterr().out.count("centralnotice release") == 3
