"""The budget ledger's state machine: reserve, (take over), publish, commit.

Every real release of every job goes through it (the release layer, ``pipelines/release``):

1. ``reserve([requests])`` checks every scope's budget, stores fresh secret keys in the key store
   and records each release as ``reserved`` -- all before any output exists, and all or nothing:
   a run that releases several things (campaigns, measures) is charged for all of them in one
   ledger transaction or for none.
2. The job computes into private staging with the reservation's keys.
3. ``begin_publish`` pins the record (``publishing``); the release layer publishes atomically.
4. ``commit`` records the published files (``committed``).

A release may be submitted by one process and finished by another (``--submit_only`` /
``--finalize``, :mod:`pipelines.release.lifecycle`): ``record_submission`` keeps the job's handle
with the reservation, ``find`` finds the reservation again without charging, and ``claim`` lets
two processes finishing the same release take turns.

Rules, and why they are sound:

* **Re-run on the same input** (same digest) returns the existing record and keys and spends
  nothing: the outputs reproduce byte for byte, so nothing new is revealed.
* **Take-over.** A ``reserved`` record published nothing. A later run may take it over on
  *changed* input (a corrected file has a new digest) with *fresh* keys and without spending
  again: the privacy loss of a release is the loss of what is published, and what is published
  comes from exactly one computation, the last one, whose input and key the record now holds.
  The earlier computation's outputs never left private staging (the release layer deletes
  them), and only the operator saw its error. The charge stays, and the record keeps the
  history. The release plan may change in a take-over (corrected parameters) if it still fits.
* **Changed input after publication** is refused (:class:`ChangedInputError`): reusing the key
  would put the old noise on new values and leak their difference. ``new_release=True`` charges
  a new version (``release_id#2``, ...) with fresh keys.
* **Parameters belong to a release**: the same id and input with different measures or scopes
  is refused once publication has started.
* **Content released once**: a request with a ``content_key`` (a digest of e.g. a set of
  reports, independent of file names and labels) is refused if another release id holds it.
* **Ids consumed once** (:mod:`~accounting.ledger.consumed_check`): checked and recorded inside
  the charge's transaction, against every other release's consumed-id records.
* **Budgets per scope** (:mod:`~accounting.ledger.budgets`): every record, reserved ones too,
  counts against its scopes; a recorded budget is raised only deliberately.
* Testing keys are never stored, and a reservation is never refunded.
* **Refused means unchanged**: every refusal of ``reserve`` leaves the ledger byte for byte as
  it was and no key behind -- the keys a re-run needs are loaded inside the transaction, before
  anything changes (a deleted or unreadable key file refuses the re-run, naming it), and fresh
  keys are deleted again unless the ledger written references them.
* **One run at a time per release** (:mod:`~accounting.ledger.holds`): another run reserving a
  release a live run holds is refused before anything is charged or stored.
* **Tamper-evident** (:mod:`~accounting.ledger.chain`, :mod:`~accounting.ledger.sealing`):
  every write chains the records and MACs the head; every read verifies them, naming the record.
"""
from __future__ import annotations

import json
import time
from typing import Mapping, Optional, Sequence, Union

from accounting import guarantee
from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.keystore import KeyRef, KeyStore
from accounting.ledger import budgets, chain, holds, witness
from accounting.ledger.consumed_check import CONSUMED_SUFFIX, ConsumedCheck
from accounting.ledger.records import (COMMITTED, PUBLISHING, RESERVED, ChangedInputError,
                                       ContentAlreadyReleased, LedgerError, ReleaseRequest,
                                       Reservation, Scope, empty_state, now, versioned_id)
from accounting.ledger.reservation_keys import ReservationKeys, bind, load_key
from accounting.ledger.sealing import Sealing
from accounting.ledger.stores import LedgerConflict, files_beside, store_for


class BudgetLedger:
    """The budget ledger at ``path`` (local file or ``gs://bucket/object``); see the module doc.

    ``key_store`` holds the release keys (a :class:`KeyStore` or its root path/URI).
    ``accountant`` is one of ``accounting.guarantee.ACCOUNTANTS``; it is fixed when the ledger is
    created.
    """

    def __init__(self, path: str, key_store: Union[KeyStore, str], *, accountant: str = "basic",
                 max_attempts: int = 100):
        if not isinstance(path, str) or not path:
            raise ValueError(f"ledger path must be a non-empty path or gs:// URI, got {path!r}")
        self.accountant = guarantee.check_accountant(accountant)
        self.key_store = key_store if isinstance(key_store, KeyStore) else KeyStore(key_store)
        self._store = store_for(path, max_attempts)
        self.path = getattr(self._store, "path", None) or getattr(self._store, "uri")
        self._files = files_beside(self._store, CONSUMED_SUFFIX)
        self._sealing = Sealing(self.key_store, self.path)
        self._witness = witness.Witness(self.key_store, self.path)

    # ----------------------------------------------------------------- (de)serialisation

    def _parse(self, data: Optional[bytes]) -> dict:
        """The verified state (sealing.Sealing.read), checked against its witness (the latest
        state this toolkit wrote: :mod:`~accounting.ledger.witness`), or a new empty one for no
        data."""
        if data is None:
            return empty_state(self.accountant)
        state = self._sealing.read(data)
        self._witness.check(state, getattr(self._store, "read_generation", None),
                            changed=lambda: self._store.read() != data)
        if state.get("accountant") != self.accountant:
            raise LedgerError(f"ledger {self.path} counts budgets with accountant "
                                f"{state.get('accountant')!r}, this run asked for "
                                f"{self.accountant!r}; the accountant of a ledger cannot change")
        return state

    def _dump(self, state: dict) -> bytes:
        state["updated_at"] = now()
        witness.advance(state)
        self._sealing.seal(state)
        self._witness.sealed(state)
        return (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8")

    def _transact(self, update):
        """The store's transaction, the witness updated inside it, with the chain key of a new
        ledger settled after it."""
        try:
            result = self._store.transact(update, written=self._witness.written)
        except BaseException:
            self._witness.discard()
            self._sealing.settle(written=False)
            raise
        self._sealing.settle(written=True)
        return result

    def snapshot(self) -> dict:
        """The whole ledger as a dict (a consistent read; an empty new one if it does not exist)."""
        return self._read()[1]

    def _read(self) -> tuple[Optional[bytes], dict]:
        """The ledger's bytes and verified state, read again when another writer replaced it
        while it was checked against its witness."""
        for _ in range(5):
            data = self._store.read()
            try:
                return data, self._parse(data)
            except LedgerConflict:
                continue
        raise LedgerConflict(f"ledger {self.path} keeps changing while it is read")

    def exists(self) -> bool:
        return self._store.read() is not None

    def ledger_id(self) -> Optional[str]:
        """The ledger's id, or None if the ledger does not exist yet."""
        data, state = self._read()
        return None if data is None else state["ledger_id"]

    # ----------------------------------------------------------------- queries

    def records(self) -> list[dict]:
        return list(self.snapshot()["releases"].values())

    def get(self, release_id: str, version: Optional[int] = None) -> Optional[dict]:
        """The record of ``release_id`` (its latest version unless ``version`` is given)."""
        state = self.snapshot()
        vid = state["latest"].get(release_id) if version is None else versioned_id(release_id, version)
        return None if vid is None else state["releases"].get(vid)

    def scope_budget(self, scope: str) -> Optional[PrivacyBudget]:
        data = self.snapshot()["scopes"].get(scope)
        return None if data is None else PrivacyBudget(epsilon=data["epsilon"], delta=data["delta"])

    def spent(self, scope: str) -> EpsDelta:
        """Composed spend of ``scope`` (reserved, publishing and committed records alike)."""
        return budgets.spent(self.snapshot(), scope, self.accountant)

    # ----------------------------------------------------------------- budgets

    def set_budget(self, scope: Scope, *, allow_increase: bool = False) -> None:
        """Record ``scope``'s budget; raising a recorded budget needs ``allow_increase``."""
        def update(data):
            state = self._parse(data)
            budgets.apply_budget(state, scope, allow_increase)
            return None, self._dump(state)

        self._transact(update)

    # ----------------------------------------------------------------- reserve

    def reserve(self, requests: Union[ReleaseRequest, Sequence[ReleaseRequest]], *,
                new_release: bool = False,
                hold: Optional[holds.Hold] = None) -> list[Reservation]:
        """Charge every request (or find the ones already charged for their input); all or nothing.

        See the module docstring for the rules. ``hold``: the run's hold on its releases
        (:mod:`~accounting.ledger.holds`), released with :meth:`release_hold`. Returns one
        :class:`Reservation` per request, in order; raises a :class:`LedgerError` (nothing
        charged, no key or consumed-id record left behind, the ledger unchanged) otherwise --
        :class:`~accounting.ledger.records.ReleaseHeld` when another live run holds one of them.
        """
        requests = [requests] if isinstance(requests, ReleaseRequest) else list(requests)
        if not requests or not all(isinstance(r, ReleaseRequest) for r in requests):
            raise ValueError("reserve needs ReleaseRequests")
        ids = [r.release_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"one run cannot reserve a release id twice: {ids}")
        keys = ReservationKeys(self.key_store)
        ids_check = ConsumedCheck(self)

        def update(data):
            state = self._parse(data)
            ids_check.begin(state)
            outcomes = [self._decide(state, request, new_release, keys, ids_check, hold)
                        for request in requests]
            ids_check.end(state)
            return (outcomes, state["ledger_id"]), self._dump(state)

        try:
            ids_check.prehash(requests)
            outcomes, ledger_id = self._transact(update)
        except BaseException:
            keys.abandon()
            ids_check.abandon()
            raise
        keys.settle(outcomes)
        ids_check.done()
        out = []
        for (kind, record), request in zip(outcomes, requests):
            out.append(self._reservation(kind, record, ledger_id, keys.of(record, kind),
                                         consumed=ids_check.results.get(request.release_id, {})))
        return out

    def _reservation(self, kind: str, record: dict, ledger_id: str,
                     keys: Optional[dict] = None, consumed: Optional[dict] = None) -> Reservation:
        """The :class:`Reservation` of ``record`` with its keys (loaded from the key store unless
        given), each bound to the record in the key store and in this process
        (:func:`~accounting.ledger.reservation_keys.bind`: a second process using it for
        anything else is refused), and the consumed-id decisions of this reservation (none for a
        reservation found again, :meth:`find`)."""
        refs = {name: KeyRef.from_json(ref) for name, ref in record["keys"].items()}
        if keys is None:
            keys = {name: load_key(self.key_store, record, name) for name in refs}
        keys = {name: bind(self.key_store, key, refs[name], ledger_id, record, name)
                for name, key in keys.items()}
        return Reservation(release_id=record["release_id"], version=record["version"],
                             versioned_id=record["versioned_id"], keys=keys, key_refs=refs,
                             record=record, ledger_id=ledger_id,
                             resumed=kind == "existing", taken_over=kind == "takeover",
                             state=record["state"], consumed=consumed or {})

    def release_hold(self, hold: holds.Hold) -> None:
        """End ``hold`` on every record it holds (a run calls this when it ends, whatever the
        outcome; a hold left by a killed run lapses, see holds)."""
        def update(data):
            if data is None:
                return None, None
            state = self._parse(data)
            held = [r for r in state["releases"].values()
                    if (r.get("hold") or {}).get("run") == hold.run]
            for record in held:
                del record["hold"]
            return None, (self._dump(state) if held else None)

        self._transact(update)

    def _decide(self, state: dict, request: ReleaseRequest, new_release: bool,
                keys: ReservationKeys, ids_check: ConsumedCheck,
                hold: Optional[holds.Hold]) -> tuple[str, dict]:
        """The request's outcome ("new", "existing" or "takeover") and its record, held by
        the run (a release another live run holds is refused first)."""
        latest_vid = state["latest"].get(request.release_id)
        latest = state["releases"].get(latest_vid) if latest_vid else None
        if latest is not None:
            holds.check(latest, hold)
        kind, record = self._outcome(state, request, new_release, latest, keys, ids_check)
        holds.take(record, hold)
        return kind, record

    def _outcome(self, state: dict, request: ReleaseRequest, new_release: bool,
                 latest: Optional[dict], keys: ReservationKeys, ids_check: ConsumedCheck):
        rid = request.release_id
        latest_vid = None if latest is None else latest["versioned_id"]
        measures = request.measures_json()
        scopes = [s.name for s in request.scopes]
        if latest is not None and latest["input_digest"] == request.input_digest and not new_release:
            if latest["measures"] != measures or budgets.scope_names(latest) != scopes:
                if latest["state"] != RESERVED:
                    raise LedgerError(
                        f"release {latest_vid!r} was charged for other measures or scopes; a "
                        "release's privacy parameters cannot change once publication started "
                        "(new_release charges a new version)")
                return "takeover", self._take_over(state, latest, request, keys, ids_check)
            self._check_content(state, request, latest_vid)
            keys.load(latest)  # before anything changes: a key that cannot be loaded refuses
            ids_check.rerun(state, request, latest)
            latest["runs"] += 1
            latest["last_run_at"] = now()
            return "existing", latest
        if latest is not None and latest["state"] == RESERVED:
            # Nothing of it was published: take it over (with --new_release too: never charge twice).
            return "takeover", self._take_over(state, latest, request, keys, ids_check)
        if latest is not None and not new_release:
            raise ChangedInputError(
                f"release {latest_vid!r} was published for input {latest['input_digest']}; the "
                f"input is now {request.input_digest}. Re-using its key on changed input would "
                "leak the difference: charge a new version with a fresh key (new_release)")
        self._check_content(state, request, None)
        budgets.check_budgets(state, request, None, self.accountant)
        version = 1 if latest is None else latest["version"] + 1
        vid = versioned_id(rid, version)
        consumed = ids_check.check(state, request, vid, exclude=None)
        at = now()
        record = {
            "release_id": rid, "version": version, "versioned_id": vid, "measures": measures,
            "scopes": scopes, "input_digest": request.input_digest,
            "keys": keys.fresh(request), "content_key": request.content_key,
            "state": RESERVED, "output_path": None, "files": {}, "charged_at": at,
            "publishing_at": None, "committed_at": None, "last_run_at": at, "runs": 1,
            "supersedes": latest_vid, "takeovers": [], "metadata": json.loads(json.dumps(
                dict(request.metadata))), chain.SEQ: chain.next_seq(state),
            "charged_under": witness.charge_position(state),
        }
        if consumed:
            record["consumed"] = consumed
        state["releases"][vid] = record
        state["latest"][rid] = vid
        if request.content_key:
            state["content"][request.content_key] = vid
        return "new", record

    def _check_content(self, state: dict, request: ReleaseRequest, own: Optional[str]) -> None:
        if not request.content_key:
            return
        holder = state["content"].get(request.content_key)
        if holder is not None and holder != own:
            raise ContentAlreadyReleased(
                f"release {request.release_id!r}: the same content ({request.content_key}) was "
                f"already charged as release {holder!r}; content is released once, under any id")

    def _take_over(self, state: dict, record: dict, request: ReleaseRequest, keys: ReservationKeys,
                   ids_check: ConsumedCheck) -> dict:
        vid = record["versioned_id"]
        self._check_content(state, request, vid)
        budgets.check_budgets(state, request, vid, self.accountant)
        consumed = ids_check.check(state, request, vid, exclude=vid)
        record["takeovers"].append({"at": now(), "input_digest": record["input_digest"],
                                    "key_fingerprints": {n: k["fingerprint"]
                                                         for n, k in record["keys"].items()},
                                    "measures_changed": record["measures"] != request.measures_json()})
        if record.get("content_key") and state["content"].get(record["content_key"]) == vid:
            del state["content"][record["content_key"]]
        ids_check.replaced(record.pop("consumed", None))
        if consumed:
            record["consumed"] = consumed  # the failed run's consumed ids are replaced
        record.update(measures=request.measures_json(), scopes=[s.name for s in request.scopes],
                      input_digest=request.input_digest, keys=keys.fresh(request),
                      content_key=request.content_key, last_run_at=now(),
                      runs=record["runs"] + 1, charged_under=witness.charge_position(state),
                      metadata=json.loads(json.dumps(dict(request.metadata))))
        if request.content_key:
            state["content"][request.content_key] = vid
        return record

    # ----------------------------------------------------------------- publish / commit

    def _update_record(self, reservation: Reservation, change) -> dict:
        if not isinstance(reservation, Reservation):
            raise ValueError("needs the Reservation returned by reserve()")

        def update(data):
            state = self._parse(data)
            record = state["releases"].get(reservation.versioned_id)
            if record is None:
                raise LedgerError(f"release {reservation.versioned_id!r} is not in ledger {self.path}")
            expected = {n: r.fingerprint for n, r in reservation.key_refs.items()}
            if {n: k["fingerprint"] for n, k in record["keys"].items()} != expected:
                raise LedgerError(f"the reservation for {reservation.versioned_id!r} does not match "
                                    "the ledger record (its keys changed: taken over by another run)")
            changed = change(record)
            return record, (self._dump(state) if changed else None)

        return self._transact(update)

    def begin_publish(self, reservation: Reservation) -> dict:
        """Pin the record before any byte is published: from here on its key and input are fixed."""
        def change(record):
            if record["state"] != RESERVED:
                return False
            record["state"], record["publishing_at"] = PUBLISHING, now()
            return True

        return self._update_record(reservation, change)

    def commit(self, reservation: Reservation, output_path: str,
               files: Optional[Mapping[str, str]] = None) -> dict:
        """Record the published release (its location and each file's digest)."""
        if not isinstance(output_path, str) or not output_path:
            raise ValueError(f"output_path must be a non-empty string, got {output_path!r}")
        files = dict(files or {})

        def change(record):
            if record["state"] == RESERVED:
                raise LedgerError(f"release {record['versioned_id']!r} was never published "
                                    "(begin_publish first)")
            if record["state"] == COMMITTED and record["output_path"] == output_path \
                    and record["files"] == files:
                return False
            record.update(state=COMMITTED, output_path=output_path, files=files,
                          committed_at=now())
            return True

        return self._update_record(reservation, change)

    # ----------------------------------------------------------------- submitted releases

    def record_submission(self, reservation: Reservation, handle: Mapping) -> dict:
        """Record with the reservation the handle of the job that computes it (``submission``:
        the runner, its job id and state, the staging attempt), and the fingerprints of the keys
        it computes with, so that another process can finish the release (:meth:`find`). A
        later submission replaces it. Spends nothing."""
        handle = json.loads(json.dumps(dict(handle)))
        fingerprints = {n: r.fingerprint for n, r in reservation.key_refs.items()}

        def change(record):
            record["submission"] = {**handle, "key_fingerprints": fingerprints,
                                    "submitted_at": now()}
            return True

        return self._update_record(reservation, change)

    def find(self, requests: Sequence[ReleaseRequest]) -> list[Reservation]:
        """The reservations the ``requests`` already hold, one per request in order, with their
        keys; nothing is charged or written. Each release's latest record must be for the same
        input digest, measures and scopes, else :class:`LedgerError` names it (a changed input
        is :class:`ChangedInputError`)."""
        state = self.snapshot()
        out = []
        for request in requests:
            vid = state["latest"].get(request.release_id)
            record = state["releases"].get(vid) if vid else None
            if record is None:
                raise LedgerError(f"release {request.release_id!r} has no record in ledger "
                                    f"{self.path}")
            if record["input_digest"] != request.input_digest:
                raise ChangedInputError(
                    f"release {vid!r} was reserved for input {record['input_digest']}; the "
                    f"input is now {request.input_digest}")
            if record["measures"] != request.measures_json() or \
                    budgets.scope_names(record) != [s.name for s in request.scopes]:
                raise LedgerError(f"release {vid!r} was reserved for other measures or scopes")
            out.append(self._reservation("existing", record, state["ledger_id"]))
        return out

    def claim(self, reservation: Reservation, token: str, seconds: float, *,
              replacing: Optional[str] = None) -> Optional[dict]:
        """Hold the finishing of a submitted release for ``seconds`` under ``token`` (``0``:
        let go of it), so that two processes finishing it at once take turns. Returns None when
        held (or let go), else the other holder's claim (``token``, ``until`` in seconds since
        the epoch, ``host``, ``pid``), which may be taken while it lasts only by naming it in
        ``replacing`` (its holder is known to be gone)."""
        found = []

        def change(record):
            changed, other = holds.claim_finalizing(record, token, seconds, replacing, time.time())
            if other is not None:
                found.append(other)
            return changed

        self._update_record(reservation, change)
        return found[0] if found else None
