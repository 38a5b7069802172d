"""The catalog as data: ``catalog.json`` with its JSON Schema, and a ``README.md`` per dataset
(the same facts as the dataset's page, as text, ready for a data portal).

Both are rendered from :class:`pipelines.catalog.facts.DatasetFacts`, like the HTML pages, so
the three forms cannot disagree. Output is deterministic (sorted keys, no clock): the same
releases give the same bytes.
"""
from __future__ import annotations

import json
import math
from typing import Optional, Sequence

from accounting.composition import FIGURE_ACCOUNTANTS
from accounting.guarantee import ACCOUNTANTS
from pipelines.catalog.about import NOT_STATED
from pipelines.catalog.facts import DatasetFacts, null_meaning
from pipelines.catalog.site import dataset_folder, ordered_columns

CATALOG_FORMAT = "beam-dp-release/catalog/v1"
SCHEMA_ID = "catalog.schema.json"


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _measure(m) -> dict:
    s = m.measure.sensitivities
    return {"name": m.measure.name, "mechanism": m.measure.mechanism,
            "neighbouring": m.measure.neighbouring, "description": m.measure.description,
            "epsilon": _finite(m.measure.epsilon), "delta": m.measure.delta, "rho": m.measure.rho,
            "sensitivities": None if s is None else {"l0": s.l0, "l1": s.l1, "l2": s.l2,
                                                     "linf": s.linf},
            "noise_scale": m.noise_scale, "std": m.std, "ci95_halfwidth": m.ci95_halfwidth}


def _release(r) -> dict:
    g = r.guarantee
    return {"release_id": r.release_id, "version": r.version, "versioned_id": r.versioned_id,
            "job": r.job, "folder": r.folder,
            "period": None if r.period is None else {"first": r.period[0], "last": r.period[1]},
            "guarantee": {"accountant": g.accountant, "figure_accountant": g.figure_accountant,
                          "epsilon": _finite(g.guarantee.epsilon),
                          "delta": g.guarantee.delta, "covers": g.covers},
            "scopes": [s.name for s in r.scopes],
            "rows": {t.name: t.rows for t in r.outputs if t.rows is not None},
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in r.files]}


def dataset_json(f: DatasetFacts) -> dict:
    folder = dataset_folder(f.slug)
    scopes = []
    for row in f.scopes:
        scopes.append({
            "name": row.name, "description": row.description, "family_size": row.family_size,
            "budget": row.budget_text, "spent_epsilon": _finite(row.spent_epsilon),
            "remaining_epsilon": _finite(row.remaining_epsilon), "releases": row.releases,
            "shared_with": list(row.shared_with),
            "members": [{"name": u.scope.name, "budget": {"epsilon": u.scope.budget.epsilon,
                                                          "delta": u.scope.budget.delta},
                         "spent": {"epsilon": _finite(u.spent.epsilon), "delta": u.spent.delta},
                         "remaining": {"epsilon": _finite(u.remaining.epsilon),
                                       "delta": u.remaining.delta}}
                        for u in row.uses]})
    return {
        "id": f.dataset.dataset_id, "title": f.dataset.title, "kind": f.dataset.kind,
        "jobs": list(f.dataset.jobs), "page": f"{folder}/index.html",
        "readme": f"{folder}/README.md",
        "outputs": [{"name": t.name, "description": t.description,
                     "columns": [{"name": c, "type": k,
                                  "role": "key" if c in t.sorted_by else
                                  ("noisy" if c in t.noisy_columns else "public")}
                                 for c, k in ordered_columns(t)],
                     "sorted_by": list(t.sorted_by), "null_means": null_meaning(t)}
                    for t in f.outputs],
        "neighbouring": [{"measure": n, "relation": r} for n, r in f.relations],
        "measures": [_measure(m) for m in f.latest.measures],
        "scopes": scopes,
        "thresholds": [{"parameter": p, "value": v} for p, v in f.thresholds],
        "caveats": list(f.caveats),
        "releases": [_release(r) for r in f.releases],
        "about": _about(f),
        "gaps": [{"release_id": rid, "first": first, "last": last} for rid, first, last in f.gaps],
    }


def _agent(agent) -> Optional[dict]:
    return None if agent is None else {"name": agent.name, "url": agent.url, "email": agent.email}


def _about(f: DatasetFacts) -> dict:
    a = f.about
    return {"description": a.description, "citation": a.citation, "privacy_unit": a.privacy_unit,
            "license": None if a.license is None else {"name": a.license.name, "url": a.license.url},
            "publisher": _agent(a.publisher), "contact": _agent(a.contact),
            "keywords": list(a.keywords),
            "methodology": [{"name": m.name, "url": m.url} for m in a.methodology],
            "columns": {c: {"description": a.column(c).description, "unit": a.column(c).unit}
                        for t in f.outputs for c, _ in t.columns}}


def catalog_json(all_facts: Sequence[DatasetFacts], *, title: str, testing: bool) -> str:
    body = {"$schema": SCHEMA_ID, "format": CATALOG_FORMAT, "title": title, "testing": testing,
            "datasets": [dataset_json(f) for f in all_facts]}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"


def _nullable(kind) -> dict:
    return {"type": [kind, "null"]}


def schema() -> dict:
    """The JSON Schema (2020-12) of ``catalog.json``."""
    number, string, integer = {"type": "number"}, {"type": "string"}, {"type": "integer"}
    sha = {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}
    budget = {"type": "object", "required": ["epsilon", "delta"], "additionalProperties": False,
              "properties": {"epsilon": _nullable("number"), "delta": number}}
    release = {
        "type": "object", "additionalProperties": False,
        "required": ["release_id", "version", "versioned_id", "job", "folder", "period",
                     "guarantee", "scopes", "rows", "files"],
        "properties": {
            "release_id": string, "version": {"type": "integer", "minimum": 1},
            "versioned_id": string, "job": string, "folder": string,
            "period": {"oneOf": [{"type": "null"}, {
                "type": "object", "required": ["first", "last"], "additionalProperties": False,
                "properties": {"first": {"type": "string", "format": "date"},
                               "last": {"type": "string", "format": "date"}}}]},
            "guarantee": {"type": "object", "additionalProperties": False,
                          "required": ["accountant", "epsilon", "delta", "covers"],
                          "properties": {"accountant": {"enum": list(ACCOUNTANTS)},
                                         "figure_accountant": {"enum": list(FIGURE_ACCOUNTANTS)},
                                         "epsilon": _nullable("number"), "delta": number,
                                         "covers": string}},
            "scopes": {"type": "array", "items": string},
            "rows": {"type": "object", "additionalProperties": integer},
            "files": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "required": ["name", "size", "sha256"],
                "properties": {"name": string, "size": _nullable("integer"), "sha256": sha}}}}}
    link = {"type": "object", "additionalProperties": False, "required": ["name", "url"],
            "properties": {"name": string, "url": _nullable("string")}}
    agent = {"oneOf": [{"type": "null"}, {
        "type": "object", "additionalProperties": False, "required": ["name", "url", "email"],
        "properties": {"name": string, "url": _nullable("string"),
                       "email": _nullable("string")}}]}
    about = {
        "type": "object", "additionalProperties": False,
        "required": ["description", "citation", "privacy_unit", "license", "publisher",
                     "contact", "keywords", "methodology", "columns"],
        "properties": {
            "description": string, "citation": string, "privacy_unit": string,
            "license": {"oneOf": [{"type": "null"}, link]}, "publisher": agent,
            "contact": agent, "keywords": {"type": "array", "items": string},
            "methodology": {"type": "array", "items": link},
            "columns": {"type": "object", "additionalProperties": {
                "type": "object", "additionalProperties": False,
                "required": ["description", "unit"],
                "properties": {"description": string, "unit": string}}}}}
    dataset = {
        "type": "object", "additionalProperties": False,
        "required": ["id", "title", "kind", "jobs", "page", "readme", "outputs", "neighbouring",
                     "measures", "scopes", "thresholds", "caveats", "releases", "about", "gaps"],
        "properties": {
            "about": about,
            "gaps": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["release_id", "first", "last"],
                "properties": {"release_id": string, "first": {"type": "string", "format": "date"},
                               "last": {"type": "string", "format": "date"}}}},
            "id": string, "title": string, "kind": string,
            "jobs": {"type": "array", "items": string}, "page": string, "readme": string,
            "outputs": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["name", "description", "columns", "sorted_by", "null_means"],
                "properties": {
                    "name": string, "description": string, "null_means": string,
                    "sorted_by": {"type": "array", "items": string},
                    "columns": {"type": "array", "items": {
                        "type": "object", "additionalProperties": False,
                        "required": ["name", "type", "role"],
                        "properties": {"name": string, "type": string,
                                       "role": {"enum": ["key", "noisy", "public"]}}}}}}},
            "neighbouring": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["measure", "relation"],
                "properties": {"measure": string, "relation": string}}},
            "measures": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["name", "mechanism", "neighbouring", "epsilon", "delta"],
                "properties": {
                    "name": string, "mechanism": string, "neighbouring": string,
                    "description": string, "epsilon": _nullable("number"), "delta": number,
                    "rho": _nullable("number"), "noise_scale": _nullable("number"),
                    "std": _nullable("number"), "ci95_halfwidth": _nullable("number"),
                    "sensitivities": {"oneOf": [{"type": "null"}, {
                        "type": "object", "additionalProperties": False,
                        "required": ["l0", "l1", "l2", "linf"],
                        "properties": {"l0": number, "l1": number, "l2": number,
                                       "linf": number}}]}}}},
            "scopes": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["name", "description", "family_size", "budget", "spent_epsilon",
                             "remaining_epsilon", "releases", "shared_with", "members"],
                "properties": {
                    "name": string, "description": string,
                    "family_size": {"type": "integer", "minimum": 1}, "budget": string,
                    "spent_epsilon": _nullable("number"), "remaining_epsilon": _nullable("number"),
                    "releases": integer, "shared_with": {"type": "array", "items": string},
                    "members": {"type": "array", "items": {
                        "type": "object", "additionalProperties": False,
                        "required": ["name", "budget", "spent", "remaining"],
                        "properties": {"name": string, "budget": budget, "spent": budget,
                                       "remaining": budget}}}}}},
            "thresholds": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["parameter", "value"],
                "properties": {"parameter": string, "value": {"type": ["number", "string"]}}}},
            "caveats": {"type": "array", "items": string},
            "releases": {"type": "array", "items": release}}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
        "title": "Release catalog of differentially private releases",
        "description": "Public facts of published releases, grouped into datasets (written by "
                       "python -m pipelines.catalog).",
        "type": "object", "additionalProperties": False,
        "required": ["$schema", "format", "title", "testing", "datasets"],
        "properties": {"$schema": string, "format": {"const": CATALOG_FORMAT}, "title": string,
                       "testing": {"type": "boolean"},
                       "datasets": {"type": "array", "items": dataset}}}


def schema_json() -> str:
    return json.dumps(schema(), indent=1, sort_keys=True) + "\n"


# --------------------------------------------------------------------------- README.md

def _md(text) -> str:
    """Text safe inside a Markdown table cell or line (no pipes, no line breaks, no HTML)."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
            .replace(">", "&gt;").replace("\n", " "))


def _g(x: Optional[float], digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf"
    return f"{x:.{digits}g}"


def _who(agent) -> str:
    if agent is None:
        return NOT_STATED
    return " ".join(x for x in (agent.name, agent.url, f"<{agent.email}>" if agent.email else "")
                    if x)


def _named(link) -> str:
    if link is None:
        return NOT_STATED
    return f"{link.name} ({link.url})" if link.url else link.name


def readme(f: DatasetFacts, *, testing: bool) -> str:
    d, latest = f.dataset, f.latest
    g = latest.guarantee
    lines = [f"# {_md(d.title)}", ""]
    if testing:
        lines += ["**TESTING - NOT A RELEASE: made with a public testing key; protects nothing.**",
                  ""]
    lines += [f"{_md(d.kind)}; dataset `{_md(d.dataset_id)}`; job(s): "
              + ", ".join(f"`{_md(j)}`" for j in d.jobs) + ".",
              f"{len(f.releases)} published release(s); latest `{_md(latest.versioned_id)}`.", "",
              "## About this dataset", "", _md(f.about.description), "",
              f"- Publisher: {_md(_who(f.about.publisher))}",
              f"- Contact: {_md(_who(f.about.contact))}",
              f"- Licence: {_md(_named(f.about.license))}",
              f"- Citation: {_md(f.about.citation)}",
              f"- Privacy unit: {_md(f.about.privacy_unit)}",
              "- Methodology: " + ("; ".join(_md(_named(m)) for m in f.about.methodology)
                                   or NOT_STATED), "",
              "## What is released", ""]
    for t in f.outputs:
        lines += [f"### `{_md(t.name)}`", ""]
        if t.description and t.description != null_meaning(t):
            lines += [_md(t.description), ""]
        lines += [f"Sorted by: {', '.join(f'`{_md(c)}`' for c in t.sorted_by) or '-'}. "
                  f"Null: {_md(null_meaning(t))}", "",
                  "| Column | Type | Role | Description | Unit |", "| --- | --- | --- | --- | --- |"]
        for c, k in ordered_columns(t):
            role = "key" if c in t.sorted_by else ("noisy" if c in t.noisy_columns else "public")
            told = f.about.column(c)
            lines.append(f"| `{_md(c)}` | `{_md(k)}` | {role} | {_md(told.description)} | "
                         f"{_md(told.unit)} |")
        lines.append("")
    lines += ["## Privacy unit and neighbouring relation", ""]
    lines += [f"- **{_md(n)}**: {_md(r)}" for n, r in f.relations] + [""]
    lines += ["## Mechanisms and noise", "",
              "| Measure | Mechanism | Noise scale | Noise std | 95% interval | epsilon | delta | rho "
              "| epsilon by |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m in latest.measures:
        lines.append(f"| {_md(m.measure.name)} | {_md(m.measure.mechanism)} | {_g(m.noise_scale)} "
                     f"| {_g(m.std)} | +/-{_g(m.ci95_halfwidth)} | {_g(m.measure.epsilon)} | "
                     f"{_g(m.measure.delta, 3)} | {_g(m.measure.rho, 3)} | "
                     f"{_md(m.measure.accountant)} |")
    lines += ["", "## Guarantee", "",
              f"Each release: epsilon={_g(g.guarantee.epsilon)}, delta={_g(g.guarantee.delta, 3)} "
              f"({_md(g.accountant)} composition; the figure by {_md(g.figure_accountant)}) "
              f"per privacy unit: {_md(f.about.privacy_unit)}. "
              f"Covers: {_md(g.covers)}", "",
              "## Budget scopes", "", "Spent and remaining count published releases only.", "",
              "| Scope | What it bounds | Budget | Spent epsilon | Remaining epsilon | Releases |",
              "| --- | --- | --- | --- | --- | --- |"]
    for row in f.scopes:
        name = f"`{_md(row.name)}`" + (f" ({row.family_size} scopes; largest spent shown)"
                                       if row.family_size > 1 else "")
        lines.append(f"| {name} | {_md(row.description)} | {_md(row.budget_text)} | "
                     f"{_g(row.spent_epsilon)} | {_g(row.remaining_epsilon)} | {row.releases} |")
    lines += ["", "## Thresholds", ""]
    lines += [f"- `{_md(p)}`: {_md(v)}" for p, v in f.thresholds] or ["None stated."]
    lines += ["", "## Caveats", ""] + [f"- {_md(c)}" for c in f.caveats]
    lines += ["", "## Scheduled releases not published", "",
              "Due (past their grace) and not published; the catalog does not say why.", ""]
    lines += [f"- `{_md(rid)}` ({first}" + ("" if first == last else f"..{last}") + ")"
              for rid, first, last in f.gaps] or ["None."]
    lines += ["", "## Releases", "", "| Release | Version | Period | epsilon | delta | Files |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in reversed(f.releases):
        period = "-" if not r.period else (r.period[0] if r.period[0] == r.period[1]
                                           else f"{r.period[0]}..{r.period[1]}")
        files = "; ".join(f"`{_md(x.name)}` {'missing' if x.size is None else f'{x.size} bytes'} "
                          f"`{_md(x.sha256)}`" for x in r.files)
        lines.append(f"| `{_md(r.release_id)}` | {r.version} | {period} | "
                     f"{_g(r.guarantee.guarantee.epsilon)} | {_g(r.guarantee.guarantee.delta, 3)} "
                     f"| {files} |")
    return "\n".join(lines) + "\n"


def export_files(all_facts: Sequence[DatasetFacts], *, title: str,
                 testing: bool) -> dict[str, str]:
    out = {"catalog.json": catalog_json(all_facts, title=title, testing=testing),
           "catalog.schema.json": schema_json()}
    for f in all_facts:
        out[f"{dataset_folder(f.slug)}/README.md"] = readme(f, testing=testing)
    return out
