"""CentralNotice budget scopes: campaign total, per period, and one person's day across campaigns."""
from __future__ import annotations

import copy
import json

import pytest

from accounting.ledger import BudgetExceededError, BudgetLedger, ReleaseRequest
from pipelines.centralnotice.config import ConfigError, parse_config

SAMPLE = "pipelines/sample_data/centralnotice/campaigns.json"


def _config(unit=None, same_days=True):
    data = json.load(open(SAMPLE))
    data.pop("protected_countries_file", None)
    if unit is not None:
        data["unit_budget_per_period"] = unit
    if same_days:  # two campaigns running on the same days
        second = copy.deepcopy(data["campaigns"][0])
        second["campaign_id"] = "C2026_000_fr_b"
        data["campaigns"] = [data["campaigns"][0], second]
    return parse_config(data, SAMPLE)


def test_without_a_unit_budget_each_campaign_is_bounded_alone():
    config = _config()
    for campaign in config.campaigns:
        names = [s.name for s in campaign.scopes(campaign.releases()[0])]
        assert names == [f"campaign:{campaign.campaign_id}",
                         f"period:{campaign.campaign_id}:{campaign.start_date}"]


def test_a_unit_budget_bounds_one_persons_day_across_campaigns(tmp_path):
    config = _config(unit={"epsilon": 1.2, "delta": 2e-9})
    ledger = BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"))
    requests = []
    for campaign in config.campaigns:
        release = campaign.releases()[0]
        scopes = campaign.scopes(release)
        assert scopes[-1].name == f"unit-period:{campaign.start_date}"
        requests.append(ReleaseRequest(release_id=release.release_id, measures=campaign.measures(),
                                       input_digest="sha256:x", scopes=scopes))
    ledger.reserve(requests[0])
    # The second campaign's release on the same day would bring the person's day over 1.2.
    with pytest.raises(BudgetExceededError, match=f"unit-period:{config.campaigns[0].start_date}"):
        ledger.reserve(requests[1])
    assert len(ledger.records()) == 1


def test_a_unit_budget_smaller_than_one_release_is_refused_by_the_config_check():
    with pytest.raises(ConfigError, match="unit_budget_per_period"):
        _config(unit={"epsilon": 0.1, "delta": 1e-9})
