"""``python -m accounting.ledger``: operator commands on a budget ledger.

* ``migrate --ledger L --key_store K``: chain a ledger written by an older version (see
  :mod:`accounting.ledger.migrate`); exit 0 when chained, 2 when refused (nothing written).
* ``verify --ledger L [--key_store K]``: check the ledger's structure and chain (and, with the
  key store, its MAC); exit 0 when it verifies, 2 naming the first record that does not.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _verify(ledger: str, key_store: Optional[str]) -> str:
    from accounting.ledger import chain
    from accounting.ledger import records
    from accounting.ledger.machine import BudgetLedger
    from accounting.ledger.sealing import load_json
    from accounting.ledger.stores import store_for

    if key_store:
        book = BudgetLedger(ledger, key_store)
        data = book._store.read()
        if data is None:
            raise records.LedgerError(f"ledger {ledger} does not exist")
        state = book._sealing.read(data)
        return f"ledger {book.path}: {len(state['releases'])} records, chain and MAC verified"
    data = store_for(ledger).read()
    if data is None:
        raise records.LedgerError(f"ledger {ledger} does not exist")
    state = load_json(data, ledger)
    if not isinstance(state, dict) or state.get("format") != records.FORMAT:
        raise records.LedgerError(f"ledger {ledger} is not a {records.FORMAT} file")
    try:
        records.check_structure(state)
        chain.verify(state, None)
        records.check_indexes(state)
    except ValueError as err:
        raise records.LedgerError(f"ledger {ledger} does not verify: {err}")
    return (f"ledger {ledger}: {len(state['releases'])} records, chain verified (its MAC needs "
            "--key_store)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from accounting.ledger import records

    parser = argparse.ArgumentParser(prog="python -m accounting.ledger",
                                     description=__doc__.split("\n\n")[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("migrate", "chain a ledger written by an older version"),
                            ("verify", "check a ledger's structure, chain and MAC")):
        command = commands.add_parser(name, help=help_text, allow_abbrev=False)
        command.add_argument("--ledger", required=True, help="the ledger (local path or gs://)")
        command.add_argument("--key_store", required=name == "migrate",
                             help="the ledger's key store (local folder or gs:// prefix)")
    args = parser.parse_args(argv)
    try:
        if args.command == "migrate":
            from accounting.ledger.migrate import migrate

            count = migrate(args.ledger, args.key_store)
            print(f"ledger {args.ledger}: {count} records chained")
        else:
            print(_verify(args.ledger, args.key_store))
    except records.LedgerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
