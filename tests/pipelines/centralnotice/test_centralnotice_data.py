"""Synthetic CentralNotice inputs: schemas, keys inside the configuration, heavy tails, sample."""
from __future__ import annotations

import datetime as dt
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyarrow import csv

from pipelines.centralnotice import data
from pipelines.centralnotice.config import load_config
from pipelines.centralnotice.impressions import clean_impressions

KEYS = ["campaign_id", "banner_id", "country", "project", "date"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cn"))
    result = data.generate_dataset(out, impression_rows=20_000, clicks=15_000, seed=7,
                                   max_countries=30, max_projects=20, max_days=7)
    return result, load_config(result["paths"]["config"]), \
        pq.read_table(result["paths"]["impressions"]), pq.read_table(result["paths"]["clicks"])


def test_schemas_and_counts(dataset):
    result, config, impressions, clicks = dataset
    assert impressions.schema == pa.schema([("campaign_id", pa.string()), ("banner_id", pa.string()),
                                            ("country", pa.string()), ("project", pa.string()),
                                            ("date", pa.date32()), ("impressions", pa.int64())])
    assert clicks.column_names == KEYS + ["user_id"]
    assert impressions.num_rows == result["impression_rows"] == 20_000
    assert clicks.num_rows == 15_000 and result["campaigns"] == len(config.campaigns) >= 3
    assert impressions.group_by(KEYS).aggregate([]).num_rows == impressions.num_rows  # one row per key


def test_rows_stay_inside_each_campaigns_declared_dimensions(dataset):
    _, config, impressions, clicks = dataset
    for campaign in config.campaigns:
        rows = impressions.filter(pc.equal(impressions.column("campaign_id"), campaign.campaign_id))
        assert rows.num_rows > 0
        assert set(pc.unique(rows.column("banner_id")).to_pylist()) <= set(campaign.banners)
        assert set(pc.unique(rows.column("country")).to_pylist()) <= set(campaign.countries)
        assert set(pc.unique(rows.column("project")).to_pylist()) <= set(campaign.projects)
        dates = pc.unique(rows.column("date")).to_pylist()
        assert min(dates) >= campaign.start_date and max(dates) <= campaign.end_date
    # Raw data contains protected countries; the keyset (what may be released) does not.
    protected = pc.is_in(impressions.column("country"), pa.array(sorted(config.protected_countries)))
    assert pc.sum(protected).as_py() > 0
    # Every click is on a key that had impressions.
    impression_keys = set(zip(*[impressions.column(k).to_pylist() for k in KEYS]))
    assert set(zip(*[clicks.column(k).to_pylist() for k in KEYS])) <= impression_keys


def test_heavy_tails(dataset):
    _, _, impressions, clicks = dataset
    values = impressions.column("impressions").to_numpy()
    assert values.min() >= 0
    assert values.max() > 1000 * np.median(values)  # a few keys with enormous counts
    per_user = np.asarray(clicks.column("user_id").value_counts().field("counts"))
    assert 0.55 < np.mean(per_user == 1) < 0.9  # most users click once
    assert per_user.max() >= 20  # ... and a few click a lot
    ids = pc.unique(clicks.column("user_id")).to_pylist()
    assert any(i.startswith("acct-") for i in ids) and any(i.startswith("anon-") for i in ids)
    # Repeat clickers stay mostly in their own (campaign, country, project).
    top = clicks.filter(pc.equal(clicks.column("user_id"), clicks.column("user_id").value_counts()
                                 .field("values")[int(np.argmax(per_user))]))
    groups = top.group_by(["campaign_id", "country", "project"]).aggregate([([], "count_all")])
    assert groups.column("count_all").to_numpy().max() >= 0.5 * top.num_rows


def test_deterministic_for_a_seed(tmp_path):
    kwargs = dict(impression_rows=3_000, clicks=2_000, max_countries=10, max_projects=8, max_days=5)
    a = data.generate_dataset(str(tmp_path / "a"), seed=3, **kwargs)
    b = data.generate_dataset(str(tmp_path / "b"), seed=3, **kwargs)
    c = data.generate_dataset(str(tmp_path / "c"), seed=4, **kwargs)
    for name in ("impressions", "clicks"):
        assert pq.read_table(a["paths"][name]).equals(pq.read_table(b["paths"][name]))
        assert not pq.read_table(a["paths"][name]).equals(pq.read_table(c["paths"][name]))


def test_bad_rows_are_what_clean_impressions_counts(tmp_path):
    result = data.generate_dataset(str(tmp_path), impression_rows=2_000, clicks=500, seed=5, fmt="csv",
                                   bad_rows=9, max_countries=10, max_projects=8, max_days=5)
    table = csv.read_csv(result["paths"]["impressions"])
    assert table.num_rows == 2_000 + 9
    clean, counts = clean_impressions(table)
    assert counts["missing"] == 3 and counts["negative"] == 3 and counts["fractional"] == 3
    assert clean.num_rows == 2_000
    assert clean.group_by(KEYS).aggregate([]).num_rows < clean.num_rows  # duplicates to be summed


def test_bundled_sample_is_reproducible_and_small(tmp_path):
    files = ("impressions.csv", "clicks.csv", "campaigns.json", "protected_countries.txt")
    total = sum(os.path.getsize(os.path.join(data.SAMPLE_DIR, f)) for f in files)
    assert total < 400_000
    data.generate_sample(str(tmp_path))
    for name in files:
        with open(os.path.join(data.SAMPLE_DIR, name), "rb") as bundled, \
                open(tmp_path / name, "rb") as fresh:
            assert bundled.read() == fresh.read(), name
    text = open(os.path.join(data.SAMPLE_DIR, "protected_countries.txt")).read()
    assert "Legal:Country_and_Territory_Protection_List" in text


def test_catalogues():
    projects, weights = data.project_catalogue()
    assert len(projects) >= 300 and len(set(projects.tolist())) == len(projects)
    assert "en.wikipedia" in projects and "commons.wikimedia" in projects and "de.wiktionary" in projects
    assert (weights > 0).all()
    assert len(data.COUNTRIES) >= 200 and set(data.COUNTRY_ORDER) == set(data.COUNTRIES)
    assert set(data.PROTECTED_COUNTRIES) <= set(data.COUNTRIES)


def test_cli(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_info:
        data.main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--impression_rows" in out
    assert data.SAMPLE_DIR not in out and "pipelines/sample_data/centralnotice/" in out
    monkeypatch.chdir(tmp_path)
    assert data.main(["--out", "gen", "--impression_rows", "500", "--clicks", "100",
                      "--format", "csv", "--max_countries", "8", "--max_projects", "6",
                      "--max_days", "4", "--start_date", "2027-01-01"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["paths"]["clicks"] == os.path.join("gen", "clicks.csv"), summary["paths"]
    tmp_path = tmp_path / "gen"
    config = load_config(str(tmp_path / "campaigns.json"))
    assert min(c.start_date for c in config.campaigns) >= dt.date(2027, 1, 1)
    assert csv.read_csv(tmp_path / "clicks.csv").num_rows == 100


@pytest.mark.parametrize("argv, message", [
    (["--out", "x", "--impression-rows", "5"], "use --impression_rows"),
    (["--out", "x", "--start-date=2027-01-01"], "use --start_date"),
    (["--out", "x", "--max_day", "3"], "unrecognized arguments: --max_day"),   # no abbreviation
    (["--out", "x", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_cli_flags_are_underscored_and_unknown_ones_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        data.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
