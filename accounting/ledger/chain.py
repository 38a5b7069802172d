"""The ledger's record chain: each record carries the digest of the one before, the head a MAC.

A budget ledger is the only account of what was spent, and it is a JSON file an operator (or
anyone with write access to the bucket) can edit. A lowered spend, a deleted record or a raised
budget would let later releases spend what earlier ones already did. So every write *seals* the
ledger and every read *verifies* it:

* Records are numbered in the order they were charged (``seq``, 1, 2, ...; a take-over or a
  state change keeps its number). Each record carries ``prev``, the digest of the record before
  it (the first: a digest of the ledger id), and ``digest``, SHA-256 over its own canonical JSON
  (``prev`` included, ``digest`` excluded). A record edited by hand no longer matches its
  digest; a record deleted, inserted or moved breaks the ``prev`` link of the one after it. The
  reader names the record where the chain breaks: its number and release id.
* The head (``chain``: number of records, ``head``, ``mac``) covers the last record's digest and
  everything outside the records (budgets of the scopes, ``latest``, ``content``, the consumed-id
  key), so a deleted *last* record or a raised budget is caught too.
* ``mac`` is HMAC-SHA256 of the head under the ledger's **chain key**, a secret the ledger keeps
  in its key store (created with the ledger, referenced by fingerprint like a release key). The
  digests alone stop a hand edit; whoever edits on purpose can recompute them -- but not the MAC.

**Why a chain plus a MAC'd head, and not a MAC per record.** Not every reader of a ledger holds
the key store: the release catalog (``python -m pipelines.catalog``) and an auditor read the
ledger alone. They verify the chain (:func:`verify` without a secret) and so still refuse a
hand-edited ledger, naming the record; the jobs, which hold the key store, verify the MAC too.
A MAC on every record would give keyless readers nothing to check.

Records are mutable (reserved -> publishing -> committed, re-runs, take-overs), so the writer
re-seals the whole chain on every write; a write is O(records), like the JSON dump it goes with.
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Optional

from accounting.ledger.digest import canonical_json

#: The record fields the chain adds (not part of a record's content for the job).
SEQ, PREV, DIGEST = "seq", "prev", "digest"
_RECORD = b"beam-dp-release/ledger-record/v1\x00"
_GENESIS = b"beam-dp-release/ledger-genesis/v1\x00"
_HEAD = b"beam-dp-release/ledger-head/v1\x00"
_MAC = b"beam-dp-release/ledger-mac/v1\x00"


class ChainError(ValueError):
    """The ledger does not verify (raised by the ledger as a LedgerError naming its file)."""


def genesis(ledger_id: str) -> str:
    return "sha256:" + hashlib.sha256(_GENESIS + str(ledger_id).encode()).hexdigest()


def record_digest(record: dict) -> str:
    """SHA-256 over the record's canonical JSON, its own ``digest`` left out."""
    body = {k: v for k, v in record.items() if k != DIGEST}
    return "sha256:" + hashlib.sha256(_RECORD + canonical_json(body)).hexdigest()


def head_digest(state: dict, last: str, count: int) -> str:
    """The head: everything outside the records, the last record's digest and their number."""
    header = {k: v for k, v in state.items() if k not in ("releases", "chain")}
    return "sha256:" + hashlib.sha256(
        _HEAD + canonical_json(header) + b"\x00" + last.encode() + b"\x00"
        + str(count).encode()).hexdigest()


def mac(secret: bytes, head: str) -> str:
    return "hmac-sha256:" + hmac.new(secret, _MAC + head.encode(), hashlib.sha256).hexdigest()


def ordered(state: dict) -> list:
    """The records in chain order (by ``seq``)."""
    return sorted(state["releases"].values(), key=lambda r: r[SEQ])


def next_seq(state: dict) -> int:
    return 1 + max((r[SEQ] for r in state["releases"].values()), default=0)


def seal(state: dict, secret: bytes, key_ref: dict) -> None:
    """Chain every record (in ``seq`` order) and write the head and its MAC into ``state``."""
    prev = genesis(state["ledger_id"])
    records = ordered(state)
    for record in records:
        record[PREV] = prev
        record[DIGEST] = prev = record_digest(record)
    head = head_digest(state, prev, len(records))
    state["chain"] = {"records": len(records), "head": head, "mac": mac(secret, head),
                      "key": dict(key_ref)}


def _name(record: dict) -> str:
    return f"record {record.get(SEQ)} (release {record.get('versioned_id')!r})"


def verify(state: dict, secret: Optional[bytes]) -> None:
    """Raise ChainError naming the first record where the chain breaks, or the head; with
    ``secret``, the head's MAC is checked too (without it, only the digests)."""
    chain = state.get("chain")
    if not isinstance(chain, dict) or not all(isinstance(chain.get(k), str)
                                              for k in ("head", "mac")):
        raise ChainError("its head (the 'chain' entry) is missing or malformed")
    records = list(state["releases"].values())
    bad = [r for r in records if not isinstance(r.get(SEQ), int) or isinstance(r.get(SEQ), bool)]
    if bad:
        raise ChainError(f"{_name(bad[0])} has no record number: it was added by hand")
    prev = genesis(state["ledger_id"])
    for expected, record in enumerate(sorted(records, key=lambda r: r[SEQ]), 1):
        if record[SEQ] != expected:
            raise ChainError(
                f"{_name(record)} comes where record {expected} should be: a record before it "
                "was deleted, or records were renumbered")
        if record.get(PREV) != prev:
            raise ChainError(
                f"{_name(record)} does not follow the record before it (its link differs): a "
                "record before it was deleted, inserted, reordered or edited")
        if record.get(DIGEST) != record_digest(record):
            raise ChainError(f"{_name(record)} was edited (its content does not match its "
                             "digest)")
        prev = record[DIGEST]
    if chain.get("records") != len(records) or chain["head"] != head_digest(state, prev,
                                                                            len(records)):
        last = f" (the chain ends with {_name(ordered(state)[-1])})" if records else ""
        raise ChainError(
            f"its head does not match its records and budgets{last}: records after the last "
            "one were deleted, or scopes, budgets or indexes outside the records were edited")
    if secret is not None and not hmac.compare_digest(chain["mac"], mac(secret, chain["head"])):
        raise ChainError("its head's MAC does not verify under the ledger's chain key: the "
                         "ledger was rewritten by something other than this toolkit (its "
                         "digests recomputed by hand?)")
