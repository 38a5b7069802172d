"""HTML building blocks shared by the catalog's public site and its operator view.

Static pages with no external asset: one inline style sheet, no executable script, every text
escaped (:func:`e`); the page around each body, its style sheet and the
public site's page bodies are Jinja2 templates (``pipelines/catalog/templates/``) a portal can
replace (:func:`page`, :mod:`pipelines.catalog.site`). The helpers below build the operator
view's bodies (private: no portal restyles it). Tables of many rows stack into cards on narrow screens
(each cell labelled by its column), so pages read at phone widths without side scrolling.
Numbers are formatted by :func:`num` (4 significant digits) and sizes by :func:`size` (exact
bytes, in a ``span.size`` that the privacy audits mask: a released file's size depends on its
noisy values).
"""
from __future__ import annotations

import functools
import math
import os
from typing import Iterable, Optional, Sequence

from markupsafe import escape as _escape


def e(value) -> str:
    """Escaped text of any value (None as an em dash): MarkupSafe's escaping (the one the
    templates' autoescaping applies, in C: a site of 55,000 releases escapes a million texts)."""
    return "\u2014" if value is None else str(_escape(str(value)))


def num(value: Optional[float], digits: int = 4) -> str:
    if value is None:
        return "\u2014"
    if isinstance(value, float) and math.isinf(value):
        return "\u221e"
    if isinstance(value, float) and math.isnan(value):
        return "\u2014"
    if value == 0:
        return "0"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:.{digits}g}"


#: The templates every page is rendered with: ``page.html`` (the page around its body),
#: ``catalog.css`` (its one inline style sheet) and the public site's bodies (``index.html``,
#: ``dataset.html``, ``releases.html``, ``macros.html``, ``releases_listing.html``). A portal
#: restyles the catalog with ``--templates DIR`` holding its own of any (found there first).
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


@functools.lru_cache(maxsize=8)
def environment(templates: Optional[str] = None):
    """The Jinja2 environment of ``templates`` (a portal's folder) over the catalog's own.
    Autoescaping is on: a value reaches a page escaped unless it is HTML the catalog built
    (:func:`markupsafe.Markup`, e.g. a page's body, whose every text went through :func:`e`)."""
    import jinja2

    folders = ([templates] if templates else []) + [TEMPLATES]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folders), autoescape=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["pyrepr"] = repr
    env.globals.update(num=num, page_numbers=page_numbers, bar_full=bar_full,
                       bar_width=bar_width)
    return env


def page_numbers(current: int, total: int) -> list[int]:
    """The page numbers a page's links show: the first, the last, and two either side."""
    return sorted({1, total, *range(max(1, current - 2), min(total, current + 2) + 1)})


def bar_full(share: float) -> bool:
    """Whether a budget bar is full (a share that is not finite counts as spent)."""
    return not math.isfinite(share) or share >= 0.999


def bar_width(share: float) -> str:
    """A budget bar's width in percent (capped at 100 %)."""
    share = max(0.0, min(share, 1.0)) if math.isfinite(share) else 1.0
    return f"{share * 100:.0f}"


def page(*, title: str, body: str, crumbs: Sequence[tuple] = (), root: str = "",
         banner: str = "", footer: str = "", head: str = "",
         templates: Optional[str] = None) -> str:
    """A whole page, from the ``page.html`` template. ``crumbs``: (label, href or None) after
    the home link; ``root``: the relative path to the site root (e.g. ``"../../"``); ``head``:
    markup for the head (built safe by the caller: the JSON-LD of
    :mod:`pipelines.catalog.linked_data`); ``templates``: a portal's template folder."""
    from markupsafe import Markup

    return environment(templates).get_template("page.html").render(
        title=title, body=Markup(body), crumbs=list(crumbs), root=root, banner=banner,
        footer=Markup(footer), head=Markup(head))


def table(headers: Sequence, rows: Iterable[Sequence], *, cls: str = "stack",
          numeric: Sequence[int] = (), caption: str = "", empty: str = "none") -> str:
    """A table; cells are HTML already (escape with :func:`e`). ``numeric``: column indexes
    aligned right; every cell carries its header as ``data-label`` (the phone layout). A table
    without rows says so (``empty``, in one cell across the columns), never shows bare headers."""
    numeric = set(numeric)
    head = "".join(f'<th{" class=num" if i in numeric else ""} scope="col">{e(h)}</th>'
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = "".join(f'<td{" class=num" if i in numeric else ""} data-label="{e(headers[i])}">'
                        f"<div>{c}</div></td>" for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f'<tr class="empty"><td colspan="{len(headers)}" data-label="">'
                    f'<div class="muted">{e(empty)}</div></td></tr>')
    cap = f"<caption class=\"muted\">{e(caption)}</caption>" if caption else ""
    return (f'<table class="{e(cls)}">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def facts(items: Iterable[tuple]) -> str:
    """A definition list of (label, HTML value) pairs."""
    return '<dl class="facts">' + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in items) + \
        "</dl>"


def pagination(current: int, total: int, href) -> str:
    """Links to pages 1..total (``href(n)``), the current one unlinked, long runs elided: the
    ``pagination`` macro of ``macros.html`` (the public pages call it there)."""
    return str(environment().get_template("macros.html").module.pagination(current, total, href))
