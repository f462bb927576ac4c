"""The small inline SVG drawings of the view: the memory bar, the step-time split, the loss
sparkline, the recovery timeline. Each returns an `<svg>` element as a string, with a
`<title>` per part so a browser's tooltip (and a screen reader) says what it is. No script,
no external font or file: the page works offline inside Airflow's sandboxed iframe."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

from trainyard.plugins.control_room import fmt
from trainyard.plugins.control_room.model import AttemptView, MemoryBar

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
"""Tableau 10: distinguishable, also in print; a group index picks `PALETTE[i % 10]`."""
OUTCOME_COLOUR = {"completed": "#59a14f", "cancelled": "#9c9c9c", "running": "#4e79a7"}
FAILED_COLOUR = "#e15759"
GAP_COLOUR = "#f2c14e"


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def memory_bar(bar: MemoryBar, *, width: int = 640, height: int = 34) -> str:
    """Stacked items of one device's memory on a scale up to its capacity (or the estimate when
    the capacity is unknown), with the budget as a dashed line."""
    scale_max = max(filter(None, (bar.capacity_bytes, bar.total_bytes, bar.budget_bytes)), default=0)
    if not scale_max:
        return ""
    parts, x = [], 0.0
    items = bar.items or ({"estimate": bar.total_bytes} if bar.total_bytes else {})
    for i, (name, n) in enumerate(items.items()):
        w = width * n / scale_max
        parts.append(f'<rect x="{x:.1f}" y="4" width="{max(w, 0.5):.1f}" height="{height - 8}" fill="{colour(i)}">'
                     f"<title>{escape(name)}: {fmt.size(n)}</title></rect>")
        x += w
    frame = f'<rect x="0" y="2" width="{width}" height="{height - 4}" fill="none" stroke="#888"/>'
    if bar.budget_bytes:
        bx = width * bar.budget_bytes / scale_max
        parts.append(f'<line x1="{bx:.1f}" y1="0" x2="{bx:.1f}" y2="{height}" stroke="#222" stroke-width="2" '
                     f'stroke-dasharray="4 3"><title>budget {fmt.size(bar.budget_bytes)}</title></line>')
    return (f'<svg class="bar" role="img" aria-label="memory per device" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{frame}{"".join(parts)}</svg>')


def split_bar(split: dict[str, float], *, width: int = 640, height: int = 24) -> str:
    """The estimated step by phase, one stacked bar."""
    total = sum(split.values())
    if total <= 0:
        return ""
    parts, x = [], 0.0
    for i, (name, s) in enumerate(split.items()):
        w = width * s / total
        parts.append(f'<rect x="{x:.1f}" y="2" width="{max(w, 0.5):.1f}" height="{height - 4}" '
                     f'fill="{colour(i + 2)}"><title>{escape(name)}: {fmt.seconds(s)}</title></rect>')
        x += w
    return (f'<svg class="bar" role="img" aria-label="step time split" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(parts)}</svg>')


def sparkline(points: Sequence[tuple[int, float]], *, width: int = 420, height: int = 90) -> str:
    """Loss by step, min and max labelled; '' for fewer than two points."""
    if len(points) < 2:
        return ""
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    lo, hi = min(values), max(values)
    s0, s1 = steps[0], steps[-1]
    span_v = (hi - lo) or 1.0
    span_s = (s1 - s0) or 1
    pad = 14
    coords = " ".join(f"{pad + (width - 2 * pad) * (s - s0) / span_s:.1f},"
                      f"{pad + (height - 2 * pad) * (1 - (v - lo) / span_v):.1f}" for s, v in points)
    return (f'<svg class="spark" role="img" aria-label="loss by step" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><polyline points="{coords}" fill="none" stroke="{PALETTE[0]}" '
            f'stroke-width="1.5"/><text x="{pad}" y="11" font-size="10">{fmt.number(hi)}</text>'
            f'<text x="{pad}" y="{height - 2}" font-size="10">{fmt.number(lo)} · step {s0}–{s1}</text></svg>')


def timeline(attempts: Sequence[AttemptView], now: datetime, *, width: int = 900, row: int = 26) -> str:
    """Each attempt as a bar on one time axis, coloured by outcome, with the stand-still after a
    failure (its time to train again) hatched in amber."""
    if not attempts:
        return ""
    t0 = attempts[0].started_at
    t1 = max((a.ended_at or now) for a in attempts)
    span = max((t1 - t0).total_seconds(), 1.0)
    label_w, pad = 90, 4
    scale = (width - label_w - pad) / span

    def x(t: datetime) -> float:
        return label_w + (t - t0).total_seconds() * scale

    bars = []
    for i, a in enumerate(attempts):
        y = pad + i * row
        end = a.ended_at or now
        fill = OUTCOME_COLOUR.get(a.outcome or a.state, FAILED_COLOUR)
        what = f"attempt {a.attempt}: {a.outcome or a.state}" + (f" at step {a.step}" if a.step is not None else "")
        bars.append(f'<text x="0" y="{y + row * 0.65:.1f}" font-size="12">attempt {a.attempt}</text>'
                    f'<rect x="{x(a.started_at):.1f}" y="{y}" width="{max(x(end) - x(a.started_at), 2):.1f}" '
                    f'height="{row - 8}" fill="{fill}"><title>{escape(what)}</title></rect>')
        again = a.timing.time_to_train_again_s if a.timing else None
        if a.ended_at is not None and again:
            gx = x(a.ended_at) - (a.timing.detect_s or 0.0) * scale  # type: ignore[union-attr]
            bars.append(f'<rect x="{gx:.1f}" y="{y + row - 10}" width="{max(again * scale, 2):.1f}" height="6" '
                        f'fill="{GAP_COLOUR}"><title>{escape(f"stood still {fmt.seconds(again)}")}</title></rect>')
    height = pad * 2 + row * len(attempts)
    return (f'<svg class="timeline" role="img" aria-label="recovery timeline" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(bars)}</svg>')
