"""Rank 0's training figures for MLflow, at a cost per step that stays off the training's budget.

MLflow's database store spends ~70 µs of CPU per point (SQLAlchemy's ORM builds one row object
per point; measured on SQLite here, and PostgreSQL goes through the same ORM) plus ~10 ms per
batch, and the streamer's thread (`trainyard.plugins.tracking.metrics`) runs inside the training
process: seven figures every step, each handed over with a wake-up of that thread, came to
about 0.5 ms per step — 2 % of the demo model's 27 ms step, taken from a rank's core on a CPU
node and from the training thread's hold on the GIL on a GPU node. So:

- `loss` is logged for every step: its curve, the replay overlay of a resumed attempt and the
  divergence story need each point;
- the other figures are logged once per window of `every_s` seconds (1 s; every step when
  steps are slower), at the window's last step: `step_time_s`, `data_stall_s`, `tokens_per_s`
  and `mfu` as the window's averages (tokens over time, so a slow step counts for its length),
  `grad_norm`, `lr`, the data pipeline's figures (`data/…`) and the script's own metrics as of
  that step;
- the window's points go to the streamer together when it closes: one wake-up of its thread
  per window, none per step.

Per step the training thread adds two numbers and keeps a few references. `flush()` closes the
window early (the session does at a stop, a flush and the end), so the last steps are never lost
to a window that did not close; a SIGKILL loses at most the open window (the streamer's queue
was lost the same way before).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.plugins.tracking.metrics import MetricsStreamer

METRICS_EVERY_S = 1.0
"""Length of a window of per-step figures other than the loss (see the module docstring)."""


class StepMetrics:
    def __init__(self, streamer: MetricsStreamer, *, world_size: int, flops_per_token: float | None = None,
                 peak_flops: float | None = None, every_s: float = METRICS_EVERY_S) -> None:
        if every_s < 0:
            raise ValueError(f"every_s must be >= 0 (0: every step), got {every_s}")
        self.streamer = streamer
        self.every_s = every_s
        self._world_size = world_size
        self._flops_per_token = flops_per_token
        self._peak_flops = peak_flops
        self._losses: list[tuple[int, int, float]] = []
        """(step, time in ms, loss) of each step of the open window."""
        self._opened = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self._steps = 0
        self._time_s = self._tokens = self._token_time_s = self._stall_s = 0.0
        self._stalls = 0
        self._step = 0
        self._grad_norm: float | None = None
        self._lr: float | None = None
        self._data: Mapping[str, float] | None = None
        self._extra: Mapping[str, float | None] | None = None

    def add(self, step: int, *, loss: float, step_time_s: float, tokens: int | None = None,
            grad_norm: float | None = None, lr: float | None = None, data_stall_s: float | None = None,
            data_metrics: Mapping[str, float] | None = None,
            metrics: Mapping[str, float | None] | None = None) -> None:
        """One step's figures (the hot path: no dict, no hand-over unless the window closes)."""
        now = time.time()
        self._losses.append((step, int(now * 1000), loss))
        self._steps += 1
        self._time_s += step_time_s
        if tokens:
            self._tokens += tokens
            self._token_time_s += step_time_s
        if data_stall_s is not None:
            self._stall_s += data_stall_s
            self._stalls += 1
        self._step, self._grad_norm, self._lr = step, grad_norm, lr
        self._data, self._extra = data_metrics, metrics
        if time.monotonic() - self._opened >= self.every_s:
            self.flush()

    def window(self) -> dict[str, float]:
        """The open window's figures other than the loss (what `flush` logs at its last step)."""
        values = {k: v for k, v in (self._extra or {}).items() if v is not None and k != "loss"}
        if self._steps:
            values["step_time_s"] = self._time_s / self._steps
        if self._grad_norm is not None:
            values["grad_norm"] = self._grad_norm
        if self._lr is not None:
            values["lr"] = self._lr
        if self._stalls:
            values["data_stall_s"] = self._stall_s / self._stalls
        values.update({f"data/{k}": v for k, v in (self._data or {}).items()})
        if self._tokens and self._token_time_s > 0:
            values["tokens_per_s"] = tokens_per_s = self._tokens / self._token_time_s
            if self._flops_per_token and self._peak_flops:
                from trainyard.plugins.advisor.flops import mfu

                values["mfu"] = mfu(tokens_per_s, self._flops_per_token, self._world_size, self._peak_flops)
        return values

    def flush(self) -> None:
        """Close the window: hand its points to the streamer (never blocks, never raises)."""
        if self._losses:
            for step, ms, loss in self._losses:
                self.streamer.log(step, {"loss": loss}, timestamp_ms=ms)
            self._losses = []
        if self._steps:
            self.streamer.log(self._step, self.window())
        self._reset()
        self._opened = time.monotonic()
