"""Build the `WorkerEnv` (DESIGN §7) and the process environment of a launch.

One place decides where a run's checkpoints, heartbeats and logs go, so the CLI, the Airflow
operator and the tests agree: checkpoints under `<object store>/jobs/<job>/runs/<run>/checkpoints`
(`trainyard.plugins.checkpoint.uris.checkpoint_root`); heartbeats under the attempt's run folder
`<runs_dir>/<job>/<run>/<attempt>/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.config.worker_env import WorkerEnv, is_reserved

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan


def checkpoint_uri(job: TrainingJob, object_store: str, run: str) -> str:
    """This run's checkpoint root: `trainyard.plugins.checkpoint.uris.checkpoint_root` with the spec's
    `checkpoint.storage` (imported here: the checkpoint package loads its catalog, which a
    launcher import should not pay for)."""
    from trainyard.plugins.checkpoint.uris import checkpoint_root

    return checkpoint_root(object_store, job.metadata.name, run, storage=job.spec.checkpoint.storage or "")


def run_dir_for(runs_dir: str | Path, job: str, run: str, attempt: int) -> Path:
    """`<runs_dir>/<job>/<run>/<attempt>/`: logs, pid records, heartbeats of one attempt."""
    return Path(runs_dir) / job / run / str(attempt)


def build_worker_env(
    job: TrainingJob,
    plan: Plan,
    settings: Settings,
    *,
    run: str,
    attempt: int,
    resume_from: str = "",
    mlflow_run_id: str = "",
    run_dir: str | Path | None = None,
) -> WorkerEnv:
    folder = Path(run_dir) if run_dir is not None else run_dir_for(settings.runs_dir, job.metadata.name, run, attempt)
    return WorkerEnv(
        job=job.metadata.name, run=run, attempt=attempt, plan=plan.model_dump_json(),
        spec=job.model_dump_json(by_alias=True), resume_from=resume_from,
        object_store=settings.object_store, checkpoint_uri=checkpoint_uri(job, settings.object_store, run),
        heartbeat_dir=str(folder / "heartbeats"),
        hang_timeout_s=job.spec.fault_tolerance.hang_timeout.total_seconds(),
        run_dir=str(folder), mlflow_tracking_uri=settings.mlflow_tracking_uri, mlflow_run_id=mlflow_run_id,
        learning_rate=job.spec.training.learning_rate, max_steps=job.spec.training.max_steps,
    )


TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""What torchrun's agents need on every launcher. Its in-place restart (the fast path) breaks
when the workers share the c10d rendezvous store: a restarted rank reads its peer's address
from the previous round and gloo/NCCL init fails ("Connection refused"; pytorch/pytorch#135712,
seen here with torch 2.13). A store of their own per round costs one TCP listener."""


def job_environment(job: TrainingJob, plan: Plan, worker_env: WorkerEnv, *, gpu: bool) -> dict[str, str]:
    """What every process of the job gets on top of the base environment: the spec's
    `training.env`, the advisor's NCCL variables on GPU clusters, and the `WorkerEnv` —
    in that order, so the platform's names always win — with the run's scoped storage
    credentials as `AWS_*` when it has them (the launcher drops the deployment's own from the
    base environment: `without_deployment_credentials`)."""
    env: dict[str, str] = {}
    user = job.spec.training.env
    reserved = sorted(k for k in user if is_reserved(k))
    if reserved:
        raise ValueError(f"spec.training.env sets platform-reserved names {reserved}; remove them")
    env.update(user)
    if gpu:
        env.update(plan.nccl_env)
    env.update(worker_env.to_env())
    if worker_env.storage_credentials is not None:
        env.update(worker_env.storage_credentials.to_env())
    return env


def entry_args(job: TrainingJob) -> list[str]:
    """The entrypoint's arguments, on every launcher: the spec's `source.args`, as written. The
    trigger form's overrides reach the script as variables (`TRAINYARD_LEARNING_RATE`,
    `TRAINYARD_MAX_STEPS`), never as added arguments a script may reject."""
    return list(job.spec.source.args)
