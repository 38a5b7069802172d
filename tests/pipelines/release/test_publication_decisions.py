"""Publication decisions that do not leak (issue 30, item 3): one unit's faulty rows never change
whether a release is published, its files or its public report.

The rules that look at raw rows (the dropped-rows share, all rows dropped, an empty or header-only
input, missing counters) are operator-only: the release is published and the operator alerted
(operator report, a stderr line, the counters); see pipelines/release/__init__.py. Checked here
with the neighbouring-pair audit (accounting.verification.audit): the registered CentralNotice audit's job,
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

from accounting.verification.audit import Change, Dataset, Neighbour, audit

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


# ---- One record's content never decides a run (issue 30 item 3, row-level faults) ------------
#
# A value whose bytes are not UTF-8 (the CSV reader), one Masked LARk record whose value is not a
# number, missing or not finite (the browsers' job, and the helpers and the ad server behind it),
# one training record with a feature or label outside its domain: each is a fault of that row,
# counted for the operator, and the audit shows it changes neither the outcome nor what is
# released beyond the stated sensitivity.

#: Planted in a faulty unit's rows as text, then replaced in the written CSV by bytes that are
#: not UTF-8 (what a producer with another encoding writes).
MARK, NOT_UTF8 = "XNOTUTF8X", b"\xff\xfe"


def _planting(job):
    """``job`` (a ReleaseLayerJob) with MARK replaced by NOT_UTF8 in every file it writes."""
    def write(dataset, folder):
        files = job.write(dataset, folder)
        for paths in files.values():
            for path in paths:
                with open(path, "rb") as handle:
                    data = handle.read()
                if MARK.encode() in data:
                    with open(path, "wb") as handle:
                        handle.write(data.replace(MARK.encode(), NOT_UTF8))
        return files
    return dataclasses.replace(job, write=write)


def _add_unit_with_bytes_not_utf8(rows_per_unit: int):
    """D plus one unit whose click rows are well-formed but for a user id whose bytes are not
    UTF-8: read as missing, so CentralNotice's rule for a click without a user drops them."""
    def neighbours(dataset, changes, seed):
        keys = REGISTRY["centralnotice"].units.public_keys
        rows = [{**dict(zip(CN_CLK_HEADER[:5], keys[i % len(keys)])),
                 "user_id": f"{NEW_UNIT}-{MARK}"} for i in range(rows_per_unit)]
        return [Neighbour(change=Change.ADD_SPREAD, note="one unit, bytes not UTF-8",
                          dataset=Dataset(batches=[*dataset.batches, rows],
                                          name=f"{dataset.name}'", extra=dataset.extra))]
    return neighbours


def test_one_units_rows_with_bytes_not_utf8_do_not_decide_publication():
    """Before: the CSV reader failed the whole run on D' (exit 3) and published D."""
    entry = REGISTRY["centralnotice"]
    datasets = [_on_the_edge(rows_per_unit=4)]
    spec = dataclasses.replace(entry.spec(datasets), job=_planting(entry.job), units=None,
                               neighbours=_add_unit_with_bytes_not_utf8(4))
    result = audit(spec, datasets, changes=[Change.ADD_SPREAD])
    result.assert_ok()
    assert result.pairs and result.runs == 4


def test_rows_with_bytes_not_utf8_are_counted_for_the_operator():
    from pipelines.release import ReleaseOptions

    edge = _on_the_edge(rows_per_unit=4)
    (neighbour,) = _add_unit_with_bytes_not_utf8(4)(edge, [Change.ADD_SPREAD], 1)
    job = _planting(REGISTRY["centralnotice"].job)
    with tempfile.TemporaryDirectory() as folder:
        files = job.write(neighbour.dataset, folder)
        result = job.module.run(job.request(files, ReleaseOptions(
            output=os.path.join(folder, "out"), testing_seed=1)))
    (alert,) = [a for a in result.alerts if "clicks" in a]
    assert "eligible rows dropped (more than 50%)" in alert
    assert "clicks.dropped.missing_user=4" in alert and "\ufffd" not in alert
    assert "'clicks.values_not_utf8': 4" in repr(result.counters)  # flat or per namespace


#: What a record's value may be instead of a number: not a number, missing (an empty field),
#: not finite (as text; 1e400 parses to infinity).
FAULTY_VALUES = ("oops", "", "nan", "1e400")
#: A record of key B: B has 6 records, k = 5 -- a record dropped instead of neutralised would
#: take B from released to suppressed (audit_kit._lark_records).
LARK_TARGET = 12


def _lark_faulty(values=FAULTY_VALUES, column="value", target=LARK_TARGET, extra_row=None):
    """Neighbours of a Masked LARk dataset: record ``target``'s ``column`` replaced by each of
    ``values`` (the helpers' relation: one report's values replaced), and ``extra_row`` added
    (a record the browsers remove: no public identity)."""
    def neighbours(dataset, changes, seed):
        out = []
        for value in values:
            batches = [[{**r, column: value} if r["record_id"] == target else r for r in b]
                       for b in dataset.batches]
            out.append(Neighbour(change=Change.REPLACE_VALUES, note=f"{column}={value!r}",
                                 dataset=Dataset(batches=batches, name=f"{dataset.name}'")))
        if extra_row is not None:
            out.append(Neighbour(change=Change.REPLACE_VALUES, note="a record the browsers remove",
                                 dataset=Dataset(batches=[*dataset.batches, [extra_row]],
                                                 name=f"{dataset.name}+")))
        return out
    return neighbours


def test_one_lark_records_faulty_value_neither_fails_nor_moves_a_key_across_k():
    """share -> helpers -> combine, exact mode: the combined sums move by at most the helpers'
    stated sensitivity and key B stays released. Before: the share job refused D' inside the
    pipeline (exit 3); dropping the record instead would suppress B (5 reports, k = 5)."""
    entry = REGISTRY["masked_lark_combine"]
    datasets = entry.datasets()
    spec = dataclasses.replace(
        entry.spec(datasets), units=None, modes=("exact",),
        neighbours=_lark_faulty(extra_row={"record_id": 999, "key": None, "value": 1.0}))
    result = audit(spec, datasets, changes=[Change.REPLACE_VALUES])
    result.assert_ok()
    assert len(result.pairs) == len(FAULTY_VALUES) + 1


def test_one_training_records_faulty_feature_or_label_does_not_decide_the_model():
    """The training driver, exact mode: the model moves by at most the stated gradient
    sensitivity (the record adds nothing instead of its clipped gradient). Before: refused on
    D' before the charge (exit 2) -- a decision on one record's value."""
    entry = REGISTRY["masked_lark_train"]
    datasets = entry.datasets()
    neighbours = [_lark_faulty(("oops", "", "256", "7.5"), column="x_0", target=3),
                  _lark_faulty(("2", "", "-1"), column="label", target=3)]
    spec = dataclasses.replace(
        entry.spec(datasets), units=None, modes=("exact",),
        neighbours=lambda d, c, s: [n for build in neighbours for n in build(d, c, s)])
    result = audit(spec, datasets, changes=[Change.REPLACE_VALUES])
    result.assert_ok()
    assert len(result.pairs) == 7
