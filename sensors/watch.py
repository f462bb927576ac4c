"""The three deferrable watchers of a running attempt (DESIGN §4): training, checkpoints, health.

Each checks once and finishes at once when its condition already holds (DESIGN §9: a trigger
that fires within a second of `defer()` can be marked failed by Airflow itself), else defers to
its trigger in `sensors/triggers.py` and holds no worker slot while training runs. Each re-reads
the `RunHandle` from `launch_training`'s XCom, so a retry or a restarted Airflow re-attaches to
the same processes. What a watcher concludes is data for `classify_outcome`; none of them fails
the attempt by failing itself, except the checkpoint alarm, which is meant to be seen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from trainyard.operators.common import opened_of, pull, runtime, settings
from trainyard.operators.launch import LAUNCH

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainyard.plugins.run.model import RunHandle

WATCH_TRAINING = "watch_training"


class TriggerFailed(AirflowException):
    """The watcher's trigger failed in its own code (an `error` event from `triggers.reported`),
    not the training: its exception's class and message, and the triggerer's stack trace."""


def raise_trigger_error(event: dict[str, Any]) -> None:
    """Fail the task with the trigger's own failure, where the event is one."""
    if event.get("status") == "error":
        raise TriggerFailed(f"the trigger failed: {event.get('error_class', 'an exception')}: "
                            f"{event.get('message', '')}\n{event.get('stack_trace', '')}")


def _handle(context: Context) -> RunHandle:
    from trainyard.plugins.run.model import RunHandle

    return pull(context, LAUNCH, RunHandle)


class WatchTrainingSensor(BaseOperator):
    """Until every worker has exited, or a rank hangs past `hangTimeout`, or `training.maxRuntime`
    passes, or the reservation's lease is lost (the gang is stopped, with the reason). Renews the
    reservation meanwhile. Pushes the final `RunStatus`."""

    ui_color = "#fcf3cf"

    def __init__(self, *, poll_interval_s: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval_s = poll_interval_s

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import watch_state
        from trainyard.plugins.attempt.watching import progress_line, watch_once
        from trainyard.sensors.triggers import TrainingTrigger

        handle = _handle(context)
        step = watch_once(handle, watch_state(opened_of(context), handle), runtime())
        handle = step.handle or handle
        if step.finished:
            return step.status.model_dump(mode="json")
        self.log.info("watching %s run %s attempt %d: %s", handle.job, handle.run, handle.attempt,
                      progress_line(step.status, handle))
        self.defer(trigger=TrainingTrigger(handle.model_dump(mode="json"), watch=step.state.model_dump(),
                                           poll_interval_s=self.poll_interval_s),
                   method_name="execute_complete")
        raise AssertionError("defer() returns only by raising")  # pragma: no cover

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        raise_trigger_error(event)
        from trainyard.plugins.attempt.watching import progress_line
        from trainyard.plugins.run.model import RunStatus

        final = RunStatus.model_validate(event["run_status"])
        self.log.info("training watch ended: %s — %s · %s", event["status"], event.get("message", ""),
                      progress_line(final, _handle(context)))
        return event["run_status"]

    def on_kill(self) -> None:  # the task is killed, not the training: re-attach on retry
        self.log.info("watch_training killed; the gang keeps running and a retry re-attaches")


class WatchCheckpointsSensor(BaseOperator):
    """Re-defers once per committed checkpoint: verify its SHA-256 hashes and record it in MLflow
    (the worker already recorded it and applied retention at the commit: both idempotent). Fails
    — an alarm the UI shows, training goes on — when saves stop landing for two checkpoint
    intervals."""

    ui_color = "#fcf3cf"

    def __init__(self, *, poll_interval_s: float = 3.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval_s = poll_interval_s

    def execute(self, context: Context, after_step: int | None = None) -> dict[str, Any]:
        from trainyard.plugins.attempt import watching
        from trainyard.plugins.attempt.steps import checkpoint_committed, checkpoints_root
        from trainyard.sensors.triggers import CheckpointTrigger

        opened, rt, handle = opened_of(context), runtime(), _handle(context)
        root, endpoint = checkpoints_root(opened, rt), settings().s3_endpoint_url
        if after_step is None:  # the first look: what earlier attempts committed is not ours
            before = watching.committed_after(root, -1, endpoint_url=endpoint)
            after_step = before[-1].step if before else -1
            self.log.info("watching checkpoints of run %s under %s after step %d", opened.conf.run, root, after_step)
        mlflow_run_id = context["ti"].xcom_pull(task_ids=LAUNCH, key="mlflow_run_id") or ""
        for record in watching.committed_after(root, after_step, endpoint_url=endpoint):
            seen = checkpoint_committed(opened, record.step, record.manifest_uri, rt, mlflow_run_id=mlflow_run_id)
            if seen.verified:
                self.log.info("checkpoint step %d verified and recorded", seen.step)
            elif seen.retired:
                self.log.info("checkpoint step %d already deleted by the worker's retention", seen.step)
            else:
                self.log.error("checkpoint step %d does NOT verify: %s", seen.step, "; ".join(seen.problems))
            after_step = record.step
        if watching.poll(handle, rt).finished:
            return {"last_step": after_step, "root": root}
        self.defer(trigger=CheckpointTrigger(
            handle.model_dump(mode="json"), checkpoint_root=root, after_step=after_step,
            interval_steps=opened.job.spec.checkpoint.interval_steps, endpoint_url=endpoint,
            poll_interval_s=self.poll_interval_s), method_name="execute_complete")
        raise AssertionError("defer() returns only by raising")  # pragma: no cover

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        raise_trigger_error(event)
        if event["status"] == "overdue":
            raise AirflowException(f"checkpoint alarm: {event['message']}")
        # a new checkpoint or the end: record everything new since the trigger started, then
        # watch on (or finish)
        return self.execute(context, after_step=int(event["after_step"]))


class WatchHealthSensor(BaseOperator):
    """Polls the node agents of the gang's nodes (`TRAINYARD_NODE_AGENTS`); a fatal GPU verdict,
    or an agent that misses three polls, stops the gang with the reason `node_lost`."""

    ui_color = "#fcf3cf"

    def __init__(self, *, poll_interval_s: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.poll_interval_s = poll_interval_s

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt import watching
        from trainyard.sensors.triggers import HealthTrigger

        handle = _handle(context)
        nodes = handle.gang_nodes
        agents = watching.node_agents(handle, runtime())
        if not agents:
            self.log.warning("no node agent found for %s (TRAINYARD_NODE_AGENTS, or the nodes' addresses on "
                             "Kubernetes): GPU health is not watched for this attempt", ", ".join(nodes))
            return {"watched": []}
        if watching.poll(handle, runtime()).finished:
            return {"watched": sorted(agents)}
        self.defer(trigger=HealthTrigger(handle.model_dump(mode="json"), agents=agents,
                                         poll_interval_s=self.poll_interval_s),
                   method_name="execute_complete")
        raise AssertionError("defer() returns only by raising")  # pragma: no cover

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        raise_trigger_error(event)
        self.log.info("health watch ended: %s — %s", event["status"], event.get("message", ""))
        return {"status": event["status"], "message": event.get("message", ""), "nodes": event.get("nodes", [])}
