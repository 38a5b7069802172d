"""What a release says about itself: the public marker and the operator's report.

* The **marker** (``RELEASE.json``, published with the release) holds public information only:
  the release's id, version and job; its guarantee (accountant, epsilon, delta, what it covers,
  the ledger scopes); every measure with its mechanism, neighbouring relation, sensitivity and
  noise; public parameters; the files with their digests; public facts of the released tables
  (e.g. keys released); the keys' fingerprints and a keyed binding to the input. It is
  deterministic (no clock), so an identical re-run reproduces it byte for byte.
* The **operator report** (``report.json`` and ``report.txt``, in ``--report_dir``, by default
  beside the ledger) adds what only the operator may see: row counters (raw-data facts), the
  dropped-rows shares and the alerts made from them, the ledger state of every scope (spent and
  remaining), the input digest and timings. It is never published.
"""
from __future__ import annotations

import json
import math
import time
from typing import Mapping, Sequence

from accounting.ledger import keyed_binding
from pipelines.release import names, storage
from pipelines.release.layout import FAILURE, MARKER_FORMAT, REPORT


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def marker(*, job, prepared, context, version: int, files: Mapping[str, str], tables,
           ledger=None, reservation=None) -> dict:
    """The public marker of one release (see the module docstring)."""
    p = context.planned
    out = {
        "format": MARKER_FORMAT, "job": job.name, "release_id": p.release_id,
        "version": version, "versioned_id": context.versioned_id, "testing": context.testing,
        "status": ("TESTING - NOT A RELEASE (" + ("noise-free exact " if any(k.noise_free for k in context.keys.values()) else "public ")
                   + "testing key)") if context.testing else "released",
        "guarantee": p.guarantee_json(),
        "measures": [m.to_dict() for m in p.measures],
        "parameters": dict(p.parameters),
        "outputs": {spec.name: {"sha256": files[spec.name], "rows": tables[spec.name].num_rows,
                                "sorted_by": list(spec.sort_by), "noisy_columns": list(spec.noisy),
                                "columns": {f.name: str(f.type) for f in spec.schema},
                                "description": spec.description, "errors": dict(spec.errors)}
                    for spec in p.outputs},
        "summary": job.public_summary(prepared, p, tables),
        "key_fingerprints": {n: k.fingerprint() for n, k in sorted(context.keys.items())},
    }
    if reservation is not None:
        out["ledger_id"] = reservation.ledger_id
        key = reservation.keys.get("release") or reservation.keys[sorted(reservation.keys)[0]]
        out["input_binding"] = keyed_binding(key.secret_bytes(), reservation.record["input_digest"])
        if reservation.record.get("charged_under"):
            # The random id of the charge (accounting.ledger.witness.charge_position): a reader
            # without the key store (the catalog) can tell a ledger older than the release.
            out["ledger_charge"] = reservation.record["charged_under"]["charge"]
    return json.loads(json.dumps(out, default=str))


def operator_report(*, context, marker: Mapping, status: str, folder: str, counters, shares,
                    alerts, ledger, reservation, started: float, finalized: bool = False,
                    progress: Sequence[str] = ()) -> dict:
    """The operator's report of one published release (raw-data facts: never published).
    ``finalized``: published by ``--finalize`` (charged by its ``--submit_only``: finding that
    reservation again is the plan, not a re-run). Its timing: ``seconds`` since preflight and
    ``progress``, the run's progress lines so far (pipelines.release.progress)."""
    out = {"marker": dict(marker), "status": status, "folder": folder,
           "counters": dict(counters), "dropped_rows": shares, "alerts": list(alerts),
           "seconds": round(time.time() - started, 3), "progress": list(progress)}
    if ledger is not None and reservation is not None:
        scopes = []
        for scope in context.planned.scopes:
            spent = ledger.spent(scope.name)
            budget = ledger.scope_budget(scope.name)
            scopes.append({"name": scope.name, "description": scope.description,
                           "budget": {"epsilon": budget.epsilon, "delta": budget.delta},
                           "spent": {"epsilon": _finite(spent.epsilon), "delta": spent.delta},
                           "remaining": {"epsilon": _finite(max(budget.epsilon - spent.epsilon, 0.0)),
                                         "delta": max(budget.delta - spent.delta, 0.0)}})
        out["ledger"] = {"path": ledger.path, "accountant": ledger.accountant, "scopes": scopes,
                         "input_digest": reservation.record["input_digest"],
                         "resumed": reservation.resumed and not finalized,
                         "finalized": finalized, "taken_over": reservation.taken_over,
                         "runs": reservation.record.get("runs")}
    return out


def text(job, report: Mapping) -> str:
    m = report["marker"]
    g = m["guarantee"]
    lines = [f"{job.name} release {m['versioned_id']} ({report['status']})",
             f"  published at: {report['folder']}",
             f"  guarantee: epsilon={g['epsilon']:.4g}, delta={g['delta']:.3g} "
             f"({g['accountant']} composition); covers {g['covers']}"]
    for measure in m["measures"]:
        noise = f", scale {measure['noise_scale']:.4g}, std {measure['std']:.4g}, 95% " \
                f"+/-{measure['ci95_halfwidth']:.4g}" if "noise_scale" in measure else ""
        lines.append(f"  {measure['name']}: {measure['mechanism']}{noise}; {measure['neighbouring']}"
                     + (f"; {measure['description']}" if measure.get("description") else ""))
    for name, output in m["outputs"].items():
        lines.append(f"  {name}: {output['rows']} rows")
    lines.extend(job.report_lines(m.get("summary", {})))
    ledger = report.get("ledger")
    if ledger:
        for scope in ledger["scopes"]:
            spent, budget = scope["spent"]["epsilon"], scope["budget"]["epsilon"]
            lines.append(f"  budget {scope['name']}: spent epsilon="
                         f"{'inf' if spent is None else f'{spent:.4g}'} of {budget:g}")
        if ledger.get("finalized"):
            lines.append("  (finalized: charged when it was submitted; nothing more was spent)")
        elif ledger["resumed"]:
            lines.append("  (re-run of a charged release: nothing more was spent)")
        if ledger["taken_over"]:
            lines.append("  (took over an unpublished reservation: nothing more was spent)")
    rows = {k: v for k, v in report["counters"].items() if v}
    if rows:
        lines.append("  rows (operator only): " + ", ".join(f"{k}={v}" for k, v in rows.items()))
    for alert in report.get("alerts", ()):
        lines.append(f"  ALERT (operator only; the release is published): {alert}")
    return "\n".join(lines) + "\n"


def _folder(root: str, release_id: str, version: int) -> str:
    return storage.join(root, *names.release_path(release_id), f"v{version}")


def report_path(root: str, release_id: str, version: int) -> str:
    """Where the operator report of a release version is (:func:`write`)."""
    return storage.join(_folder(root, release_id, version), REPORT)


def write(report: Mapping, *, root: str, release_id: str, version: int, job) -> str:
    """The operator report of a published release. A failure record of an earlier attempt at
    this version (a run that published nothing and was then taken over) moves into it as
    ``earlier_failure``, so the folder never shows a failure beside a release that succeeded."""
    folder = _folder(root, release_id, version)
    path = storage.join(folder, REPORT)
    stale = storage.join(folder, FAILURE)
    earlier = storage.read_bytes(stale)
    if earlier is not None:
        report = {**report, "earlier_failure": json.loads(earlier.decode("utf-8"))}
    storage.write_bytes(path, (json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")
                        .encode("utf-8"))
    storage.write_bytes(storage.join(folder, "report.txt"), text(job, report).encode("utf-8"))
    if earlier is not None:
        storage.delete_file(stale)
    return path


def write_failure(body: Mapping, *, root: str, release_id: str, version: int) -> str:
    """The operator's record of a run that published nothing for this release version."""
    path = storage.join(_folder(root, release_id, version), FAILURE)
    storage.write_bytes(path, (json.dumps(body, indent=1, sort_keys=True, default=str) + "\n")
                        .encode("utf-8"))
    return path
