"""Coverage alarms (operator-only): a key value that had rows in earlier releases and none lately.

A job that wants its coverage watched counts the rows it kept per value of a key column, after
its public-keyset filter, as operator counters named ``<input>.coverage.<column>.<value>``
(e.g. ``impressions.coverage.country.DE``; the CentralNotice job counts countries and projects).
Only values of the public configuration ever reach a counter name, never a raw string of the
data. The counters are raw-data facts: they are read from the operator reports and shown in the
operator view only.

An alarm is raised for a (dataset, input, column, value) that had rows in some release before
the last ``window`` releases of the dataset and none in each of them -- the pattern of a country
whose rows stopped arriving under the configured name, or a project renamed upstream. Only
releases with an operator report count towards the window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

PREFIX = "coverage"


@dataclass(frozen=True, kw_only=True)
class CoverageAlarm:
    dataset_id: str
    input: str
    column: str
    value: str
    last_seen: str            # versioned id of the last release with rows for the value
    silent_releases: tuple    # the last ``window`` releases, none with rows for the value

    def line(self) -> str:
        return (f"{self.dataset_id}: {self.input} rows of {self.column}={self.value} stopped: "
                f"none in the last {len(self.silent_releases)} release(s) (last seen in "
                f"{self.last_seen})")


def coverage_counts(counters: Mapping[str, int]) -> dict:
    """{(input, column, value): rows} from one report's counters."""
    out = {}
    for name, value in counters.items():
        parts = name.split(".", 3)
        if len(parts) == 4 and parts[1] == PREFIX:
            out[(parts[0], parts[2], parts[3])] = int(value)
    return out


def alarms(datasets: Iterable, reports: Mapping, window: int) -> list[CoverageAlarm]:
    """Coverage alarms over every dataset (``Dataset`` with releases in public order) given the
    operator reports ({versioned id: OperatorReport})."""
    if window < 1:
        raise ValueError("the coverage window must be at least one release")
    out = []
    for dataset in datasets:
        history = [(r.versioned_id, coverage_counts(reports[r.versioned_id].counters))
                    for r in dataset.releases
                    if r.versioned_id in reports and reports[r.versioned_id].kind == "report"]
        if len(history) <= window:
            continue
        earlier, recent = history[:-window], history[-window:]
        seen_before = {}
        for vid, counts in earlier:
            for key, rows in counts.items():
                if rows > 0:
                    seen_before[key] = vid
        for key in sorted(seen_before):
            if all(counts.get(key, 0) == 0 for _, counts in recent):
                out.append(CoverageAlarm(dataset_id=dataset.dataset_id, input=key[0],
                                         column=key[1], value=key[2],
                                         last_seen=seen_before[key],
                                         silent_releases=tuple(v for v, _ in recent)))
    return out
