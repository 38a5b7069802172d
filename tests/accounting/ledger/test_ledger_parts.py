"""The ledger's parts by concept, each tested on its own: budgets per scope, a reservation's
keys, the finalizing claim of holds, the consumed-id check's bookkeeping
(accounting/ledger/budgets.py, reservation_keys.py, holds.py, consumed_check.py)."""
from __future__ import annotations

import pytest

from accounting.budget import PrivacyBudget
from accounting.keystore import KeyStore
from accounting.ledger import budgets, consumed_check, holds, reservation_keys
from accounting.ledger.records import (BudgetExceededError, LedgerError, ReleaseRequest, Scope,
                                       empty_state)
from accounting.measures import Measure


def _measure(epsilon: float) -> Measure:
    return Measure(name="count", mechanism="laplace", epsilon=epsilon, delta=0.0,
                   neighbouring="add/remove one unit")


def _state_with(*charges) -> dict:
    state = empty_state("basic")
    for vid, scope, epsilon in charges:
        state["releases"][vid] = {"scopes": [scope], "measures": [_measure(epsilon).to_json()]}
    return state


def test_budgets_compose_every_record_of_a_scope_and_refuse_what_does_not_fit():
    state = _state_with(("a", "campaign:C", 0.4), ("b", "campaign:C", 0.5), ("c", "other", 9.0))
    state["scopes"]["campaign:C"] = {"epsilon": 1.0, "delta": 0.0}
    assert budgets.spent(state, "campaign:C", "basic").epsilon == pytest.approx(0.9)
    assert [m.epsilon for m in budgets.measures_of(state, "campaign:C", exclude="a")] == [0.5]
    scope = Scope(name="campaign:C", budget=PrivacyBudget(epsilon=1.0))
    fits = ReleaseRequest(release_id="d", measures=[_measure(0.1)], input_digest="sha256:d",
                          scopes=[scope])
    budgets.check_budgets(state, fits, None, "basic")
    over = ReleaseRequest(release_id="e", measures=[_measure(0.2)], input_digest="sha256:e",
                          scopes=[scope])
    with pytest.raises(BudgetExceededError, match="over its budget") as err:
        budgets.check_budgets(state, over, None, "basic")
    assert err.value.spent.epsilon == pytest.approx(0.9)
    budgets.check_budgets(state, over, "b", "basic")  # a take-over of b replaces its charge


def test_a_recorded_budget_is_lowered_freely_and_raised_only_deliberately():
    state = empty_state("basic")
    budgets.apply_budget(state, Scope(name="s", budget=PrivacyBudget(epsilon=2.0)), False)
    budgets.apply_budget(state, Scope(name="s", budget=PrivacyBudget(epsilon=1.0)), False)
    with pytest.raises(LedgerError, match="is larger"):
        budgets.apply_budget(state, Scope(name="s", budget=PrivacyBudget(epsilon=3.0)), False)
    budgets.apply_budget(state, Scope(name="s", budget=PrivacyBudget(epsilon=3.0)), True)
    assert state["scopes"]["s"]["epsilon"] == 3.0


def test_a_reservations_fresh_keys_are_stored_once_and_deleted_unless_taken(tmp_path):
    store = KeyStore(str(tmp_path / "keys"))
    keys = reservation_keys.ReservationKeys(store)
    request = ReleaseRequest(release_id="r/1", measures=[], input_digest="sha256:x", scopes=[],
                             key_names=("release", "helper"))
    refs = keys.fresh(request)
    assert keys.fresh(request) == refs  # a GCS conflict re-runs the transaction: same keys
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "keys").iterdir()) == \
        ["r_1", "r_1_helper"]
    assert reservation_keys.label("r/1", "helper") == "r/1/helper"
    keys.settle([("new", {"release_id": "r/1", "keys": {"release": refs["release"]}})])
    assert [p.name.split(".")[0] for p in (tmp_path / "keys").iterdir()] == ["r_1"]
    keys.abandon()
    assert list((tmp_path / "keys").iterdir()) == []


def test_a_finalizing_claim_is_taken_in_turns_and_let_go_by_its_holder_only():
    record: dict = {}
    assert holds.claim_finalizing(record, "t1", 60, None, now=1000.0) == (True, None)
    changed, other = holds.claim_finalizing(record, "t2", 60, None, now=1001.0)
    assert not changed and other["token"] == "t1"
    assert holds.claim_finalizing(record, "t2", 60, "t1", now=1001.0) == (True, None)
    assert holds.claim_finalizing(record, "t1", 0, None, now=1002.0) == (False, None)
    assert holds.claim_finalizing(record, "t2", 0, None, now=1002.0) == (True, None)
    assert record["finalizing"] is None


def test_a_live_hold_of_another_run_refuses_and_a_dead_one_is_removed():
    mine, other = holds.Hold.new(), holds.Hold.new()
    record = {"versioned_id": "r", "hold": other.to_json()}
    with pytest.raises(LedgerError, match="held by another run"):
        holds.check(record, mine)
    holds.check(record, other)  # its own hold
    record["hold"]["pid"] = 2 ** 22 + 7  # no such process on this host: dead
    holds.check(record, mine)
    assert "hold" not in record
    holds.take(record, mine)
    assert record["hold"]["run"] == mine.run


def test_the_consumed_check_knows_which_record_files_the_ledger_references():
    state = {"releases": {"a": {"consumed": {"ns": {"file": "x.arrow"}, "empty": {"file": None}}},
                          "b": {}}}
    assert consumed_check.referenced_files(state) == {"x.arrow"}
    assert consumed_check.CONSUMED_SUFFIX == ".consumed"
