"""Quantities people write in specs — `80GB`, `48h`, `7e9`, `6.7B` — as numbers with units.

YAML 1.1 reads `7e9` as a *string* (a float needs a dot), and people write sizes the way the
hardware vendors do, so each quantity type accepts the spellings people actually use and
turns them into one canonical number: bytes, a `timedelta`, or a plain count.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, ByteSize, PlainSerializer

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNITS = {
    "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0
}
_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([kKMBTG])?\s*$")
_COUNT_SUFFIX = {None: 1, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_duration(value: Any) -> timedelta:
    """`30m`, `48h`, `90s`, `2d`, `1.5h` or a number of seconds → `timedelta`."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30m or 48h, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ValueError(f"expected a duration like 30m, 48h or 90s, got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError as e:  # beyond timedelta's 999,999,999 days
        raise ValueError(f"a duration must be shorter than a million years, got {value!r}") from e


def parse_count(value: Any) -> int:
    """`7e9`, `6.7B`, `70M`, `405000000000` → an integer count (parameters, tokens)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a count like 7e9 or 6.7B, got {value!r}")
    if isinstance(value, int):
        number = float(value)
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str) and (m := _COUNT.match(value)):
        number = float(m.group(1)) * _COUNT_SUFFIX[m.group(2)]
    else:
        raise ValueError(f"expected a count like 7e9, 6.7B or 70M, got {value!r}")
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"a count must be positive, got {value!r}")
    return round(number)


def readable_number(value: float, decimals: int) -> str:
    """`value` with thousands separators and `decimals` places — unless that would print a
    non-zero value as 0 (0.0042 GPU-hours as `0.0`, $0.004 as `0.00`): then two significant
    digits, so a small run reads as small, not as free."""
    if value != 0 and abs(value) < 0.5 * 10 ** -decimals:
        return f"{value:.2g}" if abs(value) >= 1e-4 else f"{value:.1e}"
    return f"{value:,.{decimals}f}"


def _format_duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _bytes_before(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 80GB, got {value!r}")
    if isinstance(value, int | float) and value <= 0:
        raise ValueError(f"a size must be positive, got {value!r}")
    return value


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(_format_duration, return_type=str, when_used="json"),
]
"""A positive duration; YAML `48h` ↔ `timedelta(hours=48)`; serialises back to `48h`."""

Count = Annotated[int, BeforeValidator(parse_count)]
"""A positive integer count written as `7e9`, `6.7B`, `70M` or a plain number."""

_BANDWIDTH = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([kKMGT]?)(B|b)(?:/s|ps)\s*$")
_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def parse_bandwidth(value: Any) -> float:
    """`450GB/s`, `3.35TB/s`, `400Gb/s`, `50GBps` → bytes per second (SI prefixes; a
    lower-case `b` is bits, as network engineers write it: `400Gb/s` = 50 GB/s). A bare
    number is refused: 450 could be either unit, and the two differ eightfold."""
    if isinstance(value, str) and (m := _BANDWIDTH.match(value)):
        number = float(m.group(1)) * _SI[m.group(2)] / (8.0 if m.group(3) == "b" else 1.0)
        if math.isfinite(number) and number > 0:
            return number
        raise ValueError(f"a bandwidth must be positive, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(f"a bandwidth needs its unit: write {value:g}GB/s for gigabytes or "
                         f"{value:g}Gb/s for gigabits per second, got the bare number {value!r}")
    raise ValueError(f"expected a bandwidth like 450GB/s or 400Gb/s, got {value!r}")


def _format_bandwidth(value: float) -> str:
    for unit, size in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}B/s"


Bandwidth = Annotated[
    float,
    BeforeValidator(parse_bandwidth),
    PlainSerializer(_format_bandwidth, return_type=str, when_used="json"),
]
"""Bytes per second, written with its unit: `450GB/s`, `3.35TB/s`, `400Gb/s` (bits)."""

Bytes = Annotated[ByteSize, BeforeValidator(_bytes_before)]
"""A size in bytes: `80GB` = 80·10⁹ (SI), `80GiB` = 80·2³⁰, or a plain number of bytes."""
