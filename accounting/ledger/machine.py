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
* **Ids consumed once** (:mod:`~accounting.ledger.consumed`): a request's ``consumes`` are
  checked, inside the same transaction as its charge, against the consumed-id records of every
  other release (reserved ones included: they may publish any time; earlier versions of the same
  release id too: a new version must not aggregate the same reports again) and recorded with it.
  An id another release holds refuses the request (:class:`ConsumedIdsError`: how many, and
  which releases), unless the request skips such ids -- then they are not recorded and the job
  removes their rows. Budgeted namespaces grant each id what is left of its budget. A re-run
  reads its decision back from its own record (so it reproduces); a take-over replaces the
  record's consumed ids; a published record's ids are permanent.
* **Budgets per scope**: a scope's budget is recorded on first use; a lower budget later is
  accepted (more conservative), a higher one refused unless raised with :meth:`set_budget`.
  A reserved record counts against its scopes like a published one (it may publish any time).
* Testing keys are never stored, and a reservation is never refunded.
* **Refused means unchanged**: every refusal of ``reserve`` leaves the ledger byte for byte as
  it was and no key behind -- the keys a re-run needs are loaded inside the transaction, before
  anything changes (a deleted or unreadable key file refuses the re-run, naming it), and fresh
  keys are deleted again unless the ledger written references them.
* **One run at a time per release** (:mod:`~accounting.ledger.holds`): a run holds the
  releases it reserved until it ends; another run reserving one of them meanwhile is refused
  (:class:`~accounting.ledger.records.ReleaseHeld`) before anything is charged or stored.
* **Tamper-evident** (:mod:`~accounting.ledger.chain`, :mod:`~accounting.ledger.sealing`):
  every write chains the records and MACs the head under the ledger's chain key (in the key
  store); every read verifies them, so a lowered spend, a deleted or reordered record or a
  raised budget is refused, naming the record. A ledger of an older version is refused until
  migrated once (``python -m accounting.ledger migrate``).

Composition of a scope's measures is :func:`accounting.guarantee.compose` with the ledger's
accountant (fixed when the ledger is created), at the scope budget's delta.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from accounting import guarantee
from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.keys import ReleaseKey
from accounting.keystore import KeyRef, KeyStore
from accounting.ledger import consumed as C
from accounting.ledger import records as R
from accounting.ledger import chain, holds
from accounting.ledger.sealing import Sealing, error_text
from accounting.ledger.stores import LedgerConflict, files_beside, store_for
from accounting.measures import Measure


def _bound(key: ReleaseKey, ledger_id: str, record: dict, name: str) -> ReleaseKey:
    """A reservation's key, bound to its release version and input digest in a new session: a
    re-run of the same input in this process reproduces the release (it may claim the key's
    purposes again); nothing else can draw from it (accounting.keys, "One secret, one use")."""
    label = record["release_id"] if name == "release" else f"{record['release_id']}/{name}"
    return key.bound(f"{ledger_id}/{record['versioned_id']}/{name}@{record['input_digest']}",
                     issued_for=label)


#: Where the consumed-id records live: a folder (or gs:// prefix) beside the ledger document.
CONSUMED_SUFFIX = ".consumed"
#: The key-store label of the ledger's consumed-id hashing key.
CONSUMED_KEY_LABEL = "ledger-consumed-ids"


def _scope_names(record: dict) -> list:
    return list(record.get("scopes", []))


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

    # ----------------------------------------------------------------- (de)serialisation

    def _parse(self, data: Optional[bytes]) -> dict:
        """The verified state (sealing.Sealing.read), or a new empty one for no data."""
        if data is None:
            return R.empty_state(self.accountant)
        state = self._sealing.read(data)
        if state.get("accountant") != self.accountant:
            raise R.LedgerError(f"ledger {self.path} counts budgets with accountant "
                                f"{state.get('accountant')!r}, this run asked for "
                                f"{self.accountant!r}; the accountant of a ledger cannot change")
        return state

    def _dump(self, state: dict) -> bytes:
        state["updated_at"] = R.now()
        self._sealing.seal(state)
        return (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8")

    def _transact(self, update):
        """The store's transaction, with the chain key of a new ledger settled after it."""
        try:
            result = self._store.transact(update)
        except BaseException:
            self._sealing.settle(written=False)
            raise
        self._sealing.settle(written=True)
        return result

    def snapshot(self) -> dict:
        """The whole ledger as a dict (a consistent read; an empty new one if it does not exist)."""
        return self._parse(self._store.read())

    def exists(self) -> bool:
        return self._store.read() is not None

    def ledger_id(self) -> Optional[str]:
        """The ledger's id, or None if the ledger does not exist yet."""
        data = self._store.read()
        return None if data is None else self._parse(data)["ledger_id"]

    # ----------------------------------------------------------------- queries

    def records(self) -> list[dict]:
        return list(self.snapshot()["releases"].values())

    def get(self, release_id: str, version: Optional[int] = None) -> Optional[dict]:
        """The record of ``release_id`` (its latest version unless ``version`` is given)."""
        state = self.snapshot()
        vid = state["latest"].get(release_id) if version is None else R.versioned_id(release_id, version)
        return None if vid is None else state["releases"].get(vid)

    def scope_budget(self, scope: str) -> Optional[PrivacyBudget]:
        data = self.snapshot()["scopes"].get(scope)
        return None if data is None else PrivacyBudget(epsilon=data["epsilon"], delta=data["delta"])

    @staticmethod
    def _measures(state: dict, scope: str, exclude: Optional[str] = None) -> list[Measure]:
        out = []
        for vid, record in state["releases"].items():
            if vid != exclude and scope in _scope_names(record):
                out.extend(Measure.from_json(m) for m in record["measures"])
        return out

    def spent(self, scope: str) -> EpsDelta:
        """Composed spend of ``scope`` (reserved, publishing and committed records alike)."""
        state = self.snapshot()
        measures = self._measures(state, scope)
        budget = state["scopes"].get(scope)
        delta = budget["delta"] if budget else None
        if not measures:
            return EpsDelta(0.0, 0.0)
        return guarantee.fits(measures, budget["epsilon"] if budget else float("inf"),
                              delta if delta is not None else guarantee.default_delta(measures),
                              self.accountant)[1]

    # ----------------------------------------------------------------- budgets

    def set_budget(self, scope: R.Scope, *, allow_increase: bool = False) -> None:
        """Record ``scope``'s budget; raising a recorded budget needs ``allow_increase``."""
        def update(data):
            state = self._parse(data)
            self._apply_budget(state, scope, allow_increase)
            return None, self._dump(state)

        self._transact(update)

    @staticmethod
    def _apply_budget(state: dict, scope: R.Scope, allow_increase: bool) -> None:
        old = state["scopes"].get(scope.name)
        new = {"epsilon": scope.budget.epsilon, "delta": scope.budget.delta}
        if old is not None and not allow_increase and \
                (new["epsilon"] > old["epsilon"] or new["delta"] > old["delta"]):
            raise R.LedgerError(
                f"scope {scope.name!r} has a recorded budget (epsilon={old['epsilon']:g}, "
                f"delta={old['delta']:g}); the requested (epsilon={new['epsilon']:g}, "
                f"delta={new['delta']:g}) is larger. Raise it deliberately with "
                "BudgetLedger.set_budget(scope, allow_increase=True)")
        state["scopes"][scope.name] = new

    def _check_budgets(self, state: dict, request: R.ReleaseRequest,
                       exclude: Optional[str]) -> None:
        """Refuse ``request`` if a scope would exceed its budget. ``state`` already holds the
        records accepted earlier in the same transaction (all-or-nothing reservations)."""
        for scope in request.scopes:
            self._apply_budget(state, scope, allow_increase=False)
            limit = state["scopes"][scope.name]
            before = self._measures(state, scope.name, exclude)
            ok, total = guarantee.fits(before + list(request.measures), limit["epsilon"],
                                       limit["delta"], self.accountant)
            if ok:
                continue
            spent = guarantee.fits(before, limit["epsilon"], limit["delta"], self.accountant)[1]
            raise R.BudgetExceededError(
                f"scope {scope.name!r}: spent (epsilon={spent.epsilon:g}, delta={spent.delta:g}); "
                f"release {request.release_id!r} would bring it to (epsilon={total.epsilon:g}, "
                f"delta={total.delta:g}), over its budget (epsilon={limit['epsilon']:g}, "
                f"delta={limit['delta']:g}). Nothing was charged.",
                scope=scope.name, spent=spent, requested=total,
                budget=PrivacyBudget(epsilon=limit["epsilon"], delta=limit["delta"]))

    # ----------------------------------------------------------------- reserve

    def reserve(self, requests: Union[R.ReleaseRequest, Sequence[R.ReleaseRequest]], *,
                new_release: bool = False,
                hold: Optional[holds.Hold] = None) -> list[R.Reservation]:
        """Charge every request (or find the ones already charged for their input); all or nothing.

        See the module docstring for the rules. ``hold``: the run's hold on its releases
        (:mod:`~accounting.ledger.holds`), released with :meth:`release_hold`. Returns one
        :class:`Reservation` per request, in order; raises a :class:`LedgerError` (nothing
        charged, no key or consumed-id record left behind, the ledger unchanged) otherwise --
        :class:`~accounting.ledger.records.ReleaseHeld` when another live run holds one of them.
        """
        requests = [requests] if isinstance(requests, R.ReleaseRequest) else list(requests)
        if not requests or not all(isinstance(r, R.ReleaseRequest) for r in requests):
            raise ValueError("reserve needs ReleaseRequests")
        ids = [r.release_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"one run cannot reserve a release id twice: {ids}")
        keys = _Keys(self, hold)
        ids_check = _ConsumedCheck(self)

        def update(data):
            state = self._parse(data)
            ids_check.begin(state)
            outcomes = [self._decide(state, request, new_release, keys, ids_check)
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
                     keys: Optional[dict] = None, consumed: Optional[dict] = None) -> R.Reservation:
        """The :class:`Reservation` of ``record`` with its keys (loaded from the key store unless
        given), bound to the record (:func:`_bound`), and the consumed-id decisions of this
        reservation (none for a reservation found again, :meth:`find`)."""
        refs = {name: KeyRef.from_json(ref) for name, ref in record["keys"].items()}
        if keys is None:
            keys = {name: self.key_store.load(ref) for name, ref in refs.items()}
        keys = {name: _bound(key, ledger_id, record, name) for name, key in keys.items()}
        return R.Reservation(release_id=record["release_id"], version=record["version"],
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

    def _decide(self, state: dict, request: R.ReleaseRequest, new_release: bool, keys: "_Keys",
                ids_check: "_ConsumedCheck") -> tuple[str, dict]:
        """The request's outcome ("new", "existing" or "takeover") and its record, held by
        the run (a release another live run holds is refused first)."""
        latest_vid = state["latest"].get(request.release_id)
        latest = state["releases"].get(latest_vid) if latest_vid else None
        if latest is not None:
            keys.check_hold(latest)
        kind, record = self._outcome(state, request, new_release, latest, keys, ids_check)
        keys.hold(record)
        return kind, record

    def _outcome(self, state: dict, request: R.ReleaseRequest, new_release: bool,
                 latest: Optional[dict], keys: "_Keys", ids_check: "_ConsumedCheck"):
        rid = request.release_id
        latest_vid = None if latest is None else latest["versioned_id"]
        measures = request.measures_json()
        scopes = [s.name for s in request.scopes]
        if latest is not None and latest["input_digest"] == request.input_digest and not new_release:
            if latest["measures"] != measures or _scope_names(latest) != scopes:
                if latest["state"] != R.RESERVED:
                    raise R.LedgerError(
                        f"release {latest_vid!r} was charged for other measures or scopes; a "
                        "release's privacy parameters cannot change once publication started "
                        "(new_release charges a new version)")
                return "takeover", self._take_over(state, latest, request, keys, ids_check)
            self._check_content(state, request, latest_vid)
            keys.load(latest)  # before anything changes: a key that cannot be loaded refuses
            ids_check.rerun(state, request, latest)
            latest["runs"] += 1
            latest["last_run_at"] = R.now()
            return "existing", latest
        if latest is not None and latest["state"] == R.RESERVED:
            # Nothing of it was published: take it over (with --new_release too: never charge twice).
            return "takeover", self._take_over(state, latest, request, keys, ids_check)
        if latest is not None and not new_release:
            raise R.ChangedInputError(
                f"release {latest_vid!r} was published for input {latest['input_digest']}; the "
                f"input is now {request.input_digest}. Re-using its key on changed input would "
                "leak the difference: charge a new version with a fresh key (new_release)")
        self._check_content(state, request, None)
        self._check_budgets(state, request, exclude=None)
        version = 1 if latest is None else latest["version"] + 1
        vid = R.versioned_id(rid, version)
        consumed = ids_check.check(state, request, vid, exclude=None)
        now = R.now()
        record = {
            "release_id": rid, "version": version, "versioned_id": vid, "measures": measures,
            "scopes": scopes, "input_digest": request.input_digest,
            "keys": keys.fresh(request), "content_key": request.content_key,
            "state": R.RESERVED, "output_path": None, "files": {}, "charged_at": now,
            "publishing_at": None, "committed_at": None, "last_run_at": now, "runs": 1,
            "supersedes": latest_vid, "takeovers": [], "metadata": json.loads(json.dumps(
                dict(request.metadata))), chain.SEQ: chain.next_seq(state),
        }
        if consumed:
            record["consumed"] = consumed
        state["releases"][vid] = record
        state["latest"][rid] = vid
        if request.content_key:
            state["content"][request.content_key] = vid
        return "new", record

    def _check_content(self, state: dict, request: R.ReleaseRequest, own: Optional[str]) -> None:
        if not request.content_key:
            return
        holder = state["content"].get(request.content_key)
        if holder is not None and holder != own:
            raise R.ContentAlreadyReleased(
                f"release {request.release_id!r}: the same content ({request.content_key}) was "
                f"already charged as release {holder!r}; content is released once, under any id")

    def _take_over(self, state: dict, record: dict, request: R.ReleaseRequest, keys: "_Keys",
                   ids_check: "_ConsumedCheck") -> dict:
        vid = record["versioned_id"]
        self._check_content(state, request, vid)
        self._check_budgets(state, request, exclude=vid)
        consumed = ids_check.check(state, request, vid, exclude=vid)
        record["takeovers"].append({"at": R.now(), "input_digest": record["input_digest"],
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
                      content_key=request.content_key, last_run_at=R.now(),
                      runs=record["runs"] + 1,
                      metadata=json.loads(json.dumps(dict(request.metadata))))
        if request.content_key:
            state["content"][request.content_key] = vid
        return record

    # ----------------------------------------------------------------- publish / commit

    def _update_record(self, reservation: R.Reservation, change) -> dict:
        if not isinstance(reservation, R.Reservation):
            raise ValueError("needs the Reservation returned by reserve()")

        def update(data):
            state = self._parse(data)
            record = state["releases"].get(reservation.versioned_id)
            if record is None:
                raise R.LedgerError(f"release {reservation.versioned_id!r} is not in ledger {self.path}")
            expected = {n: r.fingerprint for n, r in reservation.key_refs.items()}
            if {n: k["fingerprint"] for n, k in record["keys"].items()} != expected:
                raise R.LedgerError(f"the reservation for {reservation.versioned_id!r} does not match "
                                    "the ledger record (its keys changed: taken over by another run)")
            changed = change(record)
            return record, (self._dump(state) if changed else None)

        return self._transact(update)

    def begin_publish(self, reservation: R.Reservation) -> dict:
        """Pin the record before any byte is published: from here on its key and input are fixed."""
        def change(record):
            if record["state"] != R.RESERVED:
                return False
            record["state"], record["publishing_at"] = R.PUBLISHING, R.now()
            return True

        return self._update_record(reservation, change)

    def commit(self, reservation: R.Reservation, output_path: str,
               files: Optional[Mapping[str, str]] = None) -> dict:
        """Record the published release (its location and each file's digest)."""
        if not isinstance(output_path, str) or not output_path:
            raise ValueError(f"output_path must be a non-empty string, got {output_path!r}")
        files = dict(files or {})

        def change(record):
            if record["state"] == R.RESERVED:
                raise R.LedgerError(f"release {record['versioned_id']!r} was never published "
                                    "(begin_publish first)")
            if record["state"] == R.COMMITTED and record["output_path"] == output_path \
                    and record["files"] == files:
                return False
            record.update(state=R.COMMITTED, output_path=output_path, files=files,
                          committed_at=R.now())
            return True

        return self._update_record(reservation, change)

    # ----------------------------------------------------------------- submitted releases

    def record_submission(self, reservation: R.Reservation, handle: Mapping) -> dict:
        """Record with the reservation the handle of the job that computes it (``submission``:
        the runner, its job id and state, the staging attempt), and the fingerprints of the keys
        it computes with, so that another process can finish the release (:meth:`find`). A
        later submission replaces it. Spends nothing."""
        handle = json.loads(json.dumps(dict(handle)))
        fingerprints = {n: r.fingerprint for n, r in reservation.key_refs.items()}

        def change(record):
            record["submission"] = {**handle, "key_fingerprints": fingerprints,
                                    "submitted_at": R.now()}
            return True

        return self._update_record(reservation, change)

    def find(self, requests: Sequence[R.ReleaseRequest]) -> list[R.Reservation]:
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
                raise R.LedgerError(f"release {request.release_id!r} has no record in ledger "
                                    f"{self.path}")
            if record["input_digest"] != request.input_digest:
                raise R.ChangedInputError(
                    f"release {vid!r} was reserved for input {record['input_digest']}; the "
                    f"input is now {request.input_digest}")
            if record["measures"] != request.measures_json() or \
                    _scope_names(record) != [s.name for s in request.scopes]:
                raise R.LedgerError(f"release {vid!r} was reserved for other measures or scopes")
            out.append(self._reservation("existing", record, state["ledger_id"]))
        return out

    def claim(self, reservation: R.Reservation, token: str, seconds: float, *,
              replacing: Optional[str] = None) -> Optional[dict]:
        """Hold the finishing of a submitted release for ``seconds`` under ``token`` (``0``:
        let go of it), so that two processes finishing it at once take turns. Returns None when
        held (or let go), else the other holder's claim (``token``, ``until`` in seconds since
        the epoch, ``host``, ``pid``), which may be taken while it lasts only by naming it in
        ``replacing`` (its holder is known to be gone)."""
        now, other = time.time(), []

        def change(record):
            held = record.get("finalizing")
            if seconds <= 0:
                if held and held.get("token") == token:
                    record["finalizing"] = None
                    return True
                return False
            if held and held.get("token") not in (token, replacing) and held["until"] > now:
                other.append(dict(held))
                return False
            record["finalizing"] = {"token": token, "until": now + seconds,
                                    "host": socket.gethostname(), "pid": os.getpid()}
            return True

        self._update_record(reservation, change)
        return other[0] if other else None


class _Keys:
    """The release keys of one ``reserve`` call: fresh ones saved once (reused when a GCS write
    conflict re-runs the transaction) and deleted again unless the ledger written references
    them; existing ones loaded inside the transaction, so that a key that cannot be loaded
    refuses the reservation before the ledger changes; and the run's hold."""

    def __init__(self, ledger: BudgetLedger, hold: Optional[holds.Hold]):
        self.ledger, self._hold = ledger, hold
        self.pending: dict = {}   # (release id, key name) -> (key, ref)
        self.loaded: dict = {}    # (versioned id, key name) -> key

    def check_hold(self, record: dict) -> None:
        held = record.get("hold")
        if held is None or (self._hold is not None and held.get("run") == self._hold.run):
            return
        if holds.is_live(held):
            raise R.ReleaseHeld(
                f"release {record['versioned_id']!r} is held by another run ({holds.describe(held)}). "
                "Nothing was charged or stored; run again once it has ended")
        del record["hold"]  # a dead run's hold

    def hold(self, record: dict) -> None:
        if self._hold is not None:
            record["hold"] = self._hold.to_json()

    def fresh(self, request: R.ReleaseRequest) -> dict:
        refs = {}
        for name in request.key_names:
            slot = (request.release_id, name)
            if slot not in self.pending:
                key = ReleaseKey.generate()
                label = request.release_id if name == "release" else f"{request.release_id}/{name}"
                self.pending[slot] = (key, self.ledger.key_store.save(key, label,
                                                                      issued_for=label))
            refs[name] = self.pending[slot][1].to_json()
        return refs

    def load(self, record: dict) -> dict:
        out = {}
        for name, ref in record["keys"].items():
            slot = (record["versioned_id"], name)
            if slot not in self.loaded:
                try:
                    self.loaded[slot] = self.ledger.key_store.load(KeyRef.from_json(ref))
                except (OSError, ValueError) as err:
                    raise R.LedgerError(
                        f"release {record['versioned_id']!r} (ledger record {record.get('seq')}): "
                        f"its key {ref['uri']} cannot be loaded ("
                        f"{err if isinstance(err, ValueError) else error_text(err)}); without it "
                        "the release cannot be reproduced or completed. Nothing was charged or "
                        "changed; restore the key store (or point --key_store at it)") from None
            out[name] = self.loaded[slot]
        return out

    def of(self, record: dict, kind: str) -> dict:
        if kind in ("new", "takeover"):
            return {name: self.pending[(record["release_id"], name)][0] for name in record["keys"]}
        return self.load(record)

    def abandon(self) -> None:
        for _, ref in self.pending.values():
            self.ledger.key_store.delete(ref)

    def settle(self, outcomes) -> None:
        used = {(o[1]["release_id"], name) for o in outcomes if o[0] in ("new", "takeover")
                for name in o[1]["keys"]}
        for slot, (_, ref) in self.pending.items():
            if slot not in used:
                self.ledger.key_store.delete(ref)


class _ConsumedCheck:
    """The consumed-id side of one ``reserve`` call (see :mod:`accounting.ledger.consumed`).

    Runs inside the ledger's transaction (possibly several times: a GCS write conflict re-runs
    it on the new state). Record files are content-addressed and written before the ledger
    document that references them; files and a freshly created hashing key that end up
    referenced by nothing are deleted afterwards, so a refusal leaves none behind.
    """

    def __init__(self, ledger: BudgetLedger):
        self.ledger = ledger
        self.records: dict = {}      # sha256 -> consumed.Record (read and verified once)
        self.hashes: dict = {}       # (key fingerprint, release id, namespace) -> (n, 2) hashes
        self.keys: dict = {}         # key fingerprint -> secret bytes
        self.pending_key = None      # (ReleaseKey, KeyRef) created by this call
        self.written: set = set()    # file names written by this call (any attempt)
        self.results: dict = {}
        self.replaced_files: set = set()
        self.referenced: set = set()

    # -- per attempt
    def begin(self, state: dict) -> None:
        self.results, self.replaced_files = {}, set()

    def end(self, state: dict) -> None:
        self.referenced = _referenced_files(state)

    # -- keys and hashes
    def _secret(self, state: dict) -> tuple[bytes, str]:
        ref = state.get("consumed_key")
        if ref is None:
            if self.pending_key is None:
                key = ReleaseKey.generate()
                self.pending_key = (key, self.ledger.key_store.save(key, CONSUMED_KEY_LABEL))
            key, kref = self.pending_key
            state["consumed_key"] = kref.to_json()
            self.keys[kref.fingerprint] = key.secret_bytes()
            return key.secret_bytes(), kref.fingerprint
        fingerprint = ref["fingerprint"]
        if fingerprint not in self.keys:
            try:
                self.keys[fingerprint] = self.ledger.key_store.load(
                    KeyRef.from_json(ref)).secret_bytes()
            except (OSError, ValueError) as err:
                raise R.LedgerError(
                    f"ledger {self.ledger.path}: the key its consumed-id records are hashed with "
                    f"({ref['uri']}) cannot be loaded ({type(err).__name__}); without it no "
                    "release can be checked against earlier batches: refusing") from None
        return self.keys[fingerprint], fingerprint

    def prehash(self, requests) -> None:
        """Hash the requests' ids before the transaction when the ledger has its key already
        (the usual case): the transaction -- a lock held, or a GCS read-write race -- then only
        checks and records."""
        if not any(r.consumes for r in requests):
            return
        data = self.ledger._store.read()
        state = self.ledger._parse(data) if data is not None else {}
        if state.get("consumed_key") is None:
            return
        for request in requests:
            for ids in request.consumes:
                self._hashes(state, request, ids)

    def _hashes(self, state: dict, request, ids: C.ConsumedIds) -> np.ndarray:
        secret, fingerprint = self._secret(state)
        slot = (fingerprint, request.release_id, ids.namespace)
        if slot not in self.hashes:
            self.hashes[slot] = C.hash_ids(secret, ids.namespace, ids.ids)
        return self.hashes[slot]

    # -- record files
    def _load(self, vid: str, namespace: str, entry: dict) -> C.Record:
        if not entry.get("count"):
            return C.Record(hi=np.zeros(0, np.uint64), lo=np.zeros(0, np.uint64),
                            amount=np.zeros(0, np.int64))
        sha = entry.get("sha256")
        if sha not in self.records:
            name = entry.get("file") or ""
            where = (f"the consumed-id record of release {vid!r} ({namespace}: "
                     f"{self.ledger._files.where(name)})")
            data = self.ledger._files.read(name) if name == sha.split(":", 1)[-1] + ".arrow" \
                else None
            if data is None:
                if self.ledger._store.changed_since_read():
                    raise LedgerConflict(f"{where} went away while the ledger changed")
                raise R.LedgerError(f"{where} is missing (deleted or moved): the ids earlier "
                                    "batches consumed cannot be checked; refusing. Nothing was "
                                    "charged")
            try:
                self.records[sha] = C.decode_record(data, namespace=namespace, sha256=sha,
                                             count=int(entry["count"]), where=where)
            except C.ConsumedRecordError as err:
                raise R.LedgerError(f"{err}: refusing. Nothing was charged") from None
        return self.records[sha]

    def _write(self, namespace: str, hashes: np.ndarray, amounts, noun: str) -> dict:
        entry = {"count": int(hashes.shape[0]), "noun": noun, "file": None, "sha256": None}
        if amounts is not None:
            entry["amount"] = int(np.sum(amounts))
        if hashes.shape[0]:
            # ``hashes`` come sorted from the check (consumed.Check.result)
            data = C.encode_record(namespace, hashes, amounts, presorted=True)
            name, sha = C.file_name(data)
            if name not in self.written:
                self.ledger._files.write(name, data)
                self.written.add(name)
            self.records[sha] = C.Record(
                hi=hashes[:, 0].copy(), lo=hashes[:, 1].copy(),
                amount=None if amounts is None else np.asarray(amounts, np.int64))
            entry.update(file=name, sha256=sha)
        return entry

    # -- decisions
    def check(self, state: dict, request, vid: str, exclude: Optional[str],
              only: Optional[Sequence[str]] = None) -> dict:
        """Check ``request``'s consumed ids against every release but ``exclude``; raise
        ConsumedIdsError on a conflict it does not skip; return the entries to record."""
        entries, results = {}, self.results.setdefault(request.release_id, {})
        for ids in request.consumes:
            if only is not None and ids.namespace not in only:
                continue
            hashes = self._hashes(state, request, ids)
            check = C.Check(ids=ids, hashes=hashes)
            for other, record in state["releases"].items():
                entry = (record.get("consumed") or {}).get(ids.namespace)
                if other != exclude and entry is not None:
                    check.add(other, self._load(other, ids.namespace, entry))
            result, keep, amounts = check.result()
            held = int(result.held.sum())
            if held and not ids.skip:
                raise R.ConsumedIdsError(
                    f"release {vid!r}: {held} of its {len(ids)} {ids.noun} were already consumed "
                    f"by {C.describe_holders(result.holders)}; each is aggregated at most once "
                    f"across all batches ({ids.namespace}). Remove them from the input, or skip "
                    "them (--skip_consumed: their rows are removed inside the pipeline, "
                    "counted). Nothing was charged.",
                    namespace=ids.namespace, count=held, holders=result.holders)
            entries[ids.namespace] = self._write(ids.namespace, keep, amounts, ids.noun)
            results[ids.namespace] = result
        return entries

    def rerun(self, state: dict, request, record: dict) -> None:
        """A re-run on the same input: its decisions come from its own record (so the job
        removes and grants exactly what the first run did); namespaces the record lacks (it
        predates them) are checked and recorded now."""
        vid = record["versioned_id"]
        own = record.get("consumed") or {}
        results = self.results.setdefault(request.release_id, {})
        missing = [c.namespace for c in request.consumes if c.namespace not in own]
        for ids in request.consumes:
            if ids.namespace in own:
                hashes = self._hashes(state, request, ids)
                results[ids.namespace] = C.own_result(
                    ids, hashes, self._load(vid, ids.namespace, own[ids.namespace]))
        if missing:
            added = self.check(state, request, vid, exclude=vid, only=missing)
            record["consumed"] = {**own, **added}

    def replaced(self, entries: Optional[dict]) -> None:
        for entry in (entries or {}).values():
            if entry.get("file"):
                self.replaced_files.add(entry["file"])

    # -- after the transaction
    def done(self) -> None:
        for name in (self.written | self.replaced_files) - self.referenced:
            self.ledger._files.delete(name)
        if self.pending_key is not None:
            self._drop_pending_key_unless_used()

    def abandon(self) -> None:
        if not self.written and self.pending_key is None:
            return
        try:
            data = self.ledger._store.read()
            state = self.ledger._parse(data) if data is not None else {}
        except Exception:  # noqa: BLE001 -- the original error is what the caller must see
            return
        for name in self.written - _referenced_files(state):
            self.ledger._files.delete(name)
        if self.pending_key is not None:
            self.referenced = set()
            ref = (state.get("consumed_key") or {})
            if ref.get("fingerprint") != self.pending_key[1].fingerprint:
                self.ledger.key_store.delete(self.pending_key[1])

    def _drop_pending_key_unless_used(self) -> None:
        ref = self.ledger.snapshot().get("consumed_key") or {}
        if ref.get("fingerprint") != self.pending_key[1].fingerprint:
            self.ledger.key_store.delete(self.pending_key[1])


def _referenced_files(state: dict) -> set:
    return {entry["file"] for record in state.get("releases", {}).values()
            for entry in (record.get("consumed") or {}).values() if entry.get("file")}
