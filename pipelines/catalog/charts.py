"""Budget-over-time charts as inline SVG (no script, no external asset).

One chart per budget scope: the epsilon spent by the published releases after each release, in
public order, against the scope's budget (a dashed line). A family of per-period scopes
(``period:C1:<day>``) gets one chart of each period's spend against the per-period budget. The
SVG scales to its container (``viewBox``); text stays legible at phone widths because the
drawing is only 480 units wide. Every chart carries ``data-scope`` and an accessible title.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from pipelines.catalog.html import e, num

WIDTH, HEIGHT = 480, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 18, 50


def _ticks(top: float) -> list[float]:
    """About four round tick values from 0 to at least ``top``."""
    if top <= 0:
        return [0.0, 1.0]
    step = _nice_step(top / 4)
    ticks, value = [], 0.0
    while value < top * (1 + 1e-9):
        ticks.append(value)
        value = round(value + step, 12)
    ticks.append(value)
    return ticks


def _nice_step(raw: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at least ``raw``."""
    exponent = math.floor(math.log10(raw))
    base = 10 ** exponent
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * base:
            return m * base
    return 10 * base


def budget_chart(*, scope: str, series: Sequence[tuple], budget: Optional[float],
                 kind: str = "cumulative", caption: str = "") -> str:
    """A ``<figure>`` with the SVG chart of ``series`` ((label, epsilon), in order).

    ``kind``: ``"cumulative"`` (a step line: total spend after each release) or ``"per-period"``
    (points: each period's own spend)."""
    values = [v for _, v in series if v is not None and v == v and v != float("inf")]
    top = max([*values, budget or 0.0, 1e-9])
    ticks = _ticks(top)
    y_max = ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    n = len(series)

    def x(i: int) -> float:
        return LEFT + (plot_w * (i / (n - 1)) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - min(v, y_max) / y_max)

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-labelledby="t-{_id(scope)}" data-scope="{e(scope)}" data-points="{n}" '
             f'xmlns="http://www.w3.org/2000/svg">',
             f'<title id="t-{_id(scope)}">{e(_title(scope, kind))}</title>',
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fbfcfd" '
             'stroke="#d1d9e0"/>']
    for t in ticks:
        ty = y(t)
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{ty:.1f}" y2="{ty:.1f}" '
                     'stroke="#e6eaef"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end" '
                     f'font-size="13" fill="#59636e">{e(num(t, 3))}</text>')
    parts.append(f'<text x="14" y="{TOP + plot_h / 2:.0f}" font-size="13" fill="#59636e" '
                 f'transform="rotate(-90 14 {TOP + plot_h / 2:.0f})" text-anchor="middle">'
                 "\u03b5 spent</text>")
    if budget is not None:
        by = y(budget)
        parts.append(f'<line class="budget" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{by:.1f}" '
                     f'y2="{by:.1f}" stroke="#b42318" stroke-width="1.5" stroke-dasharray="6 4"/>')
        parts.append(f'<text x="{LEFT + plot_w - 4}" y="{by - 5:.1f}" text-anchor="end" '
                     f'font-size="13" fill="#b42318">budget \u03b5={e(num(budget))}</text>')
    if n:
        if kind == "cumulative":
            points = [(x(0), y(0.0))] if n > 1 else []
            for i, (_, v) in enumerate(series):
                if i and n > 1:
                    points.append((x(i), points[-1][1]))
                points.append((x(i), y(v)))
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(f'<polyline class="spent" points="{path}" fill="none" '
                         'stroke="#0a58a6" stroke-width="2"/>')
        if kind != "cumulative" or n <= 40:
            radius = 3 if n <= 40 else 1.6
            parts.extend(f'<circle class="spent" cx="{x(i):.1f}" cy="{y(v):.1f}" r="{radius}" '
                         f'fill="#0a58a6"><title>{e(label)}: \u03b5={e(num(v))}</title></circle>'
                         for i, (label, v) in enumerate(series))
        first, last = series[0][0], series[-1][0]
        parts.append(f'<text x="{LEFT}" y="{HEIGHT - BOTTOM + 18}" font-size="13" '
                     f'fill="#59636e">{e(_short(first))}</text>')
        if n > 1:
            parts.append(f'<text x="{LEFT + plot_w}" y="{HEIGHT - BOTTOM + 18}" '
                         f'text-anchor="end" font-size="13" fill="#59636e">{e(_short(last))}</text>')
        parts.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 10}" text-anchor="middle" '
                     f'font-size="13" fill="#59636e">{e(_axis(kind, n))}</text>')
    parts.append("</svg>")
    cap = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f'<figure class="budget-chart">{"".join(parts)}{cap}</figure>'


def _id(scope: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in scope)


def _title(scope: str, kind: str) -> str:
    if kind == "cumulative":
        return f"Budget of scope {scope}: epsilon spent by published releases over time"
    return f"Budget of the scopes {scope}: epsilon spent in each period"


def _axis(kind: str, n: int) -> str:
    if kind == "cumulative":
        return f"releases in order ({n} point{'s' if n != 1 else ''})"
    return f"periods ({n} point{'s' if n != 1 else ''})"


def _short(label: str) -> str:
    return label if len(label) <= 28 else label[:27] + "\u2026"
