"""Schedule health: the release slots each job's schedule declares, against the ledger.

Where slots come from:

* **CentralNotice** configurations (``--config campaigns.json``): every scheduled release of
  every campaign (:meth:`pipelines.centralnotice.config.CampaignConfig.releases`: one per day,
  or one for the whole campaign), with the measures and ledger scopes a release of it spends.
* **A cadence** for any other job, declared in a schedule file (``--config``, format
  :data:`SCHEDULE_FORMAT`, fields in the published JSON Schema
  ``pipelines/catalog/schedule.schema.json``) or with ``--cadence``: a release-id template with ``{date}`` and a
  step, e.g. ``summary_reports/{date}=daily:2026-11-01`` (daily from that day, up to
  ``--as_of``) or ``ldp_frequencies/week-{date}=7d:2026-11-02:2026-12-28``.

A slot's period ends on its ``due`` day; it is **overdue** when that day is more than
``grace`` days before ``as_of``. Its state, from the ledger, the published markers and the
operator reports:

* ``published``: a marker of the release id is published (a record whose publication was
  started but not yet committed counts: the marker is what makes a release published);
* ``failed``: charged, nothing published, and an operator report records the failure (or a
  publication that started and never finished);
* ``reserved``: charged, nothing published, no failure recorded (a run in progress, or one that
  stopped before it could record anything);
* ``over budget``: no record, and a release of the slot cannot fit a scope's remaining budget;
* ``missing``: no record at all (the run never happened, or it was refused for another reason);
* ``pending``: not published and not yet overdue.

**What is knowable about refusals.** A refusal leaves nothing behind, by design (the release
layer's "a refusal leaves no reservation and no key behind"): neither the ledger nor the
operator reports record one. What the catalog can know is whether a release of the slot *would*
be refused for its budget now: it composes the ledger's charges of each scope the release would
be charged to (reserved records included, as the ledger counts) with the release's own measures,
exactly as :meth:`accounting.ledger.BudgetLedger.reserve` checks them, and calls the slot
``over budget`` when one does not fit. For CentralNotice the release's measures and scopes come
from the configuration; for a cadence, from the series' latest ledger record (its scopes named
with its own date are per-period scopes of that release and are not checked). Other refusals
(bad input, a missing file, a mistyped flag) cannot be told from a run that never happened: they
are ``missing``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from accounting import guarantee
from pipelines.catalog.model import CatalogInputError, CatalogInputs, dataset_of
from pipelines.release import textfiles

SCHEDULE_FORMAT = "beam-dp-release/schedule/v1"
#: The schedule file's published JSON Schema (checked by :mod:`pipelines.release.config_schema`).
SCHEDULE_SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "schedule.schema.json")
PUBLISHED, FAILED, RESERVED, OVER_BUDGET, MISSING, PENDING = (
    "published", "failed", "reserved", "over budget", "missing", "pending")
STATES = (PUBLISHED, FAILED, RESERVED, OVER_BUDGET, MISSING, PENDING)
#: The release layer's rule for release ids (pipelines/release/names.py; not imported here: the
#: release layer imports Beam). tests/pipelines/catalog/test_catalog_units.py checks the two agree.
_RELEASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,7}$")
_EVERY = re.compile(r"^(daily|weekly|[1-9][0-9]{0,3}d)$")


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One scheduled release. ``measures``/``scopes``: what a release of it would spend and be
    charged to (Measures and ledger Scopes), when the schedule knows (for the over-budget
    check); ``scope_names``: scope names to check with the ledger's recorded budgets."""

    dataset_id: str
    release_id: str
    start: _dt.date
    due: _dt.date
    source: str
    measures: tuple = ()
    scopes: tuple = ()
    scope_names: tuple = ()


@dataclass(frozen=True, kw_only=True)
class SlotHealth:
    slot: Slot
    state: str
    detail: str
    overdue: bool
    versioned_id: Optional[str] = None

    def line(self) -> str:
        s = self.slot
        period = s.due.isoformat() if s.start == s.due else f"{s.start}..{s.due}"
        return f"{s.release_id} ({s.dataset_id}, {period}): {self.state}" + \
            (f" -- {self.detail}" if self.detail else "")


@dataclass(frozen=True, kw_only=True)
class Cadence:
    """A release every ``every_days`` from ``start`` (to ``end``, else up to the as-of day),
    named by ``template`` with ``{date}`` replaced by the slot's first day."""

    template: str
    every_days: int
    start: _dt.date
    end: Optional[_dt.date]
    source: str

    def pattern(self) -> re.Pattern:
        head, tail = self.template.split("{date}")
        return re.compile(re.escape(head) + r"(\d{4}-\d{2}-\d{2})" + re.escape(tail) + "$")

    def slots(self, as_of: _dt.date, inputs: CatalogInputs) -> list[Slot]:
        last = self.end or as_of
        latest = self._latest_record(inputs)
        job = latest.job if latest is not None else ""
        out, day = [], self.start
        step = _dt.timedelta(days=self.every_days)
        while day <= last:
            due = day + step - _dt.timedelta(days=1)
            if self.end is None and due > as_of:
                break
            release_id = self.template.replace("{date}", day.isoformat())
            dataset = dataset_of(job, release_id, {})[0] if job else self.template
            out.append(Slot(dataset_id=dataset, release_id=release_id, start=day, due=due,
                            source=self.source,
                            measures=tuple(latest.measures) if latest is not None else (),
                            scope_names=self._shared_scopes(latest)))
            day += step
        return out

    def _latest_record(self, inputs: CatalogInputs):
        if inputs.ledger is None:
            return None
        pattern = self.pattern()
        found = [(m.group(1), r) for r in inputs.ledger.records
                 if (m := pattern.match(r.release_id))]
        return max(found, key=lambda pair: (pair[0], pair[1].version))[1] if found else None

    def _shared_scopes(self, record) -> tuple:
        if record is None:
            return ()
        day = self.pattern().match(record.release_id).group(1)
        return tuple(n for n in record.scope_names if day not in n)


def parse_cadence(text: str, source: str = "--cadence") -> Cadence:
    """``TEMPLATE=EVERY:START[:END]``; EVERY is daily, weekly or Nd (every N days)."""
    template, eq, rule = text.partition("=")
    parts = rule.split(":")
    if not eq or len(parts) not in (2, 3):
        raise CatalogInputError(f"{source}: expected TEMPLATE=EVERY:START[:END], e.g. "
                                "summary_reports/{date}=daily:2026-11-01")
    return _cadence(template, parts[0], parts[1], parts[2] if len(parts) == 3 else None, source)


def _cadence(template, every, start, end, source) -> Cadence:
    if not isinstance(template, str) or template.count("{date}") != 1:
        raise CatalogInputError(f"{source}: the release-id template needs one {{date}}")
    if not _RELEASE_ID.match(template.replace("{date}", "2000-01-01")):
        raise CatalogInputError(f"{source}: the template is not a valid release id "
                                "(letters, digits, '.', '_', '-', segments joined by '/')")
    if not isinstance(every, str) or not _EVERY.match(every):
        raise CatalogInputError(f"{source}: the step must be daily, weekly or Nd (e.g. 7d)")
    days = {"daily": 1, "weekly": 7}.get(every) or int(every[:-1])
    try:
        first = _dt.date.fromisoformat(start)
        last = None if end in (None, "") else _dt.date.fromisoformat(end)
    except (TypeError, ValueError):
        raise CatalogInputError(f"{source}: start and end must be YYYY-MM-DD dates") from None
    if last is not None and last < first:
        raise CatalogInputError(f"{source}: the end is before the start")
    return Cadence(template=template, every_days=days, start=first, end=last, source=source)


def load_config(path: str):
    """A ``--config`` file: a CentralNotice configuration (``campaigns``) or a schedule file
    (``cadences``). Returns ``("centralnotice", config)`` or ``("cadences", [Cadence])``. Read
    by the one configuration reader (:mod:`pipelines.release.textfiles`: it names the file, line
    and column, never the content, and refuses a release key file); a CentralNotice one is
    parsed by its job's own parser (imported here: it loads pyarrow, which a catalog without
    CentralNotice configuration never needs). Both are Beam-free (tests/test_layout.py)."""
    try:
        data = textfiles.read(path, "--config").json()
    except textfiles.TextFileError as err:
        raise CatalogInputError(str(err)) from None
    if isinstance(data, dict) and "campaigns" in data:
        from pipelines.centralnotice.config import ConfigError, parse_config

        try:
            return "centralnotice", parse_config(data, path)
        except ConfigError as err:
            # The message names a field path and what is wrong with it, never a value (the
            # schema's messages, pipelines/release/config_schema.py, and the rules after it).
            raise CatalogInputError(f"--config {path}: not a valid CentralNotice configuration: "
                                    f"{err.path}: {err.message}") from None
    if isinstance(data, dict) and data.get("format") == SCHEDULE_FORMAT:
        from pipelines.release import config_schema

        try:  # the file's structure; then each cadence's values as for --cadence
            config_schema.validate(data, SCHEDULE_SCHEMA_FILE, f"--config {path}")
        except config_schema.ConfigSchemaError as err:
            raise CatalogInputError(str(err)) from None
        return "cadences", [_cadence(item["release_id"], item["every"], item["start"],
                                     item.get("end"), f"--config {path}: cadences[{i}]")
                            for i, item in enumerate(data["cadences"])]
    raise CatalogInputError(f"--config {path} is neither a CentralNotice configuration nor a "
                            f"{SCHEDULE_FORMAT} schedule file")


def centralnotice_slots(config) -> list[Slot]:
    """Every scheduled release of a CentralNotice configuration, with what it would spend."""
    out = []
    for campaign in config.campaigns:
        measures = tuple(campaign.shared_budget(config.accountant).measures())
        for release in campaign.releases():
            out.append(Slot(dataset_id=f"centralnotice/{campaign.campaign_id}",
                            release_id=release.release_id, start=min(release.dates),
                            due=max(release.dates), source=config.source, measures=measures,
                            scopes=tuple(campaign.scopes(release))))
    return out


def slots_from(configs: Sequence[str], cadences: Sequence[str], as_of: _dt.date,
               inputs: CatalogInputs) -> list[Slot]:
    slots = []
    for path in configs:
        kind, value = load_config(path)
        if kind == "centralnotice":
            slots.extend(centralnotice_slots(value))
        else:
            for cadence in value:
                slots.extend(cadence.slots(as_of, inputs))
    for text in cadences:
        slots.extend(parse_cadence(text).slots(as_of, inputs))
    seen, unique = set(), []
    for slot in slots:
        if slot.release_id not in seen:
            seen.add(slot.release_id)
            unique.append(slot)
    return unique


# --------------------------------------------------------------------------- assessment

def would_refuse(slot: Slot, ledger) -> str:
    """Why the ledger would refuse a release of ``slot`` for its budget now ("" if it would
    not, or if what it would spend is unknown): the check BudgetLedger.reserve makes."""
    if ledger is None or not slot.measures:
        return ""
    checks = []
    for scope in slot.scopes:
        recorded = ledger.budgets.get(scope.name)
        if recorded is not None and (scope.budget.epsilon > recorded.epsilon
                                     or scope.budget.delta > recorded.delta):
            return (f"scope {scope.name}: the configured budget is larger than the one the "
                    "ledger recorded, which the ledger refuses unless raised deliberately "
                    "(inferred: the ledger records no refusals)")
        checks.append((scope.name, scope.budget))   # the ledger then records this budget
    checks += [(n, ledger.budgets[n]) for n in slot.scope_names if n in ledger.budgets]
    for name, limit in checks:
        before = ledger.measures_of_scope(name)
        ok, total = guarantee.fits(before + list(slot.measures), limit.epsilon, limit.delta,
                                   ledger.accountant)
        if not ok:
            spent = guarantee.fits(before, limit.epsilon, limit.delta, ledger.accountant)[1]
            return (f"scope {name} has spent epsilon={spent.epsilon:.4g} of {limit.epsilon:g}; "
                    f"this release would bring it to {total.epsilon:.4g} (inferred: the ledger "
                    "records no refusals)")
    return ""


def assess(slots: Iterable[Slot], inputs: CatalogInputs, as_of: _dt.date,
           grace: int) -> list[SlotHealth]:
    """The state of every slot (see the module docstring), in (due day, release id) order."""
    ledger = inputs.ledger
    published: dict = {}
    for release in inputs.releases():
        published.setdefault(release.release_id, []).append(release.versioned_id)
    cutoff = as_of - _dt.timedelta(days=grace)
    out = []
    for slot in sorted(slots, key=lambda s: (s.due, s.release_id)):
        overdue = slot.due < cutoff
        record = ledger.latest_record(slot.release_id) if ledger is not None else None
        versions = published.get(slot.release_id)
        if versions:
            detail = ""
            if record is not None and record.state != "committed" and \
                    record.versioned_id in versions:
                detail = "published; the ledger commit did not complete (a re-run completes it)"
            out.append(SlotHealth(slot=slot, state=PUBLISHED, detail=detail, overdue=False,
                                  versioned_id=versions[-1]))
            continue
        if record is not None:
            report = inputs.reports.get(record.versioned_id)
            if record.state == "committed":
                state, detail = FAILED, ("committed in the ledger but no marker under "
                                         "--releases (moved or deleted?)")
            elif report is not None and report.kind == "failure":
                state, detail = FAILED, report.detail or report.status
            elif record.state == "publishing":
                state, detail = FAILED, "publication started and did not finish"
            else:
                state, detail = RESERVED, ("charged, nothing published, no failure recorded "
                                           "(running, or stopped before recording)")
            out.append(SlotHealth(slot=slot, state=state, detail=detail, overdue=overdue,
                                  versioned_id=record.versioned_id))
            continue
        refusal = would_refuse(slot, ledger)
        if refusal:
            out.append(SlotHealth(slot=slot, state=OVER_BUDGET, detail=refusal, overdue=overdue))
        else:
            out.append(SlotHealth(slot=slot, state=MISSING if overdue else PENDING,
                                  detail="" if overdue else f"due {slot.due}", overdue=overdue))
    return out


def overdue(health: Iterable[SlotHealth]) -> list[SlotHealth]:
    """Slots past their grace that are not published: what ``--check`` names."""
    return [h for h in health if h.overdue and h.state != PUBLISHED]


def public_gaps(health: Iterable[SlotHealth]) -> dict:
    """{dataset id: ((release id, first day, last day), ...)} of the slots past their grace and
    not published, for the public site. Only what is public goes in: the configured schedule,
    the as-of day and the published markers decide it; the state and detail (failed, refused
    over budget, ... read from the ledger and the operator reports) stay with the operator."""
    out: dict = {}
    for h in overdue(health):
        s = h.slot
        out.setdefault(s.dataset_id, []).append((s.release_id, s.start.isoformat(),
                                                 s.due.isoformat()))
    return {k: tuple(v) for k, v in out.items()}


def counts(health: Iterable[SlotHealth]) -> Mapping[str, int]:
    out = {state: 0 for state in STATES}
    for h in health:
        out[h.state] += 1
    return out
