"""Publication decisions that do not leak (issue 30, item 3): one unit's faulty rows never change
whether a release is published, its files or its public report.

The rules that look at raw rows (the dropped-rows share, all rows dropped, an empty or header-only
input, missing counters) are operator-only: the release is published and the operator alerted
(operator report, a stderr line, the counters); see pipelines/release/__init__.py. Checked here
with the neighbouring-pair audit (accounting.audit): the registered CentralNotice audit's job,
tables and marker rules, on datasets built to sit on each rule's edge, against a neighbour that
adds one unit whose rows are all faulty. The audit compares the outcome (a run that is refused on
one side only is an observable difference), file names and counts, the released keys, and the
public marker (RELEASE.json) apart from its noisy fields.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile

from audit_kit import REGISTRY
from release_testkit import CN_CLK_HEADER

from accounting.audit import Change, Dataset, Neighbour, audit

#: A click-row date that does not parse: the row is dropped (missing_or_unparseable_key).
BAD_DATE = "11/01/2026"
NEW_UNIT = "audit-faulty-unit"


def _faulty_rows(user, keys, n):
    """``n`` click rows of ``user`` in ``keys``, every one dropped by a row rule."""
    return [{**dict(zip(CN_CLK_HEADER[:5], keys[i % len(keys)])), "date": BAD_DATE,
             "user_id": user} for i in range(n)]


def _add_faulty_unit(rows_per_unit: int):
    """The neighbour builder: D plus one new unit whose ``rows_per_unit`` rows are all faulty."""
    def neighbours(dataset, changes, seed):
        keys = REGISTRY["centralnotice"].units.public_keys
        rows = _faulty_rows(NEW_UNIT, keys, rows_per_unit)
        return [Neighbour(change=Change.ADD_SPREAD, note="one unit, all rows faulty",
                          dataset=Dataset(batches=[*dataset.batches, rows],
                                          name=f"{dataset.name}'", extra=dataset.extra))]
    return neighbours


def _audit(datasets, rows_per_unit):
    entry = REGISTRY["centralnotice"]
    spec = entry.spec(datasets)
    spec = dataclasses.replace(spec, units=None, neighbours=_add_faulty_unit(rows_per_unit))
    return audit(spec, datasets, changes=[Change.ADD_SPREAD])


def _on_the_edge(rows_per_unit: int) -> Dataset:
    """The registered audit's dataset plus faulty rows of its own units, so that the dropped share
    of the clicks input is at most 50% (the default --max_dropped_fraction) and one more unit's
    ``rows_per_unit`` faulty rows take it over."""
    entry = REGISTRY["centralnotice"]
    (base,) = entry.datasets()
    good = len(base.rows())
    faulty = good - rows_per_unit // 2          # share faulty / (good + faulty) <= 0.5
    assert faulty / (good + faulty) <= 0.5 < (faulty + rows_per_unit) / (good + faulty + rows_per_unit)
    users = sorted({r["user_id"] for r in base.rows()}, key=str)
    keys = entry.units.public_keys
    rows = [r for i in range(faulty) for r in _faulty_rows(users[i % len(users)], keys, 1)]
    return Dataset(batches=[*base.batches, rows], name="clicks, dropped share <= 50%")


def _empty_release() -> Dataset:
    """No click row of the release at all (every row belongs to another day: skipped)."""
    (base,) = REGISTRY["centralnotice"].datasets()
    other_day = [{**r, "date": "2026-11-02"} for r in base.rows()[:3]]
    return Dataset(batches=[other_day], name="clicks: no row of the release")


def _alerts(dataset: Dataset) -> list[str]:
    """The run's operator alerts (a testing run of the audited job on ``dataset``)."""
    from pipelines.release import ReleaseOptions

    job = REGISTRY["centralnotice"].job
    with tempfile.TemporaryDirectory() as folder:
        files = job.write(dataset, folder)
        result = job.module.run(job.request(files, ReleaseOptions(
            output=os.path.join(folder, "out"), testing_seed=1)))
        return list(result.alerts)


def _plus_faulty_unit(dataset: Dataset, rows_per_unit: int) -> Dataset:
    (neighbour,) = _add_faulty_unit(rows_per_unit)(dataset, [Change.ADD_SPREAD], 1)
    return neighbour.dataset


def test_one_units_faulty_rows_do_not_push_a_release_over_the_dropped_share():
    result = _audit([_on_the_edge(rows_per_unit=4)], rows_per_unit=4)
    result.assert_ok()
    assert result.pairs and result.runs == 4  # D and D', exact and noisy


def test_one_units_faulty_rows_in_an_input_without_rows_do_not_decide_publication():
    """D: no click row of the release (an input without eligible rows); D': one unit whose
    rows are all dropped (all rows dropped)."""
    result = _audit([_empty_release()], rows_per_unit=3)
    result.assert_ok()
    assert result.pairs and result.runs == 4


def test_the_audited_pairs_sit_on_the_rules_edges():
    """What the audits above compare is a pair the rules tell apart: the operator is alerted on
    one side only (so a rule that decided publication would be caught)."""
    edge = _on_the_edge(rows_per_unit=4)
    assert not any("clicks" in a for a in _alerts(edge))
    (alert,) = [a for a in _alerts(_plus_faulty_unit(edge, 4)) if "clicks" in a]
    assert "eligible rows dropped (more than 50%)" in alert
    assert "missing_or_unparseable_key" in alert
    empty = _empty_release()
    assert [a for a in _alerts(empty) if "clicks" in a] == [
        "C1/2026-11-01: clicks: no eligible rows (an empty or header-only input, or rows of "
        "other releases only)"]
    (alert,) = [a for a in _alerts(_plus_faulty_unit(empty, 3)) if "clicks" in a]
    assert "clicks: all 3 eligible rows dropped" in alert
