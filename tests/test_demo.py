"""`make demo` (``python -m pipelines.centralnotice --demo``) shows its numbers and reproduces.

The demo ends with the first rows of a released table, nulls explained, and where everything was
written; its ledger and keys stay beside the releases, so running it again reproduces the same
bytes and spends nothing.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os

from pipelines.centralnotice import job as centralnotice


def _digests(out) -> dict:
    return {os.path.relpath(p, out): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in glob.glob(os.path.join(out, "releases", "*", "*", "v*", "*"))}


def _charges(out) -> tuple:
    releases = json.load(open(os.path.join(out, "ledger.json")))["releases"]
    return ({name: (r["charged_at"], r["files"]) for name, r in releases.items()},
            sorted(os.listdir(os.path.join(out, "keys"))))


def test_demo_prints_a_released_table_and_where_things_are_and_a_rerun_reproduces(tmp_path, capsys):
    out = str(tmp_path / "demo")
    assert centralnotice.main(["--demo", "--output", out]) == 0
    first = capsys.readouterr().out
    summary = first[first.index("The first "):]
    shown = summary.split("\n")[0].split(" of ")[-1].rstrip(":")
    assert shown.startswith(os.path.join(out, "releases")) and shown.endswith("centralnotice.parquet")
    header = summary.split("\n")[1].split()
    assert header == ["campaign_id", "banner_id", "country", "project", "date", "impressions",
                      "impressions_ci95_low", "impressions_ci95_high", "impressions_std",
                      "clicks", "clicks_ci95_low", "clicks_ci95_high", "clicks_std"]
    rows = [line.split() for line in summary.split("\n")[2:10] if line.startswith("  C")]
    values = [header.index("impressions"), header.index("clicks")]
    assert rows and "null" in {row[i] for row in rows for i in values}  # a suppressed value
    assert "null = SUPPRESSED, not zero" in summary
    for place in ("releases/CAMPAIGN/PERIOD/v1/", "reports/CAMPAIGN/PERIOD/v1/", "ledger.json",
                  "keys/"):
        assert place in summary
    published = _digests(out)
    charges = _charges(out)

    assert centralnotice.main(["--demo", "--output", out]) == 0
    again = capsys.readouterr().out
    assert again.count("(reproduced)") == 3 and "(released)" not in again
    assert again[again.index("The first "):] == summary  # the same numbers
    assert _digests(out) == published
    assert _charges(out) == charges  # nothing more charged, the same keys
