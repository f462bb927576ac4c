"""Polling until something holds, for tests that watch real processes and servers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str, timeout_s: float = 120.0, poll_s: float = 0.05,
             detail: Callable[[], object] | None = None) -> T:
    """Call `check` every `poll_s` until it returns something truthy, and return that; fail the
    test naming `what` after `timeout_s` — with `detail()` (what the logs say, say) when given."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, (f"timed out after {timeout_s:g} s waiting for {what}"
                                             + (f": {detail()}" if detail else ""))
        time.sleep(poll_s)
    return found
