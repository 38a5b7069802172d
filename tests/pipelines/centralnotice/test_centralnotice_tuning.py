"""Choosing k and epsilon: noise distribution, suppression shares, report and CLI."""
from __future__ import annotations

import csv
import os

import numpy as np
import pytest
from pyarrow import csv as pacsv

from accounting.calibration import calibrate
from pipelines.centralnotice import tuning
from pipelines.centralnotice.config import load_config
from pipelines.centralnotice.data import SAMPLE_DIR


@pytest.fixture(scope="module")
def sample():
    config = load_config(os.path.join(SAMPLE_DIR, "campaigns.json"))
    impressions = pacsv.read_csv(os.path.join(SAMPLE_DIR, "impressions.csv"))
    clicks = pacsv.read_csv(os.path.join(SAMPLE_DIR, "clicks.csv"))
    return config, impressions, clicks


def test_true_values_on_the_keyset(sample):
    config, impressions, clicks = sample
    campaign = config.campaigns[1]
    imp = tuning.impressions_per_key(campaign, impressions)
    assert imp.shape == (campaign.keyset_size(),)
    assert (imp >= 0).all() and (imp > 0).mean() > 0.2
    click_values = tuning.clicks_per_key(campaign, clicks)
    assert click_values.shape == imp.shape
    # Protected countries are outside the keyset, so their clicks are not counted.
    in_campaign = clicks.filter(clicks.column("campaign_id").to_numpy(zero_copy_only=False)
                                == campaign.campaign_id)
    released = np.isin(in_campaign.column("country").to_numpy(zero_copy_only=False),
                       campaign.released_countries())
    assert click_values.sum() == released.sum()


def test_tune_campaign_rows(sample):
    config, impressions, clicks = sample
    campaign = next(c for c in config.campaigns if not c.clicks.budget.is_zcdp)
    ks, epsilons = [10, 50, 100], [0.5, 1, 2]
    truth = tuning.true_values_by_campaign(config.campaigns, impressions, clicks)
    true_impressions, true_clicks = truth[campaign.campaign_id]
    np.testing.assert_array_equal(true_impressions, tuning.impressions_per_key(campaign, impressions))
    np.testing.assert_array_equal(true_clicks, tuning.clicks_per_key(campaign, clicks))
    rows = tuning.tune_campaign(campaign, ks, epsilons, true_impressions=true_impressions,
                                true_clicks=true_clicks)
    imp = [r for r in rows if r.measure == "impressions"]
    click_rows = [r for r in rows if r.measure == "clicks"]
    assert len(imp) == 9 and len(click_rows) == 3
    for r in imp:
        spec = calibrate(campaign.impressions.noise, epsilon=r.epsilon, l1_sensitivity=r.k)
        assert r.std == pytest.approx(spec.std) and r.scale == spec.scale and r.sensitivity == r.k
        assert r.threshold == campaign.impressions.release_threshold and r.keys == campaign.keyset_size()
        assert 0 <= r.share_suppressed <= 1
    by = {(r.k, r.epsilon): r for r in imp}
    assert by[(100, 0.5)].std > by[(50, 0.5)].std > by[(10, 0.5)].std > by[(10, 2)].std
    assert by[(100, 0.5)].spurious_rate > by[(10, 2)].spurious_rate
    assert all(r.sensitivity == 1 for r in click_rows)
    # Thresholds from a target spurious rate follow the noise scale.
    derived = tuning.tune_campaign(campaign, ks, [1.0], spurious=1e-3)
    thresholds = [r.threshold for r in derived if r.measure == "impressions"]
    assert thresholds == sorted(thresholds) and thresholds[0] < thresholds[-1]
    assert all(r.spurious_rate <= 1e-3 and r.share_suppressed is None for r in derived)
    zcdp = next(c for c in config.campaigns if c.clicks.budget.is_zcdp)
    rho_rows = [r for r in tuning.tune_campaign(zcdp, [10], [1.0], rhos=[0.005, 0.02])
                if r.measure == "clicks"]
    assert [r.rho for r in rho_rows] == [0.005, 0.02] and rho_rows[0].std > rho_rows[1].std
    with pytest.raises(ValueError, match="at least one"):
        tuning.tune_campaign(campaign, [], [1.0])
    with pytest.raises(ValueError, match="one value per keyset key"):
        tuning.tune_campaign(campaign, [10], [1.0], true_impressions=np.zeros(3))


def test_cli_writes_table_csv_and_plot(tmp_path, capsys):
    campaign = load_config(os.path.join(SAMPLE_DIR, "campaigns.json")).campaigns[0].campaign_id
    code = tuning.main(["--config", os.path.join(SAMPLE_DIR, "campaigns.json"),
                        "--impressions", os.path.join(SAMPLE_DIR, "impressions.csv"),
                        "--clicks", os.path.join(SAMPLE_DIR, "clicks.csv"),
                        "--campaign", campaign, "--k", "10,50,100", "--epsilon", "0.5,1,2",
                        "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "suppressed" in out and campaign in out
    with open(tmp_path / "tuning.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len([r for r in rows if r["measure"] == "impressions"]) == 9 and rows[0]["k"] == "10"
    assert len([r for r in rows if r["measure"] == "clicks"]) >= 1
    assert {r["campaign_id"] for r in rows} == {campaign}
    png = tmp_path / f"tuning_{campaign}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = (tmp_path / "tuning.txt").read_text().splitlines()[0].split()
    assert header[:3] == ["campaign", "measure", "k"] and "suppressed" in header
    with pytest.raises(SystemExit):
        tuning.main(["--config", "x.json", "--k", "10,-5", "--epsilon", "1", "--out", str(tmp_path)])


@pytest.mark.parametrize("with_data", [True, False])
def test_plot_axes_are_honest(sample, tmp_path, with_data):
    """Shares and probabilities span their whole [0, 1] range; linear axes start at 0 (a zoomed
    axis made the worst (epsilon, k) look best)."""
    config, impressions, clicks = sample
    campaign = next(c for c in config.campaigns if not c.clicks.budget.is_zcdp)
    truth = tuning.true_values_by_campaign(config.campaigns, impressions, clicks)[campaign.campaign_id]
    data = dict(true_impressions=truth[0], true_clicks=truth[1]) if with_data else {}
    rows = tuning.tune_campaign(campaign, [10, 50, 100], [0.5, 1, 2], **data)
    axes = tuning.plot_campaign(rows, str(tmp_path / "plot.png"))
    assert len(axes) == 4
    for axis in axes:
        low, high = axis["limits"]
        if axis["scale"] == "log":
            assert "log scale" in axis["label"]
            continue
        assert low <= 0, axis
        if "share" in axis["label"] or "P(" in axis["label"]:
            assert high >= 1, axis


def _panels_show_their_data(axes):
    """Every panel shows data (two points or more), or says in it why it does not."""
    for axis in axes:
        assert axis["points"] >= 2 or axis["notes"], axis


@pytest.mark.parametrize("with_data", [True, False])
def test_every_panel_of_every_sample_campaign_shows_its_data(sample, tmp_path, with_data):
    config, impressions, clicks = sample
    truth = tuning.true_values_by_campaign(config.campaigns, impressions, clicks)
    for campaign in config.campaigns:  # row-DP, user-DP Laplace and zCDP Gaussian clicks
        data = dict(true_impressions=truth[campaign.campaign_id][0],
                    true_clicks=truth[campaign.campaign_id][1]) if with_data else {}
        rows = tuning.tune_campaign(campaign, [10, 50, 100, 200], [0.25, 0.5, 1, 2], **data)
        axes = tuning.plot_campaign(rows, str(tmp_path / f"{campaign.campaign_id}.png"))
        _panels_show_their_data(axes)
        clicks_axis = next(a for a in axes if a["title"].startswith("clicks"))
        assert clicks_axis["points"] >= 4, clicks_axis  # zCDP clicks too: candidates around rho


def test_lines_that_coincide_and_a_single_candidate_are_said_so(sample, tmp_path):
    config, impressions, clicks = sample
    campaign = config.campaigns[0]
    truth = tuning.true_values_by_campaign(config.campaigns, impressions, clicks)[campaign.campaign_id]
    rows = tuning.tune_campaign(campaign, [10, 50, 100], [0.5, 1, 2], true_impressions=truth[0],
                                true_clicks=truth[1])
    shares = {e: [r.share_suppressed for r in rows if r.measure == "impressions" and r.epsilon == e]
              for e in (0.5, 1, 2)}
    assert tuning.coinciding(shares, 0.01) == [[0.5, 1, 2]]  # the sample's first campaign
    axes = tuning.plot_campaign(rows, str(tmp_path / "same.png"))
    suppressed = next(a for a in axes if a["title"] == "impressions: suppressed keys")
    assert any("coincide" in note and "epsilon=0.5, 1, 2" in note for note in suppressed["notes"])
    one = tuning.tune_campaign(campaign, [10, 50], [1.0], true_impressions=truth[0],
                               true_clicks=truth[1])
    axes = tuning.plot_campaign(one, str(tmp_path / "one.png"))
    _panels_show_their_data(axes)
    assert any("one candidate" in n for a in axes for n in a["notes"])
    assert tuning.coinciding({"a": [0.1, 0.2], "b": [0.1, 0.25]}, 0.01) == []
