"""The managed mode's whole API (DESIGN §7): `trainyard.init()` and the `Session` it returns — a
few added lines around a script's own loop, nothing re-indented, as Ray Train users know it:

    import trainyard
    session = trainyard.init()                   # after (or instead of) init_process_group
    start = session.restore(model=model, optimizer=optimizer, scheduler=scheduler)
    for epoch in ...:                            # the script's own loop, unchanged
        for batch in ...:
            ...forward, backward, optimizer.step()...
            session.report(loss=loss.item(), lr=scheduler.get_last_lr()[0])
            if session.should_stop:
                break
        if session.should_stop:
            break
    session.finish()

- `restore` loads the checkpoint to resume from (the attempt's named one, else the run's newest
  valid one), verified, into the objects given — the model (plain, DDP or FSDP), the optimizer
  and any object with `state_dict()`/`load_state_dict()` — with the RNG states; it returns the
  optimizer steps already done (0 when fresh) and says in the rank log what it restored.
- `report` is called once per optimizer step with the loss *this rank* sees: the session averages
  it across ranks (one small all-reduce, which also carries the ranks' stop/save flags), counts the step, writes the heartbeat, streams the
  metrics to the run's MLflow run, checks for divergence, checkpoints on the spec's schedule,
  applies the trigger form's fault Params and turns a SIGTERM into an emergency checkpoint.
- `should_stop` is True once the steps done reach `training.maxSteps` (the spec's, or the
  trigger form's `max_steps`).
- `finish` commits the final checkpoint and ends the session; a process group the script
  created is left to the script (its own `destroy_process_group()` stays valid).

Exact resume: the checkpoint holds the model, the optimizer, the objects given and every RNG
state, taken at a step boundary. A resumed run continues exactly where the checkpoint was when
the loop draws its batches *after* `restore` from state that `restore` restored — a sampler or
data iterator passed to `restore` (anything with `state_dict`), or batches derived from the step
count `restore` returned; a data order drawn before `restore` starts again from its beginning.

`TrainingSession` (`trainyard.worker.session`) is the layer below, kept for scripts that drive
each step themselves (`worker/train.py`); this class adds the step counting, the global loss and
the stop rule on top of it.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainyard.worker.session import SessionConfig, TrainingSession

LOGGER = "trainyard"


def init(*, spec: str | Path | None = None) -> Session:
    """The session of this rank: the launcher's contract from the environment, or — run by hand
    with plain `torchrun` for debugging — `spec` (a TrainingJob YAML) with plain data parallelism
    over the processes. Uses the process group the script created; creates one (gloo on CPU,
    NCCL on GPU) when there is none."""
    _log_to_stderr()
    from trainyard.config.loader import load_spec_file

    job = load_spec_file(Path(spec)) if spec is not None and not os.environ.get("TRAINYARD_JOB") else None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return Session(TrainingSession(SessionConfig.from_env(spec=job, world_size=world)))


class Session:
    """See the module docstring. One per process; every rank calls each method together."""

    def __init__(self, inner: TrainingSession) -> None:
        self._inner = inner
        self._steps = 0
        self._restored = False
        self.max_steps = inner.config.spec.spec.training.max_steps
        """The steps this run trains to (`training.maxSteps`, or the trigger form's `max_steps`);
        None: the script's own loop decides."""

    @property
    def rank(self) -> int:
        return self._inner.rank

    @property
    def world_size(self) -> int:
        return self._inner.world_size

    @property
    def device(self) -> torch.device:
        """`cuda:<local rank>` on a GPU node, else the CPU."""
        return self._inner.device

    @property
    def steps_done(self) -> int:
        """Optimizer steps done so far in the run, restored ones included."""
        return self._steps

    def restore(self, *, model: torch.nn.Module, optimizer: Any = None, **state: Any) -> int:
        """Load the checkpoint to resume from into `model`, `optimizer` and `state` (objects with
        `state_dict()` / `load_state_dict()`: a scheduler, a sampler, a data iterator); return the
        steps already done (0 when the run starts fresh). Those objects are also what every
        checkpoint of this run saves."""
        self._inner.attach(model=model, optimizer=optimizer, extra=state)
        self._steps = self._inner.restore() - 1
        self._restored = True
        self._inner.before_step(self._steps + 1)
        return self._steps

    def report(self, *, loss: float | torch.Tensor, lr: float | None = None, grad_norm: float | None = None,
               tokens: int | None = None, **metrics: float) -> None:
        """One optimizer step done; `loss` as this rank computed it (averaged across ranks here),
        `tokens` this step's tokens over all ranks (for tokens/s and MFU), `metrics` more values
        for the run's MLflow run. May end the process: a diverged loss, a SIGTERM (after an
        emergency checkpoint) — with the exit code the control plane reads."""
        if not self._restored:
            raise RuntimeError("Session.report() before Session.restore(model=..., optimizer=...): the "
                               "session needs to know what each checkpoint saves")
        step = self._steps + 1
        mean, flags = self._global_mean(loss)
        self._inner.step_end(step, loss=mean, grad_norm=_number(grad_norm), lr=_number(lr), tokens=tokens,
                             metrics={k: _number(v) for k, v in metrics.items()}, flags=flags)
        self._steps = step
        if not self.should_stop:
            self._inner.before_step(step + 1)

    @property
    def should_stop(self) -> bool:
        """True once the run has done its `max_steps`."""
        return self.max_steps is not None and self._steps >= self.max_steps

    def finish(self) -> None:
        """The last step is done: commit its checkpoint, mark the rank done, end the session."""
        try:
            if self._restored and self._steps > 0:
                self._inner.finish(self._steps)
        finally:
            self._inner.close()

    def _global_mean(self, loss: float | torch.Tensor) -> tuple[float, tuple[int, ...]]:
        """The loss averaged over the ranks, and the sums of the session's flags, in one all-reduce."""
        local = float(loss.detach().item() if isinstance(loss, torch.Tensor) else loss)
        value = torch.tensor([local, *self._inner.flags()], dtype=torch.float64, device=self._collective_device())
        if self.world_size > 1:
            dist.all_reduce(value)
        mean, *flags = value.tolist()
        return mean / self.world_size, tuple(int(f) for f in flags)

    def _collective_device(self) -> torch.device:
        """Where this group's collectives run: the GPU under NCCL, else the CPU (gloo)."""
        backend = dist.get_backend() if dist.is_initialized() else "gloo"
        return self.device if "nccl" in str(backend) and self.device.type == "cuda" else torch.device("cpu")


def _number(value: float | torch.Tensor | None) -> float | None:
    if value is None:
        return None
    return float(value.detach().item()) if isinstance(value, torch.Tensor) else float(value)


def _log_to_stderr() -> None:
    """What the session says (what it restored, each checkpoint) reaches the rank log even when
    the script configures no logging; a script that configures the root logger gets it there."""
    logger = logging.getLogger(LOGGER)
    if logging.getLogger().handlers or any(getattr(h, "_trainyard", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler._trainyard = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(f"trainyard [rank {os.environ.get('RANK', '0')}]: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


__all__ = ["Session", "init"]
