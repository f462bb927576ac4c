"""The three deferrable watchers of a running attempt (DESIGN §4): training, checkpoints, health.

Each checks once and finishes at once when its condition already holds (DESIGN §9: a trigger
that fires within a second of `defer()` can be marked failed by Airflow itself), else defers to
its trigger in `sensors/triggers.py` and holds no worker slot while training runs. Each re-reads
the `RunHandle` from `launch_training`'s XCom, so a retry or a restarted Airflow re-attaches to
the same processes. What a watcher concludes is data for `classify_outcome`; none of them fails
the attempt by failing itself, except the checkpoint alarm, which is meant to be seen.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from operators.common import attempt_of, pull, settings
from operators.launch import LAUNCH

if TYPE_CHECKING:
    from airflow.sdk import Context

    from plugins.launch.model import RunHandle

WATCH_TRAINING = "watch_training"


def _handle(context: Context) -> RunHandle:
    from plugins.launch.model import RunHandle

    return pull(context, LAUNCH, RunHandle)


class WatchTrainingSensor(BaseOperator):
    """Until every worker has exited, or a rank hangs past `hangTimeout` (the gang is stopped),
    or `training.maxRuntime` passes (stopped too). Renews the reservation meanwhile. Pushes the
    final `RunStatus`."""

    ui_color = "#fcf3cf"

    def __init__(self, *, poll_interval_s: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval_s = poll_interval_s

    def execute(self, context: Context) -> dict[str, Any]:
        from plugins.recovery import watch
        from sensors.triggers import TrainingTrigger

        handle = _handle(context)
        status = watch.poll(handle)
        if status.finished:
            return watch.settle(handle, status).model_dump(mode="json")
        job, _ = attempt_of(context)
        runtime = job.spec.training.max_runtime  # the trigger stops the gang past it (a timeout of
        # the deferral itself would fail this task and leave the gang running)
        deadline = (handle.created_at + runtime).timestamp() if runtime else None
        self.log.info("watching %s run %s attempt %d: %s", handle.job, handle.run, handle.attempt,
                      watch.describe_status(status))
        self.defer(trigger=TrainingTrigger(handle.model_dump(mode="json"), state_db=settings().state_db,
                                           poll_interval_s=self.poll_interval_s, deadline=deadline),
                   method_name="execute_complete")
        raise AssertionError("defer() returns only by raising")  # pragma: no cover

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        self.log.info("training watch ended: %s — %s", event["status"], event.get("message", ""))
        return event["run_status"]

    def on_kill(self) -> None:  # the task is killed, not the training: re-attach on retry
        self.log.info("watch_training killed; the gang keeps running and a retry re-attaches")


class WatchCheckpointsSensor(BaseOperator):
    """Re-defers once per committed checkpoint: verify its SHA-256 hashes, record it in MLflow,
    apply the retention policy (never touching the newest valid one). Fails — an alarm the UI
    shows, training goes on — when saves stop landing for two checkpoint intervals."""

    ui_color = "#fcf3cf"

    def __init__(self, *, poll_interval_s: float = 3.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval_s = poll_interval_s

    def execute(self, context: Context, after_step: int | None = None) -> dict[str, Any]:
        from plugins.launch.environment import checkpoint_uri
        from plugins.recovery import watch
        from sensors.triggers import CheckpointTrigger

        job, conf = attempt_of(context)
        handle = _handle(context)
        config = settings()
        root = checkpoint_uri(job, config.object_store, conf.run)
        if after_step is None:  # the first look: what earlier attempts committed is not ours
            before = watch.committed_after(root, -1, endpoint_url=config.s3_endpoint_url)
            after_step = before[-1].step if before else -1
            self.log.info("watching checkpoints of run %s under %s after step %d", conf.run, root, after_step)
        for record in watch.committed_after(root, after_step, endpoint_url=config.s3_endpoint_url):
            self._record(context, root, record.manifest_uri, record.step)
            after_step = record.step
        status = watch.poll(handle)
        if status.finished:
            return {"last_step": after_step, "root": root}
        self.defer(trigger=CheckpointTrigger(
            handle.model_dump(mode="json"), checkpoint_root=root, after_step=after_step,
            interval_steps=job.spec.checkpoint.interval_steps, endpoint_url=config.s3_endpoint_url,
            poll_interval_s=self.poll_interval_s), method_name="execute_complete")
        raise AssertionError("defer() returns only by raising")  # pragma: no cover

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event["status"] == "overdue":
            raise AirflowException(f"checkpoint alarm: {event['message']}")
        # a new checkpoint or the end: record everything new since the trigger started, then
        # watch on (or finish)
        return self.execute(context, after_step=int(event["after_step"]))

    def _record(self, context: Context, root: str, manifest_uri: str, step: int) -> None:
        from plugins.checkpoint.catalog import verify
        from plugins.checkpoint.retention import RetentionPolicy, apply_retention
        from plugins.tracking.runs import log_committed_checkpoint

        job, _ = attempt_of(context)
        config = settings()
        started = time.monotonic()
        result = verify(root, step, endpoint_url=config.s3_endpoint_url)
        if not result.ok:
            self.log.error("checkpoint step %d does NOT verify: %s", step, "; ".join(result.problems))
            return
        mlflow_run_id = context["ti"].xcom_pull(task_ids=LAUNCH, key="mlflow_run_id")
        if mlflow_run_id:
            log_committed_checkpoint(mlflow_run_id, manifest_uri, tracking_uri=config.mlflow_tracking_uri,
                                     endpoint_url=config.s3_endpoint_url)
        report = apply_retention(root, RetentionPolicy.from_spec(job.spec.checkpoint), known_valid=step,
                                 endpoint_url=config.s3_endpoint_url)
        self.log.info("checkpoint step %d verified and recorded in %.1fs; retention deleted %s",
                      step, time.monotonic() - started, sorted(report.deleted) or "nothing")


class WatchHealthSensor(BaseOperator):
    """Polls the node agents of the gang's nodes (`TRAINYARD_NODE_AGENTS`); a fatal GPU verdict,
    or an agent that misses three polls, stops the gang with the reason `node_lost`."""

    ui_color = "#fcf3cf"

    def __init__(self, *, poll_interval_s: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval_s = poll_interval_s

    def execute(self, context: Context) -> dict[str, Any]:
        from plugins.recovery import watch
        from sensors.triggers import HealthTrigger

        handle = _handle(context)
        nodes = handle.nodes or sorted({a.node for a in handle.agents})
        agents = {n: u for n, u in settings().node_agents.items() if n in nodes}
        if not agents:
            self.log.warning("no node agent is configured for %s (TRAINYARD_NODE_AGENTS): GPU health "
                             "is not watched for this attempt", ", ".join(nodes))
            return {"watched": []}
        if watch.poll(handle).finished:
            return {"watched": sorted(agents)}
        self.defer(trigger=HealthTrigger(handle.model_dump(mode="json"), agents=agents,
                                         poll_interval_s=self.poll_interval_s),
                   method_name="execute_complete")
        raise AssertionError("defer() returns only by raising")  # pragma: no cover

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        self.log.info("health watch ended: %s — %s", event["status"], event.get("message", ""))
        return {"status": event["status"], "message": event.get("message", ""), "nodes": event.get("nodes", [])}

