"""The triggers behind the deferrable sensors (they live outside `dags/`, as Airflow requires).

A trigger runs in the triggerer's event loop, so every engine call (a launcher's poll, the object
store, the state database, a node agent over HTTP) goes through `asyncio.to_thread` — except a
Kubernetes attempt's poll, made on the loop through the provider's `AsyncKubernetesHook`. Each trigger
re-attaches from the `RunHandle` alone — the launcher is the handle's (`launcher_for`) — so
restarting the triggerer (or Airflow) re-creates it from `serialize()` and it carries on; it never
holds a worker slot while training runs.

Events carry `{"status": ..., "message": ...}` plus the facts the sensor needs; the sensor's
`execute_complete` decides what to do with them (Airflow's provider habit). A trigger whose own
code raises reports it as one `error` event — the exception's class, message and stack trace, as
the cncf-kubernetes provider's triggers do — and its task fails with them (`sensors/watch.py`),
instead of the triggerer logging the exception while the task waits for an event that never comes.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from trainyard.plugins.run.rules import MISSED_HEARTBEATS_LOST

if TYPE_CHECKING:
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.run.model import RunHandle, RunStatus


def _runtime() -> Runtime:
    from trainyard.operators.common import runtime

    return runtime()


async def _poll_on_the_loop(handle: RunHandle) -> RunStatus | None:
    """A Kubernetes attempt's poll through the cncf-kubernetes provider's `AsyncKubernetesHook`
    (the Volcano Job, its pods, their exit codes and nodes): no thread, no sync client on the
    triggerer. None for the other launchers: the engine polls them in its thread."""
    if handle.kind != "kubernetes":
        return None
    from trainyard.operators.kubernetes_clients import poll_with_async_hook

    return await poll_with_async_hook(handle)


async def reported(events: AsyncIterator[TriggerEvent]) -> AsyncIterator[TriggerEvent]:
    """`events`, or — when the trigger's own code raises — one `error` event saying what raised."""
    try:
        async for event in events:
            yield event
    except Exception as e:  # noqa: BLE001 - every failure becomes the task's, with its class and trace
        yield TriggerEvent({"status": "error", "message": f"{type(e).__name__}: {e}",
                            "error_class": f"{type(e).__module__}.{type(e).__qualname__}",
                            "stack_trace": traceback.format_exc()})


class TrainingTrigger(BaseTrigger):
    """Loops over the attempt engine's `watch_once` until the attempt is over: the workers have
    all exited, or it stopped the gang (a hang, `training.maxRuntime`, a lost lease) with the
    reason. `watch` is the `WatchState` it carries (deadline, lease renewal).

    While it waits it logs a progress line (`watching.progress_line`: step, loss, tokens/s, each
    rank's phase) when the step moved, at most every `PROGRESS_EVERY_S`: the triggerer writes a
    trigger's log into its task's log, so `watch_training`'s page in Airflow shows the run
    moving instead of nothing until the end."""

    PROGRESS_EVERY_S = 10.0

    def __init__(self, handle: dict[str, Any], *, watch: dict[str, Any] | None = None,
                 poll_interval_s: float = 2.0) -> None:
        super().__init__()
        self.handle = handle
        self.watch = watch or {}
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("trainyard.sensors.triggers.TrainingTrigger", {
            "handle": self.handle, "watch": self.watch, "poll_interval_s": self.poll_interval_s})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for event in reported(self._events()):
            yield event

    async def _events(self) -> AsyncIterator[TriggerEvent]:
        from trainyard.plugins.attempt.watching import WatchState, progress_line, watch_once
        from trainyard.plugins.run.model import RunHandle

        handle, state, runtime = RunHandle.model_validate(self.handle), WatchState.model_validate(self.watch), _runtime()
        logged_step, logged_at = -1, 0.0
        while True:
            polled = await _poll_on_the_loop(handle)
            step = await asyncio.to_thread(watch_once, handle, state, runtime, status=polled)
            state = step.state
            now = time.monotonic()
            if (step.status.step or 0) > logged_step and now - logged_at >= self.PROGRESS_EVERY_S:
                self.log.info("%s", await asyncio.to_thread(progress_line, step.status, handle))
                logged_step, logged_at = step.status.step or 0, now
            if step.finished:
                yield TriggerEvent({"status": step.stop.reason if step.stop else "finished",
                                    "message": step.stop.detail if step.stop else step.status.message,
                                    "run_status": step.status.model_dump(mode="json")})
                return
            await asyncio.sleep(self.poll_interval_s)


class CheckpointTrigger(BaseTrigger):
    """Fires on each checkpoint committed after `after_step`, when the attempt ends, or when
    every rank is two checkpoint intervals past the newest checkpoint (saves are not landing)."""

    def __init__(self, handle: dict[str, Any], *, checkpoint_root: str, after_step: int,
                 interval_steps: int | None = None, endpoint_url: str | None = None,
                 poll_interval_s: float = 3.0) -> None:
        super().__init__()
        self.handle = handle
        self.checkpoint_root = checkpoint_root
        self.after_step = after_step
        self.interval_steps = interval_steps
        self.endpoint_url = endpoint_url
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("trainyard.sensors.triggers.CheckpointTrigger", {
            "handle": self.handle, "checkpoint_root": self.checkpoint_root, "after_step": self.after_step,
            "interval_steps": self.interval_steps, "endpoint_url": self.endpoint_url,
            "poll_interval_s": self.poll_interval_s})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for event in reported(self._events()):
            yield event

    async def _events(self) -> AsyncIterator[TriggerEvent]:
        from trainyard.plugins.attempt import watching
        from trainyard.plugins.run.model import RunHandle

        handle, runtime = RunHandle.model_validate(self.handle), _runtime()
        while True:
            status = await asyncio.to_thread(watching.poll, handle, runtime)
            new = await asyncio.to_thread(watching.committed_after, self.checkpoint_root, self.after_step,
                                          endpoint_url=self.endpoint_url)
            if new:
                yield TriggerEvent({"status": "checkpoint", "message": f"step {new[0].step} committed",
                                    "after_step": self.after_step, "step": new[0].step,
                                    "manifest_uri": new[0].manifest_uri})
                return
            if status.finished:
                yield TriggerEvent({"status": "finished", "message": status.message, "after_step": self.after_step})
                return
            if watching.checkpoint_overdue(status, self.after_step, self.interval_steps):
                yield TriggerEvent({"status": "overdue", "after_step": self.after_step, "message": (
                    f"every rank is past step {status.step} but the newest checkpoint is step "
                    f"{self.after_step}: more than 2 × {self.interval_steps} steps without a save")})
                return
            await asyncio.sleep(self.poll_interval_s)


class HealthTrigger(BaseTrigger):
    """Polls the node agents of the gang's nodes; on a fatal verdict (or `MISSED_HEARTBEATS_LOST` missed polls) it stops
    the gang with the reason and fires. Fires `finished` when the attempt ends on its own."""

    def __init__(self, handle: dict[str, Any], *, agents: dict[str, str], poll_interval_s: float = 5.0,
                 max_misses: int = MISSED_HEARTBEATS_LOST) -> None:
        super().__init__()
        self.handle = handle
        self.agents = agents
        self.poll_interval_s = poll_interval_s
        self.max_misses = max_misses

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("trainyard.sensors.triggers.HealthTrigger", {
            "handle": self.handle, "agents": self.agents, "poll_interval_s": self.poll_interval_s,
            "max_misses": self.max_misses})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for event in reported(self._events()):
            yield event

    async def _events(self) -> AsyncIterator[TriggerEvent]:
        from trainyard.plugins.attempt import watching
        from trainyard.plugins.run.model import RunHandle

        handle, runtime = RunHandle.model_validate(self.handle), _runtime()
        misses: dict[str, int] = {}
        answered: dict[str, float] = {}
        while True:
            started = time.monotonic()
            status = await asyncio.to_thread(watching.poll, handle, runtime)
            if status.finished:
                yield TriggerEvent({"status": "finished", "message": status.message})
                return
            lost = await asyncio.to_thread(watching.lost_nodes, handle, self.agents, misses=misses,
                                           max_misses=self.max_misses, answered=answered)
            if lost:
                reason = watching.node_lost_stop(lost, misses=misses, answered=answered)
                await asyncio.to_thread(watching.stop_gang, handle, reason, runtime)
                yield TriggerEvent({"status": "node_lost", "message": reason.detail, "nodes": reason.nodes})
                return
            # Polls every poll_interval_s from start to start: a silent agent's probe timeout
            # must not stretch the time between the misses that call its node lost.
            await asyncio.sleep(max(0.0, self.poll_interval_s - (time.monotonic() - started)))
