"""The release catalog at scale: three years of daily releases of 50 CentralNotice campaigns.

    python benchmarks/catalog.py [--campaigns 50] [--days 1095] [--keep DIR]
    python benchmarks/catalog.py --campaigns 2 --days 20  # quick

Synthesises what the jobs would leave behind -- a budget ledger, a published ``RELEASE.json``
and a released file per release, an operator report per release (row counters with coverage
counters) -- from a real CentralNotice configuration (its measures, scopes and guarantee scopes
come from :mod:`pipelines.centralnotice.config`, as the job's own markers do). About one slot in
a thousand is missing, one in 1500 failed after its reservation and one in 2000 was released
again as version 2. Then it runs ``python -m pipelines.catalog`` with the site, the operator view
and ``--check`` over the configuration, timing each phase in-process, and the command as a user
runs it (a fresh process): the public site alone (what the goal is about), then the site with the
operator view and ``--check``.

Prints a table (phase, seconds) and the site's sizes, and a last line
``releases=N datasets=D seconds=S cpu_seconds=C largest_page_kb=K pages=P`` (S: the public
site command's wall time, C: its CPU time -- the figure to read when other work shares the cores, as
the load average printed beside it tells; K: the largest HTML page). The goal: S < 30 on this
machine's 2 quiet cores, pages paginated so K stays small.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pipelines import quiet_beam_import  # noqa: E402

quiet_beam_import()  # no `apitools not found` warning as the first line

COUNTRIES = ["DE", "FR", "IT", "ES", "NL", "PL", "SE", "US"]
PROJECTS = ["de.wikipedia", "en.wikipedia", "commons.wikimedia"]


def config_dict(campaigns: int, days: int, start: dt.date) -> dict:
    end = start + dt.timedelta(days=days - 1)
    return {"version": 1, "accountant": "basic", "campaigns": [{
        "campaign_id": f"C{start.year}_{i:03d}", "banners": [f"C{i:03d}_dsk", f"C{i:03d}_mob"],
        "countries": COUNTRIES[: 4 + i % 5], "projects": PROJECTS,
        "start_date": start.isoformat(), "end_date": end.isoformat(), "schedule": "daily",
        "privacy": {
            "impressions": {"k": 100, "epsilon": 0.5, "noise": "discrete_laplace",
                            "neighbouring": "period", "release_threshold": 150.0},
            "clicks": {"noise": "discrete_laplace", "epsilon": 0.5, "neighbouring": "row",
                       "release_threshold": 10.0},
            "budget": {"campaign_total": {"epsilon": days * 1.0 + 50.0},
                       "per_period": {"epsilon": 2.0}}}} for i in range(campaigns)]}


def synthesise(root: Path, *, campaigns: int, days: int, start: dt.date = dt.date(2024, 1, 1)):
    """Write ledger.json, releases/, reports/ and campaigns.json under ``root``; returns
    (config path, releases written)."""
    from accounting.guarantee import compose
    from pipelines.centralnotice.config import parse_config

    data = config_dict(campaigns, days, start)
    root.mkdir(parents=True, exist_ok=True)
    config_path = root / "campaigns.json"
    config_path.write_text(json.dumps(data, indent=1))
    config = parse_config(data, str(config_path))
    ledger_id = hashlib.sha256(b"benchmark-ledger").hexdigest()[:32]
    ledger = {"format": "beam-dp-release/budget-ledger/v2", "ledger_id": ledger_id,
              "accountant": "basic", "scopes": {}, "releases": {}, "latest": {}, "content": {},
              "created_at": "2024-01-01T00:00:00+00:00", "updated_at": None}
    releases, reports = root / "releases", root / "reports"
    written, n = 0, 0
    for campaign in config.campaigns:
        measures = campaign.shared_budget(config.accountant).measures()
        g = compose(measures, config.accountant)
        measures_json = [m.to_json() for m in measures]
        measures_public = [m.to_dict() for m in measures]
        countries = list(campaign.released_countries())
        keyset = len(campaign.banners) * len(countries) * len(campaign.projects)
        for release in campaign.releases():
            n += 1
            rid = release.release_id
            scopes = campaign.scopes(release)
            for s in scopes:
                ledger["scopes"][s.name] = {"epsilon": s.budget.epsilon, "delta": s.budget.delta}
            versions = 2 if n % 2003 == 0 else 1
            if n % 997 == 0:
                continue                      # never ran: a missing slot
            failed = n % 1499 == 0
            for version in range(1, versions + 1):
                vid = rid if version == 1 else f"{rid}#{version}"
                fingerprint = hashlib.sha256(f"{vid}/key".encode()).hexdigest()[:16]
                folder = releases.joinpath(*rid.split("/"), f"v{version}")
                report_folder = reports.joinpath(*rid.split("/"), f"v{version}")
                report_folder.mkdir(parents=True, exist_ok=True)
                record = {"release_id": rid, "version": version, "versioned_id": vid,
                          "measures": measures_json, "scopes": [s.name for s in scopes],
                          "input_digest": "sha256:" + hashlib.sha256(vid.encode()).hexdigest(),
                          "keys": {"release": {"fingerprint": fingerprint,
                                               "uri": f"/keys/{fingerprint}.key"}},
                          "content_key": None, "state": "reserved", "output_path": None,
                          "files": {}, "charged_at": f"{release.dates[0]}T23:00:00+00:00",
                          "publishing_at": None, "committed_at": None,
                          "last_run_at": f"{release.dates[0]}T23:00:00+00:00", "runs": 1,
                          "supersedes": None if version == 1 else rid, "takeovers": [],
                          "metadata": {"job": "centralnotice"}}
                ledger["releases"][vid] = record
                ledger["latest"][rid] = vid
                counters = {"impressions.read": 4000 + n % 97, "clicks.read": 900 + n % 13,
                            "impressions.dropped.negative": n % 3,
                            **{f"impressions.coverage.country.{c}": 100 + (n % 7)
                               for c in countries if not (c == "DE" and n % 1095 > 1000)}}
                if failed:
                    (report_folder / "failure.json").write_text(json.dumps(
                        {"release_id": rid, "versioned_id": vid, "counters": counters,
                         "status": "failed: nothing published", "detail": "too many dropped rows"}))
                    continue
                body = os.urandom(400 + n % 300)
                folder.mkdir(parents=True)
                (folder / "centralnotice.parquet").write_bytes(body)
                sha = "sha256:" + hashlib.sha256(body).hexdigest()
                released = keyset - n % 5
                marker = {
                    "format": "beam-dp-release/release/v1", "job": "centralnotice",
                    "release_id": rid, "version": version, "versioned_id": vid, "testing": False,
                    "status": "released",
                    "guarantee": {"accountant": config.accountant, "epsilon": g.epsilon,
                                  "delta": g.delta, "rho_of_zcdp_measures": None,
                                  "covers": "one release: impressions and clicks of the release's "
                                            "keys, composed",
                                  "ledger_scopes": [{"name": s.name, "epsilon": s.budget.epsilon,
                                                     "delta": s.budget.delta,
                                                     "description": s.description}
                                                    for s in scopes]},
                    "measures": measures_public,
                    "parameters": {"campaign_id": campaign.campaign_id,
                                   "dates": [d.isoformat() for d in release.dates],
                                   "impressions": {"k": 100, "release_threshold": 150.0,
                                                   "neighbouring": "period"},
                                   "clicks": {"neighbouring": "row", "release_threshold": 10.0},
                                   "keyset": {"banners": list(campaign.banners),
                                              "countries": countries,
                                              "projects": list(campaign.projects),
                                              "size": keyset}},
                    "outputs": {"centralnotice.parquet": {
                        "sha256": sha, "rows": released, "sorted_by": list(
                            ["campaign_id", "banner_id", "country", "project", "date"]),
                        "noisy_columns": ["impressions", "clicks"],
                        "columns": {"campaign_id": "string", "banner_id": "string",
                                    "country": "string", "project": "string",
                                    "date": "date32[day]", "impressions": "int64",
                                    "clicks": "int64"},
                        "description": "one row per released key; null = suppressed by the "
                                       "release threshold (not zero)"}},
                    "summary": {"keys": {"keyset": keyset, "released": released,
                                         "not_released": keyset - released},
                                "guarantee_scopes": campaign.guarantee_scopes(release)},
                    "key_fingerprints": {"release": fingerprint}, "ledger_id": ledger_id,
                    "input_binding": "hmac-sha256:" + "0" * 64}
                (folder / "RELEASE.json").write_text(json.dumps(marker, indent=1, sort_keys=True))
                record.update(state="committed", output_path=str(folder),
                              files={"centralnotice.parquet": sha},
                              committed_at=f"{release.dates[0]}T23:05:00+00:00",
                              publishing_at=f"{release.dates[0]}T23:04:00+00:00")
                (report_folder / "report.json").write_text(json.dumps(
                    {"status": "released", "counters": counters,
                     "dropped_rows": {"impressions": {"eligible": 4000, "dropped": n % 3,
                                                      "share": (n % 3) / 4000}}}))
                written += 1
    (root / "ledger.json").write_text(json.dumps(ledger, sort_keys=True))
    releases.mkdir(exist_ok=True)
    # The output root's binding lives beside the ledger (pipelines.release.publish), as written
    # by a release; the catalog reads only the releases and the ledger.
    bindings = root / "ledger.json.bindings"
    bindings.mkdir(exist_ok=True)
    (bindings / "synthetic.json").write_text(json.dumps(
        {"ledger_id": ledger_id, "ledger": str(root / "ledger.json"), "output": str(releases)}))
    return config_path, written


def phases(root: Path, config: Path, as_of: dt.date) -> list[tuple[str, float]]:
    """In-process timings of each phase of one build (the command does the same steps)."""
    from pipelines.catalog import coverage as catalog_coverage
    from pipelines.catalog import export as catalog_export
    from pipelines.catalog import facts as catalog_facts
    from pipelines.catalog import model as catalog_model
    from pipelines.catalog import operator as catalog_operator
    from pipelines.catalog import schedule as catalog_schedule
    from pipelines.catalog import site as catalog_site

    import gc

    gc.disable()      # as the command does (pipelines/catalog/cli.py, build)
    out, t, c = [], time.perf_counter(), time.process_time()

    def lap(name):
        nonlocal t, c
        now, cpu = time.perf_counter(), time.process_time()
        out.append((name, now - t, cpu - c))
        t, c = now, cpu

    ledger = catalog_model.read_ledger(str(root / "ledger.json"))
    lap("read ledger")
    inputs = catalog_model.read_catalog(str(root / "releases"), ledger,
                                        reports_root=str(root / "reports"))
    lap("read markers + reports")
    all_facts = catalog_facts.all_facts(inputs.datasets)
    lap("public facts (budgets)")
    pages = catalog_site.site_pages(all_facts, title="bench", page_size=100)
    lap("render HTML")
    catalog_export.export_files(all_facts, title="bench", testing=False)
    lap("catalog.json + READMEs")
    slots = catalog_schedule.slots_from([str(config)], [], as_of, inputs)
    health = catalog_schedule.assess(slots, inputs, as_of, 1)
    lap("schedule health")
    alarms = catalog_coverage.alarms(inputs.datasets, inputs.reports, 3)
    catalog_operator.operator_files(inputs, health, alarms, page_size=100, as_of=as_of, grace=1)
    lap("operator view")
    del pages
    gc.enable()
    return out


def _command(argv) -> tuple:
    """(completed process, wall seconds, CPU seconds) of one fresh command."""
    import resource

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--campaigns", type=int, default=50)
    parser.add_argument("--days", type=int, default=1095)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the data and site here (and re-use data found there)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="catalog-bench-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        if args.keep is not None and (work / "data" / "ledger.json").exists():
            config = work / "data" / "campaigns.json"
            written = sum(1 for _ in (work / "data" / "releases").rglob("RELEASE.json"))
            print(f"re-using the {written} releases under {work / 'data'}", flush=True)
        else:
            config, written = synthesise(work / "data", campaigns=args.campaigns, days=args.days)
            print(f"synthesised {written} releases of {args.campaigns} campaigns in "
                  f"{time.perf_counter() - t0:.0f} s (not timed below)", flush=True)
        as_of = dt.date(2024, 1, 1) + dt.timedelta(days=args.days + 3)
        timings = phases(work / "data", config, as_of)
        base = [sys.executable, "-m", "pipelines.catalog", "--ledger",
                str(work / "data" / "ledger.json"), "--releases", str(work / "data" / "releases")]
        site_only = _command(base + ["--output", str(work / "site")])
        everything = _command(base + ["--config", str(config), "--output", str(work / "site"),
                                      "--operator", str(work / "operator"), "--check",
                                      "--as_of", as_of.isoformat()])
        for done in (site_only[0], everything[0]):
            if done.returncode not in (0, 1):
                print(done.stderr, file=sys.stderr)
                return done.returncode
        done, seconds, cpu = site_only
        load = os.getloadavg()[0]
        overdue = sum(1 for line in everything[0].stdout.splitlines()
                      if line.startswith("OVERDUE"))
        pages = [p for p in (work / "site").rglob("*.html")]
        sizes = sorted((p.stat().st_size, p) for p in pages)
        largest, largest_path = sizes[-1]
        print(f"{'phase (in-process)':<30}{'seconds':>9}{'CPU s':>9}")
        for name, value, cpu_s in timings:
            print(f"{name:<30}{value:>9.2f}{cpu_s:>9.2f}")
        print(f"{'in-process total':<30}{sum(t[1] for t in timings):>9.2f}"
              f"{sum(t[2] for t in timings):>9.2f}")
        print(f"{'command: public site':<30}{seconds:>9.2f}{cpu:>9.2f}   (a fresh process)")
        print(f"{'command: + operator + check':<30}{everything[1]:>9.2f}{everything[2]:>9.2f}   "
              f"exit {everything[0].returncode}, {overdue} overdue slots named")
        print(f"load average {load:.1f} on {os.cpu_count()} cores: with other work on the cores, "
              "read the CPU column")
        total = sum(s for s, _ in sizes)
        json_size = (work / "site" / "catalog.json").stat().st_size
        print(f"site: {len(pages)} HTML pages, {total / 1e6:.1f} MB; largest "
              f"{largest / 1024:.0f} kB ({largest_path.relative_to(work / 'site')}); median "
              f"{sizes[len(sizes) // 2][0] / 1024:.0f} kB; catalog.json {json_size / 1e6:.1f} MB")
        print(f"releases={written} datasets={args.campaigns} seconds={seconds:.1f} "
              f"cpu_seconds={cpu:.1f} largest_page_kb={largest / 1024:.0f} pages={len(pages)}")
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
