"""Watching a running attempt: what the deferrable sensors' triggers and `trainyard launch`
check on every poll, and the one way the control plane stops a gang for a reason.

`watch_once(handle, state, runtime)` is one look at the training: the launcher's status, and —
when a rank hangs past `hangTimeout`, the attempt outlives `training.maxRuntime` or the
reservation's lease is lost — the stop, with its reason. The training trigger and
`trainyard launch` loop over it, so they cannot watch differently.

Synchronous and Airflow-free: a trigger calls these through `asyncio.to_thread`. Whoever stops
a gang stops it here (`stop_gang`): the reason is written beside the run (`stop-reason.json`)
before the stop, so `classify` tells a hang or a lost node from a stop a person asked for.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from trainyard.plugins.attempt.launchers import Runtime, launcher_for
from trainyard.plugins.run.model import RunHandle, RunStatus
from trainyard.plugins.run.records import STOP_REASON_FILE, StopReason, read_model
from trainyard.plugins.run.rules import MISSED_HEARTBEATS_LOST
from trainyard.plugins.state.reservations import RENEW_EVERY_S, RESERVATION_LEASE_S

if TYPE_CHECKING:
    from trainyard.plugins.checkpoint.catalog import CheckpointRecord


class WatchState(BaseModel):
    """What one look at the training carries to the next (a trigger serialises it)."""

    model_config = ConfigDict(frozen=True)

    deadline: float | None = None
    """Epoch seconds past which the attempt is stopped (`training.maxRuntime`, `--timeout-s`)."""
    deadline_reason: str = "the attempt outlived training.maxRuntime"
    renew_lease: bool = True
    """Renew the gang's reservation while it runs (off where nothing reserved it)."""
    last_renew: float = 0.0
    """Monotonic seconds of the last renewal in this process (0: renew at the first look)."""


class WatchStep(BaseModel):
    """One look: the status, and — when the attempt is over — why (`stop`: the control plane
    stopped it; None with `finished`: the workers ended on their own)."""

    model_config = ConfigDict(frozen=True)

    status: RunStatus
    finished: bool
    stop: StopReason | None = None
    state: WatchState
    handle: RunHandle | None = None
    """The handle as this look found the gang bound (`RunHandle.bound`): the one to watch on
    with; None where it did not change."""


def poll(handle: RunHandle, runtime: Runtime) -> RunStatus:
    return launcher_for(handle, runtime).poll(handle)


def settle(handle: RunHandle, status: RunStatus, runtime: Runtime) -> RunStatus:
    """Clean up what a finished attempt left running (a peer waiting in torchrun's barrier)."""
    return launcher_for(handle, runtime).settle(handle, status)


def read_stop_reason(run_dir: str | Path) -> StopReason | None:
    return read_model(Path(run_dir) / STOP_REASON_FILE, StopReason, lenient=True)


def stop_gang(handle: RunHandle, reason: StopReason, runtime: Runtime, *, grace_s: float = 10.0) -> RunStatus:
    """Record why, then stop every process of the attempt (SIGTERM, then SIGKILL); settled."""
    path = Path(handle.run_dir) / STOP_REASON_FILE if handle.run_dir else None
    if path is not None and not path.exists():  # the first reason stands (a hang seen twice is still the first)
        reason.write(path)
    lost = reason.nodes if reason.reason == "node_lost" else []
    return launcher_for(handle, runtime).stop(handle, grace_s=grace_s, lost_nodes=lost)


def hung_ranks(status: RunStatus, handle: RunHandle | None = None) -> list[int]:
    """The ranks to blame for a hang: of those alive without step progress for longer than the
    job's `hangTimeout` (once one rank stalls, every rank does at its next collective), the
    ones `trainyard.plugins.run.rules.hang_culprits` blames — frozen (no sign of life in their
    heartbeat files either) or lagging; all of them where nothing tells them apart.

    A culprit is blamed once its own last progress is older than `hangTimeout`, as the node
    agent's `hang_verdicts` does: the first rank to cross the timeout is often a peer that
    finished the same step a moment before the culprit froze, and stopping then would name a
    rank that had not yet been without progress for `hangTimeout` (a detection time under the
    timeout). The culprit crosses it within that moment: a frozen rank's progress never moves."""
    if not any(r.hung for r in status.ranks):
        return []
    from trainyard.plugins.run.heartbeat import read_heartbeats
    from trainyard.plugins.run.rules import hang_culprits, stalled_ranks

    ranks = [r.rank for r in status.ranks]
    beats = read_heartbeats(handle.heartbeat_dir, ranks) if handle and handle.heartbeat_dir else {}
    now = time.time()
    culprits = hang_culprits(stalled_ranks(status.ranks, {rank: beat.frozen(now) for rank, beat in beats.items()}))
    stale = {r.rank for r in status.ranks if r.hung}
    return [rank for rank in culprits if rank in stale]


def hang_stop(status: RunStatus, handle: RunHandle | None = None) -> StopReason | None:
    """The stop a hang calls for — the reason naming the ranks to blame — or None when no rank hangs."""
    hung = hung_ranks(status, handle)
    if not hung:
        return None
    from trainyard.plugins.run.model import stillness

    last = f"last step {status.step}" if status.step is not None else "a plain script, watched by its activity"
    return StopReason(reason="hang", ranks=hung,
                      detail=f"ranks {hung} {stillness(status.hang_signal)} for longer than the job's "
                             f"hangTimeout ({last})")


def watch_once(handle: RunHandle, state: WatchState, runtime: Runtime, *, grace_s: float = 10.0,
               status: RunStatus | None = None) -> WatchStep:
    """One look at the training (see the module docstring). A finished attempt is settled; a
    hang, a passed deadline or a lost lease stops the gang first, with the reason. `status` is
    the launcher's poll where the caller made it already (the training trigger polls a Kubernetes
    attempt through the provider's async hook, on the triggerer's event loop)."""
    status = status if status is not None else poll(handle, runtime)
    bound = record_bound(handle, status, runtime)
    handle = bound or handle
    if status.finished:
        return WatchStep(status=settle(handle, status, runtime), finished=True, state=state, handle=bound)
    stop = hang_stop(status, handle)
    if stop is None and state.deadline is not None and time.time() > state.deadline:
        stop = StopReason(reason="timeout", detail=state.deadline_reason)
    if stop is None and state.renew_lease and time.monotonic() - state.last_renew > RENEW_EVERY_S:
        from trainyard.plugins.state.reservations import open_state

        renewed = open_state(runtime.settings.state_db).renew(handle.job, handle.attempt, run=handle.run,
                                                              lease_s=RESERVATION_LEASE_S)
        if renewed is None:
            stop = StopReason(reason="lease_lost", detail="the gang's reservation expired")
        state = state.model_copy(update={"last_renew": time.monotonic()})
    if stop is not None:
        status = stop_gang(handle, stop, runtime, grace_s=grace_s)
        return WatchStep(status=status, finished=True, stop=stop, state=state, handle=bound)
    return WatchStep(status=status, finished=False, state=state, handle=bound)


def record_bound(handle: RunHandle, status: RunStatus, runtime: Runtime) -> RunHandle | None:
    """Once the gang's pods are bound, the handle naming their nodes in node-rank order
    (`RunHandle.bound`), kept in the job state as the attempt's handle — what the conclusion,
    `trainyard status` and the timeline read — or None where nothing changed. The placement only
    chose the set: the scheduler decides which pod, hence which node rank, lands where."""
    bound = handle.bound(status)
    if bound is handle:
        return None
    from trainyard.plugins.state.jobs import open_job_state

    open_job_state(runtime.settings.state_db).set_handle(handle.job, handle.run, handle.attempt, bound)
    return bound


def node_agents(handle: RunHandle, runtime: Runtime) -> dict[str, str]:
    """Where the agents of the gang's nodes answer: `TRAINYARD_NODE_AGENTS` where it names them
    (the local stack, a site's own map), else where the launcher finds them (Kubernetes: each
    Node's address at the DaemonSet's hostPort). The health watch, the conclusion's evidence and
    fault injection all ask here."""
    nodes = set(handle.gang_nodes)
    configured = {n: u for n, u in runtime.settings.node_agents.items() if n in nodes}
    if configured:
        return configured
    return launcher_for(handle, runtime).node_agents(handle)


def committed_after(root: str, after_step: int, *, endpoint_url: str | None = None) -> list[CheckpointRecord]:
    """Checkpoints of the run committed after `after_step`, oldest first."""
    from trainyard.plugins.checkpoint.catalog import list_checkpoints

    return [r for r in list_checkpoints(root, endpoint_url=endpoint_url) if r.step > after_step]


def checkpoint_overdue(status: RunStatus, last_step: int, interval_steps: int | None) -> bool:
    """Every rank is more than two intervals past the newest checkpoint: saves are not landing."""
    return bool(interval_steps) and status.step is not None and status.step > last_step + 2 * interval_steps


PROBE_TIMEOUT_S = 3.0
"""How long one poll waits for a node agent's answer before counting a missed heartbeat."""
PROBES_AT_ONCE = 64
"""Threads one poll probes with: a gang of more nodes is probed in waves of this many."""


def lost_nodes(handle: RunHandle, agents: dict[str, str], *, misses: dict[str, int], max_misses: int = MISSED_HEARTBEATS_LOST,
               answered: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """(node, why) for each node of the gang whose agent reports a fatal verdict or missed
    `max_misses` polls in a row (`misses` carries the count between polls; `answered`, where
    given, each agent's last answer — what dates a node lost to silence). One probe and one
    judgement per node: `evidence.observe_node` and `classify.node_fatal_reasons`, the same
    ones `classify` reads (an agent that answers with garbage is alive: not a missed beat).

    The nodes are probed at once: a silent agent costs its probe the whole timeout, and one
    after another a rack of them would stretch a poll — and the detection, three polls — by
    that timeout per node."""
    from concurrent.futures import ThreadPoolExecutor

    from trainyard.plugins.attempt.evidence import observe_node
    from trainyard.plugins.recovery.classify import node_fatal_reasons

    nodes = [n for n in handle.gang_nodes if agents.get(n)]
    if not nodes:
        return []
    asked = time.time()
    with ThreadPoolExecutor(max_workers=min(len(nodes), PROBES_AT_ONCE), thread_name_prefix="node-probe") as pool:
        seen = list(pool.map(lambda n: observe_node(n, agents[n], missed_before=misses.get(n, 0),
                                                    timeout=PROBE_TIMEOUT_S), nodes))
    lost = []
    for node, observation in zip(nodes, seen, strict=True):
        misses[node] = observation.missed_heartbeats
        if answered is not None and observation.missed_heartbeats == 0:
            answered[node] = asked
        reasons = node_fatal_reasons(observation, max_misses=max_misses)
        if reasons:
            lost.append((node, "; ".join(reasons)))
    return lost


def node_lost_stop(lost: list[tuple[str, str]], *, misses: dict[str, int], answered: dict[str, float]
                   ) -> StopReason:
    """The stop for the nodes `lost_nodes` lost, dated (`since`) by the last answer of the
    earliest of them lost to silence — a verdict dates itself (`classify` reads its onset)."""
    silent = [answered[node] for node, _ in lost if node in answered and misses.get(node)]
    return StopReason(reason="node_lost", nodes=[node for node, _ in lost],
                      detail="; ".join(f"{node}: {why}" for node, why in lost), since=min(silent) if silent else None)


def waiting_note(status: RunStatus, attempt: int, last: str = "") -> str:
    """The DAG run's note while the attempt's gang waits to start — its launcher's reason, on
    Kueue the queue's own (`attempt 1: waiting to start — … Kueue: pending: couldn't assign
    flavors … insufficient unused quota for cpu …`) — then, once it runs, that it started; ''
    when there is nothing new to say (`last`: the note this watch wrote before). The attempt's
    conclusion replaces it with its summary."""
    if status.state == "pending" and status.message:
        note = f"attempt {attempt}: waiting to start — {status.message}"[:1000]
    elif last and status.state == "running":
        note = f"attempt {attempt}: started after waiting in its queue"
    else:
        return ""
    return note if note != last else ""


def progress_line(status: RunStatus, handle: RunHandle | None = None) -> str:
    """What `watch_training`'s log says on each look a person would want to read: the step, rank
    0's loss and tokens/s (its heartbeat, where the control plane can read it) and each rank's
    phase and step, e.g. `step 120 · loss 3.1416 · 5,210 tokens/s · rank 0 train@120, rank 1
    train@120` — a line, not a dict."""
    parts = [f"{status.state}" if status.step is None else f"step {status.step}"]
    beat = None
    if handle is not None and handle.heartbeat_dir:
        from trainyard.plugins.run.heartbeat import read_heartbeats

        beat = read_heartbeats(handle.heartbeat_dir, [0]).get(0)
    if beat is not None and beat.loss is not None:
        parts.append(f"loss {beat.loss:.4f}")
    if beat is not None and beat.tokens_per_s is not None:
        parts.append(f"{beat.tokens_per_s:,.0f} tokens/s")
    ranks = ", ".join(f"rank {r.rank} {r.phase or r.outcome or 'starting'}" + (f"@{r.step}" if r.step is not None
                                                                               else "") for r in status.ranks)
    if ranks:
        parts.append(ranks)
    if status.message and status.finished:
        parts.append(status.message)
    return " · ".join(parts)


