"""The persistent privacy-budget ledger of scheduled releases (local file or ``gs://`` object).

* :mod:`~accounting.ledger.records` -- the format, budget scopes, release records and states;
* :mod:`~accounting.ledger.stores` -- where the ledger lives and how it is updated atomically;
* :mod:`~accounting.ledger.machine` -- :class:`BudgetLedger`, the state machine: reserve, take
  over, publish, commit;
* :mod:`~accounting.ledger.budgets` -- what a scope has spent, and whether a release still fits;
* :mod:`~accounting.ledger.reservation_keys` -- a reservation's keys: fresh ones stored before the
  charge, existing ones loaded inside it, each bound to its release and input;
* :mod:`~accounting.ledger.chain` -- each record carries the digest of the one before, the
  head a MAC keyed from the key store: a hand edit is refused, naming the record;
* :mod:`~accounting.ledger.sealing` -- reading (structure, chain and MAC verified) and writing
  (sealed) the ledger document;
* :mod:`~accounting.ledger.witness` -- the latest state, witnessed in the key store: a
  rolled-back or rewritten ledger is refused before any charge;
* :mod:`~accounting.ledger.operations` -- operator commands: a deliberate restore, holds of dead
  hosts, orphan keys and staging attempts (``python -m accounting.ledger``);
* :mod:`~accounting.ledger.holds` -- which run is working on a release: a concurrent run is
  refused ("held by another run") before anything is charged or stored; which process is
  finishing a submitted release;
* :mod:`~accounting.ledger.migrate` -- chaining a ledger of an older version, once
  (``python -m accounting.ledger migrate``; ``verify`` checks a ledger);
* :mod:`~accounting.ledger.digest` -- the input digest a release's keys are bound to;
* :mod:`~accounting.ledger.consumed` -- what each release consumed (ids aggregated at most once);
* :mod:`~accounting.ledger.consumed_check` -- the consumed-id side of a reservation: checked
  against every other release and recorded, inside the charge's transaction.
"""
from accounting.ledger.consumed import ConsumedIds, ConsumedResult
from accounting.ledger.digest import canonical_json, combine, input_digest, keyed_binding
from accounting.ledger.machine import BudgetLedger
from accounting.ledger.records import (COMMITTED, PUBLISHING, RESERVED, BudgetExceededError,
                                       ChangedInputError, ConsumedIdsError,
                                       ContentAlreadyReleased, LedgerError, ReleaseHeld,
                                       ReleaseRequest, Reservation, Scope)
from accounting.ledger.stores import LedgerConflict, LedgerStoreError

__all__ = ["BudgetLedger", "Scope", "ReleaseRequest", "Reservation", "LedgerError",
           "BudgetExceededError", "ChangedInputError", "ContentAlreadyReleased", "LedgerConflict",
           "ReleaseHeld",
           "ConsumedIds", "ConsumedResult", "ConsumedIdsError",
           "LedgerStoreError", "RESERVED", "PUBLISHING", "COMMITTED", "input_digest",
           "keyed_binding", "canonical_json", "combine"]
