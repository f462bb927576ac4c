"""How figures read on the page: one spelling per unit, '—' for what is not known."""

from __future__ import annotations

from datetime import datetime

DASH = "—"


def size(n: int | None) -> str:
    """`1.5 GiB`, `320 MiB`, `12 KiB`, `900 B` (binary units, as device memory is sold)."""
    if n is None:
        return DASH
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= factor:
            return f"{n / factor:.3g} {unit}" if n / factor < 100 else f"{n / factor:.0f} {unit}"
    return f"{n} B"


def seconds(s: float | None) -> str:
    """`0.26 s`, `36.5 s`, `4 min 10 s`, `2 h 5 min`."""
    if s is None:
        return DASH
    if s < 10:
        return f"{s:.2g} s" if s < 1 else f"{s:.1f} s"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def age(then: datetime | None, now: datetime) -> str:
    """`12 s ago`, `3 min ago`, …"""
    if then is None:
        return DASH
    return f"{seconds(max(0.0, (now - then).total_seconds()))} ago"


def number(x: float | None, digits: int = 4) -> str:
    if x is None:
        return DASH
    return f"{x:.{digits}g}"


def percent(x: float | None) -> str:
    return DASH if x is None else f"{100 * x:.1f} %"


def clock(t: datetime | None) -> str:
    """`2026-05-01 12:00:03 UTC`."""
    return DASH if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")
