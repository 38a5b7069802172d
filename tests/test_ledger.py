"""The budget ledger: local file (flock + atomic replace) and GCS (generation preconditions).

GCS tests run against ``gcp-storage-emulator`` started in-process on a free port
(``tests/gcs_emulator.py``), which adds the documented GCS rule for ``ifGenerationMatch`` on
object inserts that the emulator itself ignores. The ledger code is unchanged.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading

import numpy as np
import pytest
from gcs_emulator import storage_emulator

from accounting.calibration import NoiseKind, calibrate, calibrate_zcdp
from accounting.keystore import KeyRef, KeyStore
from accounting.ledger import (BudgetExceededError, BudgetLedger, Budget, CampaignBudget, Charge,
                               ChangedInputError, LedgerConflict, LedgerError, _GcsStore,
                               input_digest, release_id_for)
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise

CAMPAIGN = "c2026_fundraising_en"
BUDGET = CampaignBudget(total=Budget(3.0, 0.0), per_period=Budget(1.0, 0.0))


def _ledger(tmp_path, **kw) -> BudgetLedger:
    return BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys"), **kw)


def _charge(eps=1.0):
    return [Charge(eps * 0.5, label="impressions"), Charge(eps * 0.5, label="clicks")]


def _release_outputs(key: ReleaseKey) -> bytes:
    """What a release writes: noisy counts drawn from the release key (as the pipeline does)."""
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=0.5, l1_sensitivity=100)
    keys = [(CAMPAIGN, "banner_a", country, "en.wikipedia", "2026-11-20") for country in ("DE", "FR", "US")]
    values = np.array([123456, 789, 0], dtype=np.int64)
    return add_noise(spec, values, RandomStreams.for_keys(key, "impressions", keys)).tobytes()


# --------------------------------------------------------------------------- local ledger

def test_record_commit_and_no_secret_in_ledger(tmp_path):
    ledger = _ledger(tmp_path)
    rid = release_id_for(CAMPAIGN, "2026-11-20")
    res = ledger.begin(rid, _charge(), "sha256:aaa", campaign=CAMPAIGN, periods=["2026-11-20"],
                       budget=BUDGET, metadata={"k": 100})
    assert not res.resumed and not res.committed and res.version == 1 and res.versioned_id == rid
    record = ledger.get(rid)
    assert record["state"] == "charged" and record["output_path"] is None
    assert record["charges"] == [c.to_json() for c in _charge()]
    assert record["campaign"] == CAMPAIGN and record["periods"] == ["2026-11-20"]
    assert record["input_digest"] == "sha256:aaa" and record["metadata"] == {"k": 100}
    assert record["key_ref"]["fingerprint"] == res.key.fingerprint() and record["charged_at"]
    # The key lives in the key store as a 0600 file; the ledger holds only its reference.
    key_path = record["key_ref"]["uri"]
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    assert KeyStore(str(tmp_path / "keys")).load(KeyRef.from_json(record["key_ref"])) == res.key
    ledger_text = (tmp_path / "ledger.json").read_text()
    assert res.key.secret_bytes().hex() not in ledger_text

    done = ledger.commit(res, "/out/2026-11-20")
    assert done["state"] == "committed" and done["output_path"] == "/out/2026-11-20"
    assert done["committed_at"] >= done["charged_at"]
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(1.0)
    assert ledger.spent(CAMPAIGN, "2026-11-20").epsilon == pytest.approx(1.0)
    assert ledger.spent(CAMPAIGN, "2026-11-21").epsilon == 0


def test_refuses_over_campaign_budget_before_anything_is_written(tmp_path):
    ledger = _ledger(tmp_path)
    for day in ("2026-11-20", "2026-11-21", "2026-11-22"):
        ledger.commit(ledger.begin(release_id_for(CAMPAIGN, day), _charge(), f"sha256:{day}",
                                   campaign=CAMPAIGN, periods=[day], budget=BUDGET), f"/out/{day}")
    before = (tmp_path / "ledger.json").read_bytes()
    keys_before = sorted(os.listdir(tmp_path / "keys"))
    with pytest.raises(BudgetExceededError, match="over the campaign budget") as err:
        ledger.begin(release_id_for(CAMPAIGN, "2026-11-23"), _charge(), "sha256:x",
                     campaign=CAMPAIGN, periods=["2026-11-23"], budget=BUDGET)
    assert err.value.scope == f"campaign:{CAMPAIGN}"
    assert (tmp_path / "ledger.json").read_bytes() == before
    assert sorted(os.listdir(tmp_path / "keys")) == keys_before  # no orphan key left behind
    # Another campaign has its own budget.
    ledger.begin(release_id_for("other", "2026-11-23"), _charge(), "sha256:x", campaign="other",
                 periods=["2026-11-23"], budget=BUDGET)


def test_refuses_over_period_budget(tmp_path):
    ledger = _ledger(tmp_path)
    ledger.begin("c/2026-11-20/desktop", _charge(0.6), "sha256:1", campaign=CAMPAIGN,
                 periods=["2026-11-20"], budget=BUDGET)
    with pytest.raises(BudgetExceededError, match="per-period budget") as err:
        ledger.begin("c/2026-11-20/mobile", _charge(0.6), "sha256:2", campaign=CAMPAIGN,
                     periods=["2026-11-20"], budget=BUDGET)
    assert err.value.scope == f"period:{CAMPAIGN}:2026-11-20"
    ledger.begin("c/2026-11-20/mobile", _charge(0.4), "sha256:2", campaign=CAMPAIGN,
                 periods=["2026-11-20"], budget=BUDGET)
    # A per-campaign release covering several days is checked against each of them.
    with pytest.raises(BudgetExceededError, match="2026-11-20"):
        ledger.begin("c/campaign", _charge(0.1), "sha256:3", campaign=CAMPAIGN,
                     periods=["2026-11-19", "2026-11-20"], budget=BUDGET)
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(1.0)


def test_idempotent_rerun_reuses_key_and_spends_nothing(tmp_path):
    ledger = _ledger(tmp_path)
    rid = release_id_for(CAMPAIGN, "2026-11-20")
    args = dict(campaign=CAMPAIGN, periods=["2026-11-20"], budget=BUDGET)
    first = ledger.begin(rid, _charge(), "sha256:same", **args)
    out_first = _release_outputs(first.key)
    ledger.commit(first, "/out/a")
    again = _ledger(tmp_path).begin(rid, _charge(), "sha256:same", **args)
    assert again.resumed and again.committed and again.versioned_id == rid
    assert again.key == first.key and again.key_ref == first.key_ref
    assert _release_outputs(again.key) == out_first  # byte-for-byte reproduction
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(1.0)
    assert len(ledger.records()) == 1 and ledger.get(rid)["runs"] == 2
    assert len(os.listdir(tmp_path / "keys")) == 1
    # Same id and input with different privacy parameters is not a re-run.
    with pytest.raises(LedgerError, match="privacy parameters cannot change"):
        ledger.begin(rid, _charge(0.5), "sha256:same", **args)


def test_changed_input_refused_unless_new_release(tmp_path):
    ledger = _ledger(tmp_path)
    rid = release_id_for(CAMPAIGN, "2026-11-20")
    args = dict(campaign=CAMPAIGN, budget=CampaignBudget(Budget(3.0), Budget(2.0)))
    first = ledger.begin(rid, _charge(), "sha256:old", periods=["2026-11-20"], **args)
    ledger.commit(first, "/out/v1")
    with pytest.raises(ChangedInputError, match="new_release=True"):
        ledger.begin(rid, _charge(), "sha256:new", periods=["2026-11-20"], **args)
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(1.0)
    second = ledger.begin(rid, _charge(), "sha256:new", periods=["2026-11-20"], new_release=True, **args)
    assert second.version == 2 and second.versioned_id == rid + "#2" and not second.resumed
    assert second.key_ref.fingerprint != first.key_ref.fingerprint
    assert _release_outputs(second.key) != _release_outputs(first.key)
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(2.0)
    assert ledger.get(rid)["versioned_id"] == rid + "#2" and ledger.get(rid, 1)["state"] == "committed"
    assert ledger.get(rid)["supersedes"] == rid
    # The new version is now the one re-runs find.
    assert ledger.begin(rid, _charge(), "sha256:new", periods=["2026-11-20"], **args).resumed


def _crash_after_charge(ledger_path, keys_path, release_id):
    ledger = BudgetLedger(ledger_path, keys_path)
    ledger.begin(release_id, _charge(), "sha256:crash", campaign=CAMPAIGN, periods=["2026-11-20"],
                 budget=BUDGET)
    os._exit(17)  # dies after charging, before writing outputs or committing


def test_crash_between_charge_and_commit_then_resume(tmp_path):
    rid = release_id_for(CAMPAIGN, "2026-11-20")
    proc = multiprocessing.get_context("fork").Process(
        target=_crash_after_charge, args=(str(tmp_path / "ledger.json"), str(tmp_path / "keys"), rid))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 17
    ledger = _ledger(tmp_path)
    record = ledger.get(rid)
    assert record["state"] == "charged"  # stays spent: noise may have been drawn
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(1.0)
    res = ledger.begin(rid, _charge(), "sha256:crash", campaign=CAMPAIGN, periods=["2026-11-20"],
                       budget=BUDGET)
    assert res.resumed and not res.committed
    assert res.key.fingerprint() == record["key_ref"]["fingerprint"]
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(1.0)
    assert ledger.commit(res, "/out/resumed")["state"] == "committed"


def _race(ledger_path, keys_path, day, barrier, results):
    ledger = BudgetLedger(ledger_path, keys_path)
    barrier.wait()
    try:
        ledger.begin(release_id_for(CAMPAIGN, day), _charge(), f"sha256:{day}", campaign=CAMPAIGN,
                     periods=[day], budget=BUDGET)
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
    assert sorted(r["periods"][0] for r in ledger.records()) == sorted(
        d for d, o in outcomes.items() if o == "ok")
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(3.0)
    assert len(os.listdir(tmp_path / "keys")) == 3


def test_testing_keys_refused(tmp_path):
    ledger = _ledger(tmp_path)
    with pytest.raises(LedgerError, match="testing key"):
        ledger.begin("r", _charge(), "sha256:1", campaign=CAMPAIGN, periods=["d"], budget=BUDGET,
                     key=ReleaseKey.for_testing(7))
    assert not (tmp_path / "ledger.json").exists()
    with pytest.raises(ValueError, match="testing key"):
        KeyStore(str(tmp_path / "keys")).save(ReleaseKey.for_testing(7), "r")
    # An operator-supplied secret key is accepted and stored.
    own = ReleaseKey.generate()
    assert ledger.begin("r", _charge(), "sha256:1", campaign=CAMPAIGN, periods=["d"], budget=BUDGET,
                        key=own).key == own


def test_key_fingerprint_checked_on_load(tmp_path):
    store = KeyStore(str(tmp_path / "keys"))
    ref = store.save(ReleaseKey.generate(), "r")
    with pytest.raises(ValueError, match="fingerprint"):
        store.load(KeyRef(ref.uri, "0" * 16))


def test_budget_increase_needs_set_budget(tmp_path):
    ledger = _ledger(tmp_path)
    ledger.begin("a", _charge(), "sha256:1", campaign=CAMPAIGN, periods=["d1"], budget=BUDGET)
    bigger = CampaignBudget(Budget(10.0), Budget(1.0))
    with pytest.raises(LedgerError, match="allow_increase"):
        ledger.begin("b", _charge(), "sha256:2", campaign=CAMPAIGN, periods=["d2"], budget=bigger)
    ledger.set_budget(CAMPAIGN, bigger, allow_increase=True)
    ledger.begin("b", _charge(), "sha256:2", campaign=CAMPAIGN, periods=["d2"], budget=bigger)
    # A lower budget is accepted (more conservative) and binds from now on.
    smaller = CampaignBudget(Budget(2.5), Budget(1.0))
    with pytest.raises(BudgetExceededError):
        ledger.begin("c", _charge(), "sha256:3", campaign=CAMPAIGN, periods=["d3"], budget=smaller)
    assert ledger.snapshot()["campaigns"][CAMPAIGN]["total"]["epsilon"] == 10.0  # refusal writes nothing
    ledger.begin("c", _charge(0.5), "sha256:3", campaign=CAMPAIGN, periods=["d3"], budget=smaller)
    assert ledger.snapshot()["campaigns"][CAMPAIGN]["total"]["epsilon"] == 2.5


def test_zcdp_accountant_composes_rho(tmp_path):
    # Per day: impressions pure eps=0.2 + clicks Gaussian rho=0.005; campaign budget (2, 1e-6).
    clicks = Charge.from_spec(calibrate_zcdp(NoiseKind.GAUSSIAN, rho=0.005, l2_sensitivity=1,
                                             delta_for_reporting=1e-7), "clicks")
    assert clicks.rho == 0.005 and clicks.delta == 1e-7
    budget = CampaignBudget(Budget(2.0, 1e-6))
    # Basic composition counts each day as (0.2 + 0.48, 1e-7): 2 days fit; zCDP composes the
    # rhos and converts once: 4 days fit (1.70 <= 2 < 2.01).
    for accountant, expected in (("basic", 2), ("zcdp", 4)):
        ledger = BudgetLedger(str(tmp_path / f"{accountant}.json"), str(tmp_path / "keys"),
                              accountant=accountant)
        ok = 0
        for day in range(6):
            try:
                ledger.begin(f"r{day}", [Charge(0.2, label="impressions"), clicks], "sha256:1",
                             campaign=CAMPAIGN, periods=[f"d{day}"], budget=budget)
                ok += 1
            except BudgetExceededError:
                break
        assert ok == expected, accountant
    with pytest.raises(LedgerError, match="accountant"):
        BudgetLedger(str(tmp_path / "zcdp.json"), str(tmp_path / "keys")).records()


def test_input_digest(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_bytes(b"x" * 3_000_000)
    (tmp_path / "in" / "b.csv").write_bytes(b"campaign_id\nc1\n")
    config = {"k": 100, "epsilon": 1.0}
    d = input_digest([str(tmp_path / "in")], config, chunk_size=1 << 16)
    assert d.startswith("sha256:") and len(d) == 71
    assert d == input_digest([str(tmp_path / "in" / "*.csv")], {"epsilon": 1.0, "k": 100})
    assert d != input_digest([str(tmp_path / "in")], {"k": 50, "epsilon": 1.0})
    (tmp_path / "in" / "b.csv").write_bytes(b"campaign_id\nc2\n")
    assert d != input_digest([str(tmp_path / "in")], config)
    with pytest.raises(FileNotFoundError, match="missing"):
        input_digest([str(tmp_path / "missing")], config)


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


def test_gcs_record_rerun_changed_input_and_budget(gcs_bucket):
    ledger = _gcs_ledger(gcs_bucket, "basic")
    rid = release_id_for(CAMPAIGN, "2026-11-20")
    args = dict(campaign=CAMPAIGN, periods=["2026-11-20"], budget=BUDGET)
    first = ledger.begin(rid, _charge(), "sha256:v1", **args)
    assert first.key_ref.uri.startswith(f"gs://{gcs_bucket}/basic/keys/")
    ledger.commit(first, f"gs://{gcs_bucket}/out/2026-11-20")
    again = _gcs_ledger(gcs_bucket, "basic").begin(rid, _charge(), "sha256:v1", **args)
    assert again.resumed and again.committed and again.key == first.key
    assert _release_outputs(again.key) == _release_outputs(first.key)
    with pytest.raises(ChangedInputError):
        ledger.begin(rid, _charge(), "sha256:v2", **args)
    with pytest.raises(BudgetExceededError, match="per-period"):
        ledger.begin(rid, _charge(), "sha256:v2", new_release=True, **args)
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(1.0)
    record = ledger.get(rid)
    assert record["state"] == "committed" and record["output_path"].endswith("2026-11-20")
    assert first.key.secret_bytes().hex() not in json.dumps(ledger.snapshot())
    with pytest.raises(LedgerError, match="testing key"):
        ledger.begin("t", _charge(), "sha256:t", campaign=CAMPAIGN, periods=["x"], budget=BUDGET,
                     key=ReleaseKey.for_testing(1))


def test_gcs_crash_between_charge_and_commit_then_resume(gcs_bucket):
    rid = release_id_for(CAMPAIGN, "2026-11-21")
    args = dict(campaign=CAMPAIGN, periods=["2026-11-21"], budget=BUDGET)
    crashed = _gcs_ledger(gcs_bucket, "crash").begin(rid, _charge(), "sha256:c", **args)
    del crashed  # the run dies here: no outputs, no commit
    ledger = _gcs_ledger(gcs_bucket, "crash")
    assert ledger.get(rid)["state"] == "charged"
    res = ledger.begin(rid, _charge(), "sha256:c", **args)
    assert res.resumed and not res.committed
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(1.0)
    assert ledger.commit(res, "gs://out/x")["state"] == "committed"


def test_gcs_stale_generation_write_is_rejected(gcs_bucket):
    uri = f"gs://{gcs_bucket}/conflict/ledger.json"
    ledger_a = BudgetLedger(uri, f"gs://{gcs_bucket}/conflict/keys")
    ledger_a.begin("r1", _charge(), "sha256:1", campaign=CAMPAIGN, periods=["d1"], budget=BUDGET)
    writer_a = _GcsStore(uri)
    data, generation = writer_a.read_with_generation()
    # Writer B commits a release in between ...
    BudgetLedger(uri, f"gs://{gcs_bucket}/conflict/keys").begin(
        "r2", _charge(), "sha256:2", campaign=CAMPAIGN, periods=["d2"], budget=BUDGET)
    # ... so A's write based on the old generation must fail and leave B's record in place.
    with pytest.raises(LedgerConflict):
        writer_a.write_if_generation(data, generation)
    assert {r["release_id"] for r in ledger_a.records()} == {"r1", "r2"}


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
            ledger.begin(release_id_for(CAMPAIGN, day), _charge(), f"sha256:{day}",
                         campaign=CAMPAIGN, periods=[day], budget=BUDGET)
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
    # The writers really raced: some writes hit a stale generation and were retried.
    assert sum(ledger._store.conflicts for ledger in ledgers) >= 1
    ledger = BudgetLedger(uri, f"gs://{gcs_bucket}/race/keys")
    assert len(ledger.records()) == 3
    assert ledger.spent(CAMPAIGN).epsilon == pytest.approx(3.0)


def test_gcs_input_digest_matches_local(gcs_bucket, tmp_path):
    from accounting import gcs

    files = {"impressions/part-0.csv": b"a,b\n1,2\n" * 1000, "impressions/part-1.csv": b"z" * 70_000}
    for name, content in files.items():
        (tmp_path / name.split("/")[1]).write_bytes(content)
        gcs.blob(f"gs://{gcs_bucket}/digest/{name}").upload_from_string(content)
    config = {"campaign": CAMPAIGN}
    local = input_digest([str(tmp_path)], config)
    assert input_digest([f"gs://{gcs_bucket}/digest/impressions/"], config, chunk_size=1 << 15) == local
    assert input_digest([f"gs://{gcs_bucket}/digest/impressions/part-*.csv"], config) == local
    with pytest.raises(FileNotFoundError):
        input_digest([f"gs://{gcs_bucket}/digest/nothing.csv"], config)
