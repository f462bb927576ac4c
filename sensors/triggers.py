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

**A person's decision against a restart.** Airflow 3.3's triggerer calls a trigger's `on_kill()`
only when a person acted on the deferred task (marked it — or its DAG run — failed or succeeded,
or cleared it), never when the triggerer stops, restarts or hands the trigger to another one (then
the trigger is only cancelled, and re-created from `serialize()`). The cncf-kubernetes provider
deletes its pod there; `TrainingTrigger.on_kill` stops the gang (emergency checkpoint first) when
the task or its DAG run now reads `failed`: a cleared watcher re-attaches instead, and a restart
of Airflow's parts never stops training.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
import weakref
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


_ENDED: weakref.WeakValueDictionary[tuple[object, ...], asyncio.Event] = weakref.WeakValueDictionary()
"""Per attempt, what its checkpoint and health watchers nap on in this triggerer's event loop:
set when the attempt's training watcher has seen it end (`attempt_ended`). `classify_outcome`
waits for all three watchers, and on their own the other two saw the end only at their next
poll — up to 3 s and 5 s later (in the end-to-end recovery tests' trigger logs the health watch
fired 0.9–4.0 s after the training watch in 5 of 8 attempts; woken, within 0.02 s). Held by the
watchers that nap on it, so an attempt nobody waits on leaves nothing behind; in another
triggerer process they simply poll at their own pace, as before."""


def _attempt_key(handle: dict[str, Any]) -> tuple[object, ...]:
    return tuple(handle.get(k) for k in ("kind", "job", "run", "attempt", "created_at", "run_dir", "uid"))


def _ended(handle: dict[str, Any]) -> asyncio.Event:
    key = _attempt_key(handle)
    event = _ENDED.get(key)
    if event is None:
        _ENDED[key] = event = asyncio.Event()
    return event


def attempt_ended(handle: dict[str, Any]) -> None:
    """The attempt of `handle` is over (its training watcher saw it end): wake the attempt's
    other watchers napping in this event loop, so they look now instead of at their next poll."""
    event = _ENDED.get(_attempt_key(handle))
    if event is not None:
        event.set()


async def nap(handle: dict[str, Any], seconds: float) -> None:
    """`asyncio.sleep(seconds)`, cut short when the attempt's training watcher sees it end."""
    event = _ended(handle)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=max(0.0, seconds))


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
    moving instead of nothing until the end. A gang that waits to start (on Kueue: in its team's
    queue) says why on the DAG run's note, each time the reason changes (`watching.waiting_note`)."""

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
        from trainyard.plugins.attempt.watching import (
            WatchState,
            progress_line,
            waiting_note,
            watch_once,
        )
        from trainyard.plugins.run.model import RunHandle

        handle, state, runtime = RunHandle.model_validate(self.handle), WatchState.model_validate(self.watch), _runtime()
        logged_step, logged_at, noted = -1, 0.0, ""
        while True:
            polled = await _poll_on_the_loop(handle)
            step = await asyncio.to_thread(watch_once, handle, state, runtime, status=polled)
            state, handle = step.state, step.handle or handle
            if not step.finished and (note := waiting_note(step.status, handle.attempt, noted)):
                self.log.info("%s", note)
                noted = note
                await asyncio.to_thread(self._note, note)
            now = time.monotonic()
            if (step.status.step or 0) > logged_step and now - logged_at >= self.PROGRESS_EVERY_S:
                self.log.info("%s", await asyncio.to_thread(progress_line, step.status, handle))
                logged_step, logged_at = step.status.step or 0, now
            if step.finished:
                attempt_ended(self.handle)
                yield TriggerEvent({"status": step.stop.reason if step.stop else "finished",
                                    "message": step.stop.detail if step.stop else step.status.message,
                                    "run_status": step.status.model_dump(mode="json")})
                return
            await asyncio.sleep(self.poll_interval_s)

    def _note(self, note: str) -> None:
        """The DAG run's note (a gang waiting in its queue says why there, not only in this log)."""
        ti = self.task_instance
        if ti is not None:
            from trainyard.operators.common import write_note

            write_note(ti.dag_id, ti.run_id, note)

    async def on_kill(self) -> None:
        """A person acted on `watch_training` or its DAG run (module docstring): when either now
        reads `failed`, stop the gang as `trainyard stop` does and say so on the DAG run's note.

        The work runs to its end whatever happens to this coroutine: the triggerer cancels a
        trigger it no longer wants again on every loop while `on_kill` runs (seen on the shared
        stack: the first stop was cut off after 0.45 s, its note never written), so the stop is
        shielded and bounded instead — by `STOP_GRACE_S` and the API calls' own patience."""
        ti = self.task_instance
        if ti is None:
            return
        work = asyncio.ensure_future(asyncio.to_thread(self._stop_if_marked_failed, ti.dag_id, ti.run_id, ti.task_id))
        while not work.done():
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                continue  # asked again to stop what is already stopping: let it finish

    def _stop_if_marked_failed(self, dag_id: str, run_id: str, task_id: str) -> None:
        from trainyard.plugins.run.model import RunHandle

        handle = RunHandle.model_validate(self.handle)
        try:
            why = marked_failed(dag_id, run_id, task_id)
            if not why:
                self.log.info("watch_training was acted on, but it is not failed: the gang of %s run %s attempt %d "
                              "trains on (a cleared watcher re-attaches)", handle.job, handle.run, handle.attempt)
                return
            self.log.info("%s: stopping the gang of %s run %s attempt %d", why, handle.job, handle.run, handle.attempt)
            note = stop_marked_failed(handle, why, _runtime())
            if note:
                from trainyard.operators.common import write_note

                write_note(dag_id, run_id, note)
            self.log.info("stopped: %s", note or "nothing of this attempt was live")
            if why.startswith("its DAG run"):
                keep_marked_failed(dag_id, run_id)
        except Exception:
            self.log.exception("the gang of %s run %s attempt %d could not be stopped; `trainyard stop %s --run %s` "
                               "stops it", handle.job, handle.run, handle.attempt, handle.job, handle.run)


def marked_failed(dag_id: str, run_id: str, task_id: str) -> str:
    """What a person marked failed — the DAG run, or its watcher task alone — in words; '' when
    the watcher is not failed (cleared, or marked succeeded). A DAG run marked failed keeps
    reading `running` until its teardown (`release_gang`) has run, but its pending tasks are
    skipped at once: `classify_outcome` skipped tells it from the watcher marked alone (then
    `classify_outcome` runs). Asked of Airflow's REST API, as every other read of Airflow here."""
    from trainyard.operators.outcome import CLASSIFY
    from trainyard.plugins.airflow_api import AirflowClient

    tasks = AirflowClient.of(_runtime().settings, patience_s=10).task_instances(dag_id, run_id)
    if tasks.get(task_id, {}).get("state") != "failed":
        return ""
    if tasks.get(CLASSIFY, {}).get("state") == "skipped":
        return f"its DAG run {run_id} was marked failed in Airflow"
    return f"its {task_id} task was marked failed in Airflow"


FINAL_DAG_RUN_WAIT_S = 300.0
"""How long `keep_marked_failed` waits for the DAG run's teardown to end it."""


def keep_marked_failed(dag_id: str, run_id: str) -> None:
    """A DAG run marked failed stays as the person marked it. Airflow 3.3 does not set the state
    of a DAG run marked failed while a teardown (`release_gang`) is still to run, and once the
    teardown has run the scheduler reads the leaves — all skipped — as success (seen on the
    shared stack: a green DAG run whose note said cancelled). So wait for its end, and mark it
    failed again where it ended `success`: with nothing left to run, the mark holds."""
    from trainyard.plugins.airflow_api import AirflowClient

    client = AirflowClient.of(_runtime().settings, patience_s=30)
    deadline = time.monotonic() + FINAL_DAG_RUN_WAIT_S
    while time.monotonic() < deadline:
        state = client.dag_run(dag_id, run_id).get("state")
        if state == "success":
            client.set_state(dag_id, run_id, "failed")
            return
        if state == "failed":
            return
        time.sleep(2.0)


STOP_GRACE_S = 20.0
"""SIGTERM to SIGKILL when a person's decision stops a gang from the triggerer: the emergency
checkpoint's time, inside the triggerer's 30 s `on_kill_timeout`."""


def stop_marked_failed(handle: RunHandle, why: str, runtime: Runtime) -> str:
    """Stop the attempt's gang (only while it is the run's live attempt) and return the note
    its DAG run should carry ('' when nothing was stopped)."""
    from trainyard.plugins.attempt.stop import stop_run
    from trainyard.plugins.state.jobs import open_job_state

    result = stop_run(open_job_state(runtime.settings.state_db), handle.job, runtime, handle.run,
                      grace_s=STOP_GRACE_S, detail=why, attempt=handle.attempt)
    if result.attempt is None:
        return ""
    step = f" at step {result.status.step}" if result.status is not None and result.status.step is not None else ""
    return f"attempt {result.attempt}: cancelled{step} → cancelled: {result.run.final_reason}"


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
            await nap(self.handle, self.poll_interval_s)


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
            await nap(self.handle, self.poll_interval_s - (time.monotonic() - started))
