"""``python -m accounting.ledger``: operator commands on a budget ledger.

* ``migrate --ledger L --key_store K``: chain a ledger written by an older version (see
  :mod:`accounting.ledger.migrate`); exit 0 when chained, 2 when refused (nothing written).
* ``verify --ledger L [--key_store K]``: check the ledger's structure and chain (and, with the
  key store, its MAC and its witness: the latest state this toolkit wrote); exit 0 when it
  verifies, 2 naming the first thing that does not.
* ``restore --ledger L --key_store K --reason TEXT``: accept a ledger restored from a backup on
  purpose (its chain and MAC verified), recorded in the ledger
  (:mod:`accounting.ledger.witness`).
* ``holds --ledger L --key_store K [--end RUN --reason TEXT [--host_dead]]``: list the runs
  holding releases; end the hold of a run whose host is known to be dead, recorded in the ledger.
* ``orphans --ledger L --key_store K [--staging_dir S] [--delete]``: list (and delete) release
  keys no record references and staging attempts of no reserved release, local or ``gs://``
  (:mod:`accounting.ledger.operations`).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _verify(ledger: str, key_store: Optional[str]) -> str:
    from accounting.ledger import chain, records
    from accounting.ledger.machine import BudgetLedger
    from accounting.ledger.sealing import load_json
    from accounting.ledger.stores import store_for

    if key_store:
        book = BudgetLedger(ledger, key_store)
        data = book._store.read()
        if data is None:
            raise records.LedgerError(f"ledger {ledger} does not exist")
        state = book._sealing.read(data)
        book._witness.check(state, getattr(book._store, "read_generation", None))
        return (f"ledger {book.path}: {len(state['releases'])} records, chain and MAC verified, "
                f"and its witness: write {state.get('writes', 0)} is the latest")
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
    return (f"ledger {ledger}: {len(state['releases'])} records, chain verified (its MAC and "
            "witness need --key_store)")


def _holds(book, args) -> str:
    from accounting.ledger import operations

    if args.end:
        ended = operations.end_hold(book, args.end, host_dead=args.host_dead,
                                    reason=args.reason or "")
        return f"ledger {book.path}: the hold of run {args.end} on {', '.join(ended)} ended; recorded"
    found = operations.list_holds(book)
    lines = [f"{h.kind} {h.versioned_id}: run {h.run} on {h.host.split('/')[0]} (pid {h.pid}) "
             f"until {h.until}, {'live' if h.live else 'lapsed'}" for h in found]
    return "\n".join(lines) or f"ledger {book.path}: no release is held"


def _orphans(book, args) -> str:
    from accounting.ledger import operations

    found = operations.orphans(book, args.staging_dir)
    if args.delete:
        operations.remove(found, book)
    verb = "deleted" if args.delete else "orphan"
    lines = [f"{verb} {o.kind} {o.where}: {o.why}" for o in found]
    return "\n".join(lines) or f"ledger {book.path}: no orphan keys or staging attempts"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m accounting.ledger",
                                     description=__doc__.split("\n\n")[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("migrate", "chain a ledger written by an older version"),
                            ("verify", "check a ledger's structure, chain, MAC and witness"),
                            ("restore", "accept a ledger restored from a backup on purpose"),
                            ("holds", "list the runs holding releases, or end one's hold"),
                            ("orphans", "list or delete orphan keys and staging attempts")):
        command = commands.add_parser(name, help=help_text, allow_abbrev=False)
        command.add_argument("--ledger", required=True, help="the ledger (local path or gs://)")
        command.add_argument("--key_store", required=name != "verify",
                             help="the ledger's key store (local folder or gs:// prefix)")
        if name in ("restore", "holds"):
            command.add_argument("--reason", help="why (recorded in the ledger)",
                                 required=name == "restore")
        if name == "holds":
            command.add_argument("--end", metavar="RUN", help="end the hold of this run")
            command.add_argument("--host_dead", action="store_true",
                                 help="the run's host is known to be dead (its hold is live)")
        if name == "orphans":
            command.add_argument("--staging_dir", help="the release layer's staging root")
            command.add_argument("--delete", action="store_true", help="delete what is listed")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from accounting.ledger import records

    args = _parser().parse_args(argv)
    try:
        if args.command == "migrate":
            from accounting.ledger.migrate import migrate

            count = migrate(args.ledger, args.key_store)
            print(f"ledger {args.ledger}: {count} records chained")
        elif args.command == "verify":
            print(_verify(args.ledger, args.key_store))
        else:
            from accounting.ledger import operations

            book = operations.open_ledger(args.ledger, args.key_store)
            if args.command == "restore":
                print(operations.restore(book, args.reason))
            elif args.command == "holds":
                print(_holds(book, args))
            else:
                print(_orphans(book, args))
    except records.LedgerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {type(err).__name__}: {err.strerror} ({err.filename})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
