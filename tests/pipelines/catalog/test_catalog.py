"""The release catalog end to end, on real releases a job made on the release layer
(tests/catalog_kit.py): the public site and what it says, ``--check`` naming a missing day, a
failed day and an over-budget day (and the over-budget inference agreeing with the ledger's own
refusal), the public / operator split as a privacy property, bad inputs refused with exit 2."""
from __future__ import annotations

import json
import os
import re

import pytest
from catalog_kit import files_of, impressions, make_releases, request

from accounting.ledger import BudgetLedger
from pipelines.catalog import cli as catalog
from pipelines.catalog import model as catalog_model


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return make_releases(tmp_path_factory.mktemp("catalog"))


@pytest.fixture(scope="module")
def built(made, tmp_path_factory):
    out = tmp_path_factory.mktemp("built")
    site, operator = str(out / "site"), str(out / "operator")
    code = catalog.main(made.args("--output", site, "--operator", operator,
                                  "--as_of", "2026-11-06", "--coverage_window", "1"))
    assert code == 0
    return {"site": site, "operator": operator, "files": files_of(site),
            "operator_files": files_of(operator)}


def test_the_site_lists_every_published_release_with_its_guarantee_and_files(made, built):
    files = built["files"]
    assert {"index.html", "catalog.json", "catalog.schema.json",
            "datasets/centralnotice--C1/index.html", "datasets/centralnotice--C1/README.md",
            "datasets/centralnotice--C2/index.html"} <= set(files)
    c1 = files["datasets/centralnotice--C1/index.html"]
    for rid in ("C1/2026-11-01", "C1/2026-11-02"):
        assert f'<span class="release-id">{rid}</span>' in c1
    assert c1.count('<span class="version">v2</span>') == 1
    assert "published again as a new version" in c1         # the v2 caveat
    # Every file of every release is listed with its size and the marker's digest.
    for marker in _markers(made.releases):
        for name, out in marker["outputs"].items():
            size = os.path.getsize(os.path.join(made.releases, *marker["release_id"].split("/"),
                                                f"v{marker['version']}", name))
            page = files[f"datasets/centralnotice--{marker['parameters']['campaign_id']}/index.html"]
            assert out["sha256"] in page and f"{size:,} bytes" in page
    doc = json.loads(files["catalog.json"])
    releases = {r["versioned_id"]: r for d in doc["datasets"] for r in d["releases"]}
    assert set(releases) == {"C1/2026-11-01", "C1/2026-11-01#2", "C1/2026-11-02",
                             "C2/2026-11-01"}
    assert all(r["guarantee"]["epsilon"] == pytest.approx(2.0) for r in releases.values())
    # Charts: one per scope of the dataset, with the campaign's budget line.
    assert re.search(r'<svg class="chart"[^>]*data-scope="campaign:C1"', c1)
    assert re.search(r'<svg class="chart"[^>]*data-scope="period:C1:\*"', c1)


def _markers(root):
    for folder, _, names in os.walk(root):
        if "RELEASE.json" in names:
            with open(os.path.join(folder, "RELEASE.json")) as handle:
                yield json.load(handle)


def test_public_spend_counts_published_releases_only_and_matches_the_ledger_when_all_are(made, built):
    doc = json.loads(built["files"]["catalog.json"])
    scopes = {s["name"]: s for d in doc["datasets"] for s in d["scopes"]}
    ledger = BudgetLedger(made.ledger, made.keys)
    # C1: every charge was published: the public figure is the ledger's.
    assert scopes["campaign:C1"]["spent_epsilon"] == pytest.approx(ledger.spent("campaign:C1").epsilon)
    assert scopes["campaign:C1"]["spent_epsilon"] == pytest.approx(6.0)
    assert scopes["campaign:C1"]["remaining_epsilon"] == pytest.approx(0.0)
    # C2: the failed day's reservation is charged in the ledger but is not public.
    assert ledger.spent("campaign:C2").epsilon == pytest.approx(4.0)
    assert scopes["campaign:C2"]["spent_epsilon"] == pytest.approx(2.0)
    operator = json.loads(built["operator_files"]["operator.json"])
    ledger_c2 = next(s for s in operator["scopes"] if s["name"] == "campaign:C2")
    assert ledger_c2["spent"]["epsilon"] == pytest.approx(4.0)
    assert ledger_c2["published_spent"] == pytest.approx(2.0)


def test_check_names_the_missing_failed_and_over_budget_days(made, capsys, tmp_path):
    code = catalog.main(made.args("--check", "--as_of", "2026-11-06", "--grace", "1"))
    out = capsys.readouterr().out
    assert code == 1
    overdue = [line for line in out.splitlines() if line.startswith("OVERDUE")]
    assert len(overdue) == 3
    assert any("C2/2026-11-03" in line and ": missing" in line for line in overdue)
    assert any("C2/2026-11-02" in line and ": failed" in line for line in overdue)
    assert any("C1/2026-11-03" in line and ": over budget" in line and "campaign:C1" in line
               for line in overdue)
    # Before the days are due (as of day 2, grace 1: only day 1 is due, and it is published).
    assert catalog.main(made.args("--check", "--as_of", "2026-11-02", "--grace", "1")) == 0
    # Grace: on day 3 with no grace, day 2 is overdue (C2 failed), day 3 is not yet.
    assert catalog.main(made.args("--check", "--as_of", "2026-11-03", "--grace", "0")) == 1
    out = capsys.readouterr().out
    assert "C2/2026-11-02" in out and "C2/2026-11-03" not in out.split("OVERDUE", 1)[1]


def test_a_schedule_s_first_check_before_any_charge(made, capsys, tmp_path):
    """A scheduled run's check follows its releases; before the first charge there is no ledger
    yet. Nothing overdue: exit 0 saying so; a slot due and never run: exit 1 (late), as with a
    ledger; a ledger missing next to published releases: refused (exit 2), never read as a
    first run, nor with --output (a public site of no ledger is not a first run's business)."""
    ledger, releases = str(tmp_path / "private" / "ledger.json"), str(tmp_path / "releases")
    first = ["--ledger", ledger, "--releases", releases, "--config", made.config, "--check"]
    assert catalog.main(first + ["--as_of", "2026-11-02", "--grace", "1"]) == 0
    out = capsys.readouterr().out
    assert "no ledger yet at" in out and "pending" in out and "OVERDUE" not in out
    os.makedirs(os.path.join(releases, "testing-not-a-release", "C1"))   # testing output: apart
    open(os.path.join(releases, "testing-not-a-release", "C1", "RELEASE.json"), "w").write("{}")
    assert catalog.main(first + ["--as_of", "2026-11-03", "--grace", "1"]) == 1
    out = capsys.readouterr().out
    overdue = [line for line in out.splitlines() if line.startswith("OVERDUE")]
    assert sorted(line.split()[1] for line in overdue) == ["C1/2026-11-01", "C2/2026-11-01"]
    assert all(": missing" in line for line in overdue)
    # Releases without their ledger: the missing ledger is refused, naming it.
    existing = ["--ledger", ledger, "--releases", made.releases, "--config", made.config]
    assert catalog.main(existing + ["--check", "--as_of", "2026-11-02"]) == 2
    err = capsys.readouterr().err
    assert f"ledger {ledger} does not exist" in err and "release markers" in err
    assert catalog.main(first + ["--output", str(tmp_path / "site")]) == 2
    assert "does not exist" in capsys.readouterr().err and not os.path.exists(tmp_path / "site")


def test_the_over_budget_inference_is_what_the_ledger_refuses(made, tmp_path):
    from pipelines.centralnotice.job import run
    from pipelines.release import ReleaseRefused
    from catalog_kit import clicks

    ledger_before = open(made.ledger, "rb").read()
    imp = impressions(str(tmp_path), "c1d3.csv", "C1", "2026-11-03")
    with pytest.raises(ReleaseRefused, match="campaign:C1.*over its budget"):
        run(request(made, "C1/2026-11-03", imp, clicks(str(tmp_path))))
    assert open(made.ledger, "rb").read() == ledger_before


def test_operator_view_holds_failures_counters_fingerprints_and_coverage_alarms(made, built):
    op = json.loads(built["operator_files"]["operator.json"])
    assert [u["versioned_id"] for u in op["unpublished"]] == ["C2/2026-11-02"]
    assert "a Parquet page failed its checksum" in op["unpublished"][0]["detail"]
    rows = {r["versioned_id"]: r for rs in op["releases"].values() for r in rs}
    assert rows["C1/2026-11-02"]["counters"]["impressions.read"] == 4
    ledger = catalog_model.read_ledger(made.ledger)
    assert rows["C1/2026-11-01"]["key_fingerprints"] == \
        ledger.record("C1/2026-11-01").key_fingerprints
    # DE had rows on day 1 and none on day 2 (window 1): an alarm; FR none.
    assert [(a["dataset"], a["column"], a["value"]) for a in op["coverage_alarms"]] == \
        [("centralnotice/C1", "country", "DE")]
    html = built["operator_files"]["index.html"]
    assert "country" in html and "C2/2026-11-02" in html


# --------------------------------------------------------------------------- privacy split

def operator_only_facts(made) -> dict[str, str]:
    """Facts only the operator may see, each a string that must never appear in the public
    site: {fact: where it comes from}."""
    from pipelines.catalog import schedule as catalog_schedule

    # The configured schedule is public: the site lists every due slot that is not published
    # as a gap, whether a reservation for it exists or not, so a scheduled release id tells
    # nothing of a reservation. Any other unpublished reservation's id is operator-only.
    scheduled = {slot.release_id for slot in catalog_schedule.centralnotice_slots(
        catalog_schedule.load_config(made.config)[1])}
    facts = {}
    state = json.load(open(made.ledger))
    for vid, record in state["releases"].items():
        for ref in record["keys"].values():
            facts[ref["fingerprint"]] = f"key fingerprint of {vid}"
        facts[record["input_digest"].split(":", 1)[1]] = f"input digest of {vid}"
        if record["state"] != "committed":
            if vid not in scheduled:
                facts[vid] = "an unpublished reservation"
            for scope in record["scopes"]:
                if scope.startswith("period:"):
                    facts[scope] = "a scope charged only by an unpublished reservation"
    facts[state["ledger_id"]] = "the ledger id"
    for folder, _, names in os.walk(made.reports):
        for name in (n for n in names if n.endswith(".json")):
            body = json.load(open(os.path.join(folder, name)))
            counters = body.get("counters", {})
            if counters and all(isinstance(v, dict) for v in counters.values()):
                counters = {k: v for values in counters.values() for k, v in values.items()}
            for counter in counters:
                facts[counter] = "a row counter"
            if name == "failure.json":
                facts[body["detail"]] = "a failure"
    for path in (made.ledger, made.keys, made.reports):
        facts[path] = "a private location"
    facts["hmac-sha256:"] = "the marker's keyed input binding"
    facts["coverage"] = "coverage alarms"
    return facts


def leaks(site_files: dict, facts: dict) -> list[str]:
    return sorted(f"{path}: {why} ({fact[:40]})" for path, text in site_files.items()
                  for fact, why in facts.items() if fact in text)


def test_no_operator_only_fact_reaches_the_public_site(made, built):
    facts = operator_only_facts(made)
    assert len(facts) > 20
    assert leaks(built["files"], facts) == []
    # ... and the operator view does hold them (the check is not vacuous).
    operator_text = "\n".join(built["operator_files"].values())
    held = [f for f, why in facts.items() if f in operator_text]
    assert any(why.startswith("key fingerprint") for f, why in facts.items() if f in held)
    assert "impressions.read" in held and "C2/2026-11-02" in operator_text


def test_the_split_check_catches_a_site_that_leaks(made, tmp_path, monkeypatch):
    """A mutant site that shows the ledger's key fingerprints (as a careless "provenance"
    footer might): the privacy check must fail on it."""
    from pipelines.catalog import site as catalog_site

    ledger = catalog_model.read_ledger(made.ledger)
    fingerprints = " ".join(v for r in ledger.records for v in r.key_fingerprints.values())
    monkeypatch.setattr(catalog_site, "_footer", lambda: f"keys {fingerprints}")
    site = str(tmp_path / "site")
    assert catalog.main(made.args("--output", site)) == 0
    found = leaks(files_of(site), operator_only_facts(made))
    assert found and all("key fingerprint" in f for f in found)


def test_operator_view_is_never_inside_the_site(made, tmp_path, capsys):
    site = str(tmp_path / "site")
    assert catalog.main(made.args("--output", site, "--operator", os.path.join(site, "op"))) == 2
    assert "must be apart" in capsys.readouterr().err
    assert not os.path.exists(site)
    assert catalog.main(made.args("--operator", os.path.join(made.releases, "op"))) == 2
    assert "published output root" in capsys.readouterr().err
    assert catalog.main(made.args("--output", made.root)) == 2     # it holds the ledger
    assert os.path.exists(made.ledger)


# --------------------------------------------------------------------------- bad inputs

SECRET_CONTENT = "CONTENT-THAT-MUST-NOT-BE-ECHOED"


@pytest.mark.parametrize("what", ["ledger_not_json", "ledger_format", "marker_not_json",
                                  "marker_format", "config_not_json", "config_invalid"])
def test_bad_inputs_exit_2_naming_the_file_never_its_content(made, tmp_path, capsys, what):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(made.root, copy)
    ledger, releases = str(copy / "private" / "ledger.json"), str(copy / "releases")
    config = str(copy / "inputs" / "campaigns.json")
    marker = os.path.join(releases, "C1", "2026-11-02", "v1", "RELEASE.json")
    target = {"ledger_not_json": ledger, "ledger_format": ledger, "marker_not_json": marker,
              "marker_format": marker, "config_not_json": config, "config_invalid": config}[what]
    if what.endswith("not_json"):
        body = SECRET_CONTENT + " {"
    elif what == "config_invalid":
        data = json.load(open(config))
        data["campaigns"][0]["countries"] = [SECRET_CONTENT]
        body = json.dumps(data)
    else:
        body = json.dumps({"format": SECRET_CONTENT})
    open(target, "w").write(body)
    code = catalog.main(["--ledger", ledger, "--releases", releases, "--config", config,
                         "--output", str(tmp_path / "site")])
    err = capsys.readouterr().err
    assert code == 2
    assert target in err and SECRET_CONTENT not in err
    assert not os.path.exists(tmp_path / "site")


def test_a_hand_edited_ledger_is_refused_naming_the_record(made, tmp_path, capsys):
    """The catalog holds no key store, but verifies the ledger's record chain: a lowered spend
    is refused (exit 2) naming the record, and no page is built from it."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(made.root, copy)
    ledger = copy / "private" / "ledger.json"
    state = json.loads(ledger.read_text())
    record = min(state["releases"].values(), key=lambda r: r["seq"])
    record["measures"][0]["epsilon"] /= 10
    ledger.write_text(json.dumps(state))
    code = catalog.main(["--ledger", str(ledger), "--releases", str(copy / "releases"),
                         "--output", str(tmp_path / "site")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"record 1 (release {record['versioned_id']!r}) was edited" in err
    assert not os.path.exists(tmp_path / "site")


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "unrecognized arguments"),
    (["--as_of", "2026-13-01", "--check"], "--as_of"),
    (["--grace", "-1", "--check"], "--grace"),
    # issue 40: these were a traceback with exit 1, the code of "releases are late"
    (["--as_of", "0001-01-01", "--check"], "--as-of: must be a day from 1970-01-01"),
    (["--as_of", "9999-12-31", "--check"], "--as-of: must be a day from 1970-01-01"),
    (["--grace", "10000000000", "--check"], "--grace: must be at most 36525 days"),
    (["--grace", "9" * 5000, "--check"], "--grace"),
    (["--cadence", "summary_reports/x=daily:2026-11-01", "--check"], "{date}"),
    ([], "nothing to do"),
])
def test_bad_flags_exit_2(made, capsys, argv, message):
    assert catalog.main(made.args(*argv)) == 2
    assert message in capsys.readouterr().err


def test_a_marker_of_another_ledger_stays_out_of_the_public_site(made, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(made.root, copy)
    path = copy / "releases" / "C2" / "2026-11-01" / "v1" / "RELEASE.json"
    marker = json.loads(path.read_text())
    marker["ledger_id"] = "0" * 32
    path.write_text(json.dumps(marker))
    site, operator = tmp_path / "site", tmp_path / "operator"
    assert catalog.main(["--ledger", str(copy / "private" / "ledger.json"), "--releases",
                         str(copy / "releases"), "--output", str(site), "--operator",
                         str(operator)]) == 0
    assert "left out of the public site" in capsys.readouterr().out
    doc = json.loads((site / "catalog.json").read_text())
    assert "C2/2026-11-01" not in {r["versioned_id"] for d in doc["datasets"]
                                   for r in d["releases"]}
    op = json.loads((operator / "operator.json").read_text())
    assert op["excluded_markers"][0]["reason"] == "charged by another ledger"


def test_testing_output_in_its_folder_is_not_called_a_stray_testing_marker(made, tmp_path, capsys):
    """Testing output under testing-not-a-release/ lies apart by design: neither listed nor
    "left out" (issue 42); a testing marker anywhere else is left out, saying so."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(made.root, copy)
    source = copy / "releases" / "C2" / "2026-11-01" / "v1"
    for target in (copy / "releases" / "testing-not-a-release" / "C2" / "2026-11-01",
                   copy / "releases" / "T9" / "2026-11-01" / "v1"):
        shutil.copytree(source, target)
        marker = json.loads((target / "RELEASE.json").read_text())
        (target / "RELEASE.json").write_text(json.dumps({**marker, "testing": True}))
    site, operator = tmp_path / "site", tmp_path / "operator"
    assert catalog.main(["--ledger", str(copy / "private" / "ledger.json"), "--releases",
                         str(copy / "releases"), "--output", str(site), "--operator",
                         str(operator)]) == 0
    assert "1 marker(s) left out of the public site" in capsys.readouterr().out
    op = json.loads((operator / "operator.json").read_text())
    assert [(x["path"].split("/releases/")[1], x["reason"]) for x in op["excluded_markers"]] == [
        ("T9/2026-11-01/v1/RELEASE.json", "a testing marker outside testing-not-a-release/")]


def test_rebuilding_replaces_the_site_whole_and_refuses_a_foreign_folder(made, tmp_path, capsys):
    site = tmp_path / "site"
    assert catalog.main(made.args("--output", str(site))) == 0
    first = files_of(str(site))
    (site / "stale.html").write_text("old")
    assert catalog.main(made.args("--output", str(site))) == 0
    assert files_of(str(site)) == first           # deterministic, and nothing stale survives
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert catalog.main(made.args("--output", str(other))) == 2
    assert (other / "notes.txt").read_text() == "mine"
    assert "not a folder this command wrote" in capsys.readouterr().err


def _run_make_recipe(target: str, variable: str, out: str):
    """A Makefile recipe's Python commands, run as written (the project's Python for
    $(BIN)/python, ``out`` for ``variable``); the last one's result."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    text = open(os.path.join(root, "Makefile")).read()
    recipe = text.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    commands = [line.strip() for line in recipe if "$(BIN)/python" in line]
    assert any("pipelines.catalog" in c for c in commands)
    env = dict(os.environ, PYTHONPATH=root)
    for command in commands:
        argv = command.replace("$(BIN)/python", sys.executable).replace(variable, out).split()
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_make_smoke_makes_a_release_and_its_catalog(tmp_path):
    out = str(tmp_path / "smoke")
    done = _run_make_recipe("smoke", "$(SMOKE)", out)
    assert f"open file://{out}/catalog/index.html" in done.stdout
    assert json.loads(files_of(os.path.join(out, "catalog"))["catalog.json"])["datasets"]


def test_make_demo_builds_the_catalog_of_its_releases(tmp_path):
    """The Makefile's demo recipe, run as written (the project's Python for $(BIN)/python)."""
    out = str(tmp_path / "demo")
    done = _run_make_recipe("demo", "$(OUT)", out)
    assert f"open file://{out}/catalog/index.html" in done.stdout
    site = files_of(os.path.join(out, "catalog"))
    doc = json.loads(site["catalog.json"])
    assert len(doc["datasets"]) == 3 and all(len(d["releases"]) == 1 for d in doc["datasets"])
    assert os.path.exists(os.path.join(out, "catalog-operator", "operator.json"))


def test_the_catalog_cross_checks_markers_with_the_ledger_and_says_what_it_could_not(made, tmp_path,
                                                                                    capsys):
    """Each marker carries the ledger write that charged it: a ledger older than its releases (an
    older copy put back) is refused, naming the release; what needs the key store (the head's MAC,
    the witness of the latest write) is said to be unverified, never vouched for."""
    import shutil

    assert catalog.main(made.args("--output", str(tmp_path / "site0"))) == 0
    out = capsys.readouterr().out
    assert "structure and record chain verified" in out and "NOT verified: the head's MAC" in out
    copy = tmp_path / "copy"
    shutil.copytree(made.root, copy)
    ledger_path = copy / "private" / "ledger.json"
    ledger = json.loads(ledger_path.read_text())
    path = copy / "releases" / "C2" / "2026-11-01" / "v1" / "RELEASE.json"
    marker = json.loads(path.read_text())
    assert marker["ledger_charge"] == ledger["releases"]["C2/2026-11-01"]["charged_under"]["charge"]
    args = ["--ledger", str(ledger_path), "--releases", str(copy / "releases"),
            "--output", str(tmp_path / "site")]
    marker["ledger_charge"] = "0" * 32  # charged again (another charge of the same release)
    path.write_text(json.dumps(marker))
    assert catalog.main(args) == 2
    assert "under another charge" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "site")
    # An older copy of the ledger, before C2/2026-11-01 was charged (its chain valid): refused.
    from accounting.ledger import chain

    marker["ledger_charge"] = ledger["releases"]["C2/2026-11-01"]["charged_under"]["charge"]
    path.write_text(json.dumps(marker))
    older = dict(ledger, releases={v: r for v, r in ledger["releases"].items()
                                   if r["seq"] < ledger["releases"]["C2/2026-11-01"]["seq"]})
    older["latest"] = {k: v for k, v in ledger["latest"].items() if v in older["releases"]}
    older["content"] = {}
    chain.seal(older, b"k" * 32, ledger["chain"]["key"])  # keyless readers check digests only
    ledger_path.write_text(json.dumps(older))
    code = catalog.main(args)
    err = capsys.readouterr().err
    assert code == 2 and "does not hold release C2/2026-11-01" in err and "rolled back?" in err
