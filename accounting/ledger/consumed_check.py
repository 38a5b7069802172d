"""The consumed-id side of one ``reserve`` call (the records: :mod:`~accounting.ledger.consumed`).

A request's ``consumes`` are checked, inside the same transaction as its charge, against the
consumed-id records of every other release (reserved ones included: they may publish any time;
earlier versions of the same release id too: a new version must not aggregate the same reports
again) and recorded with it. An id another release holds refuses the request
(:class:`~accounting.ledger.records.ConsumedIdsError`: how many, and which releases), unless the
request skips such ids -- then they are not recorded and the job removes their rows. Budgeted
namespaces grant each id what is left of its budget. A re-run reads its decision back from its
own record (so it reproduces); a take-over replaces the record's consumed ids; a published
record's ids are permanent.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from accounting.keys import ReleaseKey
from accounting.keystore import KeyOutsideStore, KeyRef
from accounting.ledger import consumed
from accounting.ledger.consumed import ConsumedIds
from accounting.ledger.records import ConsumedIdsError, LedgerError
from accounting.ledger.stores import LedgerConflict

#: Where the consumed-id records live: a folder (or gs:// prefix) beside the ledger document.
CONSUMED_SUFFIX = ".consumed"
#: The key-store label of the ledger's consumed-id hashing key.
CONSUMED_KEY_LABEL = "ledger-consumed-ids"


class ConsumedCheck:
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
        self.referenced = referenced_files(state)

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
                store = self.ledger.key_store
                self.keys[fingerprint] = store.load(store.resolve(
                    KeyRef.from_json(ref), CONSUMED_KEY_LABEL)).secret_bytes()
            except (OSError, ValueError) as err:
                why = str(err) if isinstance(err, KeyOutsideStore) else type(err).__name__
                raise LedgerError(
                    f"ledger {self.ledger.path}: the key its consumed-id records are hashed with "
                    f"({ref['uri']}) cannot be loaded ({why}); without it no release can be "
                    "checked against earlier batches: refusing") from None
        return self.keys[fingerprint], fingerprint

    def prehash(self, requests) -> None:
        """Hash the requests' ids before the transaction when the ledger has its key already
        (the usual case): the transaction -- a lock held, or a GCS read-write race -- then only
        checks and records."""
        if not any(r.consumes for r in requests):
            return
        data, state = self.ledger._read()
        if data is None or state.get("consumed_key") is None:
            return
        for request in requests:
            for ids in request.consumes:
                self._hashes(state, request, ids)

    def _hashes(self, state: dict, request, ids: ConsumedIds) -> np.ndarray:
        secret, fingerprint = self._secret(state)
        slot = (fingerprint, request.release_id, ids.namespace)
        if slot not in self.hashes:
            self.hashes[slot] = consumed.hash_ids(secret, ids.namespace, ids.ids)
        return self.hashes[slot]

    # -- record files
    def _load(self, vid: str, namespace: str, entry: dict) -> consumed.Record:
        if not entry.get("count"):
            return consumed.Record(hi=np.zeros(0, np.uint64), lo=np.zeros(0, np.uint64),
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
                raise LedgerError(f"{where} is missing (deleted or moved): the ids earlier "
                                    "batches consumed cannot be checked; refusing. Nothing was "
                                    "charged")
            try:
                self.records[sha] = consumed.decode_record(data, namespace=namespace, sha256=sha,
                                             count=int(entry["count"]), where=where)
            except consumed.ConsumedRecordError as err:
                raise LedgerError(f"{err}: refusing. Nothing was charged") from None
        return self.records[sha]

    def _write(self, namespace: str, hashes: np.ndarray, amounts, noun: str) -> dict:
        entry = {"count": int(hashes.shape[0]), "noun": noun, "file": None, "sha256": None}
        if amounts is not None:
            entry["amount"] = int(np.sum(amounts))
        if hashes.shape[0]:
            # ``hashes`` come sorted from the check (consumed.Check.result)
            data = consumed.encode_record(namespace, hashes, amounts, presorted=True)
            name, sha = consumed.file_name(data)
            if name not in self.written:
                self.ledger._files.write(name, data)
                self.written.add(name)
            self.records[sha] = consumed.Record(
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
            check = consumed.Check(ids=ids, hashes=hashes)
            for other, record in state["releases"].items():
                entry = (record.get("consumed") or {}).get(ids.namespace)
                if other != exclude and entry is not None:
                    check.add(other, self._load(other, ids.namespace, entry))
            result, keep, amounts = check.result()
            held = int(result.held.sum())
            if held and not ids.skip:
                raise ConsumedIdsError(
                    f"release {vid!r}: {held} of its {len(ids)} {ids.noun} were already consumed "
                    f"by {consumed.describe_holders(result.holders)}; each is aggregated at most once "
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
                results[ids.namespace] = consumed.own_result(
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
            data, state = self.ledger._read()
            state = state if data is not None else {}
        except Exception:  # noqa: BLE001 -- the original error is what the caller must see
            return
        for name in self.written - referenced_files(state):
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


def referenced_files(state: dict) -> set:
    return {entry["file"] for record in state.get("releases", {}).values()
            for entry in (record.get("consumed") or {}).values() if entry.get("file")}
