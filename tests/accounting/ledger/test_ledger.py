"""The budget ledger: scopes, reserve / take over / publish / commit, local file and GCS.

GCS tests run against ``gcp-storage-emulator`` started in-process on a free port
(``tests/gcs_emulator.py``), which adds the documented GCS rule for ``ifGenerationMatch`` on
object inserts that the emulator itself ignores. The ledger code is unchanged.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import stat
import threading
import time

import numpy as np
import pytest
from gcs_emulator import storage_emulator

from accounting.budget import PrivacyBudget
from accounting.calibration import NoiseKind, calibrate, calibrate_zcdp
from accounting.keystore import KeyRef, KeyStore
from accounting.ledger import (BudgetExceededError, BudgetLedger, ChangedInputError,
                               ContentAlreadyReleased, LedgerConflict, LedgerError,
                               ReleaseRequest, Scope, input_digest)
from accounting.ledger.__main__ import main as migrate_main
from accounting.ledger.stores import GcsStore
from accounting.measures import Measure
from accounting.sensitivity import Sensitivities
from transforms.noise import RandomStreams, add_noise

CAMPAIGN = "c2026_fundraising_en"
ONE = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)


def _measures(eps=1.0):
    return [Measure.of_noise("impressions", calibrate("discrete_laplace", epsilon=eps / 2,
                                                      l1_sensitivity=1), ONE),
            Measure.of_noise("clicks", calibrate("discrete_laplace", epsilon=eps / 2,
                                                 l1_sensitivity=1), ONE)]


def _scopes(day, total=3.0, per_period=1.0):
    return [Scope(name=f"campaign:{CAMPAIGN}", budget=PrivacyBudget(epsilon=total)),
            Scope(name=f"period:{CAMPAIGN}:{day}", budget=PrivacyBudget(epsilon=per_period))]


def _request(day="2026-11-20", digest=None, eps=1.0, **kw):
    return ReleaseRequest(release_id=f"{CAMPAIGN}/{day}", measures=_measures(eps),
                          input_digest=digest or f"sha256:{day}", scopes=_scopes(day), **kw)


def _ledger(tmp_path, **kw) -> BudgetLedger:
    return BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"), **kw)


def _release_keys(root) -> list:
    """The release keys in the key store (not the ledger's own chain key)."""
    return [n for n in os.listdir(root / "keys") if not n.startswith("ledger-")]


def _release_outputs(key) -> bytes:
    """What a release writes: noisy counts drawn from the release key (as a pipeline does)."""
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=0.5, l1_sensitivity=100)
    keys = [(CAMPAIGN, "banner_a", c, "en.wikipedia", "2026-11-20") for c in ("DE", "FR", "US")]
    values = np.array([123456, 789, 0], dtype=np.int64)
    return add_noise(spec, values, RandomStreams.for_keys(key, "impressions", keys)).tobytes()


def _published(ledger, reservation, path="/out/x"):
    ledger.begin_publish(reservation)
    return ledger.commit(reservation, path, {"x.parquet": "sha256:00"})


# --------------------------------------------------------------------------- local ledger

def test_reserve_publish_commit_and_no_secret_in_the_ledger(tmp_path):
    ledger = _ledger(tmp_path)
    [res] = ledger.reserve(_request(metadata={"k": 100}))
    assert (res.version, res.resumed, res.taken_over, res.state) == (1, False, False, "reserved")
    record = ledger.get(res.release_id)
    assert record["measures"] == [m.to_json() for m in _measures()]
    assert record["scopes"] == [s.name for s in _scopes("2026-11-20")]
    assert record["keys"]["release"]["fingerprint"] == res.key.fingerprint()
    assert record["metadata"] == {"k": 100} and record["state"] == "reserved"
    assert ledger.begin_publish(res)["state"] == "publishing"
    committed = ledger.commit(res, "/out/x", {"x.parquet": "sha256:ab"})
    assert committed["state"] == "committed" and committed["files"] == {"x.parquet": "sha256:ab"}
    text = (tmp_path / "ledger.json").read_text()
    assert res.key.secret_bytes().hex() not in text
    key_file = KeyRef.from_json(record["keys"]["release"]).uri
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert ledger.ledger_id() == json.loads(text)["ledger_id"]


def test_scopes_refuse_over_budget_before_anything_is_stored(tmp_path):
    ledger = _ledger(tmp_path)
    for day in ("2026-11-20", "2026-11-21", "2026-11-22"):
        ledger.reserve(_request(day))
    with pytest.raises(BudgetExceededError, match=f"campaign:{CAMPAIGN}") as err:
        ledger.reserve(_request("2026-11-23"))
    assert err.value.scope == f"campaign:{CAMPAIGN}" and "Nothing was charged" in str(err.value)
    assert len(ledger.records()) == 3 and len(_release_keys(tmp_path)) == 3
    with pytest.raises(BudgetExceededError, match="period"):
        _ledger(tmp_path / "b").reserve(_request(eps=1.5))


def test_several_releases_are_charged_all_or_nothing(tmp_path):
    ledger = _ledger(tmp_path)
    ledger.reserve(_request("2026-11-20"))
    with pytest.raises(BudgetExceededError):  # 2 fit, the third is over the campaign total
        ledger.reserve([_request("2026-11-21"), _request("2026-11-22"), _request("2026-11-23")])
    assert [r["release_id"] for r in ledger.records()] == [f"{CAMPAIGN}/2026-11-20"]
    assert len(_release_keys(tmp_path)) == 1
    both = ledger.reserve([_request("2026-11-21"), _request("2026-11-22")])
    assert [r.version for r in both] == [1, 1] and ledger.spent(f"campaign:{CAMPAIGN}").epsilon == 3


def test_rerun_on_the_same_input_reuses_keys_and_spends_nothing(tmp_path):
    ledger = _ledger(tmp_path)
    [first] = ledger.reserve(_request())
    _published(ledger, first)
    [again] = _ledger(tmp_path).reserve(_request())
    assert again.resumed and again.committed and again.key == first.key
    assert _release_outputs(again.key) == _release_outputs(first.key)
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(1.0)
    assert ledger.get(first.release_id)["runs"] == 2


def test_published_release_on_changed_input_needs_a_new_version(tmp_path):
    ledger = _ledger(tmp_path)
    [first] = ledger.reserve(_request(eps=0.5))
    _published(ledger, first)
    with pytest.raises(ChangedInputError, match="leak the difference"):
        ledger.reserve(_request(digest="sha256:changed", eps=0.5))
    [second] = ledger.reserve(_request(digest="sha256:changed", eps=0.5), new_release=True)
    assert second.version == 2 and second.versioned_id.endswith("#2") and second.key != first.key
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(1.0)


def test_an_unpublished_reservation_is_taken_over_without_spending_again(tmp_path):
    ledger = _ledger(tmp_path)
    [failed] = ledger.reserve(_request(digest="sha256:broken-file"))
    [fixed] = _ledger(tmp_path).reserve(_request(digest="sha256:fixed-file"))
    assert fixed.taken_over and fixed.version == 1 and fixed.key != failed.key
    record = ledger.get(fixed.release_id)
    assert record["input_digest"] == "sha256:fixed-file"
    assert record["takeovers"][0]["input_digest"] == "sha256:broken-file"
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(1.0)
    # The old run's reservation no longer matches: it cannot publish.
    with pytest.raises(LedgerError, match="taken over"):
        ledger.begin_publish(failed)
    # Corrected parameters may come with a take-over, if they fit.
    [smaller] = ledger.reserve(_request(digest="sha256:again", eps=0.4))
    assert smaller.taken_over and ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(0.4)
    # --new_release on an unpublished reservation is a take-over too: never charged twice.
    [same] = ledger.reserve(_request(digest="sha256:more", eps=0.4), new_release=True)
    assert same.taken_over and same.version == 1


def test_a_submission_is_recorded_and_found_again_without_spending(tmp_path):
    """What --submit_only / --finalize need of the ledger: the job handle kept with the
    reservation, the reservation found again (same keys, nothing written), refusals named."""
    ledger = _ledger(tmp_path)
    [res] = ledger.reserve(_request())
    record = ledger.record_submission(res, {"runner": "DataflowRunner", "job_id": "j1"})
    assert record["submission"]["job_id"] == "j1" and record["state"] == "reserved"
    assert record["submission"]["key_fingerprints"] == {"release": res.key.fingerprint()}
    before = (tmp_path / "ledger.json").read_bytes()
    [found] = _ledger(tmp_path).find([_request()])
    assert found.key == res.key and found.record["submission"]["job_id"] == "j1"
    assert (tmp_path / "ledger.json").read_bytes() == before  # nothing written, nothing spent
    with pytest.raises(ChangedInputError, match="the input is now sha256:other"):
        ledger.find([_request(digest="sha256:other")])
    with pytest.raises(LedgerError, match="has no record"):
        ledger.find([_request("2026-11-21")])
    with pytest.raises(LedgerError, match="other measures or scopes"):
        ledger.find([_request(eps=0.5)])
    [taken] = ledger.reserve(_request(digest="sha256:corrected"))  # taken over: fresh keys
    with pytest.raises(LedgerError, match="taken over by another run"):
        ledger.record_submission(res, {"runner": "DataflowRunner", "job_id": "j2"})
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(1.0)
    assert taken.taken_over


def test_finishing_a_release_is_claimed_by_one_process_at_a_time(tmp_path):
    ledger = _ledger(tmp_path)
    [res] = ledger.reserve(_request())
    assert ledger.claim(res, "a", 60) is None
    assert ledger.claim(res, "a", 60) is None  # the holder renews
    held = ledger.claim(res, "b", 60)
    assert held["token"] == "a" and held["pid"] == os.getpid() and held["until"] > 0
    assert ledger.claim(res, "b", 60, replacing="a") is None  # its holder is known to be gone
    assert ledger.claim(res, "a", 60)["token"] == "b"
    assert ledger.claim(res, "a", 0) is None and ledger.get(res.release_id)["finalizing"]
    assert ledger.claim(res, "b", 0) is None and ledger.get(res.release_id)["finalizing"] is None
    assert ledger.claim(res, "c", 0.05) is None
    time.sleep(0.1)
    assert ledger.claim(res, "d", 60) is None  # a claim lapses after its time


def test_parameters_cannot_change_once_publication_started(tmp_path):
    ledger = _ledger(tmp_path)
    [res] = ledger.reserve(_request())
    ledger.begin_publish(res)
    with pytest.raises(LedgerError, match="privacy parameters"):
        ledger.reserve(_request(eps=0.5))


def test_content_is_released_once_under_any_id(tmp_path):
    ledger = _ledger(tmp_path)
    ledger.reserve(_request("2026-11-20", content_key="sha256:reports"))
    with pytest.raises(ContentAlreadyReleased, match="2026-11-20"):
        ledger.reserve(_request("2026-11-21", content_key="sha256:reports"))
    ledger.reserve(_request("2026-11-20", content_key="sha256:reports"))  # its own re-run is fine


def test_symlinked_ledger_stays_one_ledger(tmp_path):
    real = tmp_path / "shared" / "ledger.json"
    real.parent.mkdir()
    link = tmp_path / "ledger.json"
    first = BudgetLedger(str(real), str(tmp_path / "keys"))
    first.reserve(_request("2026-11-20"))
    os.symlink(real, link)
    BudgetLedger(str(link), str(tmp_path / "keys")).reserve(_request("2026-11-21"))
    assert link.is_symlink() and len(first.records()) == 2


def _crash_after_reserve(ledger_path, keys_path):
    BudgetLedger(ledger_path, keys_path).reserve(_request(digest="sha256:crash"))
    os._exit(17)  # dies after charging, before writing outputs


def test_crash_after_reserve_then_resume_or_take_over(tmp_path):
    proc = multiprocessing.get_context("fork").Process(
        target=_crash_after_reserve, args=(str(tmp_path / "ledger.json"), str(tmp_path / "keys")))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 17
    ledger = _ledger(tmp_path)
    record = ledger.get(f"{CAMPAIGN}/2026-11-20")
    assert record["state"] == "reserved"  # stays spent: never refunded
    [res] = ledger.reserve(_request(digest="sha256:crash"))
    assert res.resumed and res.key.fingerprint() == record["keys"]["release"]["fingerprint"]
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(1.0)
    assert _published(ledger, res)["state"] == "committed"


def _race(ledger_path, keys_path, day, barrier, results):
    ledger = BudgetLedger(ledger_path, keys_path)
    barrier.wait()
    try:
        ledger.reserve(_request(day))
        results.put((day, "ok"))
    except BudgetExceededError:
        results.put((day, "refused"))
    except BaseException as err:  # reported to the parent, which fails the test
        results.put((day, repr(err)))


def test_concurrent_releases_exactly_the_budget_allowed_succeed(tmp_path):
    ctx = multiprocessing.get_context("fork")
    n = 7
    barrier, results = ctx.Barrier(n), ctx.Queue()
    days = [f"2026-11-{20 + i}" for i in range(n)]
    procs = [ctx.Process(target=_race, args=(str(tmp_path / "ledger.json"), str(tmp_path / "keys"),
                                             day, barrier, results)) for day in days]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert sorted(outcomes.values()) == ["ok"] * 3 + ["refused"] * 4, outcomes
    ledger = _ledger(tmp_path)
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(3.0)
    assert len(_release_keys(tmp_path)) == 3


def test_key_fingerprint_checked_on_load(tmp_path):
    ledger = _ledger(tmp_path)
    [res] = ledger.reserve(_request())
    uri = res.key_refs["release"].uri
    os.chmod(uri, 0o600)
    with open(uri, "w") as handle:
        handle.write("00" * 32 + "\n")
    before = (tmp_path / "ledger.json").read_bytes()
    with pytest.raises(LedgerError, match="fingerprint"):
        ledger.reserve(_request())
    assert (tmp_path / "ledger.json").read_bytes() == before  # refused before any change


def test_a_scope_budget_increase_needs_set_budget(tmp_path):
    ledger = _ledger(tmp_path)
    ledger.reserve(_request())
    bigger = [Scope(name=f"campaign:{CAMPAIGN}", budget=PrivacyBudget(epsilon=9.0))]
    request = ReleaseRequest(release_id="x", measures=_measures(), input_digest="sha256:x",
                             scopes=bigger)
    with pytest.raises(LedgerError, match="larger"):
        ledger.reserve(request)
    ledger.set_budget(bigger[0], allow_increase=True)
    ledger.reserve(request)
    assert ledger.scope_budget(f"campaign:{CAMPAIGN}").epsilon == 9.0


@pytest.mark.parametrize("accountant", ["zcdp", "pld"])
def test_tighter_accountants_fit_more_gaussian_releases(tmp_path, accountant):
    clicks = calibrate_zcdp(NoiseKind.DISCRETE_GAUSSIAN, rho=0.01, l2_sensitivity=1.0,
                            delta_for_reporting=1e-7)
    measures = [Measure.of_noise("clicks", clicks, ONE)]
    scope = [Scope(name="campaign:z", budget=PrivacyBudget(epsilon=2.0, delta=1e-6))]
    counts = {}
    for name in ("basic", accountant):
        ledger = BudgetLedger(str(tmp_path / f"{name}.json"), str(tmp_path / "keys"), accountant=name)
        n = 0
        while n < 60:
            try:
                ledger.reserve(ReleaseRequest(release_id=f"r{n}", measures=measures,
                                              input_digest=f"sha256:{n}", scopes=scope))
            except BudgetExceededError:
                break
            n += 1
        counts[name] = n
    assert counts[accountant] > counts["basic"] >= 1, counts
    with pytest.raises(LedgerError, match="accountant"):
        BudgetLedger(str(tmp_path / "basic.json"), str(tmp_path / "keys"), accountant=accountant).snapshot()


def test_a_broken_ledger_file_is_refused_not_replaced(tmp_path):
    (tmp_path / "ledger.json").write_text("{}")
    with pytest.raises(LedgerError, match="not a"):
        _ledger(tmp_path).reserve(_request())
    (tmp_path / "ledger.json").write_text("")
    with pytest.raises(LedgerError, match="not valid JSON"):
        _ledger(tmp_path).reserve(_request())
    assert (tmp_path / "ledger.json").read_text() == ""


def test_a_v1_ledger_is_read_with_its_charges_and_pinned_releases(tmp_path):
    v1 = {"format": "beam-dp-release/budget-ledger/v1", "accountant": "basic",
          "campaigns": {CAMPAIGN: {"total": {"epsilon": 3.0, "delta": 0.0},
                                   "per_period": {"epsilon": 1.0, "delta": 0.0}}},
          "latest": {f"{CAMPAIGN}/2026-11-20": f"{CAMPAIGN}/2026-11-20"},
          "releases": {f"{CAMPAIGN}/2026-11-20": {
              "release_id": f"{CAMPAIGN}/2026-11-20", "version": 1, "campaign": CAMPAIGN,
              "periods": ["2026-11-20"], "charges": [{"label": "impressions", "epsilon": 1.0}],
              "input_digest": "sha256:old", "state": "charged",
              "key_ref": {"uri": "/nowhere", "fingerprint": "ab"}}}}
    (tmp_path / "ledger.json").write_text(json.dumps(v1))
    with pytest.raises(LedgerError, match="python -m accounting.ledger migrate --ledger"):
        _ledger(tmp_path).snapshot()
    assert migrate_main(["migrate", "--ledger", str(tmp_path / "ledger.json"), "--key_store",
                         str(tmp_path / "keys")]) == 0
    ledger = _ledger(tmp_path)
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(1.0)
    with pytest.raises(ChangedInputError):  # charged under v1: pinned, not taken over
        ledger.reserve(_request(digest="sha256:new"))


# --------------------------------------------------------------------------- the record chain

def _edit(tmp_path, change):
    state = json.loads((tmp_path / "ledger.json").read_text())
    change(state)
    (tmp_path / "ledger.json").write_text(json.dumps(state))
    return (tmp_path / "ledger.json").read_bytes()


def _three_days(tmp_path) -> BudgetLedger:
    ledger = _ledger(tmp_path)
    for day in ("2026-11-20", "2026-11-21", "2026-11-22"):
        ledger.reserve(_request(day))
    return ledger


def _seq(state, day):
    return state["releases"][f"{CAMPAIGN}/{day}"]


@pytest.mark.parametrize("edit, names", [
    (lambda s: _seq(s, "2026-11-21")["measures"][0].update(epsilon=0.01),
     "record 2 (release 'c2026_fundraising_en/2026-11-21') was edited"),
    (lambda s: s["releases"].pop(f"{CAMPAIGN}/2026-11-21"),
     "record 3 (release 'c2026_fundraising_en/2026-11-22') comes where record 2 should be"),
    (lambda s: (_seq(s, "2026-11-20").update(seq=2), _seq(s, "2026-11-21").update(seq=1)),
     "record 1 (release 'c2026_fundraising_en/2026-11-21') does not follow the record before it"),
    (lambda s: s["releases"].pop(f"{CAMPAIGN}/2026-11-22"),
     "its head does not match its records and budgets (the chain ends with record 2"),
    (lambda s: s["scopes"][f"campaign:{CAMPAIGN}"].update(epsilon=30.0),
     "its head does not match"),
    (lambda s: _seq(s, "2026-11-20").update(seq=True), "record True"),
])
def test_a_hand_edit_is_refused_naming_the_record(tmp_path, edit, names):
    """A lowered spend, a deleted, reordered or last record removed, a raised budget: the ledger
    is refused when opened (naming the record), and a refused reservation leaves it as it was."""
    _three_days(tmp_path)
    edited = _edit(tmp_path, edit)
    with pytest.raises(LedgerError, match=re.escape(names)):
        _ledger(tmp_path).reserve(_request("2026-11-23"))
    assert (tmp_path / "ledger.json").read_bytes() == edited


def test_a_recomputed_chain_fails_only_the_mac(tmp_path):
    """Whoever edits on purpose can recompute every digest and the head, not the MAC (its key is
    in the key store): the ledger refuses it; a keyless reader (the catalog) sees a valid chain."""
    from accounting.ledger import chain

    _three_days(tmp_path)

    def forge(state):
        _seq(state, "2026-11-20")["measures"][0]["epsilon"] = 0.01
        chain.seal(state, os.urandom(32), state["chain"]["key"])

    _edit(tmp_path, forge)
    with pytest.raises(LedgerError, match="MAC does not verify"):
        _ledger(tmp_path).snapshot()
    assert migrate_main(["verify", "--ledger", str(tmp_path / "ledger.json")]) == 0
    assert migrate_main(["verify", "--ledger", str(tmp_path / "ledger.json"), "--key_store",
                         str(tmp_path / "keys")]) == 2


def test_the_chain_survives_state_changes_and_take_overs(tmp_path):
    """Records change after they are chained (publish, commit, re-runs, take-overs): every
    write re-seals, and the numbers stay those of the charges."""
    ledger = _three_days(tmp_path)
    [res] = ledger.reserve(_request("2026-11-21"))
    _published(ledger, res)
    ledger.reserve(_request("2026-11-22", digest="sha256:corrected"))  # a take-over
    state = ledger.snapshot()
    assert [r["seq"] for r in sorted(state["releases"].values(), key=lambda r: r["seq"])] == [1, 2, 3]
    assert _seq(state, "2026-11-21")["state"] == "committed"
    assert migrate_main(["verify", "--ledger", str(tmp_path / "ledger.json"), "--key_store",
                         str(tmp_path / "keys")]) == 0


def test_a_lost_chain_key_refuses_the_ledger_and_a_refusal_keeps_no_new_key(tmp_path):
    _three_days(tmp_path)
    [chain_key] = (tmp_path / "keys").glob("ledger-chain-*")
    chain_key.unlink()
    with pytest.raises(LedgerError, match="its chain key .* cannot be loaded \\(FileNotFoundError"):
        _ledger(tmp_path).reserve(_request("2026-11-23"))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(BudgetExceededError):  # a new ledger's first reservation refused
        _ledger(fresh).reserve(_request(eps=9.0))
    assert not (fresh / "ledger.json").exists()
    assert not (fresh / "keys").exists() or os.listdir(fresh / "keys") == []


def test_migrate_chains_an_older_ledger_once_and_refuses_a_stripped_one(tmp_path):
    from release_testkit import unchain

    _three_days(tmp_path)
    flags = ["--ledger", str(tmp_path / "ledger.json"), "--key_store", str(tmp_path / "keys")]
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "keys").mkdir()
    stripped = json.loads((tmp_path / "ledger.json").read_text())
    unchain(tmp_path / "ledger.json", tmp_path / "keys", "beam-dp-release/budget-ledger/v3")
    with pytest.raises(LedgerError, match="python -m accounting.ledger migrate --ledger"):
        _ledger(tmp_path).snapshot()
    assert migrate_main(["migrate", *flags]) == 0
    state = _ledger(tmp_path).snapshot()
    assert state["format"].endswith("/v4") and len(state["releases"]) == 3
    assert migrate_main(["migrate", *flags]) == 2  # chained already: nothing to do
    # a chained ledger whose chain was stripped (its chain key still in the key store)
    unchain(tmp_path / "ledger.json", tmp_path / "copy" / "keys", "beam-dp-release/budget-ledger/v3")
    before = (tmp_path / "ledger.json").read_bytes()
    with pytest.raises(LedgerError, match="the chain was removed by hand"):
        _ledger(tmp_path).snapshot()
    assert migrate_main(["migrate", *flags]) == 2
    assert (tmp_path / "ledger.json").read_bytes() == before
    assert stripped["chain"]["records"] == 3


# --------------------------------------------------------------------------- holds

def test_a_held_release_is_refused_until_its_run_ends(tmp_path):
    from accounting.ledger import ReleaseHeld, holds

    ledger = _ledger(tmp_path)
    first, second = holds.Hold.new(), holds.Hold.new()
    [res] = ledger.reserve(_request(), hold=first)
    before, keys = (tmp_path / "ledger.json").read_bytes(), _release_keys(tmp_path)
    for hold, digest in ((second, None), (second, "sha256:changed"), (None, None)):
        with pytest.raises(ReleaseHeld, match="is held by another run"):
            ledger.reserve(_request(digest=digest), hold=hold)
        assert (tmp_path / "ledger.json").read_bytes() == before
        assert _release_keys(tmp_path) == keys  # no key left by the refused run
    [again] = ledger.reserve(_request(), hold=first)  # its own run: not in its way
    assert again.resumed
    ledger.release_hold(first)
    assert "hold" not in ledger.get(f"{CAMPAIGN}/2026-11-20")
    [taken] = ledger.reserve(_request(digest="sha256:changed"), hold=second)
    assert taken.taken_over and ledger.get(f"{CAMPAIGN}/2026-11-20")["hold"]["run"] == second.run


def test_a_dead_or_lapsed_hold_is_not_in_the_way(tmp_path):
    from accounting.ledger import holds

    ledger = _ledger(tmp_path)
    process = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    process.start()
    process.join()
    dead = holds.Hold(run="dead", host=holds.host_id(), pid=process.pid,
                      started=holds._started(os.getpid()))
    ledger.reserve(_request(), hold=dead)
    assert not holds.is_live(ledger.get(f"{CAMPAIGN}/2026-11-20")["hold"])
    [res] = ledger.reserve(_request(), hold=holds.Hold.new())
    assert res.resumed
    lapsed = {"run": "x", "host": "elsewhere", "pid": 1, "started": "1",
              "since": "2026-01-01T00:00:00+00:00", "until": "2026-01-02T00:00:00+00:00"}
    assert not holds.is_live(lapsed) and holds.is_live({**lapsed, "until": "2999-01-01T00:00:00+00:00"})


def test_input_digest_covers_contents_and_config(tmp_path):
    def chunks(path):
        data = open(path, "rb").read()
        return len(data), iter([data[:3], data[3:]])

    (tmp_path / "a.csv").write_bytes(b"campaign_id\nc1\n")
    files = [str(tmp_path / "a.csv")]
    d = input_digest(files, {"k": 1}, open_chunks=chunks)
    assert d.startswith("sha256:") and d == input_digest(files, {"k": 1}, open_chunks=chunks)
    assert d != input_digest(files, {"k": 2}, open_chunks=chunks)
    (tmp_path / "a.csv").write_bytes(b"campaign_id\nc2\n")
    assert d != input_digest(files, {"k": 1}, open_chunks=chunks)


# --------------------------------------------------------------------------- GCS (emulator)

@pytest.fixture(scope="module")
def gcs_bucket():
    with storage_emulator("dp-ledger") as bucket:
        yield bucket


def _gcs_ledger(bucket, name):
    return BudgetLedger(f"gs://{bucket}/{name}/ledger.json", f"gs://{bucket}/{name}/keys")


def test_gcs_emulator_enforces_generation_preconditions(gcs_bucket):
    from google.api_core import exceptions
    from accounting import gcs

    blob = gcs.blob(f"gs://{gcs_bucket}/precondition/x")
    blob.upload_from_string(b"1", if_generation_match=0)
    with pytest.raises(exceptions.PreconditionFailed):
        gcs.blob(f"gs://{gcs_bucket}/precondition/x").upload_from_string(b"2", if_generation_match=0)
    assert gcs.blob(f"gs://{gcs_bucket}/precondition/x").download_as_bytes() == b"1"


def test_gcs_reserve_rerun_take_over_and_budget(gcs_bucket):
    ledger = _gcs_ledger(gcs_bucket, "basic")
    [first] = ledger.reserve(_request())
    assert first.key_refs["release"].uri.startswith(f"gs://{gcs_bucket}/basic/keys/")
    _published(ledger, first, f"gs://{gcs_bucket}/out/2026-11-20")
    [again] = _gcs_ledger(gcs_bucket, "basic").reserve(_request())
    assert again.resumed and again.committed and again.key == first.key
    with pytest.raises(ChangedInputError):
        ledger.reserve(_request(digest="sha256:v2"))
    with pytest.raises(BudgetExceededError, match="period"):
        ledger.reserve(_request(digest="sha256:v2"), new_release=True)
    [other] = ledger.reserve(_request("2026-11-21", digest="sha256:broken"))
    [fixed] = ledger.reserve(_request("2026-11-21", digest="sha256:fixed"))
    assert fixed.taken_over and ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(2.0)
    assert first.key.secret_bytes().hex() not in json.dumps(ledger.snapshot())


def test_gcs_stale_generation_write_is_rejected(gcs_bucket):
    uri = f"gs://{gcs_bucket}/conflict/ledger.json"
    ledger_a = BudgetLedger(uri, f"gs://{gcs_bucket}/conflict/keys")
    ledger_a.reserve(_request("2026-11-20"))
    writer_a = GcsStore(uri)
    data, generation = writer_a.read_with_generation()
    BudgetLedger(uri, f"gs://{gcs_bucket}/conflict/keys").reserve(_request("2026-11-21"))
    with pytest.raises(LedgerConflict):
        writer_a.write_if_generation(data, generation)
    assert len(ledger_a.records()) == 2


def test_gcs_concurrent_releases_exactly_the_budget_allowed_succeed(gcs_bucket):
    uri = f"gs://{gcs_bucket}/race/ledger.json"
    n = 6
    barrier = threading.Barrier(n)
    outcomes, ledgers = {}, []

    def run(day):
        ledger = BudgetLedger(uri, f"gs://{gcs_bucket}/race/keys")
        ledgers.append(ledger)
        barrier.wait()
        try:
            ledger.reserve(_request(day))
            outcomes[day] = "ok"
        except BudgetExceededError:
            outcomes[day] = "refused"
        except BaseException as err:
            outcomes[day] = repr(err)

    threads = [threading.Thread(target=run, args=(f"2026-12-{10 + i}",)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes.values()) == ["ok"] * 3 + ["refused"] * 3, outcomes
    assert sum(ledger._store.conflicts for ledger in ledgers) >= 1
    ledger = BudgetLedger(uri, f"gs://{gcs_bucket}/race/keys")
    assert len(ledger.records()) == 3
    assert ledger.spent(f"campaign:{CAMPAIGN}").epsilon == pytest.approx(3.0)
