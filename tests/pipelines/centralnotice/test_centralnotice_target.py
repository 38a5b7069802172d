"""CentralNotice releases calibrated jointly to one target (``privacy.target``; issue 39.2): less
noise than the separate calibration at the same stated total, the target and the accountant in
every statement, the schedule check charging the joint measures, and bad targets refused before
any work. (The independent dp_accounting check of the composed guarantee is in
tests/accounting/verification/test_stated_guarantees.py; the neighbouring-pair audit is
``centralnotice/target`` in tests/audit_kit.py.)"""
from __future__ import annotations

import copy
import json
import os

import pyarrow.parquet as pq
import pytest
from release_testkit import (CN_CLK_HEADER as CLK_HEADER, CN_DAY1 as DAY1, CN_IMP_HEADER as IMP_HEADER,
                             CN_RELEASE1 as RELEASE1, LOW, cn_config, write_csv, write_json)

from accounting import guarantee
from accounting.ledger.operations import open_ledger
from pipelines.centralnotice.config import JOINT_PART, ConfigError, parse_config
from pipelines.centralnotice.job import CentralNoticeRequest, main, run
from pipelines.release import ReleaseOptions

TARGET = {"epsilon": 1.0, "delta": 1e-7}
ROW_GAUSSIAN_CLICKS = {"noise": "discrete_gaussian", "epsilon": 0.5, "delta": 1e-7,
                       "neighbouring": "row", "release_threshold": LOW}
BUDGET = {"campaign_total": {"epsilon": 8.0, "delta": 1e-6},
          "per_period": {"epsilon": 4.0, "delta": 1e-6}}


def separate(impressions=None, clicks=None, accountant="pld", budget=BUDGET) -> dict:
    """Impressions and clicks each calibrated from its own budget: (0.5, 0) + (0.5, 1e-7), a
    stated total of (1, 1e-7)."""
    data = cn_config(impressions={"epsilon": 0.5, **(impressions or {})},
                     clicks=clicks or dict(ROW_GAUSSIAN_CLICKS), budget=copy.deepcopy(budget))
    data["accountant"] = accountant
    return data


def joint(target=None, **kwargs) -> dict:
    """:func:`separate` with the two budgets read as weights of one target, by default (1, 1e-7)."""
    data = separate(**kwargs)
    data["campaigns"][0]["privacy"]["target"] = dict(target or TARGET)
    return data


def campaign_of(data):
    return parse_config(data).campaigns[0]


def _inputs(folder):
    keys = [("C1", b, c, p, DAY1) for b in ("C1_dsk", "C1_mob") for c in ("DE", "FR")
            for p in ("de.wikipedia", "fr.wikipedia")]
    imp = write_csv(os.path.join(folder, "imp.csv"), IMP_HEADER,
                    [k + (100 + 10 * i,) for i, k in enumerate(keys)])
    clk = write_csv(os.path.join(folder, "clk.csv"), CLK_HEADER,
                    [k + (f"u{i}-{j}",) for i, k in enumerate(keys) for j in range(i)])
    return imp, clk


def _testing_run(tmp_path, data, name):
    folder = tmp_path / name
    folder.mkdir()
    imp, clk = _inputs(str(folder))
    config = write_json(folder / "campaigns.json", data)
    (outcome,) = run(CentralNoticeRequest(
        config=config, impressions=(imp,), clicks=(clk,), release=RELEASE1, num_shards=2,
        options=ReleaseOptions(output=str(folder / "out"), testing_seed=3))).releases
    marker = json.load(open(os.path.join(outcome.folder, "RELEASE.json")))
    return pq.read_table(os.path.join(outcome.folder, "centralnotice.parquet")), marker


# --------------------------------------------------------------------------- less noise

@pytest.mark.parametrize("impressions, weights", [
    (None, "1:1"),                                                   # Laplace + Gaussian
    ({"noise": "discrete_gaussian", "delta": 5e-8, "epsilon": 0.5}, "1:1"),   # two Gaussians
    (None, "1:3"),
])
def test_joint_calibration_spends_less_noise_than_the_separate_one_at_the_same_stated_total(
        impressions, weights):
    """Both measures get strictly less noise than their separate calibration from budgets that
    add up to the target (Gaussian clicks, pld), and together they still compose within it."""
    clicks = dict(ROW_GAUSSIAN_CLICKS)
    target = dict(TARGET)
    if weights == "1:3":
        clicks["epsilon"] = 1.5
        target["epsilon"] = 2.0
    if impressions is not None:  # the two deltas, 5e-8 + 5e-8, are the target's 1e-7
        clicks["delta"] = 5e-8
    sep = campaign_of(separate(impressions=impressions, clicks=clicks))
    jnt = campaign_of(joint(target=target, impressions=impressions, clicks=clicks))
    calibration = jnt.joint_calibration()
    assert calibration.multiplier > 1.0 and calibration.accountant == "pld"
    before, after = sep.noise_specs(), jnt.noise_specs()
    for name in ("impressions", "clicks"):
        assert after[name].scale < before[name].scale, name
        assert after[name].std < before[name].std, name
    # the separate budgets add up to the target: that is the stated total both start from
    assert sep.impressions.budget.epsilon + sep.clicks.budget.epsilon == pytest.approx(target["epsilon"])
    assert sep.impressions.budget.delta + sep.clicks.budget.delta == pytest.approx(target["delta"])
    spent = guarantee.stated(jnt.measures(), "pld", target["delta"])
    assert guarantee.within(spent.guarantee, target["epsilon"], target["delta"])
    # ... and spends more of it than the separate measures, which leave budget unused
    assert spent.epsilon > guarantee.stated(sep.measures(), "pld", target["delta"]).epsilon
    # the weights' proportions are kept: one multiplier for both epsilons
    shares = [m.share.epsilon for m in jnt.measures()]
    assert shares[0] / shares[1] == pytest.approx(sep.impressions.budget.epsilon / sep.clicks.budget.epsilon)


def test_a_released_table_states_the_smaller_noise(tmp_path):
    """Through the job: the jointly calibrated release's error columns (its stated noise) are
    smaller than the separately calibrated release's for both values."""
    table_sep, _ = _testing_run(tmp_path, separate(), "separate")
    table_joint, _ = _testing_run(tmp_path, joint(), "joint")
    for value in ("impressions", "clicks"):
        std_sep = set(table_sep.column(f"{value}_std").to_pylist())
        std_joint = set(table_joint.column(f"{value}_std").to_pylist())
        assert len(std_sep) == len(std_joint) == 1
        assert std_joint.pop() < std_sep.pop(), value


def test_the_basic_accountant_gives_the_separate_calibration():
    """Under basic composition the largest multiplier is 1: the target changes nothing."""
    sep = campaign_of(separate(accountant="basic"))
    jnt = campaign_of(joint(accountant="basic"))
    assert jnt.joint_calibration().multiplier == 1.0
    for name in ("impressions", "clicks"):
        assert jnt.noise_specs()[name].scale == pytest.approx(sep.noise_specs()[name].scale, rel=1e-12)


def test_user_dp_clicks_over_several_keys_are_calibrated_jointly_too():
    """User-DP discrete Gaussian clicks spread over up to m = 2 keys compose under pld by the PLD
    dominating their shift patterns: the joint calibration goes below the sum for them too, and
    their noise stays calibrated for every way m clicks fall on keys (L0 = m)."""
    user = {"noise": "discrete_gaussian", "epsilon": 0.5, "delta": 1e-7, "neighbouring": "user",
            "max_clicks_per_user": 2, "bound_per": "period", "release_threshold": LOW}
    sep, jnt = campaign_of(separate(clicks=user)), campaign_of(joint(clicks=user))
    assert jnt.joint_calibration().multiplier > 1.0
    for name in ("impressions", "clicks"):
        assert jnt.noise_specs()[name].scale < sep.noise_specs()[name].scale
    clicks = jnt.measures()[1]
    assert clicks.noise.l0 == 2 and clicks.sensitivities.l0 == 2
    assert guarantee.within(guarantee.stated(jnt.measures(), "pld", 1e-7).guarantee, 1.0, 1e-7)


# --------------------------------------------------------------------------- statements

def test_the_release_states_the_target_and_the_accountant(tmp_path, capsys):
    """RELEASE.json (parameters, guarantee, measures), --explain and the ledger's charge all say
    that the release was calibrated to the target, and by which accountant."""
    data = joint()
    campaign = campaign_of(data)
    calibration = campaign.joint_calibration()
    _, marker = _testing_run(tmp_path, data, "testing")
    stated = marker["parameters"]["target"]
    assert (stated["epsilon"], stated["delta"], stated["accountant"]) == (1.0, 1e-7, "pld")
    assert stated["multiplier"] == calibration.multiplier > 1
    assert stated["weights"] == {"impressions": {"epsilon": 0.5, "delta": None},
                                 "clicks": {"epsilon": 0.5, "delta": 1e-7}}
    g = marker["guarantee"]
    assert g["accountant"] == "pld" and g["figure_accountant"] == "pld"
    assert g["epsilon"] <= 1.0 and g["delta"] == 1e-7
    assert "calibrated jointly to the target epsilon=1, delta=1e-07 by the pld accountant" in g["covers"]
    for m in marker["measures"]:
        assert "to the release's target (epsilon=1, delta=1e-07) by the pld accountant" in m["description"]

    folder = tmp_path / "real"
    folder.mkdir()
    imp, clk = _inputs(str(folder))
    config = write_json(folder / "campaigns.json", data)
    args = ["--config", config, "--impressions", imp, "--clicks", clk, "--release", RELEASE1,
            "--num_shards", "2"]
    capsys.readouterr()
    assert main(args + ["--explain"]) == 0
    text = capsys.readouterr().out
    assert "Calibrated jointly to the target (epsilon=1, delta=1e-07)-DP by the 'pld' accountant" in text
    assert f"m={calibration.multiplier:.4g}" in text and JOINT_PART in text
    ledger_path, keys = str(folder / "ledger.json"), str(folder / "keys")
    assert main(args + ["--output", str(folder / "out"), "--ledger", ledger_path,
                        "--key_store", keys]) == 0
    ledger = open_ledger(ledger_path, keys)  # with the accountant it was created with
    assert ledger.accountant == "pld"
    charged = ledger.get(RELEASE1)["measures"]
    assert [m["name"] for m in charged] == ["impressions", "clicks"]
    assert [m["epsilon"] for m in charged] == [m.epsilon for m in calibration.measures]
    assert all("target (epsilon=1, delta=1e-07) by the pld accountant" in m["description"]
               for m in charged)
    spent = ledger.spent("campaign:C1")
    assert spent.epsilon == pytest.approx(guarantee.stated(calibration.measures, "pld", 1e-6).epsilon)


def test_a_configuration_without_a_target_states_nothing_new(tmp_path):
    """Existing configurations keep their meaning and their release metadata."""
    _, marker = _testing_run(tmp_path, separate(), "plain")
    assert "target" not in marker["parameters"]
    assert "jointly" not in marker["guarantee"]["covers"]
    assert all("jointly" not in m["description"] for m in marker["measures"])


# --------------------------------------------------------------------------- the schedule check

def test_the_schedule_check_charges_the_joint_measures():
    """A campaign total between what two separately calibrated releases compose to and what two
    jointly calibrated ones do: the separate configuration fits, the joint one is refused,
    naming the budget and the target (the check charges what the ledger will)."""
    delta = BUDGET["campaign_total"]["delta"]
    sep_measures = campaign_of(separate()).measures()
    joint_measures = campaign_of(joint()).measures()
    low = guarantee.stated(sep_measures * 2, "pld", delta).epsilon
    high = guarantee.stated(joint_measures * 2, "pld", delta).epsilon
    assert low < high
    budget = {"campaign_total": {"epsilon": (low + high) / 2, "delta": delta}}
    campaign_of(separate(budget=budget))
    with pytest.raises(ConfigError, match=r"campaigns\[0\]\.privacy\.budget\.campaign_total: 2 "
                                          r"scheduled release\(s\) spend .*privacy\.target"):
        campaign_of(joint(budget=budget))


# --------------------------------------------------------------------------- bad targets

def _edit(data, change):
    kind, value = change
    privacy = data["campaigns"][0]["privacy"]
    if kind == "target":
        privacy["target"] = value
    elif kind == "accountant":
        data["accountant"] = value
    elif kind == "rho":
        del privacy["clicks"]["epsilon"]
        privacy["clicks"]["rho"] = value
    return data


@pytest.mark.parametrize("change, field", [
    (("target", {"epsilon": 0, "delta": 1e-7}), "campaigns[0].privacy.target.epsilon: must be > 0"),
    (("target", {"epsilon": 1.0}), "campaigns[0].privacy.target: missing delta (the clicks' "
                                   "Gaussian noise takes its delta from the target"),
    (("target", {"epsilon": 1.0, "delta": 0}), "campaigns[0].privacy.target.delta: must be > 0"),
    (("target", {"epsilon": 1.0, "delta": 1.5}), "campaigns[0].privacy.target.delta: must be < 1"),
    (("target", {"epsilon": 1.0, "delta": 1e-7, "rho": 1}), "campaigns[0].privacy.target: unknown field"),
    (("target", {"epsilon": 5.0, "delta": 1e-7}), "campaigns[0].privacy.budget.per_period: one "
                                                  "release spends"),
    (("accountant", "zcdp"), "campaigns[0].privacy.target: needs the accountant \"pld\""),
    (("rho", 0.01), "campaigns[0].privacy.clicks.rho: not with a target"),
])
def test_a_bad_target_is_refused_before_any_work_naming_the_field(tmp_path, capsys, change, field):
    data = _edit(joint(budget={"campaign_total": {"epsilon": 20.0, "delta": 1e-6},
                               "per_period": {"epsilon": 4.5, "delta": 1e-6}}), change)
    config = write_json(tmp_path / "campaigns.json", data)
    imp, clk = _inputs(str(tmp_path))
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["--config", config, "--impressions", imp, "--clicks", clk, "--release", RELEASE1,
                 "--output", str(out), "--ledger", str(tmp_path / "ledger.json"),
                 "--key_store", str(tmp_path / "keys")]) == 2
    err = capsys.readouterr().err
    assert field in err, err
    if "per_period" in field:
        assert "each release is calibrated to campaigns[0].privacy.target" in err
    assert not out.exists() and not (tmp_path / "ledger.json").exists()
    assert not (tmp_path / "keys").exists()
