"""Test-only fault injection, off unless `TRAINYARD_FAULTS` is set (like the node agent's fault
API): lets the integration tests drive the failure paths of a real training run exactly at a
chosen step instead of racing a timer.

`TRAINYARD_FAULTS` is a comma-separated list of `kind@step`:

- `nan_loss@N` — the loss of step N is replaced by NaN (every rank: the loss is global);
- `sigkill_after_checkpoint@N` — after the checkpoint of step N is committed, every rank
  SIGKILLs itself (a hard crash: no handler, no cleanup);
- `sigterm@N` — rank 0 alone sends itself SIGTERM before step N, as a preemption notice that
  reaches one rank first (the ranks must still agree on when to stop);
- `oom@N` — every rank raises `torch.OutOfMemoryError` in step N (inside the session's
  `stop_on_oom()`, where a real one would surface).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

ENV = "TRAINYARD_FAULTS"
KINDS = frozenset({"nan_loss", "sigkill_after_checkpoint", "sigterm", "oom"})


@dataclass(frozen=True)
class Faults:
    at: dict[str, frozenset[int]] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Faults:
        raw = (os.environ if environ is None else environ).get(ENV, "").strip()
        at: dict[str, set[int]] = {}
        for item in filter(None, (s.strip() for s in raw.split(","))):
            kind, sep, step = item.partition("@")
            if not sep or kind not in KINDS or not step.isdigit():
                raise ValueError(f"{ENV}: {item!r} is not kind@step with kind in {sorted(KINDS)}")
            at.setdefault(kind, set()).add(int(step))
        return cls({k: frozenset(v) for k, v in at.items()})

    def due(self, kind: str, step: int) -> bool:
        return step in self.at.get(kind, ())

    def loss(self, step: int, loss: float) -> float:
        return float("nan") if self.due("nan_loss", step) else loss

    def before_step(self, step: int, rank: int) -> None:
        if rank == 0 and self.due("sigterm", step):
            os.kill(os.getpid(), signal.SIGTERM)

    def oom(self, step: int) -> None:
        if self.due("oom", step):
            import torch

            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {ENV} at step {step})")

    def after_checkpoint(self, step: int) -> None:
        if self.due("sigkill_after_checkpoint", step):
            os.kill(os.getpid(), signal.SIGKILL)
