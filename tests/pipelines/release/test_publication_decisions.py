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


# ---- Repeated and uncanonical ids never decide a run (issue 40, item 3) ----------------------
#
# Every job that declares consumed ids (``Job.consumes``) removes every copy of an id repeated
# within its batch with copies that conflict (public-identity jobs: every copy) and drops a row whose id has no canonical form, counted for the operator;
# only ids consumed by *earlier* releases refuse a batch. The neighbours below sit on that edge:
# D plus one more copy of an id D already holds (another content: the copies conflict), and D
# plus one row whose id has no canonical form. Before issue 40 each D' was refused (exit 2)
# while D was published -- an observable difference the audit reports.

#: An id without a canonical form (its plain decimal form would have 1000 digits).
NO_CANONICAL_FORM = "1e999"


def _edge(name, neighbours, *, job=None, tables=None, datasets=None):
    entry = REGISTRY[name]
    datasets = datasets if datasets is not None else entry.datasets()
    spec = dataclasses.replace(entry.spec(datasets), units=None, neighbours=neighbours,
                               modes=("exact",))
    if job is not None:
        spec = dataclasses.replace(spec, job=job)
    if tables is not None:
        spec = dataclasses.replace(spec, tables={**spec.tables, **tables})
    _published(spec.job, datasets)
    result = audit(spec, datasets, changes=[Change.ADD_SPREAD])
    result.assert_ok()
    return result


def _published(job, datasets):
    """Each dataset is published (a refusal of D itself is the regression these audits pin: an
    assertion, not an audit that cannot start)."""
    from pipelines.release import ReleaseRefused

    for dataset in datasets:
        try:
            job(dataset, 1, True)
        except ReleaseRefused as err:
            raise AssertionError(f"{dataset.name} was refused: {err}") from None


def _adding(*rows_of):
    """Neighbours: D plus the rows ``row_of(dataset)`` returns, in a batch of their own."""
    def neighbours(dataset, changes, seed):
        return [Neighbour(change=Change.ADD_SPREAD, note=note,
                          dataset=Dataset(batches=[*dataset.batches, build(dataset)],
                                          name=f"{dataset.name}+{note}", extra=dataset.extra))
                for note, build in rows_of]
    return neighbours


def _relabel(target):
    """Label-DP neighbours: the label of each row ``target(row)`` selects flipped, one at a
    time (the relation: one example's label changed; ids and features fixed)."""
    def neighbours(dataset, changes, seed):
        out = []
        for i, row in enumerate(dataset.rows()):
            if not target(row):
                continue
            flipped = [dict(r) for r in dataset.rows()]
            flipped[i]["label"] = "no" if row["label"] == "yes" else "yes"
            out.append(Neighbour(change=Change.REPLACE_VALUES, note=f"row {i} relabelled",
                                 dataset=Dataset(batches=[flipped], name=f"{dataset.name}'")))
        return out
    return neighbours


def test_label_dp_a_repeated_or_uncanonical_example_id_does_not_decide_the_export():
    """D holds one example twice (two labels) and a row whose id is "1e999"; its label-DP
    neighbours flip the label of each of those rows and of an ordinary example. Before issue 40
    D itself was refused (exit 2: nothing to audit); now every run is published, the repeated
    example's rows are removed and the faulty row dropped (the ids are public: which rows are
    exported depends on them only), and a flipped label moves its own example only."""
    entry = REGISTRY["label_dp"]
    (base,) = entry.datasets()
    rows = base.rows()
    extra = [{**rows[0], "label": "no" if rows[0]["label"] == "yes" else "yes"},
             {**rows[1], "example_id": NO_CANONICAL_FORM}]
    edge = Dataset(batches=[*base.batches, extra], name="examples + a repeat + 1e999")
    rule = entry.tables["*/dataset.parquet"]
    kept = [k for k in rule.public_keys if k != (str(rows[0]["example_id"]),)]
    targets = {str(rows[0]["example_id"]), NO_CANONICAL_FORM, str(rows[5]["example_id"])}
    result = _edge("label_dp", _relabel(lambda r: str(r["example_id"]) in targets),
                   datasets=[edge],
                   tables={"*/dataset.parquet": dataclasses.replace(rule, public_keys=kept)})
    assert len(result.pairs) == 4   # the example's two rows, the faulty row, an ordinary one


def _summary_with_ids(dataset: Dataset) -> Dataset:
    rows = [{**r, "report_id": f"r{i}"} for i, r in enumerate(dataset.rows())]
    size = -(-len(rows) // len(dataset.batches))
    return Dataset(batches=[rows[i:i + size] for i in range(0, len(rows), size)],
                   name=f"{dataset.name} with report ids", extra=dataset.extra)


def _summary_reports_job_with_ids():
    """The registered summary-reports job, its reports written with their ``report_id``."""
    from audit_kit import rows_as_jsonl

    job = REGISTRY["summary_reports"].job

    def write(dataset, folder):
        buckets = dataset.extra["buckets"]
        domain = os.path.join(folder, "domain.txt")
        with open(domain, "w") as handle:
            handle.writelines(f"{b:#x}\n" for b in buckets)
        files = rows_as_jsonl("reports", lambda r: {
            "report_id": r["report_id"], "source_id": r["source_id"],
            "contributions": [{"bucket": f"{r['bucket']:#x}", "value": r["value"]}]})(
                dataset, folder)
        return {**files, "domain": [domain]}
    return dataclasses.replace(job, write=write)


def test_summary_reports_a_report_sent_twice_or_an_uncanonical_id_does_not_decide_the_batch():
    """D' adds a second copy of one report (another value: the copies conflict, so every copy
    is removed -- within one report's contribution, the source's L1 bound), or a report whose
    id has no canonical form (a faulty report: dropped)."""
    def again(dataset):
        row = dataset.rows()[0]
        return [{**row, "value": max(1, row["value"] // 2)}]

    def faulty(dataset):
        return [{**dataset.rows()[1], "report_id": NO_CANONICAL_FORM}]

    entry = REGISTRY["summary_reports"]
    datasets = [_summary_with_ids(d) for d in entry.datasets()]
    result = _edge("summary_reports", _adding(("report sent twice", again),
                                              ("no canonical report id", faulty)),
                   job=_summary_reports_job_with_ids(), datasets=datasets)
    assert len(result.pairs) == 2


def test_ldp_a_replayed_client_does_not_decide_the_collection():
    """D' adds a second report of one client (another value): every report of that client is
    removed -- the client's own reports only; the collection is published on both sides."""
    for name in ("ldp_frequencies", "ldp_heavy_hitters"):
        def again(dataset):
            row = dataset.rows()[0]
            return [{**row, "value": (int(row["value"]) + 1) % 8}]
        result = _edge(name, _adding(("client replayed", again)))
        assert len(result.pairs) == 1


def test_masked_lark_training_a_repeated_record_id_does_not_decide_the_model():
    """D holds one record id twice and a record whose id is "1e999" (public identities: every
    copy of the repeated id is removed, the faulty one dropped, counted); its neighbours replace
    those records' labels (the helpers' relation: one report's values replaced). Before issue 40
    D was refused (exit 2); now every run trains, and the model moves by at most the stated
    gradient sensitivity."""
    entry = REGISTRY["masked_lark_train"]
    (base,) = entry.datasets()
    rows = base.rows()
    extra = [{**rows[3], "label": 1 - int(rows[3]["label"])},
             {**rows[4], "record_id": NO_CANONICAL_FORM}]
    edge = Dataset(batches=[*base.batches, extra], name=f"{base.name} + a repeat + 1e999")

    def neighbours(dataset, changes, seed):
        out = []
        for i, row in enumerate(dataset.rows()):
            if str(row["record_id"]) not in {str(rows[3]["record_id"]), NO_CANONICAL_FORM,
                                             str(rows[6]["record_id"])}:
                continue
            changed = [dict(r) for r in dataset.rows()]
            changed[i]["label"] = 1 - int(row["label"])
            out.append(Neighbour(change=Change.REPLACE_VALUES, note=f"record {i} relabelled",
                                 dataset=Dataset(batches=[changed], name=f"{dataset.name}'")))
        return out

    result = _edge("masked_lark_train", neighbours, datasets=[edge])
    assert len(result.pairs) == 4


def test_event_level_a_source_registered_twice_or_uncanonical_does_not_decide_the_batch():
    """D registers one source a second time (another campaign: the registrations conflict, so
    the source and its conversions are removed, counted) and a source whose id has no canonical
    form (dropped); the registered sources are public, so D is audited against the job's own
    neighbours (one source's conversions added, removed, rebatched). Before issue 40 D was
    refused (exit 2: nothing to audit)."""
    def registrations(base):
        source = base.rows()[0]["source_id"]
        campaign = "c2" if base.extra[source] == "c1" else "c1"
        return [(source, campaign), (NO_CANONICAL_FORM, "c1")]

    _audit_event_level_with_registrations("a repeat + 1e999", registrations)


def _audit_event_level_with_registrations(label: str, registrations) -> None:
    """The event-level job's dataset with ``registrations(base)`` appended to its sources file
    (source id, campaign), audited exactly against the job's own neighbours (one source's
    conversions added, removed, rebatched)."""
    entry = REGISTRY["event_level_reports"]
    job = entry.job
    (base,) = entry.datasets()

    def write(dataset, folder):
        extra = dict(dataset.extra)
        more = extra.pop("registrations", [])
        files = job.write(Dataset(batches=dataset.batches, name=dataset.name, extra=extra),
                          folder)
        with open(files["sources"][0], "a") as handle:
            handle.writelines(f"{s},{c}\n" for s, c in more)
        return files

    edge = Dataset(batches=base.batches, name=f"{base.name} + {label}",
                   extra={**base.extra, "registrations": registrations(base)})
    spec = dataclasses.replace(entry.spec([base]), job=dataclasses.replace(job, write=write),
                               modes=("exact",))
    _published(spec.job, [edge])
    result = audit(spec, [edge], changes=[Change.ADD_HEAVY, Change.REMOVE_HEAVY, Change.REBATCH])
    result.assert_ok()
    assert len(result.pairs) == 3


# ---- Identical copies keep one, conflicting copies lose all (rule 1 of consumption.py) -------
#
# For each id repeated within a batch: every copy identical -> one kept; copies that differ ->
# every copy removed. Adding one record x with id i to D then changes the kept records by at
# most one (i absent: x added; i present with copies y: x == y nothing, x != y y removed; i
# already conflicting: nothing). The neighbours below add an identical copy, and a conflicting
# copy both after and *before* D's batches: a rule that kept "the first" copy would keep x
# instead of y on one of them -- a substitution, which the add/remove audits catch (mutant
# repeat-keeps-the-first-copy).

def _before(*rows_of):
    """Neighbours: D plus the rows ``row_of(dataset)`` returns, in a batch read before D's."""
    def neighbours(dataset, changes, seed):
        return [Neighbour(change=Change.ADD_SPREAD, note=note,
                          dataset=Dataset(batches=[build(dataset), *dataset.batches],
                                          name=f"{note}+{dataset.name}", extra=dataset.extra))
                for note, build in rows_of]
    return neighbours


def _both(*after, before=()):
    first, second = _adding(*after), _before(*before)
    return lambda d, c, s: [*first(d, c, s), *second(d, c, s)]


LONE_REPORT = {"source_id": "lone-source", "bucket": 0x12, "value": 1000, "report_id": "lone"}


def test_summary_reports_an_identical_copy_changes_nothing_a_conflicting_one_removes_one():
    """D' adds an identical copy of one report (one kept: nothing moves), or a copy of its id
    from another source with the source's whole budget in another bucket, read after or before
    D's reports (every copy removed: D's report only). Keeping the first copy would move the
    sums by that report plus the whole budget on one side: more than one source's L1 bound."""
    def same(dataset):
        return [dict(dataset.rows()[0])]

    def other(dataset):
        # a copy of the lone source's report that sorts first (the smallest bucket) with the
        # whole budget of another source: whichever copy a keep-one rule picks (by arrival, by
        # content), one neighbour makes it this copy
        low = min(dataset.extra["buckets"])
        return [{**LONE_REPORT, "source_id": "another-source", "bucket": low, "value": 65536}]

    entry = REGISTRY["summary_reports"]
    datasets = [_summary_with_ids(d) for d in entry.datasets()]
    # plus a source with one report, within its budget: algorithm C keeps it in D
    datasets = [Dataset(batches=[*d.batches, [dict(LONE_REPORT)]], name=f"{d.name} + lone",
                        extra=d.extra) for d in datasets]
    result = _edge("summary_reports",
                   _both(("identical copy", same), ("conflicting copy", other),
                         before=[("conflicting copy first", other)]),
                   job=_summary_reports_job_with_ids(), datasets=datasets)
    assert len(result.pairs) == 3


def test_ldp_an_identical_report_changes_nothing_a_conflicting_one_removes_the_client():
    for name in ("ldp_frequencies", "ldp_heavy_hitters"):
        def same(dataset):
            return [dict(dataset.rows()[0])]

        def other(dataset):
            row = dataset.rows()[0]
            return [{**row, "value": (int(row["value"]) + 1) % 8}]
        result = _edge(name, _both(("identical report", same), ("conflicting report", other),
                                   before=[("conflicting report first", other)]))
        assert len(result.pairs) == 3


def _copy_then_changed(entry_name, id_column, column, change):
    """A public-identity job's dataset (label DP, Masked LARk: ids public, values private): the
    registered one plus an identical copy of its row 2; the neighbours change ``column`` of
    each copy in turn (the copies then conflict) and of an ordinary row -- the job's own
    relation. Every copy of a repeated id is removed on both sides: agreeing or not, the
    copies' private values decide nothing."""
    entry = REGISTRY[entry_name]
    (base,) = entry.datasets()
    rows = base.rows()
    edge = Dataset(batches=[*base.batches, [dict(rows[2])]], name=f"{base.name} + a copy")
    targets = {str(rows[2][id_column]), str(rows[6][id_column])}

    def neighbours(dataset, changes, seed):
        out = []
        for i, row in enumerate(dataset.rows()):
            if str(row[id_column]) not in targets:
                continue
            changed = [dict(r) for r in dataset.rows()]
            changed[i][column] = change(row[column])
            out.append(Neighbour(change=Change.REPLACE_VALUES, note=f"row {i} changed",
                                 dataset=Dataset(batches=[changed], name=f"{dataset.name}'")))
        return out
    return edge, neighbours


def test_masked_lark_share_alone_a_repeated_records_values_decide_nothing():
    """The browsers' job on its own (main had no audit of this edge): D holds a record twice
    alike; D' changes one copy's value (or another record's). Sharing one copy of alike copies
    would make the number of reports depend on whether two private values agree."""
    edge, neighbours = _copy_then_changed("masked_lark_share", "record_id", "value",
                                          lambda v: float(v) + 1.0)
    result = _edge("masked_lark_share", neighbours, datasets=[edge])
    assert len(result.pairs) == 3


def test_label_dp_an_example_given_twice_alike_is_removed_whatever_its_labels():
    edge, neighbours = _copy_then_changed(
        "label_dp", "example_id", "label", lambda label: "no" if label == "yes" else "yes")
    rule = REGISTRY["label_dp"].tables["*/dataset.parquet"]
    copied = (str(edge.rows()[2]["example_id"]),)
    kept = [k for k in rule.public_keys if k != copied]   # the example's copies are removed
    result = _edge("label_dp", neighbours, datasets=[edge],
                   tables={"*/dataset.parquet": dataclasses.replace(rule, public_keys=kept)})
    assert len(result.pairs) == 3   # each copy relabelled, an ordinary example


def test_masked_lark_training_a_record_given_twice_alike_is_removed_whatever_its_label():
    edge, neighbours = _copy_then_changed("masked_lark_train", "record_id", "label",
                                          lambda label: 1 - int(label))
    result = _edge("masked_lark_train", neighbours, datasets=[edge])
    assert len(result.pairs) == 3


def test_event_level_a_source_registered_twice_alike_is_randomized_once():
    """D registers one source a second time with the same campaign (one registration kept, its
    conversions stay) and is audited against the job's own neighbours."""
    def registrations(base):
        source = base.rows()[0]["source_id"]
        return [(source, base.extra[source])]

    _audit_event_level_with_registrations("a source registered twice", registrations)
