"""Chaining a ledger written by an older version (v1, v2 or v3), once, deliberately.

A ledger without a record chain cannot show whether it was edited by hand, so the release layer
refuses it (naming this command) instead of chaining it silently on its next write: a silent
upgrade would bless whatever was edited before -- or after someone stripped the chain of a
chained ledger to edit it. The operator checks the ledger, then runs::

    python -m accounting.ledger migrate --ledger private/ledger.json --key_store private/keys

which upgrades the format (a v1 ledger's campaigns become scopes, as before), numbers the
records in the order they were charged (``charged_at``, then release id and version), checks
every field's type (naming a malformed record), creates the ledger's chain key in the key store
and writes the chained ledger atomically. It refuses a ledger that is chained already (nothing to
do) and one whose chain key exists in the key store (it *was* chained: the chain was removed).
"""
from __future__ import annotations

from accounting.ledger import chain
from accounting.ledger import records
from accounting.ledger.machine import BudgetLedger
from accounting.ledger.sealing import load_json


def _order(record: dict) -> tuple:
    return (str(record.get("charged_at") or ""), str(record.get("release_id")),
            record.get("version") if isinstance(record.get("version"), int) else 0)


def upgrade(state: dict) -> dict:
    """An unchained state in the current format's layout, its records numbered (not sealed)."""
    if state.get("format") == records.FORMAT_V1:
        state = records.upgrade_v1(state)
    state["format"] = records.FORMAT  # v2 -> v3 only added consumed-id records; v4 adds the chain
    releases = state.get("releases")
    if isinstance(releases, dict) and all(isinstance(r, dict) for r in releases.values()):
        for seq, record in enumerate(sorted(releases.values(), key=_order), 1):
            record[chain.SEQ] = seq
    return state


def migrate(path: str, key_store) -> int:
    """Chain the ledger at ``path`` (see the module docstring); returns its number of records.
    Raises LedgerError (nothing written) when it cannot."""
    ledger = BudgetLedger(path, key_store)
    sealing = ledger._sealing

    def update(data):
        if data is None:
            raise records.LedgerError(f"ledger {ledger.path} does not exist: nothing to migrate")
        state = load_json(data, ledger.path)
        if not isinstance(state, dict) or state.get("format") not in records.UNCHAINED:
            fmt = state.get("format") if isinstance(state, dict) else None
            raise records.LedgerError(f"ledger {ledger.path} is {fmt or 'not a ledger'}, not a ledger "
                                "without a chain: nothing to migrate")
        if isinstance(state.get("ledger_id"), str) and sealing.chain_keys(state["ledger_id"]):
            raise sealing.unchained(state)
        state = upgrade(state)
        sealing.check(state)
        try:
            records.check_indexes(state)
        except ValueError as err:
            raise records.LedgerError(f"ledger {ledger.path} is malformed: {err}; nothing was migrated")
        return len(state["releases"]), ledger._dump(state)

    return ledger._transact(update)
