"""The ledger's witness: its latest state, kept in the key store, where the ledger's writer
cannot reach.

The chain and its MAC (:mod:`~accounting.ledger.chain`) stop a hand edit. They cannot stop a
*rollback*: an older copy of the ledger (a backup, a bucket's earlier object version) carries a
valid chain and MAC, and restoring it forgets the releases charged since -- their spend and the
ids they consumed, so the same report could be published twice. So every write also records, in
the key store, the head it wrote and the ledger's **write number** (``writes``: 1, 2, ... one per
write, covered by the head), and on ``gs://`` the object's generation; every read by a process
holding the key store compares the ledger with it, before anything is charged:

* the ledger is at the witness's write number with its head: the latest state -- accepted (on
  ``gs://`` an object generation other than the witnessed one means the same bytes were copied
  back in place: a warning; any other content has another head);
* one write ahead, and its ``previous_head`` is the witness's head: this toolkit's own write,
  whose witness update was interrupted (killed, or the key store unwritable for a moment) --
  accepted, and the next write brings the witness up to date;
* anything else -- an older write number (rolled back), the same number with another head
  (rewritten), further ahead -- is refused, naming both states.

A ledger without a witness is accepted only at its first write (a new ledger, or one written by
a version before witnesses); a witnessed ledger whose witness is gone is refused. The witness is
written atomically (:mod:`accounting.durable`); an empty or cut one -- this toolkit's own write,
interrupted on a file system without atomic renames -- is repaired by the next write.

**A deliberate restore** (the ledger's disk was lost and a backup is all there is) is accepted
by the operator command ``python -m accounting.ledger restore --ledger L --key_store K --reason
TEXT``: it verifies the restored ledger's chain and MAC, records the restore in the ledger
(``restores``: when, by whom, why, the state it replaced and the one it restored), numbers the
write past the witness's and updates the witness. Releases charged after the backup are gone
from the restored ledger; their published markers still name them (the release layer refuses
to release those again, :mod:`pipelines.release.publish`).

Writes and reads of the witness: the ledger writes it inside its own transaction, after the
ledger write (under the local lock; on ``gs://`` the ledger with ``if_generation_match`` on the
object as read, the witness with ``if_generation_match`` on the witness as read, so of two
racing writers only the one that read the latest witness updates it, and a reader that sees the
ledger replaced while it checked reads both again).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from typing import Optional

from accounting import durable
from accounting.keystore import KeyStore
from accounting.ledger import chain
from accounting.ledger.records import LedgerError, now
from accounting.ledger.sealing import error_text
from accounting.ledger.stores import LedgerConflict

_LOG = logging.getLogger(__name__)

WITNESS_PREFIX = "ledger-witness-"
#: What :meth:`Witness.read` returns for an empty or cut witness file.
INTERRUPTED = {"interrupted": True}
FORMAT = "beam-dp-release/ledger-witness/v1"
RESTORE = "python -m accounting.ledger restore"


def witness_name(ledger_id: str) -> str:
    return f"{WITNESS_PREFIX}{ledger_id}"


def position(state: dict) -> dict:
    """A ledger state's place in its history: write number, head and the head before."""
    return {"writes": int(state.get("writes") or 0),
            "head": (state.get("chain") or {}).get("head"),
            "previous_head": state.get("previous_head")}


def charge_position(state: dict) -> dict:
    """Where a charge (a reservation, or a take-over's fresh keys) enters the ledger: the write
    that records it, the head it follows (a new ledger: its chain's genesis) and a random charge
    id. A published release carries the charge id in its marker (``ledger_charge``), so a reader
    without the key store (the catalog) can tell a ledger older than its releases (the record
    is missing) or one that charged them again (another id). The marker carries neither the
    write number (it counts failed runs too) nor the head (a digest of private ledger state,
    input digests included): only public information shapes a release."""
    return {"writes": int(state.get("writes") or 0) + 1,
            "after_head": (state.get("chain") or {}).get("head") or chain.genesis(state["ledger_id"]),
            "charge": secrets.token_hex(16)}


def advance(state: dict) -> None:
    """Before a state is sealed for writing: its write number goes up by one and it remembers
    the head it replaces (None for a new ledger)."""
    state["previous_head"] = (state.get("chain") or {}).get("head")
    state["writes"] = int(state.get("writes") or 0) + 1


class Witness:
    """The witness of the ledger at ``path`` in ``key_store`` (see the module docstring)."""

    def __init__(self, key_store: KeyStore, path: str):
        self.key_store, self.path = key_store, path
        self._generation: dict = {}   # ledger id -> the witness generation last read
        self._written: Optional[dict] = None   # the position of the state last sealed

    def read(self, ledger_id: str) -> Optional[dict]:
        """The witness of ``ledger_id`` (None: none yet); LedgerError if it cannot be read."""
        name = witness_name(ledger_id)
        try:
            data, generation = self.key_store.read_record(name)
        except (OSError, durable.GenerationMismatch) as err:
            raise LedgerError(f"ledger {self.path}: its witness in key store "
                              f"{self.key_store.root} cannot be read ({error_text(err)}); "
                              "refusing. Nothing was charged") from None
        self._generation[ledger_id] = generation
        if data is None:
            return None
        try:
            witness = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            # Empty or cut: this toolkit's own interrupted write (on a file system where a
            # rename is not atomic); the next write of the ledger writes it again.
            return INTERRUPTED
        if not isinstance(witness, dict) or witness.get("format") != FORMAT or \
                witness.get("ledger_id") != ledger_id or not isinstance(witness.get("writes"), int):
            raise LedgerError(f"ledger {self.path}: {self.key_store.record_uri(name)} is not its "
                              "witness; refusing. Nothing was charged")
        return witness

    def check(self, state: dict, generation: Optional[int], changed=lambda: False) -> None:
        """Refuse (LedgerError) a ledger state that is not the latest this toolkit wrote;
        ``changed()``: whether the ledger was replaced since ``state`` was read (then its
        witness may be newer: LedgerConflict, read it again)."""
        try:
            self._check(state, generation)
        except LedgerError:
            if changed():
                raise LedgerConflict(f"ledger {self.path} changed while it was checked") from None
            raise

    def _check(self, state: dict, generation: Optional[int]) -> None:
        witness = self.read(state["ledger_id"])
        here = position(state)
        if witness is INTERRUPTED:
            _LOG.warning("ledger %s: its witness was cut by an interrupted write; the next write "
                         "repairs it", self.path)
            return
        if witness is None:
            if here["writes"] <= 1:
                return
            raise self._refuse(here, None, "its witness is missing from the key store (the "
                               "ledger was witnessed: it is at write "
                               f"{here['writes']})")
        if here["writes"] == witness["writes"] and here["head"] == witness.get("head"):
            if generation and witness.get("generation") and generation != witness["generation"]:
                _LOG.warning("ledger %s: object generation %s, its witness recorded %s: the "
                             "latest state was copied back in place (its content is the "
                             "witnessed one)", self.path, generation, witness["generation"])
            return
        if here["writes"] == witness["writes"] + 1 and here["previous_head"] == witness.get("head"):
            return  # this toolkit's write, whose witness update was interrupted
        if here["writes"] < witness["writes"]:
            why = (f"the ledger is at write {here['writes']}, its witness at write "
                   f"{witness['writes']}: an older copy was restored (rolled back)")
        elif here["writes"] == witness["writes"]:
            why = (f"the ledger and its witness are both at write {here['writes']} with other "
                   "heads: it was rewritten (resealed) outside this toolkit")
        else:
            why = (f"the ledger is at write {here['writes']}, past its witness's write "
                   f"{witness['writes']} (head {witness.get('head')}), and does not follow it: "
                   "it was written outside this toolkit")
        raise self._refuse(here, witness, why)

    def _refuse(self, here: dict, witness: Optional[dict], why: str) -> LedgerError:
        return LedgerError(
            f"ledger {self.path} is not the latest state this toolkit wrote: {why} (ledger head "
            f"{here['head']}, witness head {None if witness is None else witness.get('head')}). "
            "Refusing to use it; nothing was charged. If you restored it from a backup on "
            f"purpose: {RESTORE} --ledger {self.path} --key_store {self.key_store.root} "
            "--reason '...'")

    def sealed(self, state: dict) -> None:
        """The state about to be written (after :func:`advance` and sealing)."""
        self._written = {"ledger_id": state["ledger_id"], **position(state)}

    def written(self, generation: Optional[int]) -> None:
        """After the ledger write (inside its transaction): the witness records it. A witness
        that cannot be written leaves the ledger one write ahead, which the next read accepts."""
        if self._written is None:
            return
        written, self._written = self._written, None
        ledger_id = written["ledger_id"]
        if ledger_id not in self._generation:
            self.read(ledger_id)
        body = {"format": FORMAT, "ledger_id": ledger_id, "ledger": self.path,
                "writes": written["writes"], "head": written["head"],
                "generation": generation or None, "at": now()}
        data = (json.dumps(body, indent=1, sort_keys=True) + "\n").encode("utf-8")
        try:
            self._generation[ledger_id] = self.key_store.write_record(
                witness_name(ledger_id), data, generation=self._generation[ledger_id])
        except durable.GenerationMismatch:
            self._generation.pop(ledger_id, None)  # a later writer's witness is newer
        except OSError as err:
            self._generation.pop(ledger_id, None)
            _LOG.warning("ledger %s: its witness could not be updated (%s); the next write "
                         "brings it up to date", self.path, error_text(err))

    def discard(self) -> None:
        """The sealed state was not written (a conflict, or a refusal)."""
        self._written = None


def restore_entry(state: dict, witness: Optional[dict], reason: str) -> dict:
    """The ledger's record of a deliberate restore (see the module docstring)."""
    return {"at": now(), "reason": reason, "host": socket.gethostname(), "pid": os.getpid(),
            "restored": {"writes": position(state)["writes"], "head": position(state)["head"]},
            "replaced": None if not witness or "writes" not in witness else {
                "writes": witness["writes"], "head": witness.get("head")}}
