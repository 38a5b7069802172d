"""A persistent privacy-budget ledger for scheduled releases (a local file or a ``gs://`` object).

Every scheduled release (e.g. one CentralNotice campaign-day) goes through the ledger:

1. ``reservation = ledger.begin(release_id, charges, input_digest, campaign=..., periods=...,
   budget=...)`` checks the campaign's and each period's budget, stores a fresh secret
   :class:`~transforms.noise.ReleaseKey` in the :class:`~accounting.keystore.KeyStore` and
   persists a record in state ``charged`` -- all *before* any output exists. A refusal raises
   :class:`BudgetExceededError` and nothing is spent.
2. The pipeline draws all its randomness from ``reservation.key`` and writes its outputs.
3. ``ledger.commit(reservation, output_path)`` marks the record ``committed``.

Record fields: release id and version, campaign and periods charged, the charges (epsilon, delta
and rho for zCDP mechanisms, one per measure), the input digest, a *reference* to the key (its
URI and public fingerprint -- never the key), output paths, state and UTC timestamps.

Rules (why):

* Re-running a release id on unchanged input (same digest) returns the existing record and key
  and spends nothing: the outputs reproduce byte for byte, so nothing new is revealed. If the
  record is still ``charged`` (the earlier run crashed after charging), the re-run resumes it.
* A crashed reservation stays charged (the noise may already have been drawn and partly
  written; refunding would be unsafe). It is never released automatically.
* On changed input the same id is refused (:class:`ChangedInputError`): re-using the old key on
  new data would release the old noise on new values and so leak their difference. With
  ``new_release=True`` a new version ``release_id#2`` (``#3``, ...) is charged afresh with a
  fresh key.
* The same id and input with *different* charges is refused: privacy parameters belong to the
  release.
* Testing keys (:meth:`ReleaseKey.for_testing`) are refused for releases.
* A campaign's budget is recorded on first use. A lower budget later is accepted (more
  conservative); a higher one is refused unless set deliberately with :meth:`set_budget`.

Concurrency: locally the read-check-write runs under an exclusive ``fcntl.flock`` on
``<ledger>.lock`` and the new ledger replaces the old atomically (temporary file, fsync,
``os.replace``). On GCS the ledger object is read with its generation and written with
``if_generation_match``; a 412 (another writer won) re-reads and re-checks the budget, so two
concurrent releases can never both spend the last share. (GCS allows about one write per second
to one object; the client retries 429s, so heavy contention only slows the ledger down.)

Composition of charges is pluggable (``accountant``): ``"basic"`` sums epsilons and deltas;
``"zcdp"`` adds the rho of zCDP charges, converts them together with the pure-DP charges
(:func:`accounting.composition.combine_zcdp_and_pure`, at the budget's delta minus the deltas of
the remaining approximate-DP charges) and adds those by basic composition. Budgets are stated
as (epsilon, delta) in both cases; the accountant is recorded in the ledger and cannot change.
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import fnmatch
import glob
import hashlib
import json
import math
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

from accounting import gcs
from accounting.keystore import KeyRef, KeyStore
from accounting.validation import check_delta, check_epsilon, check_rho
from accounting.keys import ReleaseKey

LEDGER_FORMAT = "beam-dp-release/budget-ledger/v1"
#: Relative slack when comparing spent budget with a total (rounding of float sums only).
BUDGET_TOLERANCE = 1e-9
_DIGEST_DOMAIN = b"beam-dp-release/input-digest/v1\x00"


class LedgerError(RuntimeError):
    """A release the ledger refuses (nothing was spent)."""


class BudgetExceededError(LedgerError):
    def __init__(self, message, *, scope: str, spent, requested, budget):
        super().__init__(message)
        self.scope, self.spent, self.requested, self.budget = scope, spent, requested, budget


class ChangedInputError(LedgerError):
    """The release id exists with a different input digest (use ``new_release=True``)."""


class LedgerConflict(RuntimeError):
    """Another writer changed the ledger object (a generation precondition failed)."""


# --------------------------------------------------------------------------- charges and budgets

@dataclass(frozen=True)
class Charge:
    """What one measure of a release spends: (epsilon, delta), plus rho if it is rho-zCDP.

    A zCDP mechanism is charged its rho *and* an (epsilon, delta) it also satisfies (e.g.
    :func:`accounting.calibration.calibrate_zcdp` reports both), so either accountant can count it.
    """

    epsilon: float
    delta: float = 0.0
    rho: Optional[float] = None
    label: str = ""

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, f"charge {self.label!r} epsilon"))
        object.__setattr__(self, "delta", check_delta(self.delta, f"charge {self.label!r} delta"))
        if self.rho is not None:
            object.__setattr__(self, "rho", check_rho(self.rho, f"charge {self.label!r} rho"))
        if not isinstance(self.label, str):
            raise ValueError(f"charge label must be a string, got {self.label!r}")

    @classmethod
    def from_spec(cls, spec, label: str = "") -> "Charge":
        """The charge of one application of a calibrated :class:`~accounting.calibration.NoiseSpec`."""
        return cls(spec.epsilon, spec.delta, spec.rho, label)

    def to_json(self) -> dict:
        return {"label": self.label, "epsilon": self.epsilon, "delta": self.delta, "rho": self.rho}

    @classmethod
    def from_json(cls, data: Mapping) -> "Charge":
        return cls(data["epsilon"], data.get("delta", 0.0), data.get("rho"), data.get("label", ""))


@dataclass(frozen=True)
class Budget:
    """A total (epsilon, delta) that the composed charges of one scope must not exceed."""

    epsilon: float
    delta: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, "budget epsilon"))
        object.__setattr__(self, "delta", check_delta(self.delta, "budget delta"))

    def to_json(self) -> dict:
        return {"epsilon": self.epsilon, "delta": self.delta}

    @classmethod
    def from_json(cls, data: Mapping) -> "Budget":
        return cls(data["epsilon"], data.get("delta", 0.0))

    def covers(self, other: "Budget") -> bool:
        return other.epsilon <= self.epsilon and other.delta <= self.delta


@dataclass(frozen=True)
class CampaignBudget:
    """A campaign's total budget and (optionally) the budget of each period (e.g. each day)."""

    total: Budget
    per_period: Optional[Budget] = None

    def __post_init__(self):
        if not isinstance(self.total, Budget):
            raise ValueError("CampaignBudget.total must be a Budget")
        if self.per_period is not None and not isinstance(self.per_period, Budget):
            raise ValueError("CampaignBudget.per_period must be a Budget or None")

    def to_json(self) -> dict:
        return {"total": self.total.to_json(),
                "per_period": None if self.per_period is None else self.per_period.to_json()}

    @classmethod
    def from_json(cls, data: Mapping) -> "CampaignBudget":
        per = data.get("per_period")
        return cls(Budget.from_json(data["total"]), None if per is None else Budget.from_json(per))


@dataclass(frozen=True)
class Spent:
    """Composed privacy loss of a set of charges."""

    epsilon: float
    delta: float


def basic_accountant(charges: Sequence[Charge], budget: Budget) -> Spent:
    """Basic sequential composition: sum of epsilons and of deltas (Dwork & Roth 2014, Thm 3.16)."""
    return Spent(math.fsum(c.epsilon for c in charges), math.fsum(c.delta for c in charges))


def zcdp_accountant(charges: Sequence[Charge], budget: Budget) -> Spent:
    """zCDP charges by their rho, combined with pure-DP charges and converted once.

    Charges with ``rho`` compose additively (Bun & Steinke 2016, Lemma 2.3); pure charges
    (delta 0, no rho) join them through :func:`~accounting.composition.combine_zcdp_and_pure`
    (which takes the better of the two valid routes); approximate-DP charges without rho are
    added by basic composition. The conversion uses the budget's delta left after those.
    """
    rho = math.fsum(c.rho for c in charges if c.rho is not None)
    pure = [c.epsilon for c in charges if c.rho is None and c.delta == 0]
    approximate = [(c.epsilon, c.delta) for c in charges if c.rho is None and c.delta > 0]
    if rho == 0:
        return basic_accountant(charges, budget)
    conversion_delta = budget.delta - math.fsum(d for _, d in approximate)
    if conversion_delta <= 0:
        # No delta left to convert rho into (epsilon, delta): the release cannot fit.
        return Spent(math.inf, math.fsum(c.delta for c in charges))
    from accounting.composition import combine_zcdp_and_pure

    total = combine_zcdp_and_pure(rho, pure, conversion_delta, approximate)
    return Spent(total.epsilon, total.delta)


ACCOUNTANTS: dict[str, Callable[[Sequence[Charge], Budget], Spent]] = {
    "basic": basic_accountant,
    "zcdp": zcdp_accountant,
}


def release_id_for(campaign: str, period: str) -> str:
    """The conventional release id of a campaign's release for one period: ``campaign/period``."""
    return f"{campaign}/{period}"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _fits(spent: Spent, budget: Budget) -> bool:
    return (spent.epsilon <= budget.epsilon * (1 + BUDGET_TOLERANCE)
            and spent.delta <= budget.delta * (1 + BUDGET_TOLERANCE) + 1e-18)


# --------------------------------------------------------------------------- storage backends

class _LocalStore:
    """Read-modify-write of a local JSON file under an exclusive flock, replaced atomically."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.lock_path = self.path + ".lock"

    def transact(self, update):
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        with open(self.lock_path, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                try:
                    with open(self.path, "rb") as handle:
                        data = handle.read()
                except FileNotFoundError:
                    data = None
                result, new_data = update(data)
                if new_data is not None:
                    self._replace(directory, new_data)
                return result
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _replace(self, directory: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(self.path) + ".", suffix=".tmp",
                                   dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        except OSError as err:  # some file systems cannot fsync a directory
            if err.errno not in (errno.EINVAL, errno.EBADF):
                raise
        finally:
            os.close(dir_fd)

    def read(self):
        try:
            with open(self.path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None


class _GcsStore:
    """Optimistic concurrency on one GCS object: read with generation, write if it still matches."""

    def __init__(self, uri: str, max_attempts: int = 100):
        bucket, name = gcs.split_gcs_uri(uri)
        if not name or name.endswith("/"):
            raise ValueError(f"ledger URI must name an object, got {uri!r}")
        self.uri = uri
        self.max_attempts = max_attempts
        self.conflicts = 0

    def read_with_generation(self):
        """``(bytes or None, generation)``; generation 0 means the object does not exist."""
        from google.api_core import exceptions

        bucket, name = gcs.split_gcs_uri(self.uri)
        blob = gcs.client().bucket(bucket).get_blob(name)
        if blob is None:
            return None, 0
        generation = int(blob.generation)  # downloading may reset blob.generation from headers
        try:
            data = blob.download_as_bytes(if_generation_match=generation)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            raise LedgerConflict(f"{self.uri} changed while being read")
        return data, generation

    def write_if_generation(self, data: bytes, generation: int) -> None:
        """Write ``data`` only if the object is still at ``generation`` (0: must not exist)."""
        from google.api_core import exceptions

        try:
            gcs.blob(self.uri).upload_from_string(data, content_type="application/json",
                                                  if_generation_match=generation)
        except exceptions.PreconditionFailed:
            raise LedgerConflict(f"{self.uri} was changed by another writer (generation "
                                 f"{generation} no longer current)")

    def transact(self, update):
        delay = 0.05
        for _ in range(self.max_attempts):
            try:
                data, generation = self.read_with_generation()
                result, new_data = update(data)
                if new_data is not None:
                    self.write_if_generation(new_data, generation)
                return result
            except LedgerConflict:
                self.conflicts += 1
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
        raise LedgerError(f"gave up updating {self.uri} after {self.max_attempts} conflicting attempts")

    def read(self):
        for _ in range(self.max_attempts):
            try:
                return self.read_with_generation()[0]
            except LedgerConflict:  # replaced while being read: read the new version
                self.conflicts += 1
        raise LedgerError(f"could not read a stable version of {self.uri}")


# --------------------------------------------------------------------------- the ledger

@dataclass(frozen=True)
class Reservation:
    """A charged release: use ``key`` for all its randomness, then :meth:`BudgetLedger.commit`.

    ``resumed``: the id was already charged with this input (an earlier run crashed or is being
    repeated); nothing more was spent. ``committed``: that earlier run also committed, so its
    outputs exist (re-writing them with the same key reproduces them exactly).
    """

    release_id: str
    version: int
    versioned_id: str
    key: ReleaseKey = field(repr=False)
    key_ref: KeyRef
    record: dict = field(repr=False, compare=False)
    resumed: bool = False
    committed: bool = False


def _versioned_id(release_id: str, version: int) -> str:
    return release_id if version == 1 else f"{release_id}#{version}"


def _empty_state(accountant: str) -> dict:
    return {"format": LEDGER_FORMAT, "accountant": accountant, "campaigns": {}, "releases": {},
            "latest": {}, "created_at": _now(), "updated_at": None}


class BudgetLedger:
    """The budget ledger at ``path`` (local file or ``gs://bucket/object``); see the module doc.

    ``key_store`` holds the release keys (a :class:`KeyStore` or its root path/URI).
    ``accountant`` is ``"basic"`` or ``"zcdp"``; it is fixed when the ledger is created.
    """

    def __init__(self, path: str, key_store: Union[KeyStore, str], *, accountant: str = "basic",
                 max_attempts: int = 100):
        if not isinstance(path, str) or not path:
            raise ValueError(f"ledger path must be a non-empty path or gs:// URI, got {path!r}")
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {sorted(ACCOUNTANTS)}, got {accountant!r}")
        self.path = path
        self.accountant_name = accountant
        self.accountant = ACCOUNTANTS[accountant]
        self.key_store = key_store if isinstance(key_store, KeyStore) else KeyStore(key_store)
        self._store = _GcsStore(path, max_attempts) if gcs.is_gcs(path) else _LocalStore(path)

    # ----------------------------------------------------------------- state (de)serialisation

    def _parse(self, data: Optional[bytes]) -> dict:
        if data is None:
            return _empty_state(self.accountant_name)
        try:
            state = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise LedgerError(f"ledger {self.path} is not valid JSON: {err}")
        if not isinstance(state, dict) or state.get("format") != LEDGER_FORMAT:
            raise LedgerError(f"ledger {self.path} is not a {LEDGER_FORMAT} file")
        if state.get("accountant") != self.accountant_name:
            raise LedgerError(f"ledger {self.path} counts budgets with accountant "
                              f"{state.get('accountant')!r}, this process asked for "
                              f"{self.accountant_name!r}; the accountant of a ledger cannot change")
        return state

    @staticmethod
    def _dump(state: dict) -> bytes:
        state["updated_at"] = _now()
        return (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8")

    def snapshot(self) -> dict:
        """The whole ledger as a dict (a consistent read)."""
        return self._parse(self._store.read())

    # ----------------------------------------------------------------- queries

    def records(self) -> list[dict]:
        return list(self.snapshot()["releases"].values())

    def get(self, release_id: str, version: Optional[int] = None) -> Optional[dict]:
        """The record of ``release_id`` (its latest version unless ``version`` is given)."""
        state = self.snapshot()
        vid = state["latest"].get(release_id) if version is None else _versioned_id(release_id, version)
        return None if vid is None else state["releases"].get(vid)

    def _charges(self, state: dict, campaign: str, period: Optional[str] = None) -> list[Charge]:
        out = []
        for record in state["releases"].values():
            if record["campaign"] != campaign:
                continue
            if period is not None and period not in record["periods"]:
                continue
            out.extend(Charge.from_json(c) for c in record["charges"])
        return out

    def spent(self, campaign: str, period: Optional[str] = None) -> Spent:
        """Composed spend of ``campaign`` (or of one of its periods), charged and committed alike."""
        state = self.snapshot()
        charges = self._charges(state, campaign, period)
        if not charges:
            return Spent(0.0, 0.0)
        budget = self._recorded_budget(state, campaign)
        target = budget.total if (period is None or budget is None or budget.per_period is None) \
            else budget.per_period
        return self.accountant(charges, target or Budget(1.0, 0.0))

    @staticmethod
    def _recorded_budget(state: dict, campaign: str) -> Optional[CampaignBudget]:
        data = state["campaigns"].get(campaign)
        return None if data is None else CampaignBudget.from_json(data)

    # ----------------------------------------------------------------- budgets

    def set_budget(self, campaign: str, budget: CampaignBudget, *, allow_increase: bool = False) -> None:
        """Record ``campaign``'s budget; raising a recorded budget needs ``allow_increase``."""
        if not isinstance(budget, CampaignBudget):
            raise ValueError("budget must be a CampaignBudget")

        def update(data):
            state = self._parse(data)
            self._apply_budget(state, campaign, budget, allow_increase)
            return None, self._dump(state)

        self._store.transact(update)

    @staticmethod
    def _apply_budget(state: dict, campaign: str, budget: CampaignBudget, allow_increase: bool) -> None:
        old = BudgetLedger._recorded_budget(state, campaign)
        if old is not None and not allow_increase:
            raised = not old.total.covers(budget.total)
            if old.per_period is not None:
                raised |= budget.per_period is None or not old.per_period.covers(budget.per_period)
            if raised:
                raise LedgerError(
                    f"campaign {campaign!r} has a recorded budget {old.to_json()}; the requested "
                    f"{budget.to_json()} is larger. Raise it deliberately with "
                    f"BudgetLedger.set_budget(..., allow_increase=True)")
        state["campaigns"][campaign] = budget.to_json()

    # ----------------------------------------------------------------- begin / commit

    def begin(self, release_id: str, charges: Union[Charge, Sequence[Charge]], input_digest: str, *,
              campaign: str, periods: Sequence[str], budget: CampaignBudget,
              new_release: bool = False, key: Optional[ReleaseKey] = None,
              metadata: Optional[Mapping] = None) -> Reservation:
        """Charge a release (or find the one already charged for this input); see the module doc.

        ``charges``: one :class:`Charge` per released measure. ``periods``: the periods the
        release's data covers (one day for a daily release, every day for a per-campaign one);
        each is checked against ``budget.per_period``. ``key``: an operator-supplied key
        (default: a fresh ``ReleaseKey.generate()``); testing keys are refused.
        ``metadata``: JSON-serialisable notes stored with the record (e.g. the configuration).
        """
        if not isinstance(release_id, str) or not release_id or "#" in release_id:
            raise ValueError(f"release_id must be a non-empty string without '#', got {release_id!r}")
        charges = [charges] if isinstance(charges, Charge) else list(charges)
        if not charges or not all(isinstance(c, Charge) for c in charges):
            raise ValueError("charges must be a Charge or a non-empty sequence of Charges")
        if not isinstance(input_digest, str) or not input_digest:
            raise ValueError("input_digest must be a non-empty string (see input_digest())")
        if not isinstance(campaign, str) or not campaign:
            raise ValueError(f"campaign must be a non-empty string, got {campaign!r}")
        periods = [periods] if isinstance(periods, str) else list(periods)
        if not periods or not all(isinstance(p, str) and p for p in periods):
            raise ValueError("periods must be a non-empty sequence of non-empty strings")
        if not isinstance(budget, CampaignBudget):
            raise ValueError("budget must be a CampaignBudget")
        if key is not None and (not isinstance(key, ReleaseKey) or key.is_testing):
            raise LedgerError("refusing a testing key (ReleaseKey.for_testing) for a real release: "
                              "its noise is reproducible by anyone who knows the seed")
        metadata = dict(metadata or {})
        json.dumps(metadata)  # fail early on non-serialisable metadata
        request = [c.to_json() for c in charges]
        pending: dict = {}  # the key saved during an attempt, reused on conflict retries

        def new_key_ref() -> tuple[ReleaseKey, KeyRef]:
            if "ref" not in pending:
                new = key if key is not None else ReleaseKey.generate()
                pending["key"], pending["ref"] = new, self.key_store.save(new, release_id)
            return pending["key"], pending["ref"]

        def update(data):
            state = self._parse(data)
            latest_vid = state["latest"].get(release_id)
            latest = state["releases"].get(latest_vid) if latest_vid else None
            if latest is not None and not new_release:
                if latest["input_digest"] != input_digest:
                    raise ChangedInputError(
                        f"release {latest_vid!r} was charged for input {latest['input_digest']}; the "
                        f"input is now {input_digest}. Re-using its key on changed input would leak "
                        f"the difference: pass new_release=True to charge a new version with a fresh key")
                if latest["charges"] != request:
                    raise LedgerError(
                        f"release {latest_vid!r} was charged {latest['charges']}, this run asks for "
                        f"{request}: a release's privacy parameters cannot change on re-run "
                        f"(new_release=True charges a new version)")
                if latest["campaign"] != campaign or latest["periods"] != periods:
                    raise LedgerError(f"release {latest_vid!r} was charged to campaign "
                                      f"{latest['campaign']!r}, periods {latest['periods']}; this run "
                                      f"names {campaign!r}, {periods}")
                if key is not None and key.fingerprint() != latest["key_ref"]["fingerprint"]:
                    raise LedgerError(f"release {latest_vid!r} used key {latest['key_ref']['fingerprint']}; "
                                      f"a re-run must use the same key")
                latest["runs"] += 1
                latest["last_run_at"] = _now()
                return ("existing", latest), self._dump(state)

            self._apply_budget(state, campaign, budget, allow_increase=False)
            recorded = self._recorded_budget(state, campaign)
            self._check_budget(state, campaign, periods, charges, recorded)
            version = 1 if latest is None else latest["version"] + 1
            vid = _versioned_id(release_id, version)
            _, ref = new_key_ref()
            now = _now()
            record = {
                "release_id": release_id, "version": version, "versioned_id": vid,
                "campaign": campaign, "periods": periods, "charges": request,
                "input_digest": input_digest, "key_ref": ref.to_json(),
                "output_path": None, "output_paths": [], "state": "charged",
                "charged_at": now, "committed_at": None, "last_run_at": now, "runs": 1,
                "supersedes": latest_vid, "metadata": metadata,
            }
            state["releases"][vid] = record
            state["latest"][release_id] = vid
            return ("new", record), self._dump(state)

        try:
            kind, record = self._store.transact(update)
        except BaseException:
            if "ref" in pending:  # saved during an attempt that ended in a refusal
                self.key_store.delete(pending["ref"])
            raise
        if kind == "existing" and "ref" in pending:
            self.key_store.delete(pending["ref"])  # another writer charged it first
        ref = KeyRef.from_json(record["key_ref"])
        release_key = pending["key"] if kind == "new" else self.key_store.load(ref)
        return Reservation(release_id, record["version"], record["versioned_id"], release_key, ref,
                           record, resumed=kind == "existing",
                           committed=record["state"] == "committed")

    def _check_budget(self, state, campaign, periods, charges, budget: CampaignBudget) -> None:
        self._check_scope(self._charges(state, campaign), charges, budget.total,
                          f"campaign {campaign!r}", "the campaign budget", f"campaign:{campaign}")
        if budget.per_period is None:
            return
        for period in periods:
            self._check_scope(self._charges(state, campaign, period), charges, budget.per_period,
                              f"campaign {campaign!r}, period {period!r}", "the per-period budget",
                              f"period:{campaign}:{period}")

    def _check_scope(self, spent_before, charges, limit: Budget, where: str, what: str, scope: str) -> None:
        """Refuse ``charges`` if, composed with what the scope has spent, they exceed ``limit``."""
        total = self.accountant(spent_before + charges, limit)
        if _fits(total, limit):
            return
        before = self.accountant(spent_before, limit) if spent_before else Spent(0.0, 0.0)
        raise BudgetExceededError(
            f"{where}: spent (epsilon={before.epsilon:g}, delta={before.delta:g}); this release would "
            f"bring it to (epsilon={total.epsilon:g}, delta={total.delta:g}), over {what} "
            f"(epsilon={limit.epsilon:g}, delta={limit.delta:g}). Nothing was charged.",
            scope=scope, spent=before, requested=total, budget=limit)

    def commit(self, reservation: Reservation, output_path: str) -> dict:
        """Mark the reservation's release committed with its output location; returns the record."""
        if not isinstance(reservation, Reservation):
            raise ValueError("commit needs the Reservation returned by begin()")
        if not isinstance(output_path, str) or not output_path:
            raise ValueError(f"output_path must be a non-empty string, got {output_path!r}")

        def update(data):
            state = self._parse(data)
            record = state["releases"].get(reservation.versioned_id)
            if record is None:
                raise LedgerError(f"release {reservation.versioned_id!r} is not in ledger {self.path}")
            if record["key_ref"]["fingerprint"] != reservation.key_ref.fingerprint:
                raise LedgerError(f"reservation for {reservation.versioned_id!r} does not match the "
                                  f"ledger record (key fingerprint differs)")
            if record["state"] == "committed" and record["output_path"] == output_path:
                return record, None
            if output_path not in record["output_paths"]:
                record["output_paths"].append(output_path)
            record["output_path"] = output_path
            record["state"] = "committed"
            record["committed_at"] = _now()
            return record, self._dump(state)

        return self._store.transact(update)


# --------------------------------------------------------------------------- input digest

def _is_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def expand_inputs(paths: Iterable[str]) -> list[str]:
    """Files named by ``paths``: plain files, directories (recursively), globs; local or gs://.

    A ``gs://`` path ending in ``/`` is a prefix (all objects under it). Raises FileNotFoundError
    naming any path that matches nothing.
    """
    if isinstance(paths, str):
        paths = [paths]
    out: list[str] = []
    for path in paths:
        if gcs.is_gcs(path):
            if _is_glob(path):
                bucket, name = gcs.split_gcs_uri(path)
                head = name[:min(name.index(ch) for ch in "*?[" if ch in name)]
                found = [u for u in gcs.list_objects(f"gs://{bucket}/{head}")
                         if fnmatch.fnmatchcase(u, path)]
            elif path.endswith("/"):
                found = gcs.list_objects(path)
            else:
                found = [path] if gcs.blob(path).exists() else []
        elif _is_glob(path):
            found = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        elif os.path.isdir(path):
            found = sorted(os.path.join(root, f) for root, _, files in os.walk(path) for f in files)
        else:
            found = [path] if os.path.isfile(path) else []
        if not found:
            raise FileNotFoundError(f"input {path!r} matches no file")
        out.extend(found)
    return sorted(set(out))


def _stream(path: str, chunk_size: int):
    """(size, iterator of chunks) of one local file or GCS object."""
    if gcs.is_gcs(path):
        bucket, name = gcs.split_gcs_uri(path)
        blob = gcs.client().bucket(bucket).get_blob(name)
        if blob is None:
            raise FileNotFoundError(f"input {path!r} does not exist")
        size = int(blob.size)
        pinned = gcs.client().bucket(bucket).blob(name, generation=blob.generation)

        def chunks():
            for start in range(0, size, chunk_size):
                yield pinned.download_as_bytes(start=start, end=min(start + chunk_size, size) - 1)

        return size, chunks()
    size = os.path.getsize(path)

    def chunks():
        with open(path, "rb") as handle:
            while True:
                block = handle.read(chunk_size)
                if not block:
                    return
                yield block

    return size, chunks()


def canonical_json(config) -> bytes:
    """Canonical JSON bytes of a configuration mapping (sorted keys, no whitespace)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def input_digest(paths: Iterable[str], config=None, *, chunk_size: int = 1 << 20) -> str:
    """``"sha256:<hex>"`` over the contents of the input files and the configuration.

    Files (see :func:`expand_inputs`) are hashed in sorted path order, each as its length and
    its bytes (streamed in chunks). Only contents count, not names, so moving unchanged inputs
    keeps the digest. ``config`` is a mapping (hashed as canonical JSON), raw ``bytes``/``str``,
    or None.
    """
    files = expand_inputs(paths)
    digest = hashlib.sha256(_DIGEST_DOMAIN)
    digest.update(len(files).to_bytes(8, "big"))
    for path in files:
        size, chunks = _stream(path, chunk_size)
        digest.update(b"F" + size.to_bytes(8, "big"))
        read = 0
        for block in chunks:
            read += len(block)
            digest.update(block)
        if read != size:
            raise IOError(f"input {path!r} changed while being hashed ({read} of {size} bytes read)")
    if config is None:
        digest.update(b"N")
    else:
        raw = config.encode("utf-8") if isinstance(config, str) else \
            bytes(config) if isinstance(config, (bytes, bytearray)) else canonical_json(config)
        digest.update(b"C" + len(raw).to_bytes(8, "big") + raw)
    return "sha256:" + digest.hexdigest()
