"""What a rank's exit code means.

The worker runtime owns the codes (`worker/exit_codes.py`: 0 completed, 42 diverged,
43 emergency-checkpointed after SIGTERM, …). This module reads its integer constants, so the
launcher reports `diverged` rather than `exit 42` without a second copy of the worker's numbers.
"""

from __future__ import annotations

import functools
import signal

from trainyard.worker import exit_codes as worker_codes


@functools.cache
def known_codes() -> dict[int, str]:
    """Exit code → lower-case constant name (`DIVERGED = 42` → `diverged`)."""
    names: dict[int, str] = {}
    for name, value in vars(worker_codes).items():
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool):
            names.setdefault(value, name.lower())
    return names


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
