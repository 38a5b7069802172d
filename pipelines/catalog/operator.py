"""The operator view: what only the operator may see, written apart from the public site.

``--operator DIR`` gets ``index.html`` (schedule health, failures, take-overs, reservations
without publication, coverage alarms, markers left out of the public site, budgets as the
ledger counts them), one page per dataset (``datasets/<slug>-<n>.html``: each release's ledger
state, runs, key fingerprints, row counters and dropped-row shares) and ``operator.json`` with
the same facts. These hold raw-data facts (row counters) and operational ones (failures,
unpublished reservations): keep DIR private, like the ledger and its reports.
"""
from __future__ import annotations

import json
import math
from typing import Optional, Sequence

from pipelines.catalog import budget as catalog_budget
from pipelines.catalog.facts import slugs
from pipelines.catalog.html import e, facts, num, page, pagination, table
from pipelines.catalog.schedule import OVER_BUDGET, PUBLISHED, SlotHealth, counts

BANNER = "OPERATOR VIEW \u2014 private: row counters, failures and unpublished reservations"


def _read_rows(counters) -> dict:
    """{input: {read, dropped, skipped, excluded}} from a report's counters."""
    out: dict = {}
    for name, value in counters.items():
        parts = name.split(".")
        if len(parts) >= 2 and parts[1] in ("read", "dropped", "skipped", "excluded"):
            bucket = out.setdefault(parts[0], {"read": 0, "dropped": 0, "skipped": 0,
                                               "excluded": 0})
            bucket[parts[1]] += int(value)
    return out


def _share(dropped_rows) -> str:
    parts = []
    for name, s in sorted((dropped_rows or {}).items()):
        if isinstance(s, dict) and s.get("eligible"):
            parts.append(f"{name} {100 * float(s.get('share', 0)):.1f}% "
                         f"({s.get('dropped', 0)}/{s.get('eligible')})")
    return "; ".join(parts) or "\u2014"


def release_rows(inputs, dataset) -> list[dict]:
    """Operator facts of each published release of ``dataset``."""
    out = []
    for r in dataset.releases:
        record = inputs.ledger.record(r.versioned_id) if inputs.ledger else None
        report = inputs.reports.get(r.versioned_id)
        marker = inputs.markers.get(r.versioned_id)
        out.append({
            "versioned_id": r.versioned_id, "state": record.state if record else None,
            "runs": record.runs if record else None,
            "takeovers": len(record.takeovers) if record else 0,
            "rerun_after_publication": bool(record and record.committed_at and record.last_run_at
                                            and record.last_run_at > record.committed_at),
            "key_fingerprints": dict(record.key_fingerprints) if record else {},
            "marker_key_fingerprints": dict(marker.key_fingerprints) if marker else {},
            "rows": _read_rows(report.counters) if report else None,
            "counters": dict(report.counters) if report else None,
            "dropped_rows": dict(report.dropped_rows) if report else None,
            "dropped_rule_overridden": bool(report and report.dropped_rule_overridden),
            "earlier_failure": bool(report and report.earlier_failure)})
    return out


def problems(inputs, health: Sequence[SlotHealth]) -> dict:
    """Failures, reservations without publication, take-overs, markers left out."""
    ledger = inputs.ledger
    published = {r.versioned_id for r in inputs.releases()}
    unpublished, takeovers = [], []
    if ledger is not None:
        for record in sorted(ledger.records, key=lambda r: r.versioned_id):
            if record.versioned_id not in published:
                report = inputs.reports.get(record.versioned_id)
                unpublished.append({
                    "versioned_id": record.versioned_id, "state": record.state,
                    "charged_at": record.charged_at, "runs": record.runs,
                    "failure": report.status if report and report.kind == "failure" else "",
                    "detail": report.detail if report and report.kind == "failure" else "",
                    "scopes": list(record.scope_names),
                    "key_fingerprints": dict(record.key_fingerprints)})
            for t in record.takeovers:
                takeovers.append({"versioned_id": record.versioned_id, "at": t.at,
                                  "replaced_key_fingerprints": dict(t.key_fingerprints),
                                  "measures_changed": t.measures_changed})
    return {"unpublished": unpublished, "takeovers": takeovers,
            "excluded_markers": [{"path": p, "reason": why} for p, why in inputs.excluded],
            "missing_files": [{"versioned_id": v, "file": f} for v, f in inputs.missing_files],
            "schedule": [_slot_json(h) for h in health]}


def _slot_json(h: SlotHealth) -> dict:
    return {"release_id": h.slot.release_id, "dataset": h.slot.dataset_id,
            "first_day": h.slot.start.isoformat(), "due": h.slot.due.isoformat(),
            "state": h.state, "overdue": h.overdue, "detail": h.detail,
            "versioned_id": h.versioned_id, "source": h.slot.source}


def ledger_scopes(inputs) -> list[dict]:
    """Every ledger scope: budget as recorded, spent as the ledger counts (reserved included)
    and by published releases only."""
    ledger = inputs.ledger
    if ledger is None:
        return []
    public = catalog_budget.scope_uses(inputs.releases())
    out = []
    for name, budget in sorted(ledger.budgets.items()):
        spent = catalog_budget.ledger_spent(ledger, name, budget)
        pub = public.get(name)
        out.append({"name": name, "budget": {"epsilon": budget.epsilon, "delta": budget.delta},
                    "spent": {"epsilon": _finite(spent.epsilon), "delta": spent.delta},
                    "published_spent": None if pub is None else _finite(pub.spent.epsilon),
                    "share": (spent.epsilon / budget.epsilon) if budget.epsilon else math.inf})
    return out


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def operator_files(inputs, health: Sequence[SlotHealth], alarms, *, page_size: int,
                   as_of, grace: int) -> dict[str, str]:
    """{relative path: text} of the operator view."""
    slug_of = slugs([d.dataset_id for d in inputs.datasets])
    found = problems(inputs, health)
    scopes = ledger_scopes(inputs)
    per_dataset = {d.dataset_id: release_rows(inputs, d) for d in inputs.datasets}
    data = {"format": "beam-dp-release/catalog-operator/v1",
            "ledger": None if inputs.ledger is None else {
                "path": inputs.ledger.path, "ledger_id": inputs.ledger.ledger_id,
                "accountant": inputs.ledger.accountant, "records": len(inputs.ledger.records)},
            "as_of": as_of.isoformat(), "grace_days": grace,
            "schedule_counts": dict(counts(health)),
            "coverage_alarms": [{"dataset": a.dataset_id, "input": a.input, "column": a.column,
                                 "value": a.value, "last_seen": a.last_seen,
                                 "silent_releases": list(a.silent_releases)} for a in alarms],
            "scopes": [{k: v for k, v in s.items() if k != "share"} for s in scopes],
            "releases": per_dataset, **found}
    # Compact: json's C encoder (an indented dump of 55,000 releases' counters takes seconds).
    files = {"operator.json": json.dumps(data, sort_keys=True, separators=(",", ":"),
                                         default=str, allow_nan=False) + "\n"}
    files["index.html"] = _index(inputs, health, alarms, found, scopes, slug_of, as_of, grace)
    for dataset in inputs.datasets:
        rows = list(reversed(per_dataset[dataset.dataset_id]))
        chunks = [rows[i:i + page_size] for i in range(0, len(rows), page_size)] or [[]]
        slug = slug_of[dataset.dataset_id]

        def href(n, slug=slug):
            return f"{slug}-{n}.html"

        for n, chunk in enumerate(chunks, 1):
            nav = pagination(n, len(chunks), href)
            body = (f"<h1>{e(dataset.title)}: releases (operator)</h1>{nav}"
                    + table(["Release", "Ledger", "Runs", "Key fingerprints", "Rows per input",
                             "Dropped share", "Notes"],
                            [_release_cells(r) for r in chunk]) + nav)
            files[f"datasets/{href(n)}"] = page(
                title=f"{dataset.title} \u2014 operator view", body=body, root="../",
                crumbs=[(dataset.title, None)], banner=BANNER)
    return files


def _release_cells(r: dict) -> tuple:
    fingerprints = ", ".join(f"{e(k)} <code>{e(v)}</code>" for k, v in r["key_fingerprints"].items())
    if r["marker_key_fingerprints"] != r["key_fingerprints"]:
        fingerprints += ' <span class="bad">marker differs</span>'
    rows = "\u2014" if r["rows"] is None else "<br>".join(
        f"{e(i)}: read {num(c['read'])}, dropped {num(c['dropped'])}, skipped "
        f"{num(c['skipped'])}, excluded {num(c['excluded'])}" for i, c in sorted(r["rows"].items()))
    notes = []
    if r["takeovers"]:
        notes.append(f"{r['takeovers']} take-over(s)")
    if r["earlier_failure"]:
        notes.append("an earlier attempt failed")
    if r["dropped_rule_overridden"]:
        notes.append('<span class="bad">published despite the dropped-rows rule</span>')
    if r["rerun_after_publication"]:
        notes.append("re-run after publication (identical bytes)")
    return (f"<code>{e(r['versioned_id'])}</code>", e(r["state"]), num(r["runs"]),
            fingerprints or "\u2014", rows, e(_share(r["dropped_rows"])),
            "; ".join(notes) or "\u2014")


def _index(inputs, health, alarms, found, scopes, slug_of, as_of, grace) -> str:
    tally = counts(health)
    late = [h for h in health if h.overdue and h.state != PUBLISHED]
    watch = [h for h in health if not h.overdue and h.state not in (PUBLISHED, "pending")]
    ledger = inputs.ledger
    body = ["<h1>Operator view</h1>",
            facts([("Ledger", "\u2014" if ledger is None else
                    f"<code>{e(ledger.path)}</code> ({num(len(ledger.records))} records, "
                    f"{e(ledger.accountant)} accountant)"),
                   ("Schedule as of", f"{e(as_of.isoformat())}, grace {grace} day(s)"),
                   ("Slots", ", ".join(f"{e(k)} {num(v)}" for k, v in tally.items() if v)
                    or "no schedule given (--config, --cadence)")]),
            f'<h2 id="overdue">Overdue, not published ({num(len(late))})</h2>',
            _slots(late) if late else '<p class="ok">None.</p>']
    if watch:
        body += [f'<h2 id="watch">Not yet overdue, not published ({num(len(watch))})</h2>',
                 _slots(watch)]
    body += [f'<h2 id="coverage">Coverage alarms ({num(len(alarms))})</h2>',
             table(["Dataset", "Input", "Key column", "Value", "Last seen in",
                    "Releases without rows"],
                   [(e(a.dataset_id), e(a.input), e(a.column), f"<code>{e(a.value)}</code>",
                     f"<code>{e(a.last_seen)}</code>", e(", ".join(a.silent_releases)))
                    for a in alarms]) if alarms else '<p class="ok">None.</p>',
             f'<h2 id="unpublished">Charged, not published ({num(len(found["unpublished"]))})</h2>',
             table(["Release", "State", "Charged at", "Runs", "Failure", "Key fingerprints"],
                   [(f"<code>{e(u['versioned_id'])}</code>", e(u["state"]), e(u["charged_at"]),
                     num(u["runs"]), e(u["failure"] + (": " + u["detail"] if u["detail"] else ""))
                     or "\u2014", ", ".join(f"<code>{e(v)}</code>" for v in
                                            u["key_fingerprints"].values()))
                    for u in found["unpublished"]]) if found["unpublished"] else
             '<p class="ok">None.</p>',
             f'<h2 id="takeovers">Take-overs ({num(len(found["takeovers"]))})</h2>',
             table(["Release", "At", "Replaced keys", "Measures changed"],
                   [(f"<code>{e(t['versioned_id'])}</code>", e(t["at"]),
                     ", ".join(f"<code>{e(v)}</code>" for v in
                               t["replaced_key_fingerprints"].values()),
                     "yes" if t["measures_changed"] else "no") for t in found["takeovers"]])
             if found["takeovers"] else '<p class="ok">None.</p>']
    if found["excluded_markers"] or found["missing_files"]:
        body += ['<h2 id="excluded">Left out of the public site</h2>',
                 table(["Marker", "Why"], [(f"<code>{e(x['path'])}</code>", e(x["reason"]))
                                           for x in found["excluded_markers"]])
                 + table(["Release", "Missing file"],
                         [(f"<code>{e(m['versioned_id'])}</code>", f"<code>{e(m['file'])}</code>")
                          for m in found["missing_files"]])]
    tight = sorted(scopes, key=lambda s: (-s["share"], s["name"]))[:25]
    body += ['<h2 id="budgets">Budgets as the ledger counts them (reserved included)</h2>',
             f"<p>The {len(tight)} scope(s) closest to their budget, of {num(len(scopes))}; "
             "operator.json has all.</p>",
             table(["Scope", "Budget \u03b5", "Ledger spent \u03b5", "Published spent \u03b5"],
                   [(f"<code>{e(s['name'])}</code>", num(s["budget"]["epsilon"]),
                     num(s["spent"]["epsilon"]), num(s["published_spent"])) for s in tight],
                   numeric=(1, 2, 3)),
             '<h2 id="datasets">Datasets</h2><ul>'
             + "".join(f'<li><a href="datasets/{e(slug_of[d.dataset_id])}-1.html">{e(d.title)}</a>'
                       f" ({num(len(d.releases))} releases)</li>" for d in inputs.datasets)
             + "</ul>"]
    return page(title="Release catalog \u2014 operator view", body="".join(body), banner=BANNER)


def _slots(rows: Sequence[SlotHealth]) -> str:
    return table(["Release", "Dataset", "Due", "State", "Detail"],
                 [(f"<code>{e(h.slot.release_id)}</code>", e(h.slot.dataset_id),
                   f'<span class="period">{e(h.slot.due.isoformat())}</span>',
                   f'<span class="{"bad" if h.state != OVER_BUDGET else ""}">{e(h.state)}</span>',
                   e(h.detail) or "\u2014") for h in rows])
