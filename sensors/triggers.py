"""The triggers behind the deferrable sensors (they live outside `dags/`, as Airflow requires).

A trigger runs in the triggerer's event loop, so every engine call (reading `/proc`, the object
store, the state database, a node agent over HTTP) goes through `asyncio.to_thread`. Each trigger
re-attaches from the `RunHandle` alone: restarting the triggerer (or Airflow) re-creates it from
`serialize()` and it carries on; it never holds a worker slot while training runs.

Events carry `{"status": ..., "message": ...}` plus the facts the sensor needs; the sensor's
`execute_complete` decides what to do with them (Airflow's provider habit).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class TrainingTrigger(BaseTrigger):
    """Fires when the attempt's workers have all exited, or when a rank hangs or the attempt
    outlives `deadline` (`training.maxRuntime`) — then it stops the gang first, with the reason.
    Renews the gang's reservation while it waits."""

    def __init__(self, handle: dict[str, Any], *, state_db: str = "", lease_s: float = 900.0,
                 poll_interval_s: float = 2.0, deadline: float | None = None) -> None:
        super().__init__()
        self.handle = handle
        self.state_db = state_db
        self.lease_s = lease_s
        self.poll_interval_s = poll_interval_s
        self.deadline = deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("sensors.triggers.TrainingTrigger", {
            "handle": self.handle, "state_db": self.state_db, "lease_s": self.lease_s,
            "poll_interval_s": self.poll_interval_s, "deadline": self.deadline})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from plugins.launch.model import RunHandle
        from plugins.recovery import watch

        handle = RunHandle.model_validate(self.handle)
        last_renew = 0.0
        while True:
            status = await asyncio.to_thread(watch.poll, handle)
            if status.finished:
                status = await asyncio.to_thread(watch.settle, handle, status)
                yield TriggerEvent({"status": "finished", "message": status.message,
                                    "run_status": status.model_dump(mode="json")})
                return
            reason = watch.hang_stop(status)
            if reason is None and self.deadline is not None and time.time() > self.deadline:
                reason = watch.StopReason(reason="timeout", detail="the attempt outlived training.maxRuntime")
            if reason is not None:
                status = await asyncio.to_thread(watch.stop_gang, handle, reason)
                yield TriggerEvent({"status": reason.reason, "message": reason.detail,
                                    "run_status": status.model_dump(mode="json")})
                return
            if self.state_db and time.monotonic() - last_renew > min(60.0, self.lease_s / 3):
                if await asyncio.to_thread(_renew, self.state_db, handle, self.lease_s) is None:
                    reason = watch.StopReason(reason="lease_lost", detail="the gang's reservation expired")
                    status = await asyncio.to_thread(watch.stop_gang, handle, reason)
                    yield TriggerEvent({"status": "lease_lost", "message": reason.detail,
                                        "run_status": status.model_dump(mode="json")})
                    return
                last_renew = time.monotonic()
            await asyncio.sleep(self.poll_interval_s)


def _renew(state_db: str, handle: Any, lease_s: float) -> object:
    from plugins.placement.state import open_state

    return open_state(state_db).renew(handle.job, handle.attempt, run=handle.run, lease_s=lease_s)


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
        return ("sensors.triggers.CheckpointTrigger", {
            "handle": self.handle, "checkpoint_root": self.checkpoint_root, "after_step": self.after_step,
            "interval_steps": self.interval_steps, "endpoint_url": self.endpoint_url,
            "poll_interval_s": self.poll_interval_s})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from plugins.launch.model import RunHandle
        from plugins.recovery import watch

        handle = RunHandle.model_validate(self.handle)
        while True:
            status = await asyncio.to_thread(watch.poll, handle)
            new = await asyncio.to_thread(watch.committed_after, self.checkpoint_root, self.after_step,
                                          endpoint_url=self.endpoint_url)
            if new:
                yield TriggerEvent({"status": "checkpoint", "message": f"step {new[0].step} committed",
                                    "after_step": self.after_step, "step": new[0].step,
                                    "manifest_uri": new[0].manifest_uri})
                return
            if status.finished:
                yield TriggerEvent({"status": "finished", "message": status.message, "after_step": self.after_step})
                return
            if watch.checkpoint_overdue(status, self.after_step, self.interval_steps):
                yield TriggerEvent({"status": "overdue", "after_step": self.after_step, "message": (
                    f"every rank is past step {status.step} but the newest checkpoint is step "
                    f"{self.after_step}: more than 2 × {self.interval_steps} steps without a save")})
                return
            await asyncio.sleep(self.poll_interval_s)


class HealthTrigger(BaseTrigger):
    """Polls the node agents of the gang's nodes; on a fatal verdict (or 3 missed polls) it stops
    the gang with the reason and fires. Fires `finished` when the attempt ends on its own."""

    def __init__(self, handle: dict[str, Any], *, agents: dict[str, str], poll_interval_s: float = 5.0,
                 max_misses: int = 3) -> None:
        super().__init__()
        self.handle = handle
        self.agents = agents
        self.poll_interval_s = poll_interval_s
        self.max_misses = max_misses

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("sensors.triggers.HealthTrigger", {
            "handle": self.handle, "agents": self.agents, "poll_interval_s": self.poll_interval_s,
            "max_misses": self.max_misses})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from plugins.launch.model import RunHandle
        from plugins.recovery import watch

        handle = RunHandle.model_validate(self.handle)
        misses: dict[str, int] = {}
        while True:
            status = await asyncio.to_thread(watch.poll, handle)
            if status.finished:
                yield TriggerEvent({"status": "finished", "message": status.message})
                return
            lost = await asyncio.to_thread(watch.lost_nodes, handle, self.agents, misses=misses,
                                           max_misses=self.max_misses)
            if lost:
                reason = watch.StopReason(reason="node_lost", nodes=[n for n, _ in lost],
                                          detail="; ".join(f"{n}: {why}" for n, why in lost))
                await asyncio.to_thread(watch.stop_gang, handle, reason)
                yield TriggerEvent({"status": "node_lost", "message": reason.detail,
                                    "nodes": reason.nodes})
                return
            await asyncio.sleep(self.poll_interval_s)
