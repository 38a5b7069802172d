"""The public site: an index of datasets and, per dataset, a page of everything a reader needs
to use and trust its releases, with the releases table paginated so pages stay small.

Layout (relative to ``--output``; every link is relative, so the site opens from ``file://``
and from any static host)::

    index.html                              the datasets
    datasets/<slug>/index.html              one dataset (its newest releases on page 1)
    datasets/<slug>/releases-<n>.html       older releases, page n >= 2
    datasets/<slug>/README.md               the same facts as text (catalog_export)
    catalog.json, catalog.schema.json       machine-readable (catalog_export)

Only :mod:`pipelines.catalog.facts` reaches these pages: published facts, nothing of the ledger
or of the operator reports.

Every page is Jinja2 templates (``pipelines/catalog/templates/``, autoescaped): a page's body
(``index.html``; ``dataset.html``, a dataset's first page; ``releases.html``, its older releases;
the pieces they share in ``macros.html`` and ``releases_listing.html``) inside ``page.html``,
styled by ``catalog.css``. A portal restyles any of them with ``--templates DIR``; its own
templates are given the same context, the facts of :data:`TEMPLATE_GLOBALS` and the formatting
helpers of :func:`pipelines.catalog.html.environment`.
This module only chooses what each page holds.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from pipelines.catalog.about import NOT_STATED
from pipelines.catalog.charts import budget_chart
from pipelines.catalog.facts import DatasetFacts, null_meaning
from pipelines.catalog.html import environment, num, page

TESTING_BANNER = ("TESTING \u2014 NOT A RELEASE: these files were made with a public testing key "
                  "and protect nothing")


def dataset_folder(slug: str) -> str:
    return f"datasets/{slug}"


def release_page(current: int) -> str:
    return "index.html" if current == 1 else f"releases-{current}.html"


def file_url(files_base: Optional[str], release, name: str, root: str = "") -> Optional[str]:
    """Where a released file is downloaded from: ``files_base`` is an absolute URL of the
    releases' output root (``--releases_url``) or a path relative to the site's root (the
    default, when the releases lie beside the site); ``root`` leads from a page to the site's
    root. None when the files are not reachable from the site."""
    if not files_base:
        return None
    base = files_base if "://" in files_base else root + files_base
    return base.rstrip("/") + "/" + release.folder + "/" + name


def row_counts(release) -> list[str]:
    """A release's row counts as text: each released table's rows, then the keys released of
    the keyset when its summary states them."""
    single = len(release.outputs) == 1
    rows = [(f"{num(t.rows)} rows" if single else f"{t.name}: {num(t.rows)}")
            for t in release.outputs if t.rows is not None]
    keys = (release.summary or {}).get("keys")
    if isinstance(keys, dict) and isinstance(keys.get("released"), int) and \
            isinstance(keys.get("keyset"), int):
        rows.append(f"{num(keys['released'])} of {num(keys['keyset'])} keys")
    return rows


def ordered_columns(t) -> list[tuple]:
    """Key columns in their public order, then noisy columns, then the rest."""
    kinds = dict(t.columns)
    keys = [c for c in t.sorted_by if c in kinds]
    noisy = [c for c, _ in t.columns if c in t.noisy_columns and c not in keys]
    rest = [c for c, _ in t.columns if c not in keys and c not in noisy]
    return [(c, kinds[c]) for c in keys + noisy + rest]


def period_span(f: DatasetFacts) -> Optional[tuple]:
    """(first, last) day of the periods a dataset's releases cover, or None."""
    periods = [r.period for r in f.releases if r.period]
    if not periods:
        return None
    return min(p[0] for p in periods), max(p[1] for p in periods)


def main_scope(f: DatasetFacts):
    """The scope the index shows for a dataset: its single scope charged by most releases."""
    return max((r for r in f.scopes if r.family_size == 1), key=lambda r: r.releases,
               default=None)


def _chart(**kwargs):
    from markupsafe import Markup

    return Markup(budget_chart(**kwargs))  # SVG the catalog builds, its texts escaped


#: What the page templates (``index.html``, ``dataset.html``, ``releases.html`` and their
#: ``macros.html``) are given besides their context: the catalog's formatting and the facts
#: they derive. A portal's own templates may use any of these.
TEMPLATE_GLOBALS = {
    "file_url": file_url, "row_counts": row_counts, "period_span": period_span,
    "main_scope": main_scope, "null_meaning": null_meaning, "ordered_columns": ordered_columns,
    "dataset_folder": dataset_folder, "release_page": release_page, "chart": _chart,
    "not_stated": NOT_STATED,
}


def _body(name: str, templates: Optional[str], **context) -> str:
    from markupsafe import Markup

    env = environment(templates)  # its formatting helpers: pipelines.catalog.html
    env.globals.update(TEMPLATE_GLOBALS)
    return Markup(env.get_template(name).render(**context))


def dataset_pages(f: DatasetFacts, *, page_size: int, files_base: Optional[str],
                  testing: bool, structured: str = "",
                  templates: Optional[str] = None) -> dict[str, str]:
    """{path: HTML} of one dataset: its page (``dataset.html``) and its older releases' pages
    (``releases.html``). ``files_base``: where the released files are downloaded from
    (:func:`file_url`); ``structured``: markup for every page's head (the dataset's JSON-LD,
    :mod:`pipelines.catalog.linked_data`)."""
    folder = dataset_folder(f.slug)
    newest = list(reversed(f.releases))
    chunks = [newest[i:i + page_size] for i in range(0, len(newest), page_size)] or [[]]
    total = len(chunks)
    pages = {}
    for n, chunk in enumerate(chunks, 1):
        html = _body("dataset.html" if n == 1 else "releases.html", templates, f=f, rows=chunk,
                     current=n, total=total, files_base=files_base)
        crumbs = [(f.dataset.title, None)] if n == 1 else \
            [(f.dataset.title, "index.html"), (f"page {n}", None)]
        pages[f"{folder}/{release_page(n)}"] = page(
            title=f"{f.dataset.title} \u2014 release catalog" + (f" (page {n})" if n > 1 else ""),
            body=html, crumbs=crumbs, root="../../", banner=TESTING_BANNER if testing else "",
            footer=_footer(), head=structured, templates=templates)
    return pages


def _footer() -> str:
    return ("Every figure on this site comes from the published release markers "
            "(<code>RELEASE.json</code>) and the released files. Spent budgets count published "
            "releases only.")


def index_page(all_facts: Sequence[DatasetFacts], *, title: str, testing: bool,
               templates: Optional[str] = None) -> str:
    """The site's index (``index.html``): every dataset with its latest guarantee and main
    budget."""
    body = _body("index.html", templates, title=title, facts=list(all_facts),
                 releases=sum(len(f.releases) for f in all_facts))
    return page(title=title, body=body, banner=TESTING_BANNER if testing else "",
                footer=_footer(), templates=templates)


def site_pages(all_facts: Sequence[DatasetFacts], *, title: str, page_size: int,
               files_base: Optional[str] = None, testing: bool = False,
               structured: Optional[Mapping[str, str]] = None,
               templates: Optional[str] = None) -> dict[str, str]:
    """{relative path: HTML} of the whole public site; ``structured``: {dataset id: head
    markup} (the datasets' JSON-LD); ``templates``: a portal's template folder
    (:func:`pipelines.catalog.html.page`)."""
    pages = {"index.html": index_page(all_facts, title=title, testing=testing,
                                      templates=templates)}
    for f in all_facts:
        pages.update(dataset_pages(f, page_size=page_size, files_base=files_base,
                                   testing=testing, templates=templates,
                                   structured=(structured or {}).get(f.dataset.dataset_id, "")))
    return pages
