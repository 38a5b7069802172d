"""Reading and writing a ledger document: its structure checked, its chain verified and sealed.

:class:`Sealing` is the part of a :class:`~accounting.ledger.machine.BudgetLedger` that turns
bytes into a verified state and a state into sealed bytes (:mod:`~accounting.ledger.chain`):

* **read**: valid JSON, the current format (an older, unchained one is refused, naming the
  migration: ``python -m accounting.ledger migrate``), every field of the right type (else the
  record is named), the chain and its MAC verified under the chain key from the key store (a key
  that cannot be loaded refuses the ledger: it cannot be verified);
* **write**: the records chained and the head MAC'd; a new ledger gets its chain key here,
  saved in the key store before the ledger that references it is written, and deleted again if
  that ledger is not written (a refusal, or another writer created the ledger first).

Every refusal is a :class:`~accounting.ledger.records.LedgerError` naming the ledger file, and
never quoting its content.
"""
from __future__ import annotations

import hashlib
import json
from typing import Optional

from accounting.keys import ReleaseKey
from accounting.keystore import KeyOutsideStore, KeyRef, KeyStore
from accounting.ledger import chain
from accounting.ledger import records

#: The key-store name of a ledger's chain key (one per ledger id).
CHAIN_KEY_PREFIX = "ledger-chain-"
MIGRATE = "python -m accounting.ledger migrate"


def chain_key_name(ledger_id: str) -> str:
    return f"{CHAIN_KEY_PREFIX}{ledger_id}"


def load_json(data: bytes, path: str):
    """The parsed ledger document (LedgerError naming the file, never quoting it)."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise records.LedgerError(f"ledger {path} is not valid JSON (emptied, cut or overwritten?): "
                            "refusing to use it") from None


def error_text(err: BaseException) -> str:
    """An error's class and, for an OS error, its errno text (never a message that could
    quote a file)."""
    if isinstance(err, OSError) and err.strerror:
        return f"{type(err).__name__}: {err.strerror}"
    return type(err).__name__


class Sealing:
    """Verify on read, seal on write (see the module docstring), for the ledger at ``path``."""

    def __init__(self, key_store: KeyStore, path: str):
        self.key_store, self.path = key_store, path
        self._secrets: dict = {}        # chain key fingerprint -> secret
        self._verified: Optional[bytes] = None   # SHA-256 of the bytes last verified
        self._pending: Optional[tuple] = None    # (ledger id, KeyRef) made for a new ledger
        self._sealed_with: Optional[str] = None

    # ----------------------------------------------------------------- read
    def read(self, data: bytes) -> dict:
        """The verified state of a ledger document (raises LedgerError)."""
        state = load_json(data, self.path)
        if isinstance(state, dict) and state.get("format") in records.UNCHAINED:
            raise self.unchained(state)
        if not isinstance(state, dict) or state.get("format") != records.FORMAT or \
                not isinstance(state.get("ledger_id"), str):
            raise records.LedgerError(f"ledger {self.path} is not a {records.FORMAT} file: refusing to use "
                                "it")
        self.check(state)
        digest = hashlib.sha256(data).digest()
        if digest != self._verified:
            ref = (state.get("chain") or {}).get("key")
            if not (isinstance(ref, dict) and isinstance(ref.get("uri"), str)
                    and isinstance(ref.get("fingerprint"), str)):
                raise self._refuse("its head names no chain key")
            try:
                chain.verify(state, self.secret(ref, state["ledger_id"]))
                records.check_indexes(state)
            except ValueError as err:
                raise self._refuse(str(err))
            self._verified = digest
        return state

    def check(self, state: dict) -> None:
        """The structure of a state (types; records named), before its chain is checked."""
        try:
            records.check_structure(state)
        except ValueError as err:
            raise records.LedgerError(f"ledger {self.path} is malformed: {err}. Refusing to use it; "
                                "nothing was charged") from None

    def _refuse(self, why: str) -> records.LedgerError:
        return records.LedgerError(
            f"ledger {self.path} does not verify: {why}. Refusing to use it; nothing was "
            "charged. A ledger is only ever written by the release layer: restore it from a "
            "backup, and find out who edited it")

    def unchained(self, state: dict) -> records.LedgerError:
        """The refusal of a ledger without a record chain (an older format, or stripped)."""
        ledger_id = state.get("ledger_id")
        found = self.chain_keys(ledger_id) if isinstance(ledger_id, str) else []
        if found:
            return records.LedgerError(
                f"ledger {self.path} has no record chain, but the key store holds its chain key "
                f"({found[0]}): it was chained, and the chain was removed by hand. Refusing to "
                "use it; nothing was charged. Restore it from a backup")
        return records.LedgerError(
            f"ledger {self.path} is a {state.get('format')} ledger, written by an older version "
            "without a record chain: a hand edit of it could not be detected. Check it, then "
            f"chain it once: {MIGRATE} --ledger {self.path} --key_store {self.key_store.root}. "
            "Nothing was charged")

    def chain_keys(self, ledger_id: str) -> list:
        try:
            return self.key_store.named(chain_key_name(ledger_id))
        except OSError as err:
            raise records.LedgerError(f"ledger {self.path}: key store {self.key_store.root} cannot be "
                                f"listed ({error_text(err)}); refusing") from None

    def secret(self, ref: dict, ledger_id: str) -> bytes:
        """The chain key's secret (loaded once; its fingerprint checked), resolved inside the
        key store under the ledger's chain-key name: a head naming a key anywhere else (a key
        of whoever rewrote the ledger) is refused."""
        fingerprint = ref["fingerprint"]
        if fingerprint not in self._secrets:
            try:
                key = self.key_store.load(self.key_store.resolve(KeyRef.from_json(ref),
                                                                 chain_key_name(ledger_id)))
            except KeyOutsideStore as err:
                raise self._refuse(f"its head names a chain key outside the key store ({err})") \
                    from None
            except (OSError, ValueError) as err:
                raise records.LedgerError(
                    f"ledger {self.path}: its chain key {ref['uri']} cannot be loaded "
                    f"({error_text(err)}): without it the ledger cannot be verified. Refusing "
                    "to use it; nothing was charged (restore the key store, or point "
                    "--key_store at it)") from None
            self._secrets[fingerprint] = key.secret_bytes()
        return self._secrets[fingerprint]

    # ----------------------------------------------------------------- write
    def seal(self, state: dict) -> None:
        """Chain the records and MAC the head; a new ledger's chain key is created here."""
        ref = (state.get("chain") or {}).get("key")
        if ref is None:
            ref = self._new_key(state["ledger_id"])
        chain.seal(state, self.secret(ref, state["ledger_id"]), ref)
        self._sealed_with = ref["fingerprint"]

    def _new_key(self, ledger_id: str) -> dict:
        if self._pending is not None and self._pending[0] != ledger_id:
            self.key_store.delete(self._pending[1])
            self._pending = None
        if self._pending is None:
            if self.chain_keys(ledger_id):
                raise records.LedgerError(f"ledger {self.path}: a chain key for ledger id {ledger_id} "
                                    "exists already; refusing to chain it again")
            key = ReleaseKey.generate()
            ref = self.key_store.save(key, chain_key_name(ledger_id),
                                      issued_for="a budget ledger's record chain")
            self._secrets[ref.fingerprint] = key.secret_bytes()
            self._pending = (ledger_id, ref)
        return self._pending[1].to_json()

    def settle(self, written: bool) -> None:
        """After a transaction: a chain key made for a new ledger is kept only if the ledger
        written references it."""
        if self._pending is None:
            return
        if not written or self._sealed_with != self._pending[1].fingerprint:
            self.key_store.delete(self._pending[1])
        self._pending = None
