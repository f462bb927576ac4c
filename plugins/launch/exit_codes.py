"""What a rank's exit code means.

The worker runtime owns the codes (`worker/exit_codes.py`: 0 completed, 42 diverged,
43 emergency-checkpointed after SIGTERM, …). This module reads its integer constants when the
module exists, so the launcher reports `diverged` rather than `exit 42` without hard-coding the
worker's numbers; without it only the universal meanings are known.
"""

from __future__ import annotations

import functools
import importlib
import signal

_FALLBACK = {0: "completed"}


@functools.cache
def known_codes() -> dict[int, str]:
    """Exit code → lower-case name, from `worker.exit_codes` when present."""
    try:
        module = importlib.import_module("worker.exit_codes")
    except ImportError:
        return dict(_FALLBACK)
    names: dict[int, str] = {}
    for name, value in vars(module).items():
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool):
            names.setdefault(int(value), name.lower())
    # An IntEnum of codes is read as well.
    for value in vars(module).values():
        members = getattr(value, "__members__", None)
        if isinstance(members, dict):
            for name, member in members.items():
                if isinstance(member, int):
                    names.setdefault(int(member), name.lower())
    return names or dict(_FALLBACK)


def describe(code: int | None) -> str:
    """`completed`, `diverged`, `killed by SIGKILL`, `exit 1`, or '' while running."""
    if code is None:
        return ""
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    known = known_codes().get(code)
    if known:
        return known
    if 128 < code <= 128 + 64:
        return f"exit {code} (killed by {_signal_name(code - 128)})"
    return f"exit {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
