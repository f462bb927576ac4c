"""Test-only fault injection, off unless `TRAINYARD_FAULTS` is set (like the node agent's fault
API): lets the integration tests drive the failure paths of a real training run exactly at a
chosen step instead of racing a timer.

`TRAINYARD_FAULTS` is a comma-separated list of `kind@step` (or `kind@step:rank` for the kinds
that hit one rank):

- `nan_loss@N` — the loss of step N is replaced by NaN (every rank: the loss is global);
- `sigkill_after_checkpoint@N` — after the checkpoint of step N is committed, every rank
  SIGKILLs itself (a hard crash: no handler, no cleanup);
- `sigterm@N` — rank 0 alone sends itself SIGTERM before step N, as a preemption notice that
  reaches one rank first (the ranks must still agree on when to stop);
- `sigkill@N:R` — rank R SIGKILLs itself before step N (a worker crash mid-run), once its part of
  a checkpoint still in flight is written (`TrainingSession.before_step`): the run resumes from
  the newest checkpoint before N, not from whichever one the race with the save left (on a
  loaded machine the step-10 save of a kill at step 15 was still writing);
- `hang@N:R` — rank R stops itself with SIGSTOP before step N (alive, no progress: a hang);
- `oom@N` — every rank raises `torch.OutOfMemoryError` in step N (inside the session's
  `stop_on_oom()`, where a real one would surface).

The DAG's fault Params (`trainyard.plugins.recovery.model.FaultParams`) are turned into this variable.
A fault fires in torchrun's first incarnation only: the variable survives torchrun's in-place
restarts (`TORCHELASTIC_RESTART_COUNT` > 0), and a fault that fired again after every restart
would turn one injected crash into a crash loop that the fast path can never recover.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

ENV = "TRAINYARD_FAULTS"
KINDS = frozenset({"nan_loss", "sigkill_after_checkpoint", "sigterm", "sigkill", "hang", "oom"})
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
RANKED = frozenset({"sigkill", "hang"})
"""Kinds that hit one rank, named after the step: `sigkill@120:1`."""


@dataclass(frozen=True)
class Faults:
    at: dict[str, frozenset[int]] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)
    """The rank each ranked kind hits."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Faults:
        env = os.environ if environ is None else environ
        raw = env.get(ENV, "").strip()
        if int(env.get(RESTART_COUNT_ENV, "0") or 0) > 0:  # fired already, before the restart
            raw = ""
        at: dict[str, set[int]] = {}
        ranks: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in raw.split(","))):
            kind, sep, where = item.partition("@")
            step, colon, rank = where.partition(":")
            ranked = kind in RANKED
            if (not sep or kind not in KINDS or not step.isdigit() or ranked != bool(colon)
                    or (colon and not rank.isdigit())):
                raise ValueError(f"{ENV}: {item!r} is not kind@step (kind@step:rank for "
                                 f"{sorted(RANKED)}) with kind in {sorted(KINDS)}")
            at.setdefault(kind, set()).add(int(step))
            if ranked:
                ranks[kind] = int(rank)
        return cls({k: frozenset(v) for k, v in at.items()}, ranks)

    def due(self, kind: str, step: int) -> bool:
        return step in self.at.get(kind, ())

    def loss(self, step: int, loss: float) -> float:
        return float("nan") if self.due("nan_loss", step) else loss

    def kills(self, step: int, rank: int) -> bool:
        """`rank` SIGKILLs itself before `step` (`sigkill@N:R`)."""
        return self.ranks.get("sigkill") == rank and self.due("sigkill", step)

    def before_step(self, step: int, rank: int) -> None:
        if rank == 0 and self.due("sigterm", step):
            os.kill(os.getpid(), signal.SIGTERM)
        if self.kills(step, rank):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.ranks.get("hang") == rank and self.due("hang", step):
            os.kill(os.getpid(), signal.SIGSTOP)

    def oom(self, step: int) -> None:
        if self.due("oom", step):
            import torch

            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {ENV} at step {step})")

    def after_checkpoint(self, step: int) -> None:
        if self.due("sigkill_after_checkpoint", step):
            os.kill(os.getpid(), signal.SIGKILL)
