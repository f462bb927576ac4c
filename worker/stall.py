"""Data stalls made visible: warn when the training loop waits for data more than 5 % of the time.

A stall is the time a step waited for its batch (`data_stall_s`). Over a window of steps the
monitor compares the summed stalls with the summed step times and logs one warning per window
in which they exceed `STALL_WARN_FRACTION`, naming the figures that explain it (prefetch
depth, cache hit rate): a stalled loop wastes accelerators that the data pipeline could feed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger(__name__)

STALL_WARN_FRACTION = 0.05


class StallMonitor:
    def __init__(self, window_steps: int = 50, fraction: float = STALL_WARN_FRACTION) -> None:
        self.window_steps = window_steps
        self.fraction = fraction
        self._stall = self._time = 0.0
        self._steps = 0
        self.warnings = 0

    def update(self, step: int, stall_s: float | None, step_time_s: float,
               data: Mapping[str, float] | None = None) -> float | None:
        """Add one step; at the end of a window return its stall fraction (warning if high)."""
        if stall_s is None:
            return None
        self._stall += stall_s
        self._time += step_time_s
        self._steps += 1
        if self._steps < self.window_steps:
            return None
        share = self._stall / self._time if self._time > 0 else 0.0
        if share > self.fraction:
            self.warnings += 1
            extra = ", ".join(f"{k} {v:.3g}" for k, v in sorted((data or {}).items())
                              if k in ("prefetch_depth", "cache_hit_rate"))
            log.warning("data stall: the last %d steps (to step %d) waited for data %.1f %% of the "
                        "time (%.3f s of %.3f s; warn above %.0f %%)%s", self._steps, step, 100 * share,
                        self._stall, self._time, 100 * self.fraction, f"; {extra}" if extra else "")
        self._stall = self._time = 0.0
        self._steps = 0
        return share
