"""The catalog's pure parts without Beam or releases (tests/test_layout.py holds it Beam-free):
tolerant ledger reading, dataset grouping, budgets over time, schedules and their states,
coverage alarms, escaping, pagination, charts, catalog.json against its schema, and the site of
many releases staying small (the benchmark's synthesiser at a small size)."""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import xml.etree.ElementTree as ET

import pytest

from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.ledger.records import Scope
from accounting.measures import Measure
from pipelines.catalog import cli as catalog
from pipelines.catalog import budget as catalog_budget
from pipelines.catalog import charts as catalog_charts
from pipelines.catalog import coverage as catalog_coverage
from pipelines.catalog import export as catalog_export
from pipelines.catalog import facts as catalog_facts
from pipelines.catalog import html as catalog_html
from pipelines.catalog import model as catalog_model
from pipelines.catalog import schedule as catalog_schedule
from pipelines.catalog import site as catalog_site

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_release_id_rule_is_the_release_layers():
    from pipelines.release.names import check_release_id

    for rid in ["a", "C1/2026-11-01", "x/" * 7 + "y", "x/" * 8 + "y", "a//b", "/a", ".a",
                "a/..", "a b", "é", "a" * 128, "a" * 129, "ok.name_-1/v"]:
        try:
            check_release_id(rid)
            ok = True
        except ValueError:
            ok = False
        assert bool(catalog_schedule._RELEASE_ID.match(rid)) == ok, rid


def _ledger_state(**extra):
    measure = Measure(name="count", mechanism="discrete_laplace", epsilon=1.0).to_json()
    record = {"release_id": "r/2026-01-01", "version": 1, "versioned_id": "r/2026-01-01",
              "measures": [measure], "scopes": ["total"], "input_digest": "sha256:ab",
              "keys": {"release": {"fingerprint": "f" * 16, "uri": "/k"}}, "state": "reserved",
              "runs": 1, "takeovers": [], "metadata": {"job": "toy"},
              # fields other work adds to records: read and ignored
              "consumed": {"ids": "sha256:cd", "count": 3}, "chain": "sha256:ef"}
    return {"format": "beam-dp-release/budget-ledger/v2", "ledger_id": "id1", "accountant": "basic",
            "scopes": {"total": {"epsilon": 3.0, "delta": 0.0}},
            "releases": {"r/2026-01-01": record}, "latest": {"r/2026-01-01": "r/2026-01-01"},
            "content": {}, "chain_head": "sha256:00", **extra}


def test_ledger_read_tolerates_new_fields_and_checks_the_format(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(_ledger_state()))
    ledger = catalog_model.read_ledger(str(path))
    assert ledger.record("r/2026-01-01").key_fingerprints == {"release": "f" * 16}
    assert ledger.measures_of_scope("total")[0].epsilon == 1.0
    assert catalog_budget.ledger_spent(ledger, "total") == EpsDelta(1.0, 0.0)
    path.write_text(json.dumps(_ledger_state(format="beam-dp-release/budget-ledger/v9")))
    with pytest.raises(catalog_model.CatalogInputError, match=re.escape(str(path))):
        catalog_model.read_ledger(str(path))
    state = _ledger_state()
    del state["releases"]["r/2026-01-01"]["state"]
    path.write_text(json.dumps(state))
    with pytest.raises(catalog_model.CatalogInputError, match="malformed"):
        catalog_model.read_ledger(str(path))


def test_datasets_group_campaigns_and_batch_series():
    assert catalog_model.dataset_of("centralnotice", "C1/2026-11-01", {"campaign_id": "C1"})[0] \
        == "centralnotice/C1"
    assert catalog_model.dataset_of("reach_frequency", "rf/w1/c1", {"campaign": "c1"})[0] \
        == "reach_frequency/c1"
    assert catalog_model.dataset_of("summary_reports", "summary_reports/b7", {})[0] == \
        catalog_model.dataset_of("summary_reports", "summary_reports/b8", {})[0]
    assert catalog_model.dataset_of("masked_lark_helper", "masked_lark_helper/b/h0", {})[0] == \
        catalog_model.dataset_of("masked_lark_combine", "masked_lark_combine/b", {})[0]
    assert catalog_model.dataset_of("myjob", "myjob/2026-01-01", {})[0] == "myjob"
    assert catalog_model.dataset_of("myjob", "sales/2026-01-01", {})[0] == "myjob/sales"
    assert sorted(["b10", "b9", "b1"], key=catalog_model.natural_key) == ["b1", "b9", "b10"]
    assert catalog_model.scope_families(["campaign:C1", "period:C1:2026-11-01",
                                         "period:C1:2026-11-02"]) == {
        "campaign:C1": ["campaign:C1"],
        "period:C1:*": ["period:C1:2026-11-01", "period:C1:2026-11-02"]}


def _release(rid, day, eps, scopes, *, version=1, accountant="basic", dataset="d"):
    m = catalog_model.MeasureFacts(measure=Measure(name="m", mechanism="laplace", epsilon=eps))
    return catalog_model.PublishedRelease(
        release_id=rid, version=version, versioned_id=rid if version == 1 else f"{rid}#{version}",
        job="toy", dataset_id=dataset, folder=f"{rid}/v{version}", testing=False,
        period=(day, day),
        guarantee=catalog_model.ReleaseGuarantee(accountant=accountant,
                                                 guarantee=EpsDelta(eps, 0.0), covers="x"),
        measures=(m,), scopes=tuple(scopes), outputs=(),
        files=(catalog_model.PublishedFile(name="RELEASE.json", size=10,
                                           sha256="sha256:" + "0" * 64),))


def test_budget_over_time_is_cumulative_in_public_order_and_sampled():
    total = Scope(name="total", budget=PrivacyBudget(epsilon=1000.0))
    releases = [_release(f"r/{d}", d, 0.5, [total])
                for d in (f"2026-{m:02d}-{x:02d}" for m in range(1, 12) for x in range(1, 29))]
    use = catalog_budget.scope_uses(reversed(releases))["total"]
    assert use.spent.epsilon == pytest.approx(0.5 * len(releases))
    assert len(use.series) == catalog_budget.MAX_POINTS
    values = [v for _, v in use.series]
    assert values == sorted(values) and values[-1] == pytest.approx(use.spent.epsilon)
    assert use.series[0] == ("2026-01-01", 0.5)
    assert use.remaining.epsilon == pytest.approx(1000 - 0.5 * len(releases))
    # zCDP composes at sampled points only, and its last point is the exact total.
    z = [_release(f"z/{i}", f"2026-01-{i:02d}", 0.1, [total], accountant="zcdp")
         for i in range(1, 29)]
    zuse = catalog_budget.scope_uses(z)["total"]
    assert len(zuse.series) <= catalog_budget.MAX_COMPOSITIONS
    assert zuse.series[-1][1] == pytest.approx(zuse.spent.epsilon)


def test_sample_indices():
    assert catalog_budget.sample_indices(3, 10) == [0, 1, 2]
    picked = catalog_budget.sample_indices(1000, 50)
    assert picked[0] == 0 and picked[-1] == 999 and len(picked) <= 51


def test_chart_is_valid_svg_with_budget_line_and_escaped_labels():
    svg = catalog_charts.budget_chart(scope="a<b>&c", series=[("<x>", 0.5), ("y", 1.5)],
                                      budget=2.0, caption="c")
    root = ET.fromstring(svg)     # well-formed XML (figure > svg)
    chart = root.find("{http://www.w3.org/2000/svg}svg") or root[0]
    assert chart.get("data-scope") == "a<b>&c" and chart.get("data-points") == "2"
    assert "budget \u03b5=2" in svg and "<x>" not in svg
    flat = catalog_charts.budget_chart(scope="s", series=[], budget=None)
    ET.fromstring(flat)


def test_an_empty_table_says_none_and_a_filled_one_does_not():
    empty = catalog_html.table(["Release", "State"], [])
    assert '<td colspan="2" data-label=""><div class="muted">none</div></td>' in empty
    assert "<th" in empty  # the headers still say what would be listed
    assert "nothing failed" in catalog_html.table(["A"], [], empty="nothing failed")
    assert "none" not in catalog_html.table(["A"], [["x"]])


def test_html_escapes_everything_and_paginates():
    page = catalog_html.page(title="<t>", body=catalog_html.table(["<h>"], [[catalog_html.e("<c>")]]),
                             crumbs=[("<a>", None)])
    assert "<t>" not in page and "&lt;t&gt;" in page and "<c>" not in page
    assert "http" not in page.replace('"http://www.w3.org/2000/svg"', "")
    nav = catalog_html.pagination(5, 12, lambda n: f"p{n}.html")
    assert 'href="p4.html"' in nav and 'href="p6.html"' in nav and 'href="p12.html"' in nav
    assert '<span class="current" aria-current="page">5</span>' in nav
    assert catalog_html.pagination(1, 1, str) == ""


def _inputs(ledger_state, releases=()):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(ledger_state, handle)
    ledger = catalog_model.read_ledger(handle.name)
    os.unlink(handle.name)
    datasets = (catalog_model.Dataset(dataset_id="d", title="d", kind="k", jobs=("toy",),
                                      releases=tuple(releases)),) if releases else ()
    return catalog_model.CatalogInputs(datasets=datasets, ledger=ledger, markers={}, reports={},
                                       excluded=(), missing_files=())


def test_cadence_slots_and_states():
    cadence = catalog_schedule.parse_cadence("r/{date}=daily:2026-01-01")
    state = _ledger_state()
    inputs = _inputs(state)
    slots = cadence.slots(dt.date(2026, 1, 4), inputs)
    assert [s.release_id for s in slots] == ["r/2026-01-01", "r/2026-01-02", "r/2026-01-03",
                                             "r/2026-01-04"]
    health = {h.slot.release_id: h for h in catalog_schedule.assess(slots, inputs,
                                                                    dt.date(2026, 1, 4), 1)}
    assert health["r/2026-01-01"].state == catalog_schedule.RESERVED
    # The series' latest record spends epsilon 1 of scope "total" (3): two more fit.
    assert health["r/2026-01-02"].state == catalog_schedule.MISSING
    assert health["r/2026-01-03"].state == catalog_schedule.PENDING
    assert not health["r/2026-01-03"].overdue
    # A tighter recorded budget: no release of the series fits any more.
    state["scopes"]["total"]["epsilon"] = 1.0
    tight = _inputs(state)
    health = catalog_schedule.assess(cadence.slots(dt.date(2026, 1, 4), tight), tight,
                                     dt.date(2026, 1, 4), 1)
    assert {h.slot.release_id: h.state for h in health}["r/2026-01-02"] == \
        catalog_schedule.OVER_BUDGET
    weekly = catalog_schedule.parse_cadence("w/week-{date}=7d:2026-01-05:2026-01-25")
    assert [(s.start.isoformat(), s.due.isoformat()) for s in weekly.slots(dt.date(2026, 1, 1),
                                                                          inputs)] == [
        ("2026-01-05", "2026-01-11"), ("2026-01-12", "2026-01-18"), ("2026-01-19", "2026-01-25")]
    for bad in ["r/x=daily:2026-01-01", "r/{date}=hourly:2026-01-01", "r/{date}=daily:01/01",
                "r/{date}", "r/{date}=daily:2026-02-01:2026-01-01", "../{date}=daily:2026-01-01"]:
        with pytest.raises(catalog_model.CatalogInputError):
            catalog_schedule.parse_cadence(bad)


def test_schedule_file_declares_cadences(tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({"format": catalog_schedule.SCHEDULE_FORMAT, "cadences": [
        {"release_id": "summary_reports/{date}", "every": "weekly", "start": "2026-01-05"}]}))
    kind, cadences = catalog_schedule.load_config(str(path))
    assert kind == "cadences" and cadences[0].every_days == 7
    path.write_text(json.dumps({"format": catalog_schedule.SCHEDULE_FORMAT,
                                "cadences": [{"release_id": "a/{date}", "typo": 1}]}))
    with pytest.raises(catalog_model.CatalogInputError,
                       match=r"schedule\.json: does not follow schedule\.schema\.json: "
                             r"cadences\[0\]: unknown field\(s\); the fields are end, every, "
                             r"release_id, start; cadences\[0\]: missing every, start$"):
        catalog_schedule.load_config(str(path))
    for cadence, why in [({"every": "hourly"}, r"cadences\[0\]\.every: must be daily, weekly or Nd"),
                         ({"start": "2026-02-30"}, r"cadences\[0\]\.start: must be a YYYY-MM-DD"),
                         ({"release_id": "a/{date}/{date}"}, r"release_id: must be a release-id "
                                                               r"template with one \{date\}"),
                         ({"end": "2025-01-01"}, r"cadences\[0\]: the end is before the start")]:
        path.write_text(json.dumps({"format": catalog_schedule.SCHEDULE_FORMAT, "cadences": [
            {"release_id": "a/{date}", "every": "daily", "start": "2026-01-05", **cadence}]}))
        with pytest.raises(catalog_model.CatalogInputError, match=why) as err:
            catalog_schedule.load_config(str(path))
        assert str(path) in str(err.value)


def test_the_schedule_file_s_published_schema_is_the_one_checked():
    from jsonschema import Draft202012Validator

    from pipelines.release import config_schema

    schema = json.load(open(catalog_schedule.SCHEDULE_SCHEMA_FILE))
    Draft202012Validator.check_schema(schema)
    assert config_schema.load(catalog_schedule.SCHEDULE_SCHEMA_FILE) == schema
    assert schema["properties"]["format"]["const"] == catalog_schedule.SCHEDULE_FORMAT
    assert schema["$id"] == "schedule.schema.json" and schema["title"]
    assert catalog_schedule._EVERY.pattern == schema["$defs"]["cadence"]["properties"]["every"][
        "pattern"]


def test_coverage_alarm_needs_rows_before_and_none_in_the_window():
    def report(counts):
        return catalog_model.OperatorReport(release_id="x", version=1, kind="report", status="",
                                            counters=counts, dropped_rows={})

    releases = [_release(f"c/2026-01-0{i}", f"2026-01-0{i}", 1.0, []) for i in range(1, 5)]
    dataset = catalog_model.Dataset(dataset_id="c", title="c", kind="k", jobs=("toy",),
                                    releases=tuple(releases))
    de, fr = "impressions.coverage.country.DE", "impressions.coverage.country.FR"
    reports = {"c/2026-01-01": report({de: 5, fr: 1}), "c/2026-01-02": report({de: 3, fr: 2}),
               "c/2026-01-03": report({fr: 2}), "c/2026-01-04": report({de: 0, fr: 1})}
    found = catalog_coverage.alarms([dataset], reports, 2)
    assert [(a.column, a.value, a.last_seen) for a in found] == [("country", "DE", "c/2026-01-02")]
    assert catalog_coverage.alarms([dataset], reports, 3) == []     # DE is in the window
    assert catalog_coverage.coverage_counts({"impressions.coverage.project.en.wikipedia": 4}) == \
        {("impressions", "project", "en.wikipedia"): 4}


# --------------------------------------------------------------------------- many releases

@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    import importlib.util

    spec = importlib.util.spec_from_file_location("catalog_benchmark",
                                                  os.path.join(ROOT, "benchmarks", "catalog.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    root = tmp_path_factory.mktemp("synthetic")
    config, written = bench.synthesise(root / "data", campaigns=2, days=260)
    site = root / "site"
    code = catalog.main(["--ledger", str(root / "data" / "ledger.json"), "--releases",
                         str(root / "data" / "releases"), "--output", str(site),
                         "--page_size", "50"])
    assert code == 0
    return {"site": site, "written": written}


def test_many_releases_paginate_and_every_link_resolves(synthetic):
    site = synthetic["site"]
    pages = sorted(site.rglob("*.html"))
    later_pages = [p for p in pages if p.name.startswith("releases-")]
    ids = set()
    for page in pages:
        text = page.read_text()
        assert len(text) < 120_000, page
        for href in re.findall(r'href="([^"]+)"', text):
            assert not href.startswith(("http:", "https:", "//")), (page, href)
            if href == "data:,":      # the empty favicon (no request at all)
                continue
            target = (page.parent / href.split("#")[0]).resolve()
            assert target.exists(), (page, href)
        ids.update(re.findall(r'<span class="release-id">([^<]+)</span>', text))
    doc = json.loads((site / "catalog.json").read_text())
    assert len(later_pages) == sum(-(-len(d["releases"]) // 50) - 1 for d in doc["datasets"]) > 0
    assert len(ids) == len({r["release_id"] for d in doc["datasets"] for r in d["releases"]})
    assert sum(len(d["releases"]) for d in doc["datasets"]) == synthetic["written"]


def test_catalog_json_follows_its_schema(synthetic):
    jsonschema = pytest.importorskip("jsonschema")
    site = synthetic["site"]
    schema = json.loads((site / "catalog.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads((site / "catalog.json").read_text()))
    assert schema == catalog_export.schema()


def test_site_is_deterministic(synthetic):
    data = synthetic["site"].parent / "data"
    # Beside the first site: the download links are relative to the releases, so they are the
    # same from the same place.
    again = synthetic["site"].parent / "again"
    assert catalog.main(["--ledger", str(data / "ledger.json"), "--releases",
                         str(data / "releases"), "--output", str(again), "--page_size", "50"]) == 0
    for page in synthetic["site"].rglob("*"):
        if page.is_file():
            assert (again / page.relative_to(synthetic["site"])).read_bytes() == page.read_bytes()


def test_readme_states_the_same_facts_as_the_page(synthetic):
    readme = next(synthetic["site"].rglob("README.md")).read_text()
    page = (next(synthetic["site"].rglob("README.md")).parent / "index.html").read_text()
    for section in ("What is released", "Privacy unit and neighbouring relation",
                    "Mechanisms and noise", "Guarantee", "Budget scopes", "Thresholds", "Caveats",
                    "Releases"):
        assert f"## {section}" in readme and section in page
    assert "campaign:C2024_000" in readme and "campaign:C2024_000" in page


def test_facts_slugs_are_unique_and_safe():
    names = catalog_facts.slugs(["a/b", "a--b", "A/B", "x y", ".."])
    assert len(set(v.lower() for v in names.values())) == 5
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", v) for v in names.values())


def test_testing_site_says_so_on_every_page():
    r = _release("t/2026-01-01", "2026-01-01", 1.0, [])
    dataset = catalog_model.Dataset(dataset_id="t", title="t", kind="k", jobs=("toy",),
                                    releases=(r,))
    facts = catalog_facts.all_facts([dataset])
    pages = catalog_site.site_pages(facts, title="x", page_size=10, testing=True)
    assert all(catalog_site.TESTING_BANNER in text for text in pages.values())


def test_would_refuse_mirrors_the_ledgers_budget_rules():
    inputs = _inputs(_ledger_state())          # scope "total": budget 3, spent 1

    def slot(epsilon, cost):
        return catalog_schedule.Slot(
            dataset_id="d", release_id="r/2026-01-02", start=dt.date(2026, 1, 2),
            due=dt.date(2026, 1, 2), source="test",
            measures=(Measure(name="count", mechanism="discrete_laplace", epsilon=cost),),
            scopes=(Scope(name="total", budget=PrivacyBudget(epsilon=epsilon)),))

    assert catalog_schedule.would_refuse(slot(3.0, 2.0), inputs.ledger) == ""        # 1 + 2 fits 3
    assert "would bring it to 3.5" in catalog_schedule.would_refuse(slot(3.0, 2.5), inputs.ledger)
    assert "would bring it to 2" in catalog_schedule.would_refuse(slot(1.5, 1.0), inputs.ledger)
    assert "larger than the one the ledger recorded" in catalog_schedule.would_refuse(
        slot(4.0, 0.5), inputs.ledger)
