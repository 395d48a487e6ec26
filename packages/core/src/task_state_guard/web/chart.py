"""The overview's chart: jobs closed per time bucket, stacked by outcome, as inline SVG.

Drawn by the server from counts (:class:`~task_state_guard.ops.history.OutcomeHistory`): no
script, no library, nothing fetched. Each bar carries a ``<title>`` with its figures, and the
figures are also given as a table for screen readers and text browsers.
"""

from __future__ import annotations

import math
import time

from ..ops.history import OUTCOMES, OutcomeHistory
from .html import esc, table

COLOURS = {"succeeded": "#1f8a4c", "failed": "#c0392b", "lost": "#7d3cb5",
           "timed_out": "#b7650b", "cancelled": "#6b7280"}
LABELS = {"succeeded": "succeeded", "failed": "failed", "lost": "lost (owner dead, stale)",
          "timed_out": "time limit", "cancelled": "cancelled"}
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 12, 26


def nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``value`` (1 for 0)."""
    if value <= 1:
        return 1
    power: int = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # pragma: no cover - the loop always returns


def _clock(at: float, bucket_seconds: float) -> str:
    fmt = "%H:%M" if bucket_seconds < 6 * 3600 else "%m-%d %H:%M"
    return time.strftime(fmt, time.gmtime(at))


def outcome_chart(history: OutcomeHistory, *, width: int = 960, height: int = 220) -> str:
    """The SVG (with its legend and a figures table in a ``<details>``)."""
    n = history.buckets
    totals = [sum(history.counts[o][i] for o in OUTCOMES) for i in range(n)]
    top = nice_ceiling(max(totals, default=0))
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM
    step = plot_w / n
    bar = max(1.0, step * 0.78)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-labelledby="chart-title">'
        f'<title id="chart-title">Jobs closed per {esc(_span(history.bucket_seconds))}, '
        "by outcome</title>"
    ]
    for fraction in (0.0, 0.5, 1.0) if top % 2 == 0 else (0.0, 1.0):  # whole jobs only
        y = _TOP + plot_h * (1 - fraction)
        label = f"{top * fraction:g}"
        parts.append(f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#dde1e8" stroke-width="1"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'font-size="11" fill="#5d6675">{esc(label)}</text>')
    label_every = max(1, math.ceil(n / 8))
    for i in range(n):
        x = _LEFT + i * step + (step - bar) / 2
        start = history.start + i * history.bucket_seconds
        figures = ", ".join(f"{history.counts[o][i]} {LABELS[o]}" for o in OUTCOMES
                            if history.counts[o][i])
        parts.append(f"<g><title>{esc(_clock(start, history.bucket_seconds))} UTC: "
                     f"{esc(figures or 'none')}</title>")
        base = float(_TOP + plot_h)
        for outcome in OUTCOMES:
            count = history.counts[outcome][i]
            if not count:
                continue
            h = plot_h * count / top
            base -= h
            parts.append(f'<rect x="{x:.1f}" y="{base:.1f}" width="{bar:.1f}" '
                         f'height="{h:.1f}" fill="{COLOURS[outcome]}"/>')
        parts.append(f'<rect x="{_LEFT + i * step:.1f}" y="{_TOP}" width="{step:.1f}" '
                     f'height="{plot_h}" fill="transparent"/></g>')
        if i % label_every == 0:
            parts.append(f'<text x="{_LEFT + i * step:.1f}" y="{height - 8}" font-size="11" '
                         f'fill="#5d6675">{esc(_clock(start, history.bucket_seconds))}</text>')
    if not any(totals):
        parts.append(f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_TOP + plot_h / 2:.1f}" '
                     'text-anchor="middle" font-size="13" fill="#5d6675">'
                     "No job closed in this window</text>")
    parts.append("</svg>")
    legend = "".join(f'<span><i class="c-{o}"></i>{esc(LABELS[o])}</span>' for o in OUTCOMES)
    rows = [[f"{_clock(history.start + i * history.bucket_seconds, history.bucket_seconds)}",
             *(str(history.counts[o][i]) for o in OUTCOMES)] for i in range(n) if totals[i]]
    figures = table(["from (UTC)", *(LABELS[o] for o in OUTCOMES)], rows,
                    numeric=frozenset(range(1, len(OUTCOMES) + 1)),
                    empty="no job closed in this window")
    return (f'<div class="chart">{"".join(parts)}<div class="legend">{legend}</div></div>'
            f"<details><summary>Figures</summary>{figures}</details>")


def _span(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return unit if count == 1 else f"{count} {unit}s"
    return f"{seconds:g} s"


__all__ = ["outcome_chart"]
