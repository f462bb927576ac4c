"""`TrainingSession`: the platform callback a training script calls (seed Appendix B), so that
the script is a good citizen of the platform without the platform editing it.

    with TrainingSession(SessionConfig.from_env(...)) as session:   # process group, signals
        session.attach(model=..., optimizer=..., extra={"sampler": ..., "scheduler": ...})
        for step in range(session.restore(), max_steps + 1):        # resume where we left off
            ...one training step...
            stats = train_step(..., flags=session.flags())           # flags ride the loss's all-reduce
            session.step_end(step, loss=..., grad_norm=..., lr=..., tokens=..., data_stall_s=...,
                             flags=stats.flags)
        session.finish(max_steps)                                   # final checkpoint, exit 0

What it does, per DESIGN §5–§8:
- initialises torch.distributed (`cpu:gloo,cuda:nccl` on GPU machines, gloo on CPU) from
  torchrun's variables, or a one-process group when run without torchrun;
- restores the checkpoint named by `TRAINYARD_RESUME_FROM`, else the newest valid one, else
  starts fresh — model, optimizer, scheduler, sampler, RNG states and the step;
- saves asynchronously through `trainyard.plugins.checkpoint.CheckpointManager` every
  `checkpoint.intervalSteps` steps or `intervalMinutes` minutes, whichever comes first; rank 0
  records each commit in the MLflow run and applies the spec's retention policy itself
  (`trainyard.worker.checkpoint_records`), without waiting for the control plane's watcher;
- hands this rank's heartbeat (step, time, loss, tokens/s, NaN flag, phase) to a writer thread
  every step, which writes the newest at most every second (`trainyard.worker.heartbeats`);
- stops with `exit_codes.DIVERGED` when the loss is NaN/inf or stays above its baseline
  (`trainyard.worker.divergence`), writing `<run_dir>/diverged.json` with the onset step;
- on SIGTERM finishes the current step, takes an emergency checkpoint and exits with
  `exit_codes.PREEMPTED`;
- exits with `exit_codes.CHECKPOINT_CORRUPT` when the checkpoint to restore does not verify
  (writing `<run_dir>/checkpoint_corrupt.json`), and with `exit_codes.OOM` on a
  `torch.OutOfMemoryError` inside `stop_on_oom()`;
- streams loss (every step), grad_norm, lr, tokens_per_s, step_time_s, data_stall_s and mfu
  (once a second, windows averaged: `trainyard.worker.step_metrics`) from rank 0 to MLflow
  (`trainyard.plugins.tracking.metrics.MetricsStreamer`: async, batched, never raises).

Every decision to stop or to save on the clock is taken by all ranks at the same step: the
loss is global (the same on all ranks), and a SIGTERM or a due time-based checkpoint seen by any
rank is shared by an all-reduce. A rank that stopped alone would leave the others hanging in
their next collective. The loop that passes `flags()` into the step's own loss all-reduce
(`trainyard.worker.step.train_step`, the managed `Session.report`) and the sums to `step_end`
pays no collective for it; without them `step_end` runs one tiny all-reduce of its own.

What a step costs the training thread besides (measured by `benchmarks/worker_overhead.py`):
a few additions and lookups, and a heartbeat and the metrics handed over by reference — no
file, no validation, no MLflow call, no wake-up of a thread.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainyard.plugins.run import exit_codes
from trainyard.plugins.run.heartbeat import DATA_FIELDS, Heartbeat
from trainyard.worker.divergence import Divergence, DivergenceDetector
from trainyard.worker.faults import Faults
from trainyard.worker.heartbeats import HeartbeatWriter
from trainyard.worker.stall import StallMonitor
from trainyard.worker.step_metrics import METRICS_EVERY_S, StepMetrics

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.checkpoint.manager import CheckpointManager, SaveResult
    from trainyard.plugins.tracking.metrics import MetricsStreamer
    from trainyard.worker.checkpoint_records import CommitRecorder

log = logging.getLogger(__name__)


class StopTraining(SystemExit):
    """Raised by the session to end the process with one of `trainyard.plugins.run.exit_codes`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code)
        self.reason = reason


@dataclass(frozen=True)
class SessionConfig:
    """Everything a session needs, resolved: from the launcher's `WorkerEnv`, or defaults."""

    job: str
    spec: TrainingJob
    plan: Plan
    object_store: str
    checkpoint_uri: str
    heartbeat_dir: Path
    run_dir: Path
    run: str = "standalone"
    """The training run (one trigger of the job); `standalone` outside the platform."""
    attempt: int = 0
    resume_from: str = ""
    restart: int = 0
    """torchrun's in-place restarts before this process (`TORCHELASTIC_RESTART_COUNT`)."""
    endpoint_url: str | None = None
    hang_timeout_s: float = 600.0
    mlflow_tracking_uri: str = ""
    mlflow_run_id: str = ""
    checkpoint_interval_steps: int | None = None
    checkpoint_interval_s: float | None = None
    faults: Faults = field(default_factory=Faults)
    metrics_every_s: float = METRICS_EVERY_S
    """Window of the per-step figures other than the loss in MLflow (`trainyard.worker.step_metrics`;
    0: every step)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, spec: TrainingJob | None = None,
                 plan: Plan | None = None, world_size: int = 1) -> SessionConfig:
        """The launcher's contract (`trainyard.config.worker_env.WorkerEnv`) when `TRAINYARD_JOB` is set;
        otherwise a standalone run of `spec` with defaults: plain data parallelism over the
        world size, the configured object store (`trainyard.config.settings`), a run folder under it."""
        from trainyard.config.settings import Settings
        from trainyard.config.spec import TrainingJob
        from trainyard.config.worker_env import WorkerEnv
        from trainyard.plugins.advisor.plan import Plan
        from trainyard.plugins.checkpoint.uris import checkpoint_root

        env = os.environ if environ is None else environ
        settings = Settings()
        faults = Faults.from_env(env)
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        if env.get("TRAINYARD_JOB"):
            w = WorkerEnv.from_env(env)
            job = spec or TrainingJob.model_validate_json(w.spec)
            return cls._from_job(
                job, plan or Plan.model_validate_json(w.plan), job_name=w.job, run=w.run, attempt=w.attempt,
                resume_from=w.resume_from, restart=restart, object_store=w.object_store,
                checkpoint_uri=w.checkpoint_uri, heartbeat_dir=Path(w.heartbeat_dir),
                run_dir=Path(w.run_dir) if w.run_dir else Path(w.heartbeat_dir).parent,
                endpoint_url=settings.s3_endpoint_url, hang_timeout_s=w.hang_timeout_s,
                mlflow_tracking_uri=w.mlflow_tracking_uri, mlflow_run_id=w.mlflow_run_id, faults=faults)
        if spec is None:
            raise ValueError("no TRAINYARD_JOB in the environment: give the spec (--spec FILE) "
                             "to run standalone")
        if plan is None:
            plan = default_plan_for(spec, world_size)
        run = "standalone"
        run_dir = settings.runs_dir / spec.metadata.name / run
        return cls._from_job(
            spec, plan, job_name=spec.metadata.name, run=run, attempt=0, resume_from="", restart=restart,
            object_store=settings.object_store,
            checkpoint_uri=checkpoint_root(settings.object_store, spec.metadata.name, run,
                                           storage=spec.spec.checkpoint.storage or ""),
            heartbeat_dir=run_dir / "heartbeats", run_dir=run_dir,
            endpoint_url=settings.s3_endpoint_url,
            hang_timeout_s=spec.spec.fault_tolerance.hang_timeout.total_seconds(),
            mlflow_tracking_uri=env.get("MLFLOW_TRACKING_URI", ""),
            mlflow_run_id=env.get("MLFLOW_RUN_ID", ""), faults=faults)

    @classmethod
    def _from_job(cls, job: TrainingJob, plan: Plan, *, job_name: str, **kwargs: Any) -> SessionConfig:
        ckpt = job.spec.checkpoint
        return cls(job=job_name, spec=job, plan=plan,
                   checkpoint_interval_steps=ckpt.interval_steps,
                   checkpoint_interval_s=ckpt.interval_minutes * 60 if ckpt.interval_minutes else None,
                   **kwargs)


def default_plan_for(spec: TrainingJob, world_size: int) -> Plan:
    """Plain data parallelism (DDP) over `world_size` for the spec's batch and sequence."""
    from trainyard.worker.distributed.mesh import default_plan

    hints = spec.spec.parallelism.hints
    if hints is None:
        raise ValueError("the spec has no parallelism.hints: the batch size and the model's "
                         "shape are unknown")
    return default_plan(world_size, global_batch_size=hints.global_batch_size,
                        sequence_length=hints.sequence_length)


def init_distributed() -> tuple[int, int, int, torch.device]:
    """Start torch.distributed: (rank, world_size, local_rank, device)."""
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend=backend, device_id=device if cuda else None)
        else:  # `python worker/train.py` without torchrun: a group of one
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), local_rank, device


class TrainingSession:
    """See the module docstring. One per process; all ranks call every method together."""

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self._owns_group = not dist.is_initialized()
        """A process group the script created is the script's to destroy (`close` leaves it)."""
        self.rank, self.world_size, self.local_rank, self.device = init_distributed()
        (self.restart,) = self._max_over_ranks(config.restart)
        """torchrun's in-place restarts of the gang before this incarnation: the most any rank's
        agent counted. Across nodes torchrun restarts a healthy node's workers for its peer's
        new rendezvous round without counting a restart there, so one node's ranks can see 0
        while the failed node's see 1; the gang decides (and reports) as one."""
        self.plan = config.plan
        config.plan.layout.check_world_size(self.world_size)
        self.node = os.environ.get("TRAINYARD_NODE") or socket.gethostname()
        self.faults = config.faults
        ft = config.spec.spec.fault_tolerance
        self.divergence = DivergenceDetector(factor=ft.divergence_factor, patience=ft.divergence_steps)
        self._sigterm = False
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._model: Any = None
        self._optimizer: Any = None
        self._extra: dict[str, Any] = {}
        self._checkpoints: CheckpointManager | None = None
        self._commits: CommitRecorder | None = None
        self._metrics: MetricsStreamer | None = self._open_metrics() if self.rank == 0 else None
        self._step_metrics: StepMetrics | None = self._open_step_metrics()
        self._last_saved_step: int | None = None
        self._step = 0
        self._last_save_time = time.monotonic()
        self._last_step_time = time.perf_counter()
        self._loss: float | None = None
        self._tokens_per_s: float | None = None
        self._heartbeats = HeartbeatWriter(config.heartbeat_dir)
        self._stalls = StallMonitor()
        self._data: dict[str, float] = {}
        self._closed = False
        self.beat(0, phase="start")

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> TrainingSession:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if isinstance(exc, StopTraining):
            # Exiting on purpose with a code the control plane reads: a launcher's SIGTERM to
            # the whole gang (sent as soon as a first rank exits non-zero) must not turn the
            # slower ranks' exit into "killed by SIGTERM". SIG_IGN survives interpreter
            # shutdown, unlike a Python handler.
            self._previous_handler = signal.SIG_IGN
        self.close()

    def attach(self, *, model: torch.nn.Module, optimizer: Any,
               extra: Mapping[str, Any] | None = None) -> None:
        """What a checkpoint holds: the model (as `ParallelModel.state_module`), the optimizer,
        and `extra` objects with `state_dict()`/`load_state_dict()` (scheduler, sampler). The
        session adds its divergence detector; the manager adds RNG states and the step."""
        self._model, self._optimizer = model, optimizer
        self._extra = {**(extra or {}), "divergence": self.divergence}

    def restore(self) -> int:
        """Restore the checkpoint to resume from, if any; returns the first step to run."""
        if self._model is None:
            raise RuntimeError("TrainingSession.restore() needs attach(model=..., optimizer=...) first")
        self.beat(0, phase="restore")
        from trainyard.plugins.checkpoint.errors import NoValidCheckpointError

        manager = self.checkpoints
        target = self.resume_target()
        began = time.perf_counter()
        try:
            manifest = manager.restore(model=self._model, optimizer=self._optimizer, extra=self._extra,
                                       manifest_uri=target or None)
            init_from = self.config.spec.spec.checkpoint.init_from
            if manifest is None and init_from:
                # A fresh run of a fine-tuning job: the other job's weights only (read-only,
                # `checkpoint.initFrom`), then step 1 with this job's own optimizer and data.
                manager.restore(model=self._model, manifest_uri=init_from)
                if self.rank == 0:
                    log.info("initialised the weights from %s (checkpoint.initFrom)", init_from)
        except NoValidCheckpointError as e:
            self._checkpoint_corrupt(e)
        start = 1 if manifest is None else manifest.step + 1
        if manifest is not None:
            self._last_saved_step = manifest.step
            if self.rank == 0:
                log.info("resumed from step %d (%s) in %.3fs", manifest.step, target or "latest valid checkpoint",
                         time.perf_counter() - began)
        self._last_step_time = time.perf_counter()
        self._last_save_time = time.monotonic()
        return start

    def resume_target(self) -> str:
        """The manifest to restore ('' = the run's newest valid checkpoint).

        The attempt's named resume point (`TRAINYARD_RESUME_FROM`: a rollback, a fall-back, a
        start from another checkpoint) holds for its first incarnation. After an in-place torchrun
        restart it would throw away everything this attempt committed since: the restarted
        workers take the run's newest valid checkpoint instead — unless the run has none yet
        (a crash before the first save of an attempt that started from elsewhere). The gang's
        count decides (`restart`), so all ranks restore the same step."""
        named = self.config.resume_from
        if not named or self.restart == 0:
            return named
        from trainyard.plugins.checkpoint.catalog import list_checkpoints

        own = list_checkpoints(self.config.checkpoint_uri, endpoint_url=self.config.endpoint_url)
        return "" if own else named

    def flush_metrics(self, timeout_s: float = 30.0) -> bool:
        """Wait until rank 0's metrics so far reached MLflow (True; also without tracking)."""
        if self._step_metrics is not None:
            self._step_metrics.flush()
        return self._metrics.flush(timeout_s) if self._metrics is not None else True

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until this rank's background work so far is done — its newest heartbeat on disk,
        rank 0's metrics in MLflow — so none of it is left running into what comes next (a
        benchmark's bare loop, a pause). True when both were done within `timeout_s` each."""
        beat = self._heartbeats.flush(timeout_s)
        return self.flush_metrics(timeout_s) and beat

    def reset_step_timer(self) -> None:
        """Start the next step's clock now: after a pause that is not training (an evaluation,
        a benchmark's bare loop), so its step time and tokens/s do not include the pause."""
        self._last_step_time = time.perf_counter()

    def before_step(self, step: int) -> None:
        """Optional hook before a step (only the test fault injection uses it)."""
        self._step = step
        if self._checkpoints is not None and self.faults.kills(step, self.rank):
            self._checkpoints.wait()  # the injected crash comes after the save in flight (`faults`)
        self.faults.before_step(step, self.rank)

    @contextmanager
    def stop_on_oom(self) -> Iterator[None]:
        """Around the training loop: a `torch.OutOfMemoryError` ends the process with
        `exit_codes.OOM`, its message logged (the control plane reads it and re-plans)."""
        try:
            self.faults.oom(self._step)
            yield
        except torch.OutOfMemoryError as e:
            log.error("torch.OutOfMemoryError after step %d: %s", self._step, e)
            raise StopTraining(exit_codes.OOM, f"out of memory after step {self._step}: {e}") from e

    def flags(self) -> tuple[int, int]:
        """This rank's (SIGTERM received, clock-based checkpoint due), 0 or 1 each, for the
        all-reduce the step runs anyway (`train_step(flags=...)` sums them with the loss); give
        the sums to `step_end(flags=...)`. Read before the step: a SIGTERM that arrives during
        it counts at the next step."""
        return int(self._sigterm), int(self._time_due())

    def step_end(self, step: int, *, loss: float, grad_norm: float | None = None,
                 lr: float | None = None, tokens: int | None = None,
                 data_stall_s: float | None = None,
                 data_metrics: Mapping[str, float] | None = None,
                 metrics: Mapping[str, float | None] | None = None,
                 flags: Sequence[float] | None = None) -> None:
        """After step `step` (the global loss): heartbeat, metrics, divergence, checkpoints,
        SIGTERM. Raises `StopTraining` when the process must end. `data_metrics` (prefetch
        depth, cache counters: `trainyard.plugins.data.reader.StreamingReader.metrics`) go beside
        `data_stall_s` into the heartbeat and MLflow; stalls above 5 % warn (`trainyard.worker.stall`).
        `metrics`: the script's own values for MLflow, by name. `flags`: the sums over all ranks
        of `flags()` (`StepStats.flags`); without them the ranks agree in an all-reduce here."""
        if flags is not None and len(flags) != 2:
            raise ValueError(f"flags must be the sums of TrainingSession.flags() (2 values), got {flags!r}")
        self._step = step
        now = time.perf_counter()
        step_time = now - self._last_step_time
        self._last_step_time = now
        loss = self.faults.loss(step, loss)
        self._loss = loss
        self._tokens_per_s = tokens / step_time if tokens and step_time > 0 else None
        self._data = {**(data_metrics or {}), **({"data_stall_s": data_stall_s} if data_stall_s is not None else {})}
        self._stalls.update(step, data_stall_s, step_time, self._data)
        diverged = self.divergence.update(step, loss)
        self.beat(step, phase="diverged" if diverged else "train")
        self._log_metrics(step, loss=loss, grad_norm=grad_norm, lr=lr, step_time_s=step_time, tokens=tokens,
                          data_stall_s=data_stall_s, data_metrics=data_metrics, metrics=metrics)
        if diverged is not None:
            self._diverged(diverged)
        if flags is None:
            sigterm, time_due = self._agree(self._sigterm, self._time_due())
        else:
            sigterm, time_due = bool(flags[0]), bool(flags[1])
        if sigterm:
            self._preempted(step)
        interval = self.config.checkpoint_interval_steps
        if time_due or (interval and step % interval == 0):
            self.save(step)

    def finish(self, step: int) -> None:
        """Training reached its last step: commit its checkpoint, mark the rank done."""
        if self._last_saved_step != step:
            self.save(step, sync=True)
        else:
            self.checkpoints.wait()
        self.beat(step, phase="done")
        if self.rank == 0:
            log.info("training finished at step %d", step)

    def close(self) -> None:
        """Flush metrics, wait for an in-flight checkpoint, leave the process group (once)."""
        if self._closed:
            return
        self._closed = True
        if self._checkpoints is not None:
            self._checkpoints.close()
            self._checkpoints = None
        if self._commits is not None:  # after the last commit: its record and retention
            self._commits.close()
            self._commits = None
        if self._metrics is not None:
            if self._step_metrics is not None:  # the open window's steps, then the rest
                self._step_metrics.flush()
                self._step_metrics = None
            self._metrics.close()
            self._metrics = None
        self._heartbeats.close()
        signal.signal(signal.SIGTERM, self._previous_handler)
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()

    # --- checkpoints ----------------------------------------------------------------------

    @property
    def checkpoints(self) -> CheckpointManager:
        if self._checkpoints is None:
            from trainyard.plugins.checkpoint.manager import CheckpointManager
            from trainyard.plugins.checkpoint.uris import area_for

            run_dir = self.config.run_dir
            self._checkpoints = CheckpointManager(
                checkpoint_uri=self.config.checkpoint_uri, job=self.config.job, rank=self.rank,
                world_size=self.world_size, staging_dir=run_dir / "staging",
                compression=self.config.spec.spec.checkpoint.compression,
                endpoint_url=self.config.endpoint_url, plan_json=self.plan.model_dump_json(),
                area=area_for(self.config.spec, self.config.object_store),
                init_from=self.config.spec.spec.checkpoint.init_from or "",
                on_commit=self._commit_recorder() if self.rank == 0 else None,
                staging=self.config.spec.spec.checkpoint.staging)
        return self._checkpoints

    def _commit_recorder(self) -> CommitRecorder:
        """Rank 0's bookkeeping of each commit: MLflow record, retention (`trainyard.worker.checkpoint_records`)."""
        from trainyard.plugins.checkpoint.retention import RetentionPolicy
        from trainyard.worker.checkpoint_records import CommitRecorder

        c = self.config
        self._commits = CommitRecorder(checkpoint_uri=c.checkpoint_uri,
                                       policy=RetentionPolicy.from_spec(c.spec.spec.checkpoint),
                                       endpoint_url=c.endpoint_url, tracking_uri=c.mlflow_tracking_uri,
                                       mlflow_run_id=c.mlflow_run_id)
        return self._commits

    def save(self, step: int, *, sync: bool = False) -> SaveResult:
        """Checkpoint the attached state after `step` (asynchronously unless `sync`)."""
        metrics = {"loss": self._loss} if self._loss is not None and math.isfinite(self._loss) else {}
        if sync or not self.config.spec.spec.checkpoint.async_save:
            self.beat(step, phase="checkpoint")
            result = self.checkpoints.save_sync(step, model=self._model, optimizer=self._optimizer,
                                                extra=self._extra, metrics=metrics)
        else:
            result = self.checkpoints.save(step, model=self._model, optimizer=self._optimizer,
                                           extra=self._extra, metrics=metrics)
        self._last_saved_step = step
        self._last_save_time = time.monotonic()
        if self._step_metrics is not None:
            # The steps up to a checkpoint are never trained again after a crash: their points go to
            # the streamer now, not at the window's end (a rank killed before it would lose them).
            self._step_metrics.flush()
        if self._metrics is not None:
            self._metrics.log(step, {"checkpoint_blocking_s": result.blocking_s})
            if result.previous is not None and result.previous.stage_wait_s:
                # Deferred staging: what the steps after the previous save waited for its copy.
                self._metrics.log(result.previous.step, {"checkpoint_stage_wait_s": result.previous.stage_wait_s})
            self._metrics.send_soon()  # and on to MLflow, without waiting for the streamer's next send
        if self.faults.due("sigkill_after_checkpoint", step):
            self.checkpoints.wait()
            self.faults.after_checkpoint(step)
        return result

    def _time_due(self) -> bool:
        interval = self.config.checkpoint_interval_s
        return bool(interval) and time.monotonic() - self._last_save_time >= interval  # type: ignore[operator]

    # --- stopping -------------------------------------------------------------------------

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Only a flag: the step in progress finishes, then all ranks agree to stop (step_end).
        self._sigterm = True

    def _max_over_ranks(self, *values: int) -> tuple[int, ...]:
        """Each value's maximum over all ranks (one all-reduce of a few ints, on the CPU)."""
        t = torch.tensor(values, dtype=torch.int64)
        if self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return tuple(int(v) for v in t.tolist())

    def _agree(self, *flags: bool) -> tuple[bool, ...]:
        """Logical OR of each flag over all ranks."""
        return tuple(bool(v) for v in self._max_over_ranks(*(int(f) for f in flags)))

    def _preempted(self, step: int) -> None:
        if self.rank == 0:
            log.warning("SIGTERM: emergency checkpoint of step %d", step)
        try:
            if self._last_saved_step == step:
                self.checkpoints.wait()
            else:
                self.save(step, sync=True)
        except Exception as e:
            log.exception("emergency checkpoint of step %d failed", step)
            raise StopTraining(exit_codes.PREEMPTED_NO_CHECKPOINT,
                               f"SIGTERM; emergency checkpoint failed: {e}") from e
        raise StopTraining(exit_codes.PREEMPTED, f"SIGTERM; checkpointed step {step}")

    def _checkpoint_corrupt(self, error: Exception) -> None:
        """The restore target does not verify (every rank sees the same verdict)."""
        if self.rank == 0:
            log.error("checkpoint_corrupt: %s", error)
            from trainyard.plugins.run.records import (
                CHECKPOINT_CORRUPT_FILE,
                CheckpointCorruptRecord,
            )

            CheckpointCorruptRecord(job=self.config.job, attempt=self.config.attempt,
                                    resume_from=self.config.resume_from, reason=str(error),
                                    ).write(self.config.run_dir / CHECKPOINT_CORRUPT_FILE)
        raise StopTraining(exit_codes.CHECKPOINT_CORRUPT, str(error)) from error

    def _diverged(self, d: Divergence) -> None:
        if self.rank == 0:
            log.error("diverged: %s", d.describe())
            from trainyard.plugins.run.records import DIVERGED_FILE, DivergenceRecord

            DivergenceRecord(
                job=self.config.job, attempt=self.config.attempt, step=d.step,
                onset_step=d.onset_step, reason=d.reason, loss=repr(d.loss), baseline=d.baseline,
                last_checkpoint_step=self._last_saved_step, message=d.describe(),
            ).write(self.config.run_dir / DIVERGED_FILE)
        raise StopTraining(exit_codes.DIVERGED, d.describe())

    # --- heartbeats and metrics -----------------------------------------------------------

    def beat(self, step: int, *, phase: str) -> None:
        """Hand this rank's heartbeat to the writer thread (`trainyard.worker.heartbeats`), as the
        figures it is made of: the writer builds (validates) it when it writes it. A phase other
        than `train` is waited for, so readers see it before the long operation it announces."""
        self._heartbeats.submit(partial(self._heartbeat, step, time.time(), phase, self._loss,
                                        self._tokens_per_s, self._data))
        if phase != "train":
            self._heartbeats.flush()

    def _heartbeat(self, step: int, at: float, phase: str, loss: float | None,
                   tokens_per_s: float | None, data: Mapping[str, float]) -> Heartbeat:
        """The beat of `step`, handed over at `at` (called in the writer thread)."""
        finite = loss is None or math.isfinite(loss)
        return Heartbeat(
            job=self.config.job, run=self.config.run, attempt=self.config.attempt, rank=self.rank,
            local_rank=self.local_rank, node=self.node, pid=os.getpid(), step=step, time=at,
            loss=loss if finite else None, tokens_per_s=tokens_per_s, nan=not finite,
            hang_timeout_s=self.config.hang_timeout_s, phase=phase, restart=self.restart,
            **{k: v for k, v in data.items() if k in DATA_FIELDS})

    def _open_metrics(self) -> MetricsStreamer | None:
        uri, run_id = self.config.mlflow_tracking_uri, self.config.mlflow_run_id
        if not uri or not run_id:
            return None
        from trainyard.plugins.tracking.metrics import MetricsStreamer

        return MetricsStreamer(uri, run_id)

    def _open_step_metrics(self) -> StepMetrics | None:
        if self._metrics is None:
            return None
        flops_per_token, peak_flops = self._mfu_terms()
        return StepMetrics(self._metrics, world_size=self.world_size, flops_per_token=flops_per_token,
                           peak_flops=peak_flops, every_s=self.config.metrics_every_s)

    def _mfu_terms(self) -> tuple[float | None, float | None]:
        hints = self.config.spec.spec.parallelism.hints
        if hints is None:
            return None, None
        from trainyard.plugins.advisor.flops import flops_per_token, peak_flops_per_device

        try:  # the cluster's peak, as the attempt was planned; the catalog's for a plan without it
            return (flops_per_token(hints), self.config.plan.peak_flops_per_device or
                    peak_flops_per_device(self.config.spec.spec.hardware.gpu_type, hints.mixed_precision))
        except ValueError as e:  # an accelerator the catalog does not know: no MFU, say why once
            log.info("no MFU metric: %s", e)
            return None, None

    def _log_metrics(self, step: int, *, loss: float, grad_norm: float | None, lr: float | None,
                     step_time_s: float, tokens: int | None, data_stall_s: float | None,
                     data_metrics: Mapping[str, float] | None = None,
                     metrics: Mapping[str, float | None] | None = None) -> None:
        if self._step_metrics is not None:
            self._step_metrics.add(step, loss=loss, step_time_s=step_time_s, tokens=tokens, grad_norm=grad_norm,
                                   lr=lr, data_stall_s=data_stall_s, data_metrics=data_metrics, metrics=metrics)
