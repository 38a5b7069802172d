"""Operator commands on a ledger (``python -m accounting.ledger``): a deliberate restore, holds,
and what the release layer left behind.

* :func:`restore` -- accept a ledger restored from a backup on purpose (see
  :mod:`~accounting.ledger.witness`), recorded in the ledger (``restores``).
* :func:`list_holds` / :func:`end_hold` -- which runs hold which releases; end the hold of a run
  whose host is known to be dead (a hold of another host lapses only after
  :data:`~accounting.ledger.holds.TTL_SECONDS`), recorded in the ledger (``operations``). A hold
  of this host whose process still runs is never ended.
* :func:`orphans` / :func:`remove` -- release keys no record references (a reservation refused
  after its keys were stored, a process killed before its ledger write, the keys a take-over
  replaced) and staging attempts of no reserved release (a release committed since, or never
  charged), local or on GCS (``--staging_dir gs://...``: the prefixes of its objects). Never a
  key a record references, a key of another ledger or of
  :meth:`~accounting.keystore.KeyStore.issue`, a staging attempt of a reserved or publishing
  release, nor anything under a published release (they live under ``--output``, never here).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from typing import Optional

from accounting import durable, gcs
from accounting.keys import ReleaseKey
from accounting.keystore import KeyRef
from accounting.ledger import holds, witness
from accounting.ledger.machine import BudgetLedger
from accounting.ledger.records import COMMITTED, LedgerError, now
from accounting.ledger.sealing import load_json
from accounting.ledger.stores import store_for

#: A staging attempt's folder name (pipelines.release.publish.staging_folder: v<N>.<attempt>).
_ATTEMPT = re.compile(r"^v([0-9]+)\.([0-9a-f]+)$")
_KEY_FILE = re.compile(r"^(?P<name>.+)\.(?P<fingerprint>[0-9a-f]{16})\.key$")


def open_ledger(path: str, key_store: str) -> BudgetLedger:
    """The ledger at ``path`` with the accountant it was created with (an operator command
    works on any ledger)."""
    data = store_for(path).read()
    if data is None:
        raise LedgerError(f"ledger {path} does not exist")
    state = load_json(data, path)
    accountant = state.get("accountant") if isinstance(state, dict) else None
    return BudgetLedger(path, key_store, accountant=accountant if isinstance(accountant, str)
                        else "basic")


def _verified(ledger: BudgetLedger, data: Optional[bytes]) -> dict:
    if data is None:
        raise LedgerError(f"ledger {ledger.path} does not exist")
    return ledger._sealing.read(data)  # chain and MAC (the witness is what a restore replaces)


def restore(ledger: BudgetLedger, reason: str) -> str:
    """Accept the ledger as it is now (restored on purpose), recording why."""
    if not isinstance(reason, str) or not reason.strip():
        raise LedgerError("a restore needs --reason (recorded in the ledger)")

    def update(data):
        state = _verified(ledger, data)
        found = ledger._witness.read(state["ledger_id"])
        entry = witness.restore_entry(state, found, reason.strip())
        state.setdefault("restores", []).append(entry)
        state["writes"] = max(int(state.get("writes") or 0), (found or {}).get("writes", 0))
        replaced = entry["replaced"] or {"writes": None}
        return (f"ledger {ledger.path}: restored state (write {entry['restored']['writes']}) "
                f"accepted in place of write {replaced['writes']}; recorded"), ledger._dump(state)

    return ledger._transact(update)


@dataclass(frozen=True, kw_only=True)
class HeldRelease:
    """A release a run holds (``hold``) or a process is finishing (``finalizing``)."""

    versioned_id: str
    kind: str
    run: str
    host: str
    pid: Optional[int]
    until: str
    live: bool


def list_holds(ledger: BudgetLedger) -> list[HeldRelease]:
    out = []
    for record in ledger.records():
        held = record.get("hold")
        if held:
            out.append(HeldRelease(versioned_id=record["versioned_id"], kind="hold",
                                   run=str(held.get("run")), host=str(held.get("host")),
                                   pid=held.get("pid"), until=str(held.get("until")),
                                   live=holds.is_live(held)))
        claim = record.get("finalizing")
        if claim:
            until = _dt.datetime.fromtimestamp(claim["until"], _dt.timezone.utc)
            out.append(HeldRelease(versioned_id=record["versioned_id"], kind="finalizing",
                                   run=str(claim.get("token")), host=str(claim.get("host")),
                                   pid=claim.get("pid"), until=until.isoformat(timespec="seconds"),
                                   live=until > _dt.datetime.now(_dt.timezone.utc)))
    return out


def end_hold(ledger: BudgetLedger, run: str, *, host_dead: bool, reason: str) -> list[str]:
    """End every hold of ``run`` (the versioned ids it held). A live hold of another host needs
    ``host_dead`` (the operator knows that host is gone); a live hold of this host is refused:
    its process still runs."""
    if not reason or not reason.strip():
        raise LedgerError("ending a hold needs --reason (recorded in the ledger)")

    def update(data):
        state = _verified(ledger, data)
        ledger._witness.check(state, getattr(ledger._store, "read_generation", None))
        held = [r for r in state["releases"].values() if (r.get("hold") or {}).get("run") == run]
        if not held:
            raise LedgerError(f"ledger {ledger.path}: no release is held by run {run!r}")
        hold = held[0]["hold"]
        if holds.is_live(hold):
            if hold.get("host") == holds.host_id():
                raise LedgerError(f"run {run!r} is a process of this host that still runs "
                                  f"(pid {hold.get('pid')}): its hold is not ended")
            if not host_dead:
                raise LedgerError(f"run {run!r} runs on {hold.get('host')}, its hold lasts until "
                                  f"{hold.get('until')}: end it only once that host is known to "
                                  "be dead (--host_dead)")
        for record in held:
            del record["hold"]
        state.setdefault("operations", []).append({
            "at": now(), "command": "end-hold", "run": run, "host": hold.get("host"),
            "pid": hold.get("pid"), "releases": [r["versioned_id"] for r in held],
            "reason": reason.strip(), "by": socket.gethostname()})
        return [r["versioned_id"] for r in held], ledger._dump(state)

    return ledger._transact(update)


# --------------------------------------------------------------------------- orphans

@dataclass(frozen=True, kw_only=True)
class Orphan:
    """A key file or staging attempt nothing needs (see the module docstring)."""

    kind: str       # "key" or "staging"
    where: str
    why: str


def _key_files(root: str) -> list[str]:
    if gcs.is_gcs(root):
        return [u for u in gcs.list_objects(root.rstrip("/") + "/") if u.endswith(".key")]
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".key"))


def _read(uri: str) -> Optional[bytes]:
    return durable.read(uri)[0]


def _key_orphan(ledger: BudgetLedger, state: dict, uri: str, referenced: set) -> Optional[str]:
    match = _KEY_FILE.match(uri.rsplit("/", 1)[-1])
    if match is None or match["fingerprint"] in referenced:
        return None
    base = uri[:-len(".key")]
    if _read(base.rsplit(".", 1)[0] + ".issued") is not None:
        return None  # KeyStore.issue's (a library user's release, not this ledger's)
    try:
        issued_for = ReleaseKey.from_text((_read(uri) or b"").decode("utf-8"), uri).issued_for
    except (UnicodeDecodeError, ValueError):
        return None
    if issued_for is None or issued_for.startswith("a budget ledger"):
        return None  # not a release key (a chain or consumed-id key: kept with its ledger)
    use = _read(ledger.key_store.use_record_uri(KeyRef(uri=uri, fingerprint=match["fingerprint"])))
    if use:
        try:
            binding = str(json.loads(use.decode("utf-8")).get("binding") or "")
        except (UnicodeDecodeError, ValueError):
            return None
        if not binding.startswith(state["ledger_id"] + "/"):
            return None  # used by another ledger's release
        return (f"key of {issued_for!r} that no record references (replaced by a take-over, or "
                "its record was rolled back)")
    return f"key of {issued_for!r} stored for a reservation that was never recorded"


def orphans(ledger: BudgetLedger, staging: Optional[str] = None) -> list[Orphan]:
    """Orphan release keys in the ledger's key store and orphan staging attempts under
    ``staging`` (the release layer's ``--staging_dir``)."""
    state = ledger.snapshot()
    referenced = {k["fingerprint"] for r in state["releases"].values() for k in r["keys"].values()}
    out = []
    for uri in _key_files(ledger.key_store.root):
        why = _key_orphan(ledger, state, uri, referenced)
        if why:
            out.append(Orphan(kind="key", where=uri, why=why))
    if staging and gcs.is_gcs(staging):
        out.extend(_staging_orphans(state, _gcs_attempts(staging.rstrip("/"))))
    elif staging and os.path.isdir(staging):
        out.extend(_staging_orphans(state, _local_attempts(os.path.abspath(staging))))
    return out


def _local_attempts(root: str):
    """(release id, attempt folder name, folder path) of every staging attempt under ``root``."""
    for top, dirs, _ in os.walk(root):
        for name in sorted(dirs):
            if _ATTEMPT.match(name):
                yield os.path.relpath(top, root).replace(os.sep, "/"), name, os.path.join(top, name)
        dirs[:] = [d for d in dirs if _ATTEMPT.match(d) is None]


def _gcs_attempts(root: str):
    """The same on GCS, where folders are prefixes: read from the names of the objects under
    ``root`` (the first path segment shaped like an attempt, ``v<version>.<hex>``)."""
    seen = set()
    for uri in gcs.list_objects(root + "/"):
        parts = uri[len(root) + 1:].split("/")
        for i, part in enumerate(parts[:-1]):
            if _ATTEMPT.match(part):
                if i and (key := "/".join(parts[:i + 1])) not in seen:
                    seen.add(key)
                    yield "/".join(parts[:i]), part, f"{root}/{key}"
                break
    return


def _staging_orphans(state: dict, attempts) -> list[Orphan]:
    """The attempts of no reserved or publishing release: of a release with no record (never
    charged, or refused), or of one published and committed since."""
    out = []
    for release_id, name, folder in sorted(attempts, key=lambda a: a[2]):
        version = int(_ATTEMPT.match(name)[1])
        vid = release_id if version == 1 else f"{release_id}#{version}"
        record = state["releases"].get(vid)
        if record is None:
            out.append(Orphan(kind="staging", where=folder,
                              why=f"release {vid!r} has no record in the ledger"))
        elif record["state"] == COMMITTED:
            out.append(Orphan(kind="staging", where=folder,
                              why=f"release {vid!r} is published and committed"))
    return out


def remove(found: list[Orphan], ledger: BudgetLedger) -> None:
    """Delete what :func:`orphans` listed (keys with their use records)."""
    for orphan in found:
        if orphan.kind == "key":
            ledger.key_store._remove(orphan.where)
            fingerprint = _KEY_FILE.match(orphan.where.rsplit("/", 1)[-1])["fingerprint"]
            ledger.key_store._remove(ledger.key_store.use_record_uri(
                KeyRef(uri=orphan.where, fingerprint=fingerprint)))
        elif gcs.is_gcs(orphan.where):
            for uri in gcs.list_objects(orphan.where + "/"):
                ledger.key_store._remove(uri)
        else:
            shutil.rmtree(orphan.where, ignore_errors=True)
