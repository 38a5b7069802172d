"""Integrity over time (issue 40): a ledger only this toolkit could have written, in its latest
state; one key, one use across processes; operator commands for holds and orphans
(accounting/ledger/witness.py, operations.py, __main__.py; accounting/keystore.py).

Local ledgers and ``gs://`` ones on the GCS emulator (tests/gcs_emulator.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from gcs_emulator import storage_emulator

from accounting import gcs
from accounting.budget import PrivacyBudget
from accounting.keys import KeyReuseError, ReleaseKey
from accounting.keystore import KeyOutsideStore, KeyRef, KeyStore
from accounting.ledger import BudgetLedger, LedgerError, ReleaseRequest, Scope, chain, holds
from accounting.ledger import operations, witness
from accounting.ledger.__main__ import main as ledger_main
from accounting.measures import Measure

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _request(day: str, digest: str = "", **kw) -> ReleaseRequest:
    measure = Measure(name="count", mechanism="laplace", epsilon=0.5, delta=0.0,
                      neighbouring="add/remove one unit")
    return ReleaseRequest(release_id=f"pv/{day}", measures=[measure],
                          input_digest=digest or f"sha256:{day}",
                          scopes=[Scope(name="total", budget=PrivacyBudget(epsilon=10.0))], **kw)


def _ledger(root) -> BudgetLedger:
    return BudgetLedger(str(root / "ledger.json"), str(root / "keys"))


def _cli(root, *args) -> int:
    return ledger_main([args[0], "--ledger", str(root / "ledger.json"),
                        "--key_store", str(root / "keys"), *args[1:]])


def _edit(root, change) -> None:
    path = root / "ledger.json"
    state = json.loads(path.read_text())
    change(state)
    path.write_text(json.dumps(state))


# --------------------------------------------------------------------------- resealed

def test_a_ledger_resealed_with_a_key_outside_the_key_store_is_refused(tmp_path):
    """Someone who can write only the ledger deletes a record, recomputes the chain and MACs the
    head with a key of their own, stored where the job can read it: refused, nothing charged."""
    ledger = _ledger(tmp_path)
    for day in ("d1", "d2"):
        ledger.reserve(_request(day))
    attacker = tmp_path / "elsewhere"
    attacker.mkdir()
    key = ReleaseKey.generate()
    state = json.loads((tmp_path / "ledger.json").read_text())
    name = f"ledger-chain-{state['ledger_id']}.{key.fingerprint()}.key"
    key.save(str(attacker / name))

    def reseal(state):
        del state["releases"]["pv/d2"], state["latest"]["pv/d2"]
        chain.seal(state, key.secret_bytes(), {"uri": str(attacker / name),
                                               "fingerprint": key.fingerprint()})

    _edit(tmp_path, reseal)
    before = (tmp_path / "ledger.json").read_bytes()
    with pytest.raises(LedgerError, match="chain key outside the key store"):
        _ledger(tmp_path).reserve(_request("d2"))
    assert (tmp_path / "ledger.json").read_bytes() == before
    assert _cli(tmp_path, "verify") == 2
    assert ledger_main(["verify", "--ledger", str(tmp_path / "ledger.json")]) == 0  # chain alone


def test_every_key_the_ledger_names_is_resolved_in_the_key_store_under_its_own_name(tmp_path):
    store = KeyStore(str(tmp_path / "keys"))
    key = ReleaseKey.generate()
    ref = store.save(key, "pv/d1", issued_for="pv/d1")
    assert store.resolve(ref, "pv/d1") == ref
    for other in (KeyRef(uri=str(tmp_path / "x" / os.path.basename(ref.uri)), fingerprint=ref.fingerprint),
                  KeyRef(uri="gs://elsewhere/keys/" + os.path.basename(ref.uri), fingerprint=ref.fingerprint),
                  KeyRef(uri=ref.uri.replace("pv_d1", "pv_d2"), fingerprint=ref.fingerprint)):
        with pytest.raises(KeyOutsideStore, match="never used"):
            store.resolve(other, "pv/d1")
    with pytest.raises(KeyOutsideStore):
        store.resolve(ref, "pv/d2")  # its own file, but not the key of that release

    # A record naming a release key elsewhere (sealed as if by the toolkit): refused, exit 2.
    ledger = _ledger(tmp_path)
    ledger.reserve(_request("d1"))
    copy = tmp_path / "copy.key"
    record_ref = json.loads((tmp_path / "ledger.json").read_text())["releases"]["pv/d1"]["keys"]["release"]
    copy.write_bytes(open(record_ref["uri"], "rb").read())

    def point_elsewhere(state):
        state["releases"]["pv/d1"]["keys"]["release"]["uri"] = str(copy)
        secret = ledger._sealing.secret(state["chain"]["key"], state["ledger_id"])
        witness.advance(state)  # as the toolkit would write it: past the witness by one
        chain.seal(state, secret, state["chain"]["key"])

    _edit(tmp_path, point_elsewhere)
    with pytest.raises(LedgerError, match=r"its key .*copy.key cannot be loaded .*never used"):
        _ledger(tmp_path).reserve(_request("d1"))


# --------------------------------------------------------------------------- rollback

def _refusal(call):
    """The LedgerError text ``call`` raises, or None (an assertion, not pytest.raises, so that
    the mutation suite counts an accepted rollback as caught)."""
    try:
        call()
    except LedgerError as err:
        return str(err)
    return None


def test_a_rolled_back_ledger_is_refused_and_a_deliberate_restore_is_recorded(tmp_path, capsys):
    ledger = _ledger(tmp_path)
    ledger.reserve(_request("d1"))
    backup = (tmp_path / "ledger.json").read_bytes()
    ledger.reserve(_request("d2", consumes=()))
    (tmp_path / "ledger.json").write_bytes(backup)  # an older copy, chain and MAC valid
    refusal = _refusal(lambda: _ledger(tmp_path).reserve(_request("d2")))
    assert refusal is not None and ("at write 1, its witness at write 2: an older copy was "
                                    "restored (rolled back)") in refusal, refusal
    assert "python -m accounting.ledger restore" in refusal
    assert (tmp_path / "ledger.json").read_bytes() == backup  # nothing charged
    assert _cli(tmp_path, "verify") == 2

    capsys.readouterr()
    assert _cli(tmp_path, "restore", "--reason", "disk lost; restored the nightly backup") == 0
    assert "accepted in place of write 2; recorded" in capsys.readouterr().out
    state = _ledger(tmp_path).snapshot()
    [entry] = state["restores"]
    assert entry["reason"].startswith("disk lost") and entry["replaced"]["writes"] == 2
    assert entry["restored"]["writes"] == 1 and state["writes"] == 3  # past the witness
    assert _cli(tmp_path, "verify") == 0
    [again] = _ledger(tmp_path).reserve(_request("d2"))  # charged afresh, on the restored state
    assert not again.resumed
    # and the restore itself cannot be rolled back either
    restored = (tmp_path / "ledger.json").read_bytes()
    _ledger(tmp_path).reserve(_request("d3"))
    (tmp_path / "ledger.json").write_bytes(restored)
    with pytest.raises(LedgerError, match="rolled back"):
        _ledger(tmp_path).snapshot()


def test_a_witness_update_that_was_interrupted_leaves_the_ledger_one_write_ahead(tmp_path,
                                                                                 monkeypatch):
    ledger = _ledger(tmp_path)
    ledger.reserve(_request("d1"))
    real = KeyStore.write_record

    def full(self, name, data, *, generation):
        raise OSError(28, "No space left on device", name)

    monkeypatch.setattr(KeyStore, "write_record", full)
    ledger.reserve(_request("d2"))  # the ledger is written, its witness is not
    monkeypatch.setattr(KeyStore, "write_record", real)
    assert _ledger(tmp_path).snapshot()["writes"] == 2  # one ahead, following it: accepted
    _ledger(tmp_path).reserve(_request("d3"))  # and the next write brings the witness up to date
    found = json.loads(next((tmp_path / "keys").glob("ledger-witness-*")).read_text())
    assert found["writes"] == 3

    # two writes without their witness do not follow it: refused
    monkeypatch.setattr(KeyStore, "write_record", full)
    for day in ("d4", "d5"):
        _ledger(tmp_path).reserve(_request(day))
    monkeypatch.setattr(KeyStore, "write_record", real)
    with pytest.raises(LedgerError, match="does not follow it"):
        _ledger(tmp_path).snapshot()


def test_a_missing_witness_is_refused_and_an_empty_one_is_repaired(tmp_path):
    ledger = _ledger(tmp_path)
    for day in ("d1", "d2"):
        ledger.reserve(_request(day))
    path = next((tmp_path / "keys").glob("ledger-witness-*"))
    path.write_bytes(b"")  # an interrupted write (a file system without atomic renames)
    _ledger(tmp_path).reserve(_request("d3"))
    assert json.loads(path.read_text())["writes"] == 3  # written again
    path.unlink()
    with pytest.raises(LedgerError, match="its witness is missing"):
        _ledger(tmp_path).snapshot()


@pytest.fixture(scope="module")
def gcs_bucket():
    with storage_emulator("dp-integrity") as bucket:
        yield bucket


def test_on_gcs_a_rollback_is_refused_and_a_restore_accepted(gcs_bucket):
    base = f"gs://{gcs_bucket}/rollback"
    ledger = BudgetLedger(f"{base}/ledger.json", f"{base}/keys")
    ledger.reserve(_request("d1"))
    backup = gcs.blob(f"{base}/ledger.json").download_as_bytes()
    ledger.reserve(_request("d2"))
    latest = gcs.blob(f"{base}/ledger.json").download_as_bytes()
    gcs.blob(f"{base}/ledger.json").upload_from_string(backup)
    refusal = _refusal(lambda: BudgetLedger(f"{base}/ledger.json", f"{base}/keys").reserve(
        _request("d2")))
    assert refusal is not None and "rolled back" in refusal, refusal
    assert ledger_main(["verify", "--ledger", f"{base}/ledger.json", "--key_store",
                        f"{base}/keys"]) == 2
    gcs.blob(f"{base}/ledger.json").upload_from_string(latest)  # the latest bytes, copied back
    [again] = BudgetLedger(f"{base}/ledger.json", f"{base}/keys").reserve(_request("d2"))
    assert again.resumed  # the same content is the latest state (a new object generation)
    gcs.blob(f"{base}/ledger.json").upload_from_string(backup)
    assert ledger_main(["restore", "--ledger", f"{base}/ledger.json", "--key_store",
                        f"{base}/keys", "--reason", "restored on purpose"]) == 0
    [fresh] = BudgetLedger(f"{base}/ledger.json", f"{base}/keys").reserve(_request("d2"))
    assert not fresh.resumed


# --------------------------------------------------------------------------- one key, one use

def _in_another_process(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})


def test_two_processes_one_key_the_second_is_refused_for_anything_else(tmp_path):
    """A key the ledger issued is bound in the key store to its release and input: a second
    process (here: a copy of the ledger restored elsewhere, asking for the key on another input)
    is refused; the same release and input (a re-run) is not."""
    ledger = _ledger(tmp_path)
    [day1] = ledger.reserve(_request("d1", "sha256:input-1"))
    ref = day1.key_refs["release"]
    code = f"""
        from accounting.keys import KeyReuseError
        from accounting.keystore import KeyRef, KeyStore
        store = KeyStore({str(tmp_path / "keys")!r})
        ref = KeyRef(uri={ref.uri!r}, fingerprint={ref.fingerprint!r})
        key = store.load(ref)
        binding = {f"{day1.ledger_id}/pv/d1/release"!r}
        store.bind_use(key, ref, release="pv/d1", input_digest="sha256:input-1", binding=binding)
        print("re-run: bound")
        for release, digest in (("pv/d1", "sha256:input-2"), ("pv/d2", "sha256:input-1")):
            try:
                store.bind_use(key, ref, release=release, input_digest=digest, binding=binding)
                print("LEAK", release, digest)
            except KeyReuseError as err:
                print("refused:", str(err).split(":")[0])
    """
    result = _in_another_process(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["re-run: bound",
                                          f"refused: the key {ref.uri} drives release 'pv/d1' on input sha256",
                                          f"refused: the key {ref.uri} was issued for release 'pv/d1', not 'pv/d2'"]


def test_a_key_store_issued_key_is_bound_to_its_release_and_input_in_every_process(tmp_path):
    store = KeyStore(str(tmp_path / "keys"))
    key, ref = store.issue("pageviews/2024-05-01", input_digest="sha256:day1")
    with pytest.raises(KeyReuseError, match="was issued for release"):
        store.load(ref).claim("count")  # loaded from its file it drives nothing
    code = f"""
        from accounting.keys import KeyReuseError
        from accounting.keystore import KeyRef, KeyStore
        store = KeyStore({str(tmp_path / "keys")!r})
        ref = KeyRef(uri={ref.uri!r}, fingerprint={ref.fingerprint!r})
        store.use(ref, release="pageviews/2024-05-01", input_digest="sha256:day1").claim("count")
        print("re-run of day 1: drives it")
        for release, digest in (("pageviews/2024-05-02", "sha256:day2"),
                                ("pageviews/2024-05-01", "sha256:day2")):
            try:
                store.use(ref, release=release, input_digest=digest)
                print("LEAK")
            except KeyReuseError:
                print("refused", release, digest)
    """
    result = _in_another_process(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["re-run of day 1: drives it",
                                          "refused pageviews/2024-05-02 sha256:day2",
                                          "refused pageviews/2024-05-01 sha256:day2"]


def test_an_interrupted_use_record_is_repaired_not_taken_for_another_use(tmp_path):
    ledger = _ledger(tmp_path)
    [day1] = ledger.reserve(_request("d1"))
    record = ledger.key_store.use_record_uri(day1.key_refs["release"])
    with open(record, "wb"):
        pass  # emptied: a write interrupted on a file system without atomic renames
    [again] = _ledger(tmp_path).reserve(_request("d1"))
    assert again.resumed and json.loads(open(record).read())["input_digest"] == "sha256:d1"


# --------------------------------------------------------------------------- operator commands

def test_holds_lists_and_ends_the_hold_of_a_dead_host_recorded(tmp_path, capsys):
    ledger = _ledger(tmp_path)
    elsewhere = holds.Hold(run="far", host="worker-7/boot-1", pid=4242, started="1")
    ledger.reserve(_request("d1"), hold=elsewhere)
    here = holds.Hold.new()
    ledger.reserve(_request("d2"), hold=here)
    assert _cli(tmp_path, "holds") == 0
    out = capsys.readouterr().out
    assert "hold pv/d1: run far on worker-7 (pid 4242)" in out and "live" in out
    assert f"hold pv/d2: run {here.run}" in out
    with pytest.raises(LedgerError, match="held by another run"):
        _ledger(tmp_path).reserve(_request("d1"), hold=holds.Hold.new())
    assert _cli(tmp_path, "holds", "--end", "far", "--reason", "worker-7 was deleted") == 2
    assert "known to be dead (--host_dead)" in capsys.readouterr().err
    assert _cli(tmp_path, "holds", "--end", here.run, "--host_dead", "--reason", "x") == 2
    assert "still runs" in capsys.readouterr().err  # this host's live process: never ended
    assert _cli(tmp_path, "holds", "--end", "far", "--host_dead", "--reason",
                "worker-7 was deleted") == 0
    [entry] = _ledger(tmp_path).snapshot()["operations"]
    assert entry["command"] == "end-hold" and entry["releases"] == ["pv/d1"]
    assert entry["host"] == "worker-7/boot-1" and entry["reason"] == "worker-7 was deleted"
    _ledger(tmp_path).reserve(_request("d1"), hold=holds.Hold.new())  # no longer in the way


def test_orphans_lists_and_deletes_only_what_no_reserved_or_published_release_needs(tmp_path,
                                                                                   capsys):
    ledger = _ledger(tmp_path)
    [first] = ledger.reserve(_request("d1", "sha256:a"))
    [taken] = ledger.reserve(_request("d1", "sha256:b"))  # a take-over: a fresh key
    assert taken.taken_over
    [published] = ledger.reserve(_request("d2"))
    ledger.begin_publish(published)
    ledger.commit(published, "/out/pv/d2/v1")
    stray = ledger.key_store.save(ReleaseKey.generate(), "pv/d9", issued_for="pv/d9")  # a crash
    library, _ = KeyStore(str(tmp_path / "keys")).issue("library/day")
    staging = tmp_path / "staging"
    for folder in ("pv/d1/v1.0badc0de", "pv/d2/v1.0123abcd", "pv/d7/v1.deadbeef", "pv/d2/v1"):
        (staging / folder).mkdir(parents=True)
        (staging / folder / "x.csv").write_text("1")
    assert _cli(tmp_path, "orphans", "--staging_dir", str(staging)) == 0
    out = capsys.readouterr().out.splitlines()
    keys = sorted(line.split()[2].rstrip(":") for line in out if line.startswith("orphan key"))
    assert keys == sorted([first.key_refs["release"].uri, stray.uri])
    folders = sorted(line.split()[2].rstrip(":") for line in out if line.startswith("orphan staging"))
    assert folders == [str(staging / "pv/d2/v1.0123abcd"), str(staging / "pv/d7/v1.deadbeef")]
    assert _cli(tmp_path, "orphans", "--staging_dir", str(staging), "--delete") == 0
    assert not os.path.exists(first.key_refs["release"].uri) and not os.path.exists(stray.uri)
    for ref in (taken.key_refs["release"], published.key_refs["release"]):
        assert os.path.exists(ref.uri)
    assert len(list((tmp_path / "keys").glob("library_day.*.key"))) == 1
    assert (staging / "pv/d1/v1.0badc0de").exists() and (staging / "pv/d2/v1").exists()
    assert not (staging / "pv/d2/v1.0123abcd").exists()
    _ledger(tmp_path).reserve(_request("d1", "sha256:b"))  # the reserved release still works
    assert operations.orphans(_ledger(tmp_path), str(staging)) == []


def test_on_gcs_orphans_lists_and_deletes_keys_and_staging_never_a_reserved_release(gcs_bucket,
                                                                                   capsys):
    """The same command on a ``gs://`` ledger, key store and staging (folders are prefixes of
    object names): a refused reservation's key and a stray key, the staging attempts of a
    release with no record and of a committed one are listed and deleted; the reserved
    release's key and attempt, the published release's key and KeyStore.issue's key stay."""
    base = f"gs://{gcs_bucket}/orphans"
    ledger_uri, keys = f"{base}/ledger.json", f"{base}/keys"
    ledger = BudgetLedger(ledger_uri, keys)
    [first] = ledger.reserve(_request("d1", "sha256:a"))
    [taken] = ledger.reserve(_request("d1", "sha256:b"))  # a take-over: first's key replaced
    [published] = ledger.reserve(_request("d2"))
    ledger.begin_publish(published)
    ledger.commit(published, "/out/pv/d2/v1")
    stray = ledger.key_store.save(ReleaseKey.generate(), "pv/d9", issued_for="pv/d9")
    KeyStore(keys).issue("library/day")
    staging = f"{base}/staging"
    for folder in ("pv/d1/v1.0badc0de", "pv/d2/v1.0123abcd", "pv/d7/v1.deadbeef", "pv/d2/v1"):
        for name in ("x.csv", "part/y.csv"):
            gcs.blob(f"{staging}/{folder}/{name}").upload_from_string(b"1")
    argv = ["orphans", "--ledger", ledger_uri, "--key_store", keys, "--staging_dir", staging]
    assert ledger_main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    listed = sorted(line.split()[2].rstrip(":") for line in out if line.startswith("orphan "))
    assert listed == sorted([first.key_refs["release"].uri, stray.uri,
                             f"{staging}/pv/d2/v1.0123abcd", f"{staging}/pv/d7/v1.deadbeef"])
    assert ledger_main(argv + ["--delete"]) == 0
    left = gcs.list_objects(f"{base}/")
    assert first.key_refs["release"].uri not in left and stray.uri not in left
    assert taken.key_refs["release"].uri in left and published.key_refs["release"].uri in left
    assert any("library_day." in u and u.endswith(".key") for u in left)
    assert [u for u in left if u.startswith(f"{staging}/")] == [
        f"{staging}/pv/d1/v1.0badc0de/part/y.csv", f"{staging}/pv/d1/v1.0badc0de/x.csv",
        f"{staging}/pv/d2/v1/part/y.csv", f"{staging}/pv/d2/v1/x.csv"]
    assert operations.orphans(BudgetLedger(ledger_uri, keys), staging) == []


def test_the_witness_module_names_its_parts():
    state = {"writes": 4, "chain": {"head": "sha256:h"}, "previous_head": "sha256:g"}
    assert witness.position(state) == {"writes": 4, "head": "sha256:h", "previous_head": "sha256:g"}
    witness.advance(state)
    assert state["writes"] == 5 and state["previous_head"] == "sha256:h"
    charge = witness.charge_position(state)
    assert {k: charge[k] for k in ("writes", "after_head")} == {"writes": 6, "after_head": "sha256:h"}
    assert len(charge["charge"]) == 32 and charge["charge"] != witness.charge_position(state)["charge"]
