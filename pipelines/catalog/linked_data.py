"""The catalog as linked data portals harvest: a schema.org ``Dataset`` (JSON-LD) in the head of
every dataset page, and the whole catalog in the DCAT vocabulary (``dcat.jsonld``: a
``dcat:Catalog`` of ``dcat:Dataset``, each with its ``dcat:Distribution`` of released files).

Both are rendered from :class:`pipelines.catalog.facts.DatasetFacts` like the pages, and hold
public facts only: the configured description (:mod:`pipelines.catalog.about`), the period, the
guarantee in words, the columns and the released files' download URLs -- no size or digest
(those depend on noisy values; the pages show them where the privacy audit masks them).
Identifiers are the pages' URLs: absolute under ``--site_url``, else relative to the file that
holds them (JSON-LD resolves a relative IRI against the document's own address). Output is
deterministic: the same releases give the same bytes.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

from pipelines.catalog.about import NOT_STATED
from pipelines.catalog.facts import DatasetFacts
from pipelines.catalog.site import dataset_folder, file_url

DCAT_FILE = "dcat.jsonld"
DCAT_CONTEXT = {"dcat": "http://www.w3.org/ns/dcat#", "dct": "http://purl.org/dc/terms/",
                "foaf": "http://xmlns.com/foaf/0.1/", "vcard": "http://www.w3.org/2006/vcard/ns#",
                "xsd": "http://www.w3.org/2001/XMLSchema#"}
#: Media types of released files, by the end of their names.
MEDIA_TYPES = (("RELEASE.json", "application/json"), (".csv", "text/csv"),
               (".csv.gz", "text/csv"), (".parquet", "application/vnd.apache.parquet"),
               (".json", "application/json"), (".txt", "text/plain"))


def media_type(name: str) -> str:
    return next((kind for end, kind in MEDIA_TYPES if name.endswith(end)),
                "application/octet-stream")


def _page(f: DatasetFacts, site_url: Optional[str], root: str) -> str:
    path = f"{dataset_folder(f.slug)}/index.html"
    return f"{site_url.rstrip('/')}/{path}" if site_url else root + path


def _period(f: DatasetFacts) -> Optional[tuple]:
    periods = [r.period for r in f.releases if r.period]
    return (min(p[0] for p in periods), max(p[1] for p in periods)) if periods else None


def _downloads(f: DatasetFacts, files_base: Optional[str], root: str, newest: int) -> list:
    """(release, file name, URL) of the newest releases' files (those on the first page)."""
    if not files_base:
        return []
    out = []
    for release in list(reversed(f.releases))[:newest]:
        for published in release.files:
            out.append((release, published.name, file_url(files_base, release, published.name,
                                                          root)))
    return out


def _guarantee_text(f: DatasetFacts) -> str:
    lo, hi = f.epsilon_range
    eps = f"epsilon {lo:.4g} to {hi:.4g}" if lo != hi else f"epsilon {hi:.4g}"
    mechanisms = ", ".join(sorted({m.measure.mechanism for m in f.latest.measures}))
    return (f"Differential privacy ({mechanisms}); each release {eps} per privacy unit: "
            f"{f.about.privacy_unit}")


def schema_org(f: DatasetFacts, *, files_base: Optional[str], site_url: Optional[str],
               newest: int) -> dict:
    """The schema.org ``Dataset`` of one dataset, as its page (``datasets/<slug>/``) holds it."""
    a, root = f.about, "../../"
    period = _period(f)
    doc = {
        "@context": "https://schema.org/", "@type": "Dataset",
        "@id": _page(f, site_url, root), "url": _page(f, site_url, root),
        "identifier": f.dataset.dataset_id, "name": f.dataset.title,
        "description": a.description if a.description != NOT_STATED else
        f"{f.dataset.kind} {f.dataset.dataset_id}: differentially private releases "
        f"(description {NOT_STATED})",
        "license": (a.license.url or a.license.name) if a.license else NOT_STATED,
        "citation": a.citation, "isAccessibleForFree": True,
        "measurementTechnique": _guarantee_text(f),
        "variableMeasured": [{"@type": "PropertyValue", "name": column,
                              "description": a.column(column).description,
                              "unitText": a.column(column).unit}
                             for t in f.outputs for column, _ in t.columns],
        "distribution": [{"@type": "DataDownload", "name": f"{r.versioned_id}: {name}",
                          "contentUrl": url, "encodingFormat": media_type(name)}
                         for r, name, url in _downloads(f, files_base, root, newest)]}
    if a.keywords:
        doc["keywords"] = list(a.keywords)
    if period:
        doc["temporalCoverage"] = f"{period[0]}/{period[1]}"
    for role, agent in (("publisher", a.publisher), ("creator", a.publisher)):
        if agent is not None:
            doc[role] = {"@type": "Organization", "name": agent.name,
                         **({"url": agent.url} if agent.url else {}),
                         **({"email": agent.email} if agent.email else {})}
    return doc


def script(doc: dict) -> str:
    """JSON-LD for a page's head: ``<``, ``>`` and ``&`` escaped, so no text of it can close
    the script element or open markup."""
    text = json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/ld+json">{text}</script>\n'


def _dcat_dataset(f: DatasetFacts, files_base: Optional[str], site_url: Optional[str],
                  newest: int) -> dict:
    a, page = f.about, _page(f, site_url, "")
    period = _period(f)
    out = {"@id": page, "@type": "dcat:Dataset", "dct:identifier": f.dataset.dataset_id,
           "dct:title": f.dataset.title, "dct:description": a.description,
           "dcat:landingPage": {"@id": page}, "dct:conformsTo": _guarantee_text(f),
           "dcat:keyword": list(a.keywords),
           "dcat:distribution": [
               {"@id": url, "@type": "dcat:Distribution", "dct:title": f"{r.versioned_id}: {name}",
                "dcat:downloadURL": {"@id": url}, "dcat:accessURL": {"@id": url},
                "dcat:mediaType": media_type(name)}
               for r, name, url in _downloads(f, files_base, "", newest)]}
    if a.license is not None:
        out["dct:license"] = {"@id": a.license.url} if a.license.url else a.license.name
    if a.publisher is not None:
        out["dct:publisher"] = {"@type": "foaf:Agent", "foaf:name": a.publisher.name,
                                **({"foaf:homepage": {"@id": a.publisher.url}}
                                   if a.publisher.url else {})}
    if a.contact is not None:
        out["dcat:contactPoint"] = {"@type": "vcard:Kind", "vcard:fn": a.contact.name,
                                    **({"vcard:hasEmail": {"@id": f"mailto:{a.contact.email}"}}
                                       if a.contact.email else {})}
    if period:
        out["dct:temporal"] = {"@type": "dct:PeriodOfTime",
                               "dcat:startDate": {"@value": period[0], "@type": "xsd:date"},
                               "dcat:endDate": {"@value": period[1], "@type": "xsd:date"}}
    return out


def dcat(all_facts: Sequence[DatasetFacts], *, title: str, files_base: Optional[str],
         site_url: Optional[str], newest: int) -> str:
    """``dcat.jsonld``: the catalog (at the site's root) in the DCAT vocabulary."""
    root = f"{site_url.rstrip('/')}/" if site_url else ""
    doc = {"@context": DCAT_CONTEXT, "@id": f"{root}{DCAT_FILE}", "@type": "dcat:Catalog",
           "dct:title": title, "foaf:homepage": {"@id": f"{root}index.html"},
           "dcat:dataset": [_dcat_dataset(f, files_base, site_url, newest) for f in all_facts]}
    # Compact: json's C encoder (an indented dump goes through the pure-Python one, seconds at
    # 55,000 releases); harvesters parse it, people read the pages.
    return json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"
