"""CentralNotice configuration: strict validation with field paths, keyset expansion, schedule."""
from __future__ import annotations

import copy
import datetime as dt
import json
import os
import socket

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from accounting.calibration import NoiseKind, calibrate, calibrate_zcdp, zcdp_to_epsilon
from pipelines.centralnotice.config import (ISO_3166_ALPHA2, ConfigError, load_config, parse_config,
                                            parse_protected_countries)
from pipelines.centralnotice.data import SAMPLE_DIR

VALID = {
    "version": 1,
    "protected_countries": ["RU"],
    "campaigns": [{
        "campaign_id": "C1",
        "banners": ["C1_dsk", "C1_mob"],
        "countries": ["DE", "FR", "RU", "US"],
        "projects": ["de.wikipedia", "fr.wikipedia", "commons.wikimedia"],
        "start_date": "2026-11-01", "end_date": "2026-11-03",
        "schedule": "daily",
        "privacy": {
            "impressions": {"k": 100, "epsilon": 0.5, "noise": "discrete_laplace",
                            "neighbouring": "period", "release_threshold": 2000},
            "clicks": {"noise": "discrete_gaussian", "rho": 0.01, "delta": 1e-9,
                       "neighbouring": "user", "max_clicks_per_user": 5, "bound_per": "period",
                       "release_threshold": 30},
            "budget": {"campaign_total": {"epsilon": 5, "delta": 1e-8},
                       "per_period": {"epsilon": 1.6, "delta": 1e-8}},
        },
    }],
}


def _with(path, value):
    """VALID with the field at ``path`` (dotted, list indices as ints) set, or deleted if value is ...."""
    data = copy.deepcopy(VALID)
    *parents, last = path
    node = data
    for part in parents:
        node = node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


C = ["campaigns", 0]
P = C + ["privacy"]


@pytest.mark.parametrize("path, value, message", [
    (C + ["banners"], ..., r"campaigns\[0\]: missing banners"),
    (P + ["impressions", "epsilom"], 1.0, r"campaigns\[0\]\.privacy\.impressions: unknown field\(s\); the fields are delta, epsilon, k,"),
    (P + ["impressions", "k"], 0, r"campaigns\[0\]\.privacy\.impressions\.k: must be >= 1"),
    (P + ["impressions", "k"], 2.5, r"impressions\.k: must be integer \(got a number\)"),
    (P + ["impressions", "epsilon"], -1, r"impressions\.epsilon: must be > 0"),
    (P + ["impressions", "noise"], "gaussian", r"impressions: missing delta \(Gaussian noise needs a delta > 0\)"),
    (P + ["impressions", "delta"], 0, None),  # a Laplace kind's delta may be 0 ...
    (P + ["impressions"], {"k": 100, "epsilon": 0.5, "noise": "gaussian", "delta": 0,
                           "neighbouring": "period", "release_threshold": 2000},
     r"impressions\.delta: must be > 0"),          # ... a Gaussian kind's may not
    (P + ["impressions", "noise"], "uniform", r"impressions\.noise: must be one of \"laplace\", \"discrete_laplace\""),
    (P + ["impressions", "neighbouring"], "day", r"impressions\.neighbouring: must be one of"),
    (C + ["countries"], ["DE", "UK"], r"campaigns\[0\]\.countries\[1\]: must be an ISO 3166-1 .* \(the United Kingdom is GB\)"),
    (C + ["countries"], ["DE", "DE"], r"campaigns\[0\]\.countries: must not repeat an item"),
    (C + ["countries"], ["RU"], r"countries: every country is on the country protection list"),
    (C + ["projects"], ["Wikipedia"], r"projects\[0\]: must be a project name like en\.wikipedia"),
    (C + ["banners"], [], r"banners: must not be empty"),
    (C + ["campaign_id"], "a/b", r"campaign_id: must be letters, digits, '\.', '_' and '-', starting"),
    (C + ["campaign_id"], "..", r"campaign_id: must be letters, digits, '\.', '_' and '-', starting"),
    (C + ["start_date"], "2026-13-01", r"start_date: must be an ISO date"),
    (C + ["end_date"], "2026-10-01", r"campaigns\[0\]\.end_date: is before start_date"),
    (C + ["end_date"], "2026-02-30", r"end_date: must be an ISO date YYYY-MM-DD"),     # not a day
    (C + ["end_date"], "20261101", r"end_date: must be an ISO date YYYY-MM-DD"),
    (C + ["schedule"], "weekly", r"schedule: must be one of \"daily\", \"campaign\""),
    (P + ["clicks", "epsilon"], 0.5, r"clicks: give exactly one of 'epsilon' and 'rho'"),
    (P + ["clicks", "noise"], "discrete_laplace", r"clicks\.noise: rho \(zCDP\) needs a Gaussian kind"),
    (P + ["clicks", "max_clicks_per_user"], ..., r"clicks: missing max_clicks_per_user \(required when neighbouring is \"user\"\)"),
    (P + ["clicks", "rho"], float("nan"), r"clicks\.rho: must be a finite number"),
    (P + ["clicks", "bound_per"], "week", r"clicks\.bound_per: must be one of"),
    (P + ["budget", "campaign_total"], {"epsilon": 2, "delta": 1e-8},
     r"budget\.campaign_total: 3 scheduled release\(s\) spend .* more than"),
    (P + ["budget", "per_period"], {"epsilon": 1.0, "delta": 1e-8}, r"budget\.per_period: one release spends"),
    (P + ["budget", "campaign_total"], {"epsilon": 5, "delta": 1.5}, r"campaign_total\.delta: must be < 1"),
    (["version"], 2, r"version: must be 1"),
    (["accountant"], "rdp", r"accountant: must be one of"),
    (["protected_countries"], ["ZZ"], r"protected_countries\[0\]: must be an ISO"),
])
def test_invalid_configs_name_the_field(path, value, message):
    """Each message names the field (the schema's violations say which schema), never the
    value; ``None``: a valid neighbour of an invalid case (the rule is not over-broad)."""
    if message is None:
        parse_config(_with(path, value))
        return
    with pytest.raises(ConfigError, match=message) as err:
        parse_config(_with(path, value))
    if isinstance(value, str):
        assert repr(value) not in str(err.value) and f'"{value}"' not in str(err.value)


def test_row_dp_clicks_forbid_user_bounds():
    data = _with(P + ["clicks"], {"noise": "discrete_laplace", "epsilon": 0.5, "neighbouring": "row",
                                  "max_clicks_per_user": 3, "release_threshold": 10})
    with pytest.raises(ConfigError, match=r"clicks\.max_clicks_per_user: only allowed"):
        parse_config(data)


def test_duplicate_campaign_ids_refused():
    data = copy.deepcopy(VALID)
    data["campaigns"].append(copy.deepcopy(data["campaigns"][0]))
    with pytest.raises(ConfigError, match=r"campaigns\[1\]\.campaign_id: the same campaign id as an earlier"):
        parse_config(data)


def test_valid_config_measures_charges_and_schedule():
    config = parse_config(VALID)
    campaign = config.campaign("C1")
    assert config.protected_countries == {"RU"} and config.accountant == "basic"
    assert campaign.released_countries() == ("DE", "FR", "US")
    assert campaign.impressions.noise_spec() == calibrate(
        NoiseKind.DISCRETE_LAPLACE, epsilon=0.5, l1_sensitivity=100, l2_sensitivity=100)
    assert campaign.clicks.sensitivity == 5
    # One user's 5 clicks can spread over 5 keys: calibrated for l0 = 5 (same sigma under rho).
    # Its stated epsilon is the worst split's PLD (5 clicks: L1 = L2 = 5), below zCDP's.
    assert campaign.clicks.noise_spec() == calibrate_zcdp(
        NoiseKind.DISCRETE_GAUSSIAN, rho=0.01, l2_sensitivity=5, l0=5, delta_for_reporting=1e-9,
        l1_sensitivity=5)
    assert campaign.clicks.noise_spec().accountant == "pld"
    assert campaign.clicks.noise_spec().epsilon < zcdp_to_epsilon(0.01, 1e-9)
    assert campaign.clicks.noise_spec().scale == calibrate_zcdp(
        NoiseKind.DISCRETE_GAUSSIAN, rho=0.01, l2_sensitivity=5, delta_for_reporting=1e-9).scale
    measures = campaign.measures()
    assert [m.name for m in measures] == ["impressions", "clicks"]
    assert measures[1].rho == 0.01 and measures[0].epsilon == 0.5
    assert measures[1].sensitivities.l2 == 5 and "user" in measures[1].neighbouring
    releases = campaign.releases()
    assert [r.release_id for r in releases] == ["C1/2026-11-01", "C1/2026-11-02", "C1/2026-11-03"]
    assert releases[1].periods == ("2026-11-02",) and releases[1].dates == (dt.date(2026, 11, 2),)
    once = parse_config(_with(C + ["schedule"], "campaign")).campaigns[0].releases()
    assert len(once) == 1 and once[0].periods == ("2026-11-01", "2026-11-02", "2026-11-03")
    scopes = campaign.scopes(releases[1])
    assert [s.name for s in scopes] == ["campaign:C1", "period:C1:2026-11-02"]
    assert scopes[0].budget.epsilon == 5
    with pytest.raises(KeyError, match="no campaign"):
        config.campaign("nope")


def test_keyset_is_the_cross_product_minus_protected():
    campaign = parse_config(VALID).campaigns[0]
    keyset = campaign.keyset()
    assert keyset.num_rows == campaign.keyset_size() == 2 * 3 * 3 * 3
    assert keyset.column_names == ["campaign_id", "banner_id", "country", "project", "date"]
    assert keyset.schema.field("date").type == pa.date32()
    rows = set(zip(*[keyset.column(c).to_pylist() for c in keyset.column_names]))
    expected = {("C1", b, c, p, dt.date(2026, 11, d)) for b in ("C1_dsk", "C1_mob")
                for c in ("DE", "FR", "US") for p in ("de.wikipedia", "fr.wikipedia", "commons.wikimedia")
                for d in (1, 2, 3)}
    assert rows == expected
    one_day = campaign.keyset([dt.date(2026, 11, 2)])
    assert one_day.num_rows == 18 and set(one_day.column("date").to_pylist()) == {dt.date(2026, 11, 2)}
    with pytest.raises(ValueError, match="outside campaign"):
        campaign.keyset([dt.date(2026, 12, 1)])


def test_load_sample_config_with_protection_list_file():
    config = load_config(os.path.join(SAMPLE_DIR, "campaigns.json"))
    assert len(config.campaigns) == 3
    assert {"CN", "IR", "RU"} <= config.protected_countries
    for campaign in config.campaigns:
        keyset = campaign.keyset()
        assert keyset.num_rows == campaign.keyset_size()
        assert not set(pc.unique(keyset.column("country")).to_pylist()) & config.protected_countries
    assert any(set(c.countries) & config.protected_countries for c in config.campaigns)


def test_file_level_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1,\n "campaigns": [}')
    with pytest.raises(ConfigError, match=r"not valid JSON: .* line 2"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(str(tmp_path / "missing.json"))
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({**VALID, "protected_countries_file": "nope.txt"}))
    with pytest.raises(ConfigError, match=r"protected_countries_file: cannot read"):
        load_config(str(ref))
    with pytest.raises(ConfigError, match=r"list.txt:2"):
        parse_protected_countries("RU\nXX # typo\n", "list.txt")
    assert parse_protected_countries("# comment\n\nRU  # Russia\nCN\n") == {"RU", "CN"}
    assert len(ISO_3166_ALPHA2) == len(set(ISO_3166_ALPHA2)) == 250


def test_load_config_from_gcs(tmp_path, monkeypatch):
    from gcp_storage_emulator.server import create_server

    from accounting import gcs

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    server = create_server("localhost", port, in_memory=True, default_bucket="cfg")
    server.start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{port}")
        data = {**VALID, "protected_countries": [], "protected_countries_file": "protected.txt"}
        gcs.blob("gs://cfg/cn/campaigns.json").upload_from_string(json.dumps(data))
        gcs.blob("gs://cfg/cn/protected.txt").upload_from_string("RU\nCN\n")
        config = load_config("gs://cfg/cn/campaigns.json")
        assert config.protected_countries == {"RU", "CN"}
        assert config.campaigns[0].released_countries() == ("DE", "FR", "US")
    finally:
        server.stop()


def test_user_dp_clicks_with_epsilon_are_calibrated_for_several_keys():
    """Point 8 of the privacy issue: m clicks of one user may land on m keys, so the (epsilon,
    delta) calibration uses the multivariate bound, which needs more sigma than one key would."""
    data = copy.deepcopy(VALID)
    clicks = data["campaigns"][0]["privacy"]["clicks"]
    clicks.pop("rho")
    clicks.update(epsilon=1.0, delta=1e-9)
    spec = parse_config(data).campaign("C1").clicks.noise_spec()
    assert spec.l0 == 5
    assert spec == calibrate(NoiseKind.DISCRETE_GAUSSIAN, epsilon=1.0, delta=1e-9, l1_sensitivity=5,
                             l2_sensitivity=5, l0=5)
    assert spec.scale > calibrate(NoiseKind.DISCRETE_GAUSSIAN, epsilon=1.0, delta=1e-9,
                                  l2_sensitivity=5).scale


def test_a_release_splits_its_budget_through_a_shared_budget():
    """CentralNotice plans each release from a SharedBudget: the measures the ledger charges,
    the guarantee the marker states and the explain text all come from it."""
    import os

    from accounting import guarantee
    from accounting.shared_budget import SharedBudget
    from pipelines.centralnotice.job import JOB, CentralNoticeRequest
    from pipelines.release import ReleaseOptions

    sample = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                          "pipelines", "sample_data", "centralnotice")
    request = CentralNoticeRequest(config=os.path.join(sample, "campaigns.json"),
                                   impressions=("x.csv",), clicks=("y.csv",), first_releases=True,
                                   options=ReleaseOptions(output="/tmp/unused", testing_seed=1))
    config = load_config(request.config)
    for planned, campaign in zip(JOB.planned(request), config.campaigns):
        assert isinstance(planned.budget, SharedBudget)
        assert planned.budget.names == ("impressions", "clicks")
        assert planned.measures == tuple(campaign.measures())
        assert planned.accountant == config.accountant == planned.budget.accountant
        assert planned.guarantee() == planned.budget.guarantee()
        assert planned.guarantee() == guarantee.compose(
            planned.measures, config.accountant, campaign.release_budget().delta or None)
        text = planned.explain()
        assert "== impressions ==" in text and "== clicks ==" in text


@pytest.mark.parametrize("accountant", ["basic", "zcdp", "pld"])
def test_mixed_measures_share_one_release_budget_under_every_accountant(accountant):
    from accounting import guarantee

    campaign = parse_config(_with(["accountant"], accountant)).campaigns[0]
    shared = campaign.shared_budget(accountant)
    assert shared.total == campaign.release_budget() == campaign.per_period
    assert shared.budget("clicks").rho == 0.01 and shared.budget("impressions").epsilon == 0.5
    assert shared.guarantee() == guarantee.compose(campaign.measures(), accountant, 1e-8)
    assert guarantee.within(shared.guarantee(), 1.6, 1e-8)


def test_explain_flag_prints_the_plan_and_touches_nothing(tmp_path, capsys):
    from pipelines.centralnotice.job import main

    out = tmp_path / "out"
    assert main(["--config", os.path.join(SAMPLE_DIR, "campaigns.json"), "--impressions", "x.csv",
                 "--clicks", "y.csv", "--first_releases", "--output", str(out),
                 "--ledger", str(tmp_path / "ledger.json"), "--key_store", str(tmp_path / "keys"),
                 "--explain"]) == 0
    text = capsys.readouterr().out
    assert text.count("Shared privacy budget:") == 3
    assert "== impressions ==" in text and "== clicks ==" in text and "Whole job" in text
    assert not out.exists() and not (tmp_path / "ledger.json").exists()
    # Nothing is opened: no ledger, key store or output needed.
    assert main(["--config", os.path.join(SAMPLE_DIR, "campaigns.json"), "--first_releases",
                 "--explain"]) == 0
    assert capsys.readouterr().out == text


def test_epsilon_configured_user_clicks_are_calibrated_on_the_multi_key_pld():
    """A target (epsilon, delta) for user-DP discrete Gaussian clicks gets the least sigma that
    meets it for every split of the user's m clicks (issue 39.2), not the zCDP route's sigma;
    the measure, its record (to_dict, as the ledger and catalog read it) and explain() name
    the accountant."""
    from accounting.calibration import discrete_gaussian_sigma
    from accounting.distributions import discrete_gaussian_shift_delta

    data = copy.deepcopy(VALID)
    data["campaigns"][0]["privacy"]["clicks"] = {
        "noise": "discrete_gaussian", "epsilon": 0.8, "delta": 1e-9, "neighbouring": "user",
        "max_clicks_per_user": 3, "bound_per": "period", "release_threshold": 30}
    campaign = parse_config(data).campaign("C1")
    clicks = campaign.measures()[1]
    assert clicks.accountant == "pld" and clicks.to_dict()["accountant"] == "pld"
    assert (clicks.epsilon, clicks.delta) == (0.8, 1e-9)
    zcdp_sigma = discrete_gaussian_sigma(0.8, 1e-9, 3, 3)
    assert clicks.noise.scale < 0.96 * zcdp_sigma
    for split in [(3,), (2, 1), (1, 1, 1), (2,), (1, 1), (1,)]:
        assert discrete_gaussian_shift_delta(clicks.noise.scale, split, 0.8) <= 1e-9
    explain = campaign.shared_budget("pld").explain().splitlines()
    row = [line for line in explain if line.startswith("clicks ") and "discrete_gaussian" in line]
    assert len(row) == 1 and " pld " in row[0]  # the "epsilon by" column


def test_the_published_schema_is_the_one_checked_and_agrees_with_the_code():
    """Editors read the schema file the sample's ``$schema`` names; the job checks with the
    same file (no second copy to drift), and the schema's lists are the code's."""
    from jsonschema import Draft202012Validator

    from accounting import guarantee
    from pipelines.centralnotice import config as cn_config
    from pipelines.centralnotice.data import SAMPLE_SCHEMA_REF
    from pipelines.release import config_schema, names

    sample = json.load(open(os.path.join(SAMPLE_DIR, "campaigns.json")))
    assert sample["$schema"] == SAMPLE_SCHEMA_REF
    published = os.path.join(SAMPLE_DIR, SAMPLE_SCHEMA_REF)
    assert os.path.samefile(published, cn_config.SCHEMA_FILE)
    schema = json.load(open(published))
    Draft202012Validator.check_schema(schema)
    assert config_schema.load(os.path.abspath(cn_config.SCHEMA_FILE)) == schema
    assert schema["$id"] == os.path.basename(cn_config.SCHEMA_FILE)
    assert schema["title"] and schema["description"]
    assert list(ISO_3166_ALPHA2) == schema["$defs"]["country"]["enum"]
    assert schema["$defs"]["noise"]["enum"] == [kind.value for kind in NoiseKind]
    assert tuple(schema["properties"]["accountant"]["enum"]) == guarantee.ACCOUNTANTS
    assert schema["$defs"]["campaign"]["properties"]["campaign_id"]["pattern"] == \
        f"^{names._SEGMENT.pattern}$"
    assert schema["properties"]["version"]["const"] == 1
    # The schema is what refuses: a file that fails it is refused before any rule of the code.
    with pytest.raises(ConfigError, match=r"\(schema config\.schema\.json\)"):
        parse_config(_with(["version"], 2))
