"""Utility analysis before release and contribution bounds chosen privately (issue 16 point 3)."""
import numpy as np
import pyarrow as pa
import pytest

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from accounting.shared_budget import SharedBudget
from transforms.keyset import PublicKeyset
from transforms.metrics import Count, Mean, PrivacyUnitCount, Sum
from transforms.noise import RandomStreams
from transforms.selection import PrivateSelection
from transforms.utility import Candidate, analyze, choose_bounds


def _data(seed=0):
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(300), rng.integers(1, 12, 300))
    n = len(users)
    return pa.table({"user": users, "country": rng.choice(["DE", "FR", "JP"], n, p=[.6, .3, .1]),
                     "v": rng.uniform(0, 20, n)})


CANDIDATES = [Candidate(name=f"L0={l0},Linf={linf}",
                        bounds=ContributionBounds(max_partitions=l0, max_contributions_per_partition=linf,
                                                  min_value=0, max_value=10),
                        budget=PrivacyBudget(epsilon=1.0)) for l0, linf in [(1, 1), (3, 5)]]


def test_analysis_reports_dropped_rows_errors_and_suppression(tmp_path):
    table = _data()
    report = analyze(table, privacy_unit="user", keys=["country"], value="v",
                     metrics=[Count(threshold=100), Sum(), Mean(), PrivacyUnitCount()],
                     candidates=CANDIDATES, keyset=PublicKeyset.from_keys(["DE", "FR", "JP", "US"], ["country"]))
    summary = {(r["candidate"], r["metric"]): r for r in report.summary}
    tight, loose = summary[("L0=1,Linf=1", "count")], summary[("L0=3,Linf=5", "count")]
    # Exact dropped share for L0 = Linf = 1: one row kept per user.
    assert tight["rows_dropped_by_bounding"] == pytest.approx(1 - 300 / table.num_rows)
    assert loose["rows_dropped_by_bounding"] < tight["rows_dropped_by_bounding"]
    assert tight["keys"] == 4
    per_key = {(r["candidate"], r["key"], r["metric"]): r for r in report.per_key}
    de = per_key[("L0=1,Linf=1", "DE", "count")]
    de_rows = int(np.sum(table.column("country").to_numpy(zero_copy_only=False) == "DE"))
    assert de["true"] == de_rows and de["expected"] < de["true"]
    assert de["rmse"] == pytest.approx(np.hypot(de["bias"], de["noise_std"]))
    # US has no rows: its count is noise only, below the threshold with probability ~1.
    assert per_key[("L0=1,Linf=1", "US", "count")]["p_suppressed"] > 0.99
    assert 0 < tight["share_keys_suppressed"] <= 1
    # Sums see clamping (values up to 20 clamped to 10): bias even without bounding losses.
    assert per_key[("L0=3,Linf=5", "DE", "sum")]["bias"] < 0
    text = report.table()
    assert "rows_dropped_by_bounding" in text and "L0=3,Linf=5" in text
    report.write_csv(str(tmp_path / "summary.csv"))
    report.write_csv(str(tmp_path / "keys.csv"), per_key=True)
    assert (tmp_path / "keys.csv").read_text().count("\n") == len(report.per_key) + 1
    report.plot(str(tmp_path / "utility.png"))
    assert (tmp_path / "utility.png").stat().st_size > 1000


def test_analysis_with_private_selection_counts_dropped_keys():
    report = analyze(_data().to_pandas(), privacy_unit="user", keys="country", metrics=["count"],
                     candidates=[Candidate(name="c", bounds=ContributionBounds(max_partitions=2, max_contributions_per_partition=3),
                                           budget=PrivacyBudget(epsilon=1.0, delta=1e-6))],
                     selection=PrivateSelection())
    [row] = report.summary
    assert row["keys"] == 3 and 0 <= row["share_keys_suppressed"] < 0.5


def test_bounds_chosen_privately_are_charged_and_sensible():
    shared = SharedBudget(PrivacyBudget(epsilon=2.0), weights={"bounds": 1, "release": 1},
                          release_key=ReleaseKey.for_testing(9))
    choice = choose_bounds(_data(), privacy_unit="user", keys=["country"], budget=shared.part("bounds"),
                           quantile=0.9)
    # 90% of users have <= 3 keys and their largest key holds <= ~8 rows.
    assert choice.max_partitions in (2, 4) and choice.max_contributions_per_partition in (4, 8)
    assert choice.guarantee().epsilon == pytest.approx(1.0)
    assert "permute_and_flip" in shared.explain() and "bounds.max_partitions" in choice.explain()
    assert choice.bounds(min_value=0, max_value=1).max_partitions == choice.max_partitions


def test_choose_bounds_with_a_plain_budget_is_refused():
    """A plain budget was composed nowhere (main f02cb62): the choice spends budget, so it takes
    a SharedBudget part and the job's guarantee includes its cost."""
    with pytest.raises(TypeError, match="SharedBudget"):
        choose_bounds(_data(), privacy_unit="user", keys=["country"], budget=PrivacyBudget(epsilon=1.0),
                      release_key=ReleaseKey.for_testing(3))
    shared = SharedBudget(PrivacyBudget(epsilon=2.0), weights={"bounds": 1, "release": 3})
    choose_bounds(_data(), privacy_unit="user", keys=["country"], budget=shared.part("bounds"))
    assert [m.name for m in shared.measures()] == ["bounds.max_partitions",
                                                   "bounds.max_contributions_per_partition"]
    assert shared.guarantee().epsilon == pytest.approx(0.5)


def test_the_bounds_choice_uses_no_floating_point_uniforms(monkeypatch):
    """Gumbel-max from clipped 2^-53-grid uniforms gave some candidates probability exactly 0
    (main f02cb62). The choice reads only uniform integers (transforms/noise/exponential.py;
    its exactness is tested in tests/transforms/noise/test_exponential.py): a choice made with
    the float uniforms disabled still works."""
    def no_floats(self, lanes=None):
        raise AssertionError("a floating-point uniform was drawn")

    monkeypatch.setattr(RandomStreams, "uniform_float", no_floats)
    shared = SharedBudget(PrivacyBudget(epsilon=2.0), weights={"bounds": 1})
    choice = choose_bounds(_data(), privacy_unit="user", keys=["country"], budget=shared.part("bounds"),
                           release_key=ReleaseKey.for_testing(8))
    assert "permute-and-flip" in choice.explain() and "epsilon d / 1.8" in choice.explain()


def _show_their_data(panels):
    """Every panel shows a bar above zero, or says in it why it does not."""
    assert len(panels) == 3
    for panel in panels:
        assert any(v > 0 for v in panel["values"]) or panel["notes"], panel


def test_every_utility_panel_shows_its_data_or_says_why(tmp_path):
    keyset = PublicKeyset.from_keys(["DE", "FR", "JP", "US"], ["country"])
    report = analyze(_data(), privacy_unit="user", keys=["country"], value="v",
                     metrics=[Count(threshold=100), Sum(), Mean(), PrivacyUnitCount()],
                     candidates=CANDIDATES, keyset=keyset)
    panels = report.plot(str(tmp_path / "thresholds.png"))
    _show_their_data(panels)
    assert len(panels[0]["values"]) == len(CANDIDATES)  # rows dropped: one bar per candidate
    assert "the same for every metric" in panels[2]["notes"][0]
    # Loose bounds, no threshold: nothing dropped, nothing suppressed -- said, not left empty.
    loose = [Candidate(name=f"Linf={linf}", budget=PrivacyBudget(epsilon=1.0),
                       bounds=ContributionBounds(max_partitions=3, max_contributions_per_partition=linf,
                                                 min_value=0, max_value=10)) for linf in (12, 20)]
    report = analyze(_data(), privacy_unit="user", keys=["country"], value="v",
                     metrics=["count", "sum"], candidates=loose, keyset=keyset)
    panels = report.plot(str(tmp_path / "loose.png"))
    _show_their_data(panels)
    assert panels[0]["values"] == [0, 0] and "no row dropped" in panels[0]["notes"][0]
    assert panels[2]["notes"] == ["no key expected to be suppressed:\nno threshold and a public keyset"]
