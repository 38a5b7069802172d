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
* **Budgets per scope**: a scope's budget is recorded on first use; a lower budget later is
  accepted (more conservative), a higher one refused unless raised with :meth:`set_budget`.
  A reserved record counts against its scopes like a published one (it may publish any time).
* Testing keys are never stored, and a reservation is never refunded.

Composition of a scope's measures is :func:`accounting.guarantee.compose` with the ledger's
accountant (fixed when the ledger is created), at the scope budget's delta.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Iterable, Mapping, Optional, Sequence, Union

from accounting import guarantee
from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.keys import ReleaseKey
from accounting.keystore import KeyRef, KeyStore
from accounting.ledger import records as R
from accounting.ledger.stores import store_for
from accounting.measures import Measure


def _bound(key: ReleaseKey, ledger_id: str, record: dict, name: str) -> ReleaseKey:
    """A reservation's key, bound to its release version and input digest in a new session: a
    re-run of the same input in this process reproduces the release (it may claim the key's
    purposes again); nothing else can draw from it (accounting.keys, "One secret, one use")."""
    label = record["release_id"] if name == "release" else f"{record['release_id']}/{name}"
    return key.bound(f"{ledger_id}/{record['versioned_id']}/{name}@{record['input_digest']}",
                     issued_for=label)


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

    # ----------------------------------------------------------------- (de)serialisation

    def _parse(self, data: Optional[bytes]) -> dict:
        if data is None:
            return R.empty_state(self.accountant)
        try:
            state = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise R.LedgerError(f"ledger {self.path} is not valid JSON (emptied or overwritten?): "
                                "refusing to use it")
        if isinstance(state, dict) and state.get("format") == R.FORMAT_V1:
            state = R.upgrade_v1(state)
        if not isinstance(state, dict) or state.get("format") != R.FORMAT or "ledger_id" not in state:
            raise R.LedgerError(f"ledger {self.path} is not a {R.FORMAT} file: refusing to use it")
        if state.get("accountant") != self.accountant:
            raise R.LedgerError(f"ledger {self.path} counts budgets with accountant "
                                f"{state.get('accountant')!r}, this run asked for "
                                f"{self.accountant!r}; the accountant of a ledger cannot change")
        return state

    @staticmethod
    def _dump(state: dict) -> bytes:
        state["updated_at"] = R.now()
        return (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8")

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

        self._store.transact(update)

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
                new_release: bool = False) -> list[R.Reservation]:
        """Charge every request (or find the ones already charged for their input); all or nothing.

        See the module docstring for the rules. Returns one :class:`Reservation` per request,
        in order; raises a :class:`LedgerError` (nothing charged, no key left behind) otherwise.
        """
        requests = [requests] if isinstance(requests, R.ReleaseRequest) else list(requests)
        if not requests or not all(isinstance(r, R.ReleaseRequest) for r in requests):
            raise ValueError("reserve needs ReleaseRequests")
        ids = [r.release_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"one run cannot reserve a release id twice: {ids}")
        pending: dict = {}  # (release id, key name) -> (key, ref): saved once, reused on retries

        def fresh_keys(request) -> dict:
            refs = {}
            for name in request.key_names:
                if (request.release_id, name) not in pending:
                    key = ReleaseKey.generate()
                    label = request.release_id if name == "release" else f"{request.release_id}/{name}"
                    pending[(request.release_id, name)] = (key, self.key_store.save(
                        key, label, issued_for=label))
                refs[name] = pending[(request.release_id, name)][1].to_json()
            return refs

        def update(data):
            state = self._parse(data)
            outcomes = [self._decide(state, request, new_release, fresh_keys) for request in requests]
            return outcomes, self._dump(state)

        try:
            outcomes = self._store.transact(update)
        except BaseException:
            for _, ref in pending.values():
                self.key_store.delete(ref)
            raise
        used = {(o[1]["release_id"], name) for o in outcomes if o[0] in ("new", "takeover")
                for name in o[1]["keys"]}
        for slot, (_, ref) in pending.items():
            if slot not in used:
                self.key_store.delete(ref)
        ledger_id = self.ledger_id()
        out = []
        for kind, record in outcomes:
            fresh = None
            if kind in ("new", "takeover"):
                fresh = {name: pending[(record["release_id"], name)][0] for name in record["keys"]}
            out.append(self._reservation(kind, record, ledger_id, fresh))
        return out

    def _reservation(self, kind: str, record: dict, ledger_id: str,
                     keys: Optional[dict] = None) -> R.Reservation:
        """The :class:`Reservation` of ``record`` with its keys (loaded from the key store unless
        given: fresh ones), bound to the record (:func:`_bound`)."""
        refs = {name: KeyRef.from_json(ref) for name, ref in record["keys"].items()}
        if keys is None:
            keys = {name: self.key_store.load(ref) for name, ref in refs.items()}
        keys = {name: _bound(key, ledger_id, record, name) for name, key in keys.items()}
        return R.Reservation(release_id=record["release_id"], version=record["version"],
                             versioned_id=record["versioned_id"], keys=keys, key_refs=refs,
                             record=record, ledger_id=ledger_id,
                             resumed=kind == "existing", taken_over=kind == "takeover",
                             state=record["state"])

    def _decide(self, state: dict, request: R.ReleaseRequest, new_release: bool, fresh_keys) -> tuple[str, dict]:
        rid = request.release_id
        latest_vid = state["latest"].get(rid)
        latest = state["releases"].get(latest_vid) if latest_vid else None
        measures = request.measures_json()
        scopes = [s.name for s in request.scopes]
        if latest is not None and latest["input_digest"] == request.input_digest and not new_release:
            if latest["measures"] != measures or _scope_names(latest) != scopes:
                if latest["state"] != R.RESERVED:
                    raise R.LedgerError(
                        f"release {latest_vid!r} was charged for other measures or scopes; a "
                        "release's privacy parameters cannot change once publication started "
                        "(new_release charges a new version)")
                return "takeover", self._take_over(state, latest, request, fresh_keys)
            self._check_content(state, request, latest_vid)
            latest["runs"] += 1
            latest["last_run_at"] = R.now()
            return "existing", latest
        if latest is not None and latest["state"] == R.RESERVED:
            # Nothing of it was published: take it over (with --new_release too: never charge twice).
            return "takeover", self._take_over(state, latest, request, fresh_keys)
        if latest is not None and not new_release:
            raise R.ChangedInputError(
                f"release {latest_vid!r} was published for input {latest['input_digest']}; the "
                f"input is now {request.input_digest}. Re-using its key on changed input would "
                "leak the difference: charge a new version with a fresh key (new_release)")
        self._check_content(state, request, None)
        self._check_budgets(state, request, exclude=None)
        version = 1 if latest is None else latest["version"] + 1
        vid = R.versioned_id(rid, version)
        now = R.now()
        record = {
            "release_id": rid, "version": version, "versioned_id": vid, "measures": measures,
            "scopes": scopes, "input_digest": request.input_digest,
            "keys": fresh_keys(request), "content_key": request.content_key,
            "state": R.RESERVED, "output_path": None, "files": {}, "charged_at": now,
            "publishing_at": None, "committed_at": None, "last_run_at": now, "runs": 1,
            "supersedes": latest_vid, "takeovers": [], "metadata": json.loads(json.dumps(
                dict(request.metadata))),
        }
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

    def _take_over(self, state: dict, record: dict, request: R.ReleaseRequest, fresh_keys) -> dict:
        vid = record["versioned_id"]
        self._check_content(state, request, vid)
        self._check_budgets(state, request, exclude=vid)
        record["takeovers"].append({"at": R.now(), "input_digest": record["input_digest"],
                                    "key_fingerprints": {n: k["fingerprint"]
                                                         for n, k in record["keys"].items()},
                                    "measures_changed": record["measures"] != request.measures_json()})
        if record.get("content_key") and state["content"].get(record["content_key"]) == vid:
            del state["content"][record["content_key"]]
        record.update(measures=request.measures_json(), scopes=[s.name for s in request.scopes],
                      input_digest=request.input_digest, keys=fresh_keys(request),
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

        return self._store.transact(update)

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
