"""What the budget ledger stores: its format, budget scopes, release records and their states.

A ledger is one JSON document::

    {"format": "beam-dp-release/budget-ledger/v4", "ledger_id": "<random hex>",
     "accountant": "basic" | "zcdp" | "pld",
     "scopes":   {scope name: {"epsilon": .., "delta": ..}},      # recorded budgets
     "releases": {versioned id: record},  "latest": {release id: versioned id},
     "content":  {content key: versioned id},
     "consumed_key": {"uri": .., "fingerprint": ..},              # once a release consumed ids
     "writes": n, "previous_head": ..,                            # its witness: witness.py
     "restores": [..], "operations": [..],                        # operator commands
     "chain": {"records": n, "head": .., "mac": .., "key": {"uri": .., "fingerprint": ..}}}

A record holds the release id and version, the measures it spends (:class:`Measure` JSON: the
mechanism, its noise and its cost), the scopes charged, the input digest, *references* to its
keys (location and public fingerprint -- never a key), what it consumed (``consumed``: per
namespace the file of its ids' keyed hashes, its SHA-256 and count; see
:mod:`~accounting.ledger.consumed`), its state and history, the run holding it (``hold``, while
one runs: :mod:`~accounting.ledger.holds`) and its place in the chain (``seq``, ``prev``,
``digest``: :mod:`~accounting.ledger.chain`). Every read checks each field's type
(:func:`check_structure`, naming a malformed record) and verifies the chain. States:

* ``reserved``: charged; nothing has been published. Outputs, if any, are in private staging.
* ``publishing``: publication has started; the key and input are pinned from here on.
* ``committed``: published and recorded.

A submitted release (``--submit_only``) also holds ``submission``: the handle of the job computing
it (runner, job id and state, staging attempt, the fingerprints of its keys); ``finalizing``: who
is finishing it, until when (:meth:`BudgetLedger.claim`).

The ``ledger_id`` is drawn once, when the ledger is created: published releases and output roots
carry it, so a ledger that was deleted, replaced or mistyped is recognised as not theirs.
"""
from __future__ import annotations

import datetime as _dt
import secrets
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.keystore import KeyRef
from accounting.ledger.consumed import ConsumedIds
from accounting.measures import Measure

#: v4 chains its records (:mod:`~accounting.ledger.chain`); v3 added consumed-id records. A v1,
#: v2 or v3 ledger has no chain: it is refused until migrated once (``python -m accounting.ledger
#: migrate``), and a v4 ledger is refused by older code, which would not keep its chain.
FORMAT = "beam-dp-release/budget-ledger/v4"
FORMAT_V3 = "beam-dp-release/budget-ledger/v3"
FORMAT_V2 = "beam-dp-release/budget-ledger/v2"
FORMAT_V1 = "beam-dp-release/budget-ledger/v1"
#: Formats without a record chain (read by the release catalog; migrated by the ledger).
UNCHAINED = (FORMAT_V3, FORMAT_V2, FORMAT_V1)
RESERVED, PUBLISHING, COMMITTED = "reserved", "publishing", "committed"
STATES = (RESERVED, PUBLISHING, COMMITTED)


class LedgerError(RuntimeError):
    """A release the ledger refuses (nothing was spent)."""


class BudgetExceededError(LedgerError):
    def __init__(self, message, *, scope: str, spent, requested, budget):
        super().__init__(message)
        self.scope, self.spent, self.requested, self.budget = scope, spent, requested, budget


class ChangedInputError(LedgerError):
    """The release id was published for a different input digest (a new version is needed)."""


class ContentAlreadyReleased(LedgerError):
    """The same content (e.g. the same set of reports) was already released under another id."""


class ReleaseHeld(LedgerError):
    """Another run that is still running holds the release (:mod:`~accounting.ledger.holds`)."""


class ConsumedIdsError(LedgerError):
    """Some ids of the release were already consumed by other releases (at most once)."""

    def __init__(self, message, *, namespace: str, count: int, holders: Mapping[str, int]):
        super().__init__(message)
        self.namespace, self.count, self.holders = namespace, count, dict(holders)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True, kw_only=True)
class Scope:
    """A budget scope: every release charged to it, composed, must fit ``budget``.

    Names are conventions of the jobs, e.g. ``campaign:C1`` (a campaign's total),
    ``period:C1:2026-11-26`` (one campaign-day), ``unit-period:2026-11-26`` (one privacy unit's
    loss on a day across all campaigns).
    """

    name: str
    budget: PrivacyBudget
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a scope needs a non-empty name, got {self.name!r}")
        if not isinstance(self.budget, PrivacyBudget) or self.budget.is_zcdp:
            raise ValueError(f"scope {self.name!r}: a ledger budget is an (epsilon, delta) "
                             "PrivacyBudget (zCDP releases are converted by the zcdp accountant)")


@dataclass(frozen=True, kw_only=True)
class ReleaseRequest:
    """What one release asks of the ledger.

    ``key_names``: the independent secret keys the release needs (one by default; e.g. one per
    helper when no single party may know every noise share). ``content_key``: a digest of the
    released content that may be released only once under any id (e.g. a set of reports).
    ``consumes``: the ids it aggregates, per namespace (:class:`~accounting.ledger.consumed.
    ConsumedIds`), checked against every other release's record and recorded with it.
    """

    release_id: str
    measures: Sequence[Measure]
    input_digest: str
    scopes: Sequence[Scope]
    key_names: Sequence[str] = ("release",)
    content_key: Optional[str] = None
    metadata: Mapping = field(default_factory=dict)
    consumes: Sequence = ()

    def __post_init__(self):
        if not isinstance(self.release_id, str) or not self.release_id or "#" in self.release_id:
            raise ValueError(f"release_id must be a non-empty string without '#', got {self.release_id!r}")
        if not all(isinstance(m, Measure) for m in self.measures):
            # Empty: a release that spends nothing (recorded, charged (0, 0) to its scopes).
            raise ValueError(f"release {self.release_id!r}: measures must be a sequence of "
                             "Measures")
        if not isinstance(self.input_digest, str) or not self.input_digest:
            raise ValueError("input_digest must be a non-empty string")
        if (self.measures and not self.scopes) or \
                not all(isinstance(s, Scope) for s in self.scopes):
            raise ValueError(f"release {self.release_id!r}: scopes must be a non-empty sequence "
                             "of Scopes (empty only for a release that spends nothing)")
        names = [s.name for s in self.scopes]
        if len(set(names)) != len(names):
            raise ValueError(f"release {self.release_id!r}: scope names repeat: {names}")
        if not self.key_names or len(set(self.key_names)) != len(self.key_names) or \
                not all(isinstance(k, str) and k for k in self.key_names):
            raise ValueError(f"release {self.release_id!r}: key_names must be distinct names")
        object.__setattr__(self, "measures", tuple(self.measures))
        object.__setattr__(self, "scopes", tuple(self.scopes))
        object.__setattr__(self, "key_names", tuple(self.key_names))
        spaces = [c.namespace for c in self.consumes if isinstance(c, ConsumedIds)]
        if len(spaces) != len(self.consumes) or len(set(spaces)) != len(spaces):
            raise ValueError(f"release {self.release_id!r}: consumes must be ConsumedIds of "
                             "distinct namespaces")
        object.__setattr__(self, "consumes", tuple(self.consumes))

    def measures_json(self) -> list:
        return [m.to_json() for m in self.measures]


@dataclass(frozen=True, kw_only=True)
class Reservation:
    """A charged release: draw all its randomness from ``keys``, publish, then commit.

    ``resumed``: the release was already charged for this input (an earlier run crashed or is
    being repeated); nothing more was spent. ``taken_over``: an earlier run charged it for other
    input but published nothing; this run takes the reservation over with fresh keys, spending
    nothing more. ``state``: the record's state when this run obtained it. ``consumed``: per
    namespace of the request's ``consumes``, the ledger's decision (ids held by other releases,
    budget grants; :class:`~accounting.ledger.consumed.ConsumedResult`).
    """

    release_id: str
    version: int
    versioned_id: str
    keys: Mapping[str, ReleaseKey] = field(repr=False)
    key_refs: Mapping[str, KeyRef]
    record: dict = field(repr=False, compare=False)
    ledger_id: str = ""
    resumed: bool = False
    taken_over: bool = False
    state: str = RESERVED
    consumed: Mapping = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> ReleaseKey:
        """The release's key when it has one named ``release`` (the usual case)."""
        return self.keys["release"]

    @property
    def committed(self) -> bool:
        return self.state == COMMITTED


def versioned_id(release_id: str, version: int) -> str:
    return release_id if version == 1 else f"{release_id}#{version}"


def empty_state(accountant: str) -> dict:
    return {"format": FORMAT, "ledger_id": secrets.token_hex(16), "accountant": accountant,
            "scopes": {}, "releases": {}, "latest": {}, "content": {}, "created_at": now(),
            "updated_at": None}


def upgrade_v1(state: dict) -> dict:
    """A v1 ledger (campaign budgets, charges) as v2 (scopes, measures), keeping every charge.

    v1 campaign totals become ``campaign:<id>`` scopes and per-period budgets
    ``period:<id>:<period>`` scopes; charges become measures with mechanism ``recorded``; a v1
    record still ``charged`` (outputs may exist) becomes ``publishing``, so it is pinned to its
    key and input. The ledger gets its id now and keeps it from the next write on.
    """
    out = empty_state(state.get("accountant", "basic"))
    out["created_at"] = state.get("created_at")
    campaigns = state.get("campaigns", {})
    for campaign, budget in campaigns.items():
        out["scopes"][f"campaign:{campaign}"] = dict(budget["total"])
    for vid, record in state.get("releases", {}).items():
        campaign = record["campaign"]
        per_period = (campaigns.get(campaign) or {}).get("per_period")
        scopes = [f"campaign:{campaign}"]
        for period in record.get("periods", []):
            if per_period is not None:
                name = f"period:{campaign}:{period}"
                out["scopes"][name] = dict(per_period)
                scopes.append(name)
        measures = [Measure(name=c.get("label") or f"charge{i}", mechanism="recorded",
                            epsilon=c["epsilon"], delta=c.get("delta", 0.0), rho=c.get("rho"),
                            neighbouring="as recorded by a v1 ledger").to_json()
                    for i, c in enumerate(record["charges"])]
        out["releases"][vid] = {
            "release_id": record["release_id"], "version": record["version"],
            "versioned_id": vid, "measures": measures, "scopes": scopes,
            "input_digest": record["input_digest"], "keys": {"release": record["key_ref"]},
            "content_key": None, "state": COMMITTED if record["state"] == "committed" else PUBLISHING,
            "output_path": record.get("output_path"), "files": {},
            "charged_at": record.get("charged_at"), "committed_at": record.get("committed_at"),
            "last_run_at": record.get("last_run_at"), "runs": record.get("runs", 1),
            "supersedes": record.get("supersedes"), "takeovers": [],
            "metadata": {**record.get("metadata", {}), "campaign": campaign,
                         "periods": record.get("periods", [])},
        }
    out["latest"] = dict(state.get("latest", {}))
    return out


# --------------------------------------------------------------------------- structure

def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _ref(value) -> bool:
    return isinstance(value, dict) and isinstance(value.get("uri"), str) and \
        isinstance(value.get("fingerprint"), str)


def _record_problem(vid: str, record: dict) -> Optional[str]:
    """What is wrong with one record's fields (None: nothing)."""
    checks = (
        ("release_id", isinstance(record.get("release_id"), str)),
        ("version", isinstance(record.get("version"), int) and not isinstance(
            record.get("version"), bool) and record.get("version") >= 1),
        ("versioned_id", record.get("versioned_id") == vid),
        ("measures", isinstance(record.get("measures"), list) and all(
            isinstance(m, dict) and _real(m.get("epsilon")) and m["epsilon"] >= 0
            and _real(m.get("delta", 0.0)) for m in record.get("measures") or [])),
        ("scopes", isinstance(record.get("scopes"), list) and all(
            isinstance(s, str) for s in record.get("scopes") or [])),
        ("input_digest", isinstance(record.get("input_digest"), str)),
        ("keys", isinstance(record.get("keys"), dict) and all(
            _ref(k) for k in record.get("keys", {}).values())),
        ("state", record.get("state") in STATES),
        ("runs", isinstance(record.get("runs", 1), int)),
        ("takeovers", isinstance(record.get("takeovers", []), list)),
        ("metadata", isinstance(record.get("metadata", {}), dict)),
        ("files", isinstance(record.get("files") or {}, dict)),
        ("consumed", isinstance(record.get("consumed", {}), dict) and all(
            isinstance(e, dict) for e in (record.get("consumed") or {}).values())),
    )
    bad = [name for name, ok in checks if not ok]
    return f"field {bad[0]!r} is missing or of the wrong type" if bad else None


def check_structure(state: dict) -> None:
    """Raise ValueError naming what is malformed: a top-level entry, or a record (its number
    when it has one, and its release id). Types only; the chain checks the content."""
    for name, kind in (("ledger_id", str), ("accountant", str), ("scopes", dict),
                       ("releases", dict), ("latest", dict), ("content", dict)):
        if not isinstance(state.get(name), kind):
            raise ValueError(f"its {name!r} is missing or of the wrong type")
    for name, budget in state["scopes"].items():
        if not (isinstance(budget, dict) and _real(budget.get("epsilon"))
                and _real(budget.get("delta"))):
            raise ValueError(f"the budget of scope {name!r} is malformed")
    if state.get("consumed_key") is not None and not _ref(state["consumed_key"]):
        raise ValueError("its 'consumed_key' is malformed")
    writes = state.get("writes", 0)
    if not isinstance(writes, int) or isinstance(writes, bool) or writes < 0:
        raise ValueError("its write number ('writes') is malformed")
    if not isinstance(state.get("previous_head"), (str, type(None))):
        raise ValueError("its 'previous_head' is malformed")
    for name in ("restores", "operations"):
        if not (isinstance(state.get(name, []), list)
                and all(isinstance(e, dict) for e in state.get(name, []))):
            raise ValueError(f"its {name!r} is malformed")
    for vid, record in state["releases"].items():
        problem = "it is not an object" if not isinstance(record, dict) else \
            _record_problem(vid, record)
        if problem:
            number = record.get("seq") if isinstance(record, dict) else None
            raise ValueError(f"record {number if number is not None else '?'} (release "
                             f"{vid!r}) is malformed: {problem}")


def check_indexes(state: dict) -> None:
    """Raise ValueError if ``latest`` or ``content`` names a record the ledger does not hold
    (checked after the chain, which names a deleted record better)."""
    for index, table in (("latest", state["latest"]), ("content", state["content"])):
        for key, vid in table.items():
            if not isinstance(vid, str) or vid not in state["releases"]:
                raise ValueError(f"its {index!r} entry {key!r} names no record")
