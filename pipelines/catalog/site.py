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
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from pipelines.catalog.about import NOT_STATED
from pipelines.catalog.charts import budget_chart
from pipelines.catalog.facts import DatasetFacts, null_meaning
from pipelines.catalog.html import bar, e, facts, num, page, pagination, size, table

TESTING_BANNER = ("TESTING \u2014 NOT A RELEASE: these files were made with a public testing key "
                  "and protect nothing")


def dataset_folder(slug: str) -> str:
    return f"datasets/{slug}"


def release_page(current: int) -> str:
    return "index.html" if current == 1 else f"releases-{current}.html"


def _period(release) -> str:
    if not release.period:
        return "\u2014"
    first, last = release.period
    if first == last:
        return f'<span class="period">{e(first)}</span>'
    return f'<span class="period">{e(first)}</span> \u2013 <span class="period">{e(last)}</span>'


def _period_span(f: DatasetFacts) -> str:
    periods = [r.period for r in f.releases if r.period]
    if not periods:
        return "\u2014"
    first, last = min(p[0] for p in periods), max(p[1] for p in periods)
    return f'<span class="period">{e(first)}</span> \u2013 <span class="period">{e(last)}</span>'


def _guarantee(g, unit: str) -> str:
    """A guarantee's epsilon (and delta) with its privacy unit beside it: units differ between
    datasets, and an epsilon means nothing without one."""
    text = f"\u03b5={num(g.guarantee.epsilon)}"
    if g.guarantee.delta:
        text += f", \u03b4={num(g.guarantee.delta, 3)}"
    return (f'<span class="epsilon" data-epsilon="{g.guarantee.epsilon!r}">{e(text)}</span>'
            + _unit(unit))


def _unit(unit: str) -> str:
    return f' <span class="unit muted">per privacy unit: {e(unit)}</span>'


def file_url(files_base: Optional[str], release, name: str, root: str = "") -> Optional[str]:
    """Where a released file is downloaded from: ``files_base`` is an absolute URL of the
    releases' output root (``--releases_url``) or a path relative to the site's root (the
    default, when the releases lie beside the site); ``root`` leads from a page to the site's
    root. None when the files are not reachable from the site."""
    if not files_base:
        return None
    base = files_base if "://" in files_base else root + files_base
    return base.rstrip("/") + "/" + release.folder + "/" + name


def _files(release, files_base: Optional[str]) -> str:
    items = []
    for f in release.files:
        label, href = f"<code>{e(f.name)}</code>", file_url(files_base, release, f.name, "../../")
        link = f'<a href="{e(href)}" download>{label}</a>' if href else label
        items.append(f"<li>{link} {size(f.size)}<br>"
                     f'<code class="hash">{e(f.sha256)}</code></li>')
    return f'<ul class="files">{"".join(items)}</ul>'


def _rows(release) -> str:
    single = len(release.outputs) == 1
    rows = [(f"{num(t.rows)} rows" if single else f"{e(t.name)}: {num(t.rows)}")
            for t in release.outputs if t.rows is not None]
    keys = (release.summary or {}).get("keys")
    if isinstance(keys, dict) and isinstance(keys.get("released"), int) and \
            isinstance(keys.get("keyset"), int):
        rows.append(f"{num(keys['released'])} of {num(keys['keyset'])} keys")
    return "<br>".join(rows) or "\u2014"


def releases_table(f: DatasetFacts, rows: Sequence, files_base: Optional[str]) -> str:
    body = [(f'<span class="release-id">{e(r.release_id)}</span>',
             f'<span class="version">v{r.version}</span>', _period(r),
             _guarantee(r.guarantee, f.about.privacy_unit), _rows(r), _files(r, files_base))
            for r in rows]
    return '<div class="releases">' + table(
        ["Release", "Version", "Period", "Guarantee", "Rows", "Files (size, sha256)"], body,
        cls="stack releases") + "</div>"


def ordered_columns(t) -> list[tuple]:
    """Key columns in their public order, then noisy columns, then the rest."""
    kinds = dict(t.columns)
    keys = [c for c in t.sorted_by if c in kinds]
    noisy = [c for c, _ in t.columns if c in t.noisy_columns and c not in keys]
    rest = [c for c, _ in t.columns if c not in keys and c not in noisy]
    return [(c, kinds[c]) for c in keys + noisy + rest]


def _outputs(f: DatasetFacts) -> str:
    parts = []
    for t in f.outputs:
        roles = []
        for column, kind in ordered_columns(t):
            role = "key (public order)" if column in t.sorted_by else \
                ("noisy" if column in t.noisy_columns else "public")
            told = f.about.column(column)
            roles.append((f"<code>{e(column)}</code>", f"<code>{e(kind)}</code>", e(role),
                          e(told.description), e(told.unit)))
        null = null_meaning(t)
        keys = ", ".join(f"<code>{e(c)}</code>" for c in t.sorted_by) or "nothing stated"
        parts.append(f"<h3><code>{e(t.name)}</code></h3>"
                     + (f"<p>{e(t.description)}</p>" if t.description and t.description != null
                        else "")
                     + f"<p>Rows are sorted by {keys}. <strong>Null:</strong> {e(null)}</p>"
                     + table(["Column", "Type", "Role", "Description", "Unit"], roles,
                             cls="stack"))
    return "".join(parts)


def _mechanisms(f: DatasetFacts) -> str:
    rows = []
    for m in f.latest.measures:
        s = m.measure.sensitivities
        sens = "\u2014" if s is None else (
            f"L1 {num(s.l1)}, L2 {num(s.l2)}, L0 {num(s.l0)}")
        rows.append((f"<strong>{e(m.measure.name)}</strong>"
                     + (f'<br><span class="muted">{e(m.measure.description)}</span>'
                        if m.measure.description else ""),
                     f"<code>{e(m.measure.mechanism)}</code>", e(sens), num(m.noise_scale),
                     num(m.std), ("\u00b1" + num(m.ci95_halfwidth)) if m.ci95_halfwidth else "\u2014",
                     num(m.measure.epsilon), num(m.measure.delta, 3), num(m.measure.rho, 3),
                     e(m.measure.accountant), e(m.measure.neighbouring)))
    return table(["Measure", "Mechanism", "Sensitivity", "Noise scale", "Noise std",
                  "95% interval", "\u03b5", "\u03b4", "\u03c1 (zCDP)", "\u03b5 by",
                  "Privacy unit (neighbouring relation)"], rows, numeric=(3, 4, 5, 6, 7, 8))


def _scopes(f: DatasetFacts) -> str:
    rows, charts = [], []
    for row in f.scopes:
        name = f"<code>{e(row.name)}</code>" + (
            f'<br><span class="muted">{row.family_size} scopes, one per period</span>'
            if row.family_size > 1 else "")
        label = "largest spent" if row.family_size > 1 else "spent"
        rows.append((name, e(row.description), e(row.budget_text),
                     f"{bar(row.share_spent)}{num(row.spent_epsilon)}"
                     + (f' <span class="muted">({label})</span>' if row.family_size > 1 else ""),
                     num(row.remaining_epsilon), num(row.releases)))
        kind = "cumulative" if row.family_size == 1 else "per-period"
        caption = (f"<code>{e(row.name)}</code>: \u03b5 spent after each published release"
                   if kind == "cumulative" else
                   f"<code>{e(row.name)}</code>: \u03b5 spent in each period"
                   + (" (largest of each stretch)" if row.family_size > len(row.series) else ""))
        charts.append(budget_chart(scope=row.name, series=row.series, budget=row.chart_budget,
                                   kind=kind, caption=caption))
    return (table(["Scope", "What it bounds", "Budget", "Spent \u03b5", "Remaining \u03b5",
                   "Releases"], rows, numeric=(4, 5))
            + '<h3>Budget over time</h3><div class="charts">' + "".join(charts) + "</div>")


def _agent(agent) -> str:
    if agent is None:
        return e(NOT_STATED)
    parts = [f'<a href="{e(agent.url)}">{e(agent.name)}</a>' if agent.url else e(agent.name)]
    if agent.email:
        parts.append(f'<a href="mailto:{e(agent.email)}">{e(agent.email)}</a>')
    return " \u00b7 ".join(parts)


def _link(link) -> str:
    return f'<a href="{e(link.url)}">{e(link.name)}</a>' if link.url else e(link.name)


def _about(f: DatasetFacts, files_base: Optional[str]) -> str:
    """The portal's part of a dataset page: what the data is and who answers for it (all from
    configuration, "not stated" where none says), and how to get the files."""
    a = f.about
    download = ("Every release below links its files; each file's sha256 is listed beside it."
                if files_base else "The released files are not linked from this site (give "
                "--releases_url, or publish the site beside the releases); each file's sha256 is "
                "listed below.")
    methodology = "".join(f"<li>{_link(m)}</li>" for m in a.methodology)
    return (f'<h2 id="about">About this dataset</h2><p class="description">{e(a.description)}</p>'
            + facts([("Publisher", _agent(a.publisher)), ("Contact", _agent(a.contact)),
                     ("Licence", e(NOT_STATED) if a.license is None else _link(a.license)),
                     ("Citation", e(a.citation)),
                     ("Keywords", e(", ".join(a.keywords)) if a.keywords else e(NOT_STATED)),
                     ("Privacy unit", e(a.privacy_unit)), ("Download", e(download))])
            + '<h3 id="methodology">Methodology</h3>'
            + (f'<ul class="methodology">{methodology}</ul>' if methodology
               else f"<p>{e(NOT_STATED)}</p>"))


def _gaps(f: DatasetFacts) -> str:
    """The scheduled releases that are due and not published, shown as gaps: which, never why."""
    rows = [(f'<span class="release-id">{e(rid)}</span>',
             f'<span class="period">{e(first)}</span>' + (
                 "" if first == last else f' \u2013 <span class="period">{e(last)}</span>'))
            for rid, first, last in f.gaps]
    return ('<h2 id="gaps">Scheduled releases not published</h2>'
            "<p>Releases the schedule has due (past their grace) that are not published. "
            "The catalog does not say why.</p>"
            + table(["Release", "Period"], rows, cls="stack gaps"))


def dataset_pages(f: DatasetFacts, *, page_size: int, files_base: Optional[str],
                  testing: bool, structured: str = "",
                  templates: Optional[str] = None) -> dict[str, str]:
    """{path: HTML} of one dataset: its page and its older releases' pages. ``files_base``:
    where the released files are downloaded from (:func:`file_url`); ``structured``: markup for
    every page's head (the dataset's JSON-LD, :mod:`pipelines.catalog.linked_data`)."""
    folder = dataset_folder(f.slug)
    newest = list(reversed(f.releases))
    chunks = [newest[i:i + page_size] for i in range(0, len(newest), page_size)] or [[]]
    total = len(chunks)
    latest = f.latest
    lo, hi = f.epsilon_range
    g = latest.guarantee
    overview = facts([
        ("Kind", e(f.dataset.kind)),
        ("Job", ", ".join(f"<code>{e(j)}</code>" for j in f.dataset.jobs)),
        ("Releases", f"{num(len(f.releases))} published"
         + (f" ({num(len({r.release_id for r in f.releases}))} release ids)"
            if len({r.release_id for r in f.releases}) != len(f.releases) else "")),
        ("Period covered", _period_span(f)),
        ("Latest release", f'<code>{e(latest.versioned_id)}</code>'),
        ("Per-release guarantee", f"\u03b5 from {num(lo)} to {num(hi)}" if lo != hi else
         f"\u03b5={num(hi)}" + (f", \u03b4={num(g.guarantee.delta, 3)}" if g.guarantee.delta else "")
         + f" ({e(g.accountant)} composition)" + _unit(f.about.privacy_unit)),
        ("Machine-readable", f'<a href="README.md">README.md</a> \u00b7 '
                             f'<a href="../../catalog.json">catalog.json</a>'),
    ])
    relations = "".join(f"<li><strong>{e(name)}</strong>: {e(rel)}</li>"
                        for name, rel in f.relations)
    thresholds = table(["Parameter", "Value"], [(f"<code>{e(p)}</code>", e(num(v) if isinstance(
        v, (int, float)) else v)) for p, v in f.thresholds], cls="plain") if f.thresholds else \
        "<p>No release thresholds are stated.</p>"
    caveats = "".join(f'<div class="caveat">{e(c)}</div>' for c in f.caveats)
    body = [f'<h1>{e(f.dataset.title)}</h1><p class="lead">{e(f.dataset.kind)} \u00b7 dataset '
            f'<code>{e(f.dataset.dataset_id)}</code></p>', overview, _about(f, files_base),
            '<h2 id="released">What is released</h2>', _outputs(f),
            '<h2 id="unit">Privacy unit and neighbouring relation</h2>',
            "<p>Each measure protects the difference between two inputs that differ as follows "
            "(its neighbouring relation):</p>", f"<ul>{relations}</ul>",
            '<h2 id="mechanisms">Mechanisms and noise</h2>',
            f"<p>As stated by the latest release (<code>{e(latest.versioned_id)}</code>). Noise "
            "is integer-valued for counts; the 95% interval is the noise's own.</p>",
            _mechanisms(f),
            '<h2 id="guarantee">Guarantee</h2>',
            f"<p>Each release: {_guarantee(g, f.about.privacy_unit)} by {e(g.accountant)} "
            f"composition (the figure by {e(g.figure_accountant)}). "
            f"It covers: {e(g.covers)}</p>",
            '<h2 id="budget">Budget scopes</h2>',
            "<p>Every release is charged to these ledger scopes; a scope's budget bounds one "
            "person's total loss over all releases charged to it; every \u03b5 below is per "
            f"privacy unit: {e(f.about.privacy_unit)}.</p>", _scopes(f),
            '<h2 id="thresholds">Thresholds</h2>', thresholds,
            '<h2 id="caveats">Caveats</h2>', caveats]
    pages = {}
    for n, chunk in enumerate(chunks, 1):
        nav = pagination(n, total, release_page)
        heading = f'<h2 id="releases">Releases, newest first ({num(len(f.releases))})</h2>'
        listing = heading + nav + releases_table(f, chunk, files_base) + nav
        if n == 1:
            html = "".join(body) + listing + _gaps(f)
            crumbs = [(f.dataset.title, None)]
        else:
            html = (f'<h1>{e(f.dataset.title)}: releases, page {n}</h1>'
                    f'<p class="lead"><a href="index.html">About this dataset</a></p>' + listing)
            crumbs = [(f.dataset.title, "index.html"), (f"page {n}", None)]
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
    rows = []
    for f in all_facts:
        main = max((r for r in f.scopes if r.family_size == 1), key=lambda r: r.releases,
                   default=None)
        budget = "\u2014" if main is None else (
            f"{bar(main.share_spent)}<code>{e(main.name)}</code>: {num(main.spent_epsilon)} of "
            f"{e(main.budget_text)}" + _unit(f.about.privacy_unit))
        rows.append((f'<a href="{e(dataset_folder(f.slug))}/index.html">{e(f.dataset.title)}</a>',
                     e(f.dataset.kind), num(len(f.releases)), _period_span(f),
                     _guarantee(f.latest.guarantee, f.about.privacy_unit), budget))
    count = sum(len(f.releases) for f in all_facts)
    body = (f"<h1>{e(title)}</h1>"
            f'<p class="lead">{num(len(all_facts))} datasets, {num(count)} published releases. '
            "Each dataset's page states what is released, the privacy unit, the noise, the "
            "guarantee of every release and the budget it spends.</p>"
            + (table(["Dataset", "Kind", "Releases", "Period covered", "Latest guarantee",
                      "Main budget (spent \u03b5)"], rows, numeric=(2,))
               if rows else "<p>No release has been published yet.</p>")
            + '<p class="muted">Machine-readable: <a href="catalog.json">catalog.json</a> '
              '(<a href="catalog.schema.json">JSON Schema</a>); DCAT: '
              '<a href="dcat.jsonld">dcat.jsonld</a>.</p>')
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
