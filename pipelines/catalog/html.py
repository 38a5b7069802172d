"""HTML building blocks shared by the catalog's public site and its operator view.

Static pages with no external asset: one inline style sheet, no script, every text escaped
with :func:`html.escape` (:func:`e`). Tables of many rows stack into cards on narrow screens
(each cell labelled by its column), so pages read at phone widths without side scrolling.
Numbers are formatted by :func:`num` (4 significant digits) and sizes by :func:`size` (exact
bytes, in a ``span.size`` that the privacy audits mask: a released file's size depends on its
noisy values).
"""
from __future__ import annotations

import html
import math
from typing import Iterable, Optional, Sequence

CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--soft:#f6f8fa;--accent:#0a58a6;
--warn:#9a3412;--warnbg:#fff4e5;--bad:#b42318;--ok:#1a7f37}
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif;
color:var(--fg);background:#fff}
a{color:var(--accent)}
.top{background:#0d3b66;color:#fff;padding:.6rem 1rem}
.top a{color:#fff;text-decoration:none;font-weight:600}
.top .crumb{opacity:.85;font-weight:400}
.banner{background:var(--bad);color:#fff;padding:.5rem 1rem;font-weight:700}
main{max-width:72rem;margin:0 auto;padding:.5rem 1rem 3rem}
h1{font-size:1.65rem;line-height:1.25;margin:1rem 0 .25rem;overflow-wrap:anywhere}
h2{font-size:1.2rem;margin:2.2rem 0 .6rem;padding-bottom:.3rem;border-bottom:1px solid var(--line)}
h3{font-size:1rem;margin:1.2rem 0 .4rem}
p.lead{color:var(--muted);margin:.25rem 0 1rem}
.muted{color:var(--muted)}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1.25rem;margin:.75rem 0}
dl.facts dt{color:var(--muted)}
dl.facts dd{margin:0;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;font-size:.92rem;margin:.5rem 0}
th,td{border-bottom:1px solid var(--line);padding:.4rem .55rem;text-align:left;vertical-align:top;
overflow-wrap:anywhere}
th{background:var(--soft);font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.86em}
.hash{word-break:break-all;color:var(--muted)}
ul.files{list-style:none;margin:0;padding:0}
ul.files li+li{margin-top:.35rem}
.note{border-left:4px solid var(--accent);background:var(--soft);padding:.5rem .8rem;margin:.6rem 0}
.caveat{border-left:4px solid var(--warn);background:var(--warnbg);padding:.5rem .8rem;margin:.6rem 0}
.bad{color:var(--bad);font-weight:600}
.ok{color:var(--ok)}
.bar{display:inline-block;width:6rem;height:.6rem;background:var(--soft);border:1px solid var(--line);
border-radius:3px;vertical-align:middle;margin-right:.4rem;overflow:hidden}
.bar>span{display:block;height:100%;background:var(--accent)}
.bar.full>span{background:var(--bad)}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(22rem,34rem));gap:1.25rem 2rem}
figure{margin:0}
figcaption{font-size:.9rem;color:var(--muted);margin-top:.2rem;overflow-wrap:anywhere}
svg.chart{width:100%;height:auto;display:block}
nav.pages{margin:.75rem 0;display:flex;flex-wrap:wrap;gap:.25rem .6rem;align-items:center}
nav.pages .current{font-weight:700}
td .period{white-space:nowrap}
@media (min-width:44.01rem){table.stack td:first-child{min-width:9.5rem}}
footer{max-width:72rem;margin:0 auto;padding:1rem;color:var(--muted);font-size:.85rem;
border-top:1px solid var(--line)}
@media (max-width:44rem){
 body{font-size:15px}
 main{padding:.25rem .75rem 2rem}
 h1{font-size:1.35rem}
 dl.facts{grid-template-columns:1fr;gap:0}
 dl.facts dd{margin-bottom:.4rem}
 table.stack,table.stack tbody,table.stack tr,table.stack td{display:block;width:100%}
 table.stack thead{display:none}
 table.stack tr{border:1px solid var(--line);border-radius:6px;margin:.6rem 0;padding:.3rem .5rem}
 table.stack td{border:0;padding:.15rem 0;text-align:left;display:grid;
  grid-template-columns:7.5rem minmax(0,1fr);gap:.5rem}
 table.stack td.num{text-align:left;white-space:normal}
 table.stack td::before{content:attr(data-label);font-size:.8rem;color:var(--muted);
  padding-top:.1rem}
 table.stack tr.empty td{display:block}
 table.stack tr.empty td::before{content:none}
 .charts{grid-template-columns:minmax(0,1fr)}
}
"""


def e(value) -> str:
    """Escaped text of any value (None as an em dash)."""
    return "\u2014" if value is None else html.escape(str(value), quote=True)


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


def size(value: Optional[int]) -> str:
    return '<span class="size">' + ("missing" if value is None else f"{value:,} bytes") + \
        "</span>"


def bar(share: float) -> str:
    """A small horizontal bar for a share of a budget (capped at 100 %)."""
    if not math.isfinite(share):
        share = 1.0
    width = max(0.0, min(share, 1.0)) * 100
    cls = "bar full" if share >= 0.999 else "bar"
    return f'<span class="{cls}" aria-hidden="true"><span style="width:{width:.0f}%"></span></span>'


def page(*, title: str, body: str, crumbs: Sequence[tuple] = (), root: str = "",
         banner: str = "", footer: str = "", head: str = "") -> str:
    """A whole page. ``crumbs``: (label, href or None) after the home link; ``root``: the
    relative path to the site root (e.g. ``"../../"``); ``head``: markup for the head (built
    safe by the caller: the JSON-LD of :mod:`pipelines.catalog.linked_data`)."""
    trail = "".join(_crumb(label, href) for label, href in crumbs)
    return ("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<link rel=\"icon\" href=\"data:,\">\n"
            f"<title>{e(title)}</title>\n<style>{CSS}</style>\n{head}</head>\n<body>\n"
            f'<div class="top"><a href="{e(root)}index.html">Release catalog</a>{trail}</div>\n'
            + (f'<div class="banner" role="alert">{e(banner)}</div>\n' if banner else "")
            + f"<main>\n{body}\n</main>\n"
            + (f"<footer>{footer}</footer>\n" if footer else "")
            + "</body>\n</html>\n")


def _crumb(label: str, href: Optional[str]) -> str:
    inner = f'<a href="{e(href)}">{e(label)}</a>' if href else e(label)
    return f' <span class="crumb">/ {inner}</span>'


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
    """Links to pages 1..total (``href(n)``), the current one unlinked; long runs elided."""
    if total <= 1:
        return ""
    shown = sorted({1, total, *range(max(1, current - 2), min(total, current + 2) + 1)})
    parts, last = [], 0
    if current > 1:
        parts.append(f'<a href="{e(href(current - 1))}" rel="prev">\u2190 newer</a>')
    for n in shown:
        if n - last > 1:
            parts.append('<span class="muted">\u2026</span>')
        parts.append(f'<span class="current" aria-current="page">{n}</span>' if n == current
                     else f'<a href="{e(href(n))}">{n}</a>')
        last = n
    if current < total:
        parts.append(f'<a href="{e(href(current + 1))}" rel="next">older \u2192</a>')
    return f'<nav class="pages" aria-label="pages">Page {current} of {total}: ' + \
        " ".join(parts) + "</nav>"
