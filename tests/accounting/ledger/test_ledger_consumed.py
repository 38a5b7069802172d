"""Consumed-id records of the budget ledger (accounting/ledger/consumed.py): ids aggregated at most
once across all releases, checked and recorded inside the reservation's transaction.

Local ledgers and ``gs://`` ledgers (the GCS emulator of tests/gcs_emulator.py) alike: a refusal
leaves no reservation, key or record file behind; a re-run reproduces its decision; a take-over
replaces the failed reservation's ids; published ids are permanent, new versions included;
budgeted namespaces grant what is left; a missing or edited record file, or a lost hashing key,
is refused; two overlapping batches racing never both pass.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading

import numpy as np
import pytest
from gcs_emulator import storage_emulator

from accounting import gcs
from accounting.budget import PrivacyBudget
from accounting.calibration import calibrate
from accounting.ledger import (BudgetLedger, ConsumedIds, ConsumedIdsError, LedgerError,
                               ReleaseRequest, Scope)
from accounting.ledger import consumed
from accounting.measures import Measure
from accounting.sensitivity import Sensitivities

ONE = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)
REPORTS = "ara-summary/report"
SOURCES = "ara-summary/source-l1"


def _request(batch, ids, *, digest=None, skip=False, budget=None, **kw):
    consumes = [ConsumedIds(namespace=REPORTS, ids=list(ids), skip=skip, noun="report ids")]
    if budget is not None:
        consumes.append(ConsumedIds(namespace=SOURCES, ids=list(budget), limit=65536,
                                    amounts=np.array(list(budget.values())), noun="sources"))
    return ReleaseRequest(
        release_id=f"summary_reports/{batch}",
        measures=[Measure.of_noise("summary", calibrate("discrete_laplace", epsilon=1.0,
                                                        l1_sensitivity=1), ONE)],
        input_digest=digest or "sha256:" + hashlib.sha256(
            json.dumps([batch, list(ids), skip, budget]).encode()).hexdigest(),
        scopes=[Scope(name=f"ara-batch:{batch}", budget=PrivacyBudget(epsilon=64))],
        consumes=consumes, **kw)


def _ledger(root) -> BudgetLedger:
    if str(root).startswith("gs://"):
        return BudgetLedger(f"{root}/ledger.json", f"{root}/keys")
    return BudgetLedger(str(root / "ledger.json"), str(root / "keys"))


def _published(ledger, reservation):
    ledger.begin_publish(reservation)
    ledger.commit(reservation, f"/out/{reservation.versioned_id}", {"summary.csv": "sha256:00"})


def _listing(root) -> dict:
    """Key and record-file names (what a refusal must leave as it was; the key store's control
    records -- the ledger's witness, the keys' use records -- aside)."""
    if str(root).startswith("gs://"):
        return {"keys": [u for u in gcs.list_objects(f"{root}/keys/") if u.endswith(".key")],
                "files": gcs.list_objects(f"{root}/ledger.json.consumed/")}
    files = root / "ledger.json.consumed"
    keys = sorted(os.listdir(root / "keys")) if (root / "keys").exists() else []
    return {"keys": [k for k in keys if k.endswith(".key")],
            "files": sorted(os.listdir(files)) if files.exists() else []}


def _held(reservation, namespace=REPORTS) -> list:
    return reservation.consumed[namespace].held.tolist()


# --------------------------------------------------------------------------- the rules

def overlapping_batches_are_refused_then_skipped(root):
    ledger = _ledger(root)
    [a] = ledger.reserve(_request("A", ["rid-1", "rid-2", "rid-3"]))
    assert a.consumed[REPORTS].recorded == 3 and _held(a) == [False] * 3
    _published(ledger, a)
    before, records = _listing(root), ledger.snapshot()["releases"]
    # an earlier batch plus one late report: a new digest, but two of its ids are consumed
    with pytest.raises(ConsumedIdsError, match=r"2 of its 3 report ids were already consumed "
                                               r"by summary_reports/A \(2\)") as err:
        ledger.reserve(_request("B", ["rid-2", "rid-3", "rid-4"]))
    assert err.value.count == 2 and err.value.holders == {"summary_reports/A": 2}
    assert ledger.snapshot()["releases"] == records      # nothing reserved
    assert _listing(root) == before                      # no key, no record file left behind
    [b] = ledger.reserve(_request("B", ["rid-2", "rid-3", "rid-4"], skip=True))
    assert _held(b) == [True, True, False] and b.consumed[REPORTS].recorded == 1
    assert b.consumed[REPORTS].holders == {"summary_reports/A": 2}
    # a re-run of B reads its decision back from its own record (it reproduces)
    [again] = ledger.reserve(_request("B", ["rid-2", "rid-3", "rid-4"], skip=True))
    assert again.resumed and _held(again) == [True, True, False]
    # r4 is B's now
    with pytest.raises(ConsumedIdsError, match="summary_reports/B"):
        ledger.reserve(_request("C", ["rid-4", "rid-9"]))
    return ledger


def test_overlapping_batches_local(tmp_path):
    ledger = overlapping_batches_are_refused_then_skipped(tmp_path)
    state = json.loads((tmp_path / "ledger.json").read_text())
    assert state["format"] == "beam-dp-release/budget-ledger/v4"
    entry = state["releases"]["summary_reports/A"]["consumed"][REPORTS]
    assert entry["count"] == 3 and entry["sha256"].startswith("sha256:")
    assert (tmp_path / "ledger.json.consumed" / entry["file"]).stat().st_size < 4096
    # neither the ids nor their plain hashes are stored anywhere
    blob = (tmp_path / "ledger.json").read_bytes() + b"".join(
        p.read_bytes() for p in (tmp_path / "ledger.json.consumed").iterdir())
    assert b"rid-" not in blob
    plain = consumed.hash_ids(b"\0" * 32, REPORTS, ["rid-1"]).tobytes()
    assert plain not in blob


def test_a_take_over_replaces_the_reservations_ids_and_new_versions_do_not_reuse_them(tmp_path):
    ledger = _ledger(tmp_path)
    [a] = ledger.reserve(_request("A", ["r1", "r2"]))          # reserved, never published
    # another batch cannot take ids a reservation holds: it may publish any time
    with pytest.raises(ConsumedIdsError, match="summary_reports/A"):
        ledger.reserve(_request("B", ["r2", "r3"]))
    [fixed] = ledger.reserve(_request("A", ["r1", "r5"]))      # corrected input: a take-over
    assert fixed.taken_over and fixed.version == 1
    [b] = ledger.reserve(_request("B", ["r2", "r3"]))          # r2 was released by the take-over
    assert _held(b) == [False, False]
    assert len(_listing(tmp_path)["files"]) == 2               # A's first record file deleted
    _published(ledger, fixed)
    # a new version of a published batch must not aggregate its reports again
    with pytest.raises(ConsumedIdsError, match=r"1 of its 2 report ids .* summary_reports/A \(1\)"):
        ledger.reserve(_request("A", ["r5", "r6"]), new_release=True)
    [v2] = ledger.reserve(_request("A", ["r5", "r6"], skip=True), new_release=True)
    assert v2.versioned_id == "summary_reports/A#2" and _held(v2) == [True, False]
    with pytest.raises(ConsumedIdsError, match=r"summary_reports/A#2 \(1\)"):
        ledger.reserve(_request("C", ["r6"]))


def test_budgeted_namespace_grants_what_is_left(tmp_path):
    ledger = _ledger(tmp_path)
    [a] = ledger.reserve(_request("A", ["r1"], budget={"s1": 40000, "s2": 100}))
    assert a.consumed[SOURCES].granted.tolist() == [40000, 100]
    [b] = ledger.reserve(_request("B", ["r2"], budget={"s1": 30000, "s3": 70000}))
    assert b.consumed[SOURCES].granted.tolist() == [25536, 65536]
    assert b.consumed[SOURCES].holders == {"summary_reports/A": 1}
    [c] = ledger.reserve(_request("C", ["r3"], budget={"s1": 10, "s2": 65436, "s3": 1}))
    assert c.consumed[SOURCES].granted.tolist() == [0, 65436, 0]
    [again] = ledger.reserve(_request("B", ["r2"], budget={"s1": 30000, "s3": 70000}))
    assert again.resumed and again.consumed[SOURCES].granted.tolist() == [25536, 65536]


def test_several_releases_of_one_run_see_each_other(tmp_path):
    ledger = _ledger(tmp_path)
    with pytest.raises(ConsumedIdsError, match="summary_reports/A"):
        ledger.reserve([_request("A", ["r1", "r2"]), _request("B", ["r2"])])
    assert ledger.records() == [] and _listing(tmp_path) == {"keys": [], "files": []}


@pytest.mark.parametrize("damage", ["deleted", "edited", "key lost"])
def test_a_missing_or_edited_record_is_refused(tmp_path, damage):
    ledger = _ledger(tmp_path)
    [a] = ledger.reserve(_request("A", ["r1", "r2"]))
    entry = ledger.snapshot()["releases"]["summary_reports/A"]["consumed"][REPORTS]
    path = tmp_path / "ledger.json.consumed" / entry["file"]
    if damage == "deleted":
        path.unlink()
        expected = "is missing"
    elif damage == "edited":
        data = bytearray(path.read_bytes())
        data[-40] ^= 1
        path.write_bytes(bytes(data))
        expected = "was edited"
    else:
        os.remove(ledger.snapshot()["consumed_key"]["uri"])
        expected = "cannot be loaded"
    with pytest.raises(LedgerError, match=expected):
        ledger.reserve(_request("B", ["r3"]))
    assert [r["release_id"] for r in ledger.records()] == ["summary_reports/A"]


def test_hashes_are_keyed_per_namespace_and_128_bits():
    key = os.urandom(32)
    a = consumed.hash_ids(key, REPORTS, ["x", "y"])
    assert a.shape == (2, 2) and a.dtype == np.uint64
    assert not np.array_equal(a, consumed.hash_ids(key, SOURCES, ["x", "y"]))
    assert not np.array_equal(a, consumed.hash_ids(os.urandom(32), REPORTS, ["x", "y"]))
    record = consumed.Record(hi=np.sort(a[:, 0]), lo=a[np.argsort(a[:, 0]), 1])
    assert (consumed.matches(record, consumed.hash_ids(key, REPORTS, ["y", "z", "x"])) >= 0).tolist() == \
        [True, False, True]
    # ids sharing their first 64 bits are told apart by the other 64
    shared = consumed.Record(hi=np.array([5, 5, 5], np.uint64), lo=np.array([1, 2, 3], np.uint64))
    found = consumed.matches(shared, np.array([[5, 3], [5, 4], [6, 1]], np.uint64))
    assert found.tolist() == [2, -1, -1]


def test_a_v3_ledger_migrated_keeps_its_consumed_ids(tmp_path):
    from accounting.ledger.migrate import migrate
    from release_testkit import unchain

    ledger = _ledger(tmp_path)
    ledger.reserve(_request("A", ["r1"]))
    unchain(tmp_path / "ledger.json", tmp_path / "keys", "beam-dp-release/budget-ledger/v3")
    with pytest.raises(LedgerError, match="python -m accounting.ledger migrate"):
        _ledger(tmp_path).reserve(_request("B", ["r2"]))
    assert migrate(str(tmp_path / "ledger.json"), str(tmp_path / "keys")) == 1
    with pytest.raises(ConsumedIdsError):
        _ledger(tmp_path).reserve(_request("B", ["r1"]))


# --------------------------------------------------------------------------- races

def _race(root, batch, ids, barrier, results):
    ledger = _ledger(root)
    barrier.wait()
    try:
        ledger.reserve(_request(batch, ids))
        results.put((batch, "ok"))
    except ConsumedIdsError:
        results.put((batch, "refused"))
    except BaseException as err:  # reported to the parent, which fails the test
        results.put((batch, repr(err)))


def test_overlapping_batches_racing_never_both_pass(tmp_path):
    ctx = multiprocessing.get_context("fork")
    n = 6
    barrier, results = ctx.Barrier(n), ctx.Queue()
    # every batch shares "common" with every other: exactly one may pass
    batches = {f"B{i}": ["common", f"own{i}"] for i in range(n)}
    procs = [ctx.Process(target=_race, args=(tmp_path, b, ids, barrier, results))
             for b, ids in batches.items()]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert sorted(outcomes.values()) == ["ok"] + ["refused"] * (n - 1), outcomes
    assert len(_ledger(tmp_path).records()) == 1
    listing = _listing(tmp_path)
    # release key + hashing key + the ledger's chain key
    assert len(listing["files"]) == 1 and len(listing["keys"]) == 3


@pytest.fixture(scope="module")
def gcs_bucket():
    with storage_emulator("dp-consumed") as bucket:
        yield bucket


def test_overlapping_batches_on_gcs(gcs_bucket):
    overlapping_batches_are_refused_then_skipped(f"gs://{gcs_bucket}/rules")


def test_an_edited_record_on_gcs_is_refused(gcs_bucket):
    root = f"gs://{gcs_bucket}/edited"
    ledger = _ledger(root)
    ledger.reserve(_request("A", ["r1", "r2"]))
    entry = ledger.snapshot()["releases"]["summary_reports/A"]["consumed"][REPORTS]
    blob = gcs.blob(f"{root}/ledger.json.consumed/{entry['file']}")
    data = bytearray(blob.download_as_bytes())
    data[-40] ^= 1
    blob.upload_from_string(bytes(data))
    with pytest.raises(LedgerError, match="was edited"):
        ledger.reserve(_request("B", ["r3"]))


def test_overlapping_batches_racing_on_gcs(gcs_bucket):
    root = f"gs://{gcs_bucket}/race"
    n = 5
    barrier = threading.Barrier(n)
    outcomes, ledgers = {}, []

    def run(batch):
        ledger = _ledger(root)
        ledgers.append(ledger)
        barrier.wait()
        try:
            ledger.reserve(_request(batch, ["common", f"own-{batch}"]))
            outcomes[batch] = "ok"
        except ConsumedIdsError:
            outcomes[batch] = "refused"
        except BaseException as err:
            outcomes[batch] = repr(err)

    threads = [threading.Thread(target=run, args=(f"G{i}",)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(outcomes.values()) == ["ok"] + ["refused"] * (n - 1), outcomes
    assert sum(ledger._store.conflicts for ledger in ledgers) >= 1
    listing = _listing(root)
    assert len(listing["files"]) == 1 and len(listing["keys"]) == 3
