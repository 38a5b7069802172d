"""Real releases for the catalog tests: CentralNotice runs on the release layer (ledger, keys,
reports), with a day released twice, a failed run, an over-budget day and a missing day.

``make_releases(folder)`` makes, with the job's Python API (:func:`pipelines.centralnotice.run`):

* campaign C1 (daily, 2026-11-01..03; each release costs epsilon 2, the campaign total is 6):
  day 1 (v1), day 1 again on changed input (``--new_release``: v2), day 2 (with rows of FR
  only: DE rows stop, the coverage alarm's case). Day 3 then cannot fit the campaign total: a
  release of it is refused for its budget.
* campaign C2 (daily, 2026-11-01..03): day 1 (v1); day 2 fails after its reservation (its
  impressions are a Parquet file with a corrupt data page: the page fails its checksum in the
  computation, exit 3); day 3 never runs.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from release_testkit import (CN_BANNERS, CN_CLK_HEADER, CN_IMP_HEADER, CN_PROJECTS, cn_campaign,
                             write_csv, write_json)

DAYS = ("2026-11-01", "2026-11-02", "2026-11-03")
COUNTRIES = ("DE", "FR")


@dataclass(frozen=True, kw_only=True)
class Made:
    root: str
    config: str
    ledger: str
    keys: str
    releases: str
    reports: str

    def args(self, *extra) -> list:
        return ["--ledger", self.ledger, "--releases", self.releases, "--config", self.config,
                *extra]


def config_dict() -> dict:
    budget = {"campaign_total": {"epsilon": 6.0}, "per_period": {"epsilon": 4.0}}
    return {"version": 1, "protected_countries": ["RU"], "campaigns": [
        cn_campaign(campaign_id="C1", end=DAYS[-1], budget=budget),
        cn_campaign(campaign_id="C2", end=DAYS[-1],
                    budget={"campaign_total": {"epsilon": 8.0}, "per_period": {"epsilon": 4.0}})]}


def impressions(folder, name, campaign, day, *, countries=COUNTRIES, value=100, extra=0) -> str:
    rows = [(campaign, b, c, p, day, value + 10 * i) for i, (b, c, p) in enumerate(
        itertools.product(CN_BANNERS, countries, CN_PROJECTS))]
    if extra:
        rows.append((campaign, CN_BANNERS[0], countries[0], CN_PROJECTS[0], day, extra))
    return write_csv(os.path.join(folder, name), CN_IMP_HEADER, rows)


def corrupt_impressions(folder, name, campaign, day) -> str:
    """Impressions as Parquet with page checksums and one bit of the impressions' data page
    flipped: its footer reads (preflight passes); the computation fails on the page's checksum,
    after the reservation. (Faulty rows would not do: the row rules only alert the operator.)"""
    import pyarrow as pa

    from release_testkit import flip_value_byte
    from transforms import parquet_files

    keys = list(itertools.product(CN_BANNERS, ("DE",), CN_PROJECTS))
    table = pa.table({"campaign_id": [campaign] * len(keys), "banner_id": [b for b, _, _ in keys],
                      "country": [c for _, c, _ in keys], "project": [p for _, _, p in keys],
                      "date": pa.array([day] * len(keys)).cast(pa.date32()),
                      "impressions": pa.array([100 + 10 * i for i in range(len(keys))],
                                              pa.int64())})
    path = os.path.join(folder, name)
    parquet_files.write_table(table, path, compression="none", use_dictionary=False)
    flip_value_byte(path, "impressions")
    return path


def clicks(folder) -> str:
    rows = [(c, b, country, p, d, f"u{i}") for i, (c, b, country, p, d) in enumerate(
        itertools.product(("C1", "C2"), CN_BANNERS, COUNTRIES, CN_PROJECTS, DAYS))]
    return write_csv(os.path.join(folder, "clicks.csv"), CN_CLK_HEADER, rows)


def request(made: Made, release: str, imp: str, clk: str, **options):
    from pipelines.centralnotice.job import CentralNoticeRequest
    from pipelines.release import ReleaseOptions

    return CentralNoticeRequest(
        config=made.config, impressions=(imp,), clicks=(clk,), release=release, num_shards=2,
        options=ReleaseOptions(output=made.releases, ledger=made.ledger, key_store=made.keys,
                               **options))


def make_releases(folder) -> Made:
    from pipelines.centralnotice.job import run
    from pipelines.release import ReleaseFailed

    folder = str(folder)
    inputs = os.path.join(folder, "inputs")
    os.makedirs(inputs, exist_ok=True)
    private = os.path.join(folder, "private")
    made = Made(root=folder, config=write_json(os.path.join(inputs, "campaigns.json"),
                                               config_dict()),
                ledger=os.path.join(private, "ledger.json"), keys=os.path.join(private, "keys"),
                releases=os.path.join(folder, "releases"), reports=os.path.join(private, "reports"))
    clk = clicks(inputs)
    run(request(made, "C1/2026-11-01", impressions(inputs, "c1d1.csv", "C1", DAYS[0]), clk))
    run(request(made, "C1/2026-11-01",
                impressions(inputs, "c1d1b.csv", "C1", DAYS[0], extra=7), clk, new_release=True))
    run(request(made, "C1/2026-11-02",
                impressions(inputs, "c1d2.csv", "C1", DAYS[1], countries=("FR",)), clk))
    run(request(made, "C2/2026-11-01", impressions(inputs, "c2d1.csv", "C2", DAYS[0]), clk))
    bad = corrupt_impressions(inputs, "c2d2.parquet", "C2", DAYS[1])
    try:
        run(request(made, "C2/2026-11-02", bad, clk))
    except ReleaseFailed:
        pass
    else:
        raise AssertionError("the faulty day should have failed after its reservation")
    return made


def files_of(folder) -> dict:
    """{relative path: text} of every file under ``folder``."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, encoding="utf-8", errors="replace") as handle:
                out[os.path.relpath(path, folder)] = handle.read()
    return out

