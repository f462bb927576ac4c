"""Watching a running attempt: what the deferrable sensors' triggers (and `trainyard launch`)
check on every poll, and the one way the control plane stops a gang for a reason.

Synchronous and Airflow-free: a trigger calls these through `asyncio.to_thread`. Each returns a
small verdict; stopping the gang is done here too, because whoever detects a hang or a lost
node must stop it the same way — with the reason written beside the run (`stop-reason.json`)
so `classify` can tell a hang or a lost node from a stop a person asked for.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from plugins.checkpoint.catalog import CheckpointRecord
    from plugins.launch.local import LocalLauncher
    from plugins.launch.model import RunHandle, RunStatus

STOP_REASON_FILE = "stop-reason.json"
FATAL_VERDICTS = ("gpu_failed", "node_unhealthy")
"""Node-agent verdicts that lose the node for this attempt (a thermal warning does not)."""


class StopReason(BaseModel):
    """Why the control plane stopped a gang (written before the stop, read by `classify`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: Literal["hang", "node_lost", "requested", "lease_lost", "timeout", "preempted"]
    """`preempted`: a higher-priority gang needed the devices (`plugins/recovery/preempt.py`)."""
    detail: str
    nodes: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)
    at: float = Field(default_factory=time.time)


def launcher_for(handle: RunHandle) -> LocalLauncher:
    """A launcher that can poll and stop `handle` from any process."""
    if handle.kind != "local":
        raise NotImplementedError("watching Kubernetes runs from Airflow is not built yet "
                                  "(KubernetesLauncher.poll exists; no trigger uses it)")
    from plugins.launch.local import LocalLauncher

    return LocalLauncher(Path(handle.run_dir).parents[2])


def poll(handle: RunHandle) -> RunStatus:
    return launcher_for(handle).poll(handle)


def read_stop_reason(run_dir: str | Path) -> StopReason | None:
    try:
        return StopReason.model_validate_json((Path(run_dir) / STOP_REASON_FILE).read_text())
    except (OSError, ValueError):
        return None


def stop_gang(handle: RunHandle, reason: StopReason, *, grace_s: float = 10.0) -> RunStatus:
    """Record why, then stop every process of the attempt (SIGTERM, then SIGKILL); settled."""
    path = Path(handle.run_dir) / STOP_REASON_FILE
    if not path.exists():  # the first reason stands (a hang seen twice is still the first hang)
        from plugins.files import write_atomic

        write_atomic(path, reason.model_dump_json())
    return launcher_for(handle).stop(handle, grace_s=grace_s)


def hung_ranks(status: RunStatus) -> list[int]:
    """Ranks alive without step progress for longer than the job's `hangTimeout`."""
    return [r.rank for r in status.ranks if r.hung]


def hang_stop(status: RunStatus) -> StopReason | None:
    """The stop a hang calls for — the reason naming the hung ranks — or None when no rank
    hangs. Whoever follows a gang (the trigger, `trainyard launch`) stops it with this."""
    hung = hung_ranks(status)
    if not hung:
        return None
    return StopReason(reason="hang", ranks=hung,
                      detail=f"ranks {hung} made no step progress for longer than the job's "
                             f"hangTimeout (last step {status.step})")


def settle(handle: RunHandle, status: RunStatus) -> RunStatus:
    """Clean up what a finished attempt left running (a peer waiting in torchrun's barrier)."""
    return launcher_for(handle).settle(handle, status)


def committed_after(root: str, after_step: int, *, endpoint_url: str | None = None) -> list[CheckpointRecord]:
    """Checkpoints of the run committed after `after_step`, oldest first."""
    from plugins.checkpoint.catalog import list_checkpoints

    return [r for r in list_checkpoints(root, endpoint_url=endpoint_url) if r.step > after_step]


def checkpoint_overdue(status: RunStatus, last_step: int, interval_steps: int | None) -> bool:
    """Every rank is more than two intervals past the newest checkpoint: saves are not landing."""
    return bool(interval_steps) and status.step is not None and status.step > last_step + 2 * interval_steps


def lost_nodes(handle: RunHandle, agents: dict[str, str], *, misses: dict[str, int], max_misses: int = 3
               ) -> list[tuple[str, str]]:
    """(node, why) for each node of the gang whose agent reports a fatal verdict or missed
    `max_misses` polls in a row (`misses` carries the count between polls). One probe and one
    judgement per node: `evidence.observe_node` and `NodeObservation.fatal_reasons`, the same
    ones `classify` reads (an agent that answers with garbage is alive: not a missed beat)."""
    from plugins.recovery.evidence import observe_node

    lost = []
    for node in handle.nodes or sorted({a.node for a in handle.agents}):
        url = agents.get(node)
        if not url:
            continue
        seen = observe_node(node, url, missed_before=misses.get(node, 0), timeout=3.0)
        misses[node] = seen.missed_heartbeats
        reasons = seen.fatal_reasons(max_misses=max_misses)
        if reasons:
            lost.append((node, "; ".join(reasons)))
    return lost


def describe_status(status: RunStatus) -> dict[str, object]:
    """The few facts a sensor's log line shows."""
    return json.loads(status.model_dump_json(include={"state", "message", "step", "exit_code", "failed_rank"}))
