"""A Volcano Job's `RunStatus`, from what the API server says about it (pure, no I/O).

`KubernetesLauncher.poll` (sync client) and `poll_async` (the provider's async hook) fetch the
same objects — the Job, its PodGroup, its pods, their nodes, and while it has not started the
events — as plain JSON (`Observed`), and this module reads them:

- **state**: the Job's `status.state.phase` (`PHASES`); while it has not started, a launch that
  is blocked — the PodGroup `Unschedulable`, a container waiting with `ErrImagePull`,
  `ImagePullBackOff`, `CreateContainerError`, … — is `pending` with the scheduler's or kubelet's
  message, and `failed` ("launch failed: …", with the latest warning event) once it has been so
  for longer than the Job's start timeout (`trainyard.io/start-timeout-s`, counted from the
  handle's `created_at` — on Kueue from the Workload's admission: a gang waiting in its queue
  for quota is not a launch failure, however long it waits);
- **agents**: one per pod, in node-rank order (`gang_pods.node_order`: torchrun's c10d order of
  the pods' DNS names, whatever node each was bound to): pod name, node, whether that node is Ready,
  phase, the trainer container's exit code and reason (`Completed`, `Error`, `OOMKilled`), or
  `Evicted:<DisruptionTarget reason>` / `NodeNotReady` / a waiting reason;
- **nodes**: the nodes the pods are bound to, in node-rank order, once every pod of the Job is
  bound (empty before): where the gang really runs, which `RunHandle.bound` makes the handle's;
- **ranks**: each rank of each pod (from its place in that order and the slots of the pods
  before it, each task's `trainyard.io/slots`: `gang_pods.rank_ranges`) with its own
  exit code, read from the pod's termination message — the `exits.jsonl` lines `rank_exec`
  writes, the container's `terminationMessagePath` — so a rank that exited 42 (diverged) or 46
  (OOM) is seen as such although torchrun itself exits 1; a rank whose pod died without its
  own record (the container SIGKILLed, OOMKilled) gets the container's signal as a negative code
  (`-9`: killed by SIGKILL, the local launcher's convention) and the pod's reason as outcome;
- **failed_rank / exit_code**: the first rank that failed (earliest `ended_at`), its code;
  0 when the Job completed;
- **evicted** (Kueue): the Workload's eviction in Kueue's words (`kueue_queues.eviction_cause`).
  Kueue suspends an evicted Job and the Job controller deletes its pods with their grace: the
  ranks take their emergency checkpoint and exit 43. The attempt reads `running` ("Kueue evicted
  the gang: …; its pods are stopping") until no pod is left, then `failed` with that cause,
  whatever the Job says by then (suspended, or `Failed` by its backoff limit as the pods
  exited) — never a launch that did not start, however long it ran before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainyard.plugins.launch.gang_pods import (
    INDEXED,
    SLOTS_ANNOTATION,
    GangTask,
    node_order,
    pod_key,
    rank_ranges,
)
from trainyard.plugins.launch.manifests import START_TIMEOUT_ANNOTATION
from trainyard.plugins.run.exit_codes import describe
from trainyard.plugins.run.model import AgentStatus, RankStatus, RunHandle, RunStatus

PHASES: Mapping[str, str] = {
    "Pending": "pending", "Running": "running", "Restarting": "running", "Completing": "running",
    "Aborting": "running", "Terminating": "running", "Completed": "succeeded",
    "Aborted": "failed", "Terminated": "failed", "Failed": "failed",
}
"""Volcano Job phases (`status.state.phase`) → RunState."""
ENDED_PHASES = ("Completed", "Aborted", "Terminated", "Failed")
BLOCKING_WAITS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                  "CreateContainerError", "RunContainerError")
"""Waiting reasons that do not go away by themselves."""
TRAINER = "trainer"
LEGACY_RANKS_ANNOTATION = "trainyard.io/ranks"
"""A node's ranks (`first-last`) on each task of a Job rendered with one task per node."""


@dataclass
class Observed:
    """What the API server said, as JSON (camelCase, the wire form)."""

    job: dict[str, Any] | None
    group: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)


def pod_selector(handle: RunHandle) -> str:
    selector = f"trainyard.io/job={handle.job},trainyard.io/attempt={handle.attempt}"
    if handle.run:  # another run of the job may be at the same attempt number
        selector += f",trainyard.io/run={handle.run}"
    return selector


def group_name(handle: RunHandle, job: Mapping[str, Any]) -> str:
    """Volcano names a Job's PodGroup `<job>-<uid>`."""
    return f"{handle.name}-{job['metadata']['uid']}"


def owned_pods(handle: RunHandle, pods: list[dict[str, Any]], job_uid: str) -> list[dict[str, Any]]:
    """The pods of this Job object (owner uid), in node-rank order (`gang_pods.node_order`)."""
    mine = {pod_key(p): p for p in pods if not job_uid or any(
        r.get("uid") == job_uid for r in p["metadata"].get("ownerReferences") or [])}
    return [mine[name] for name in node_order(handle.name, mine)]


def is_batch_job(job: Mapping[str, Any]) -> bool:
    """A batch/v1 Job (the Kueue path), not a Volcano Job."""
    return job.get("apiVersion") == "batch/v1"


def gang_tasks_of(job: Mapping[str, Any]) -> list[GangTask]:
    """The gang's tasks as the Job (wire form) declares them: name, replicas and each
    template's slots (`trainyard.io/slots`; a Job rendered before it, one task per node, says
    its node's `trainyard.io/ranks` range instead, and its zero-padded task names sort in node-rank
    order: an attempt launched before an upgrade is still read right). An Indexed batch/v1 Job is
    one task (`INDEXED`) of `completions` pods."""
    spec = job.get("spec") or {}
    if is_batch_job(job):
        annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        return [GangTask(INDEXED, _slots(annotations), 0, int(spec.get("completions") or 1))]
    tasks, first = [], 0
    for task in (job.get("spec") or {}).get("tasks") or []:
        annotations = ((task.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        replicas = int(task.get("replicas", 1))
        tasks.append(GangTask(str(task["name"]), _slots(annotations), first, replicas))
        first += replicas
    return tasks


def _slots(annotations: Mapping[str, str]) -> int:
    if SLOTS_ANNOTATION in annotations:
        return int(annotations[SLOTS_ANNOTATION])
    low, _, high = annotations.get(LEGACY_RANKS_ANNOTATION, "0").partition("-")
    try:
        return int(high or low) - int(low) + 1
    except ValueError:
        return 1


def node_is_ready(node: Mapping[str, Any] | None) -> bool | None:
    if node is None:
        return None
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    return None if ready is None else ready.get("status") == "True"


def job_phase(job: Mapping[str, Any]) -> str:
    """A Volcano Job's phase (`status.state.phase`; Pending before the controller wrote one), or
    a batch/v1 Job's in the same words (`PHASES`): Completed or Failed by its conditions, Pending
    while suspended (Kueue has not admitted it, or took it back) or before a pod is active,
    Running once one is."""
    status = job.get("status") or {}
    if not is_batch_job(job):
        return (status.get("state") or {}).get("phase") or "Pending"
    held = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
    if "Complete" in held:
        return "Completed"
    if "Failed" in held:
        return "Failed"
    if (job.get("spec") or {}).get("suspend") or not status.get("active"):
        return "Pending"
    return "Running"


def run_status(handle: RunHandle, seen: Observed, *, now: datetime | None = None) -> RunStatus:
    now = now or datetime.now(UTC)
    job = seen.job
    where = f"{handle.namespace}/{handle.name}"
    # A Job that is gone (or another object now) runs nothing of this attempt: its pods went with
    # it (foreground deletion, ttlSecondsAfterFinished) — the attempt is over, stopped. Reporting
    # it as unknown kept every watcher waiting for good after a stop or a `kubectl delete`.
    if job is None:
        return RunStatus(state="stopped", processes_alive=False,
                         message=f"{_kind(job)} {where} is gone (deleted, or removed after ttlSecondsAfterFinished)")
    uid = str(job["metadata"].get("uid") or "")
    if handle.uid and uid and uid != handle.uid:
        return RunStatus(state="stopped", processes_alive=False,
                         message=f"{where} is another object now (uid {uid}, expected {handle.uid}): this "
                                 "attempt's Job is gone")
    phase = job_phase(job)
    state = PHASES.get(phase, "unknown")
    agents, ranks, ended = [], [], {}
    gang = rank_ranges(handle.name, gang_tasks_of(job))
    for pod in seen.pods:
        own = gang.get(pod_key(pod), range(0))
        agent, pod_ranks = _pod(pod, seen.nodes.get(pod["spec"].get("nodeName") or ""), own)
        agents.append(agent)
        ranks += pod_ranks
        ended.update(_ended_at(pod, own))
    bound = {pod_key(p): p["spec"].get("nodeName") or "" for p in seen.pods}
    nodes = [bound[pod] for pod in gang] if gang and all(bound.get(pod) for pod in gang) else []
    message = _message(job, phase, agents)
    evicted = _eviction(seen)
    if evicted:
        return _evicted(evicted, message, seen, ranks=ranks, agents=agents, nodes=nodes, ended=ended)
    blocked = _blocked(seen, agents) if phase == "Pending" or any(a.phase == "Pending" for a in agents) else ""
    if blocked:
        message += f"; not started: {blocked}"
        limit = float((job["metadata"].get("annotations") or {}).get(START_TIMEOUT_ANNOTATION, 600))
        since = _start_clock(seen, handle.created_at)
        waited = (now - since).total_seconds() if since is not None else 0.0
        if state in ("pending", "running") and waited > limit:
            event = _latest_warning(seen)
            return RunStatus(state="failed", agents=agents, ranks=ranks, nodes=nodes, processes_alive=_alive(seen.pods),
                             message=f"launch failed: the pods of {where} did not start in {limit:.0f} s: {blocked}"
                                     + (f" (event: {event})" if event and event not in blocked else ""))
    failed = _failed_first(ranks, ended)
    code = 0 if state == "succeeded" else (failed[0].exit_code if failed else None)
    if state == "failed" and code is None:
        code = next((a.exit_code for a in agents if a.exit_code not in (None, 0)), 1)
    return RunStatus(state=state, message=message, exit_code=code,  # type: ignore[arg-type]
                     failed_rank=failed[0].rank if failed and state != "succeeded" else None,
                     ranks=ranks, agents=agents, nodes=nodes,
                     processes_alive=phase not in ENDED_PHASES or _alive(seen.pods))


def _start_clock(seen: Observed, created_at: datetime) -> datetime | None:
    """Since when the pods should have started: the Job's creation, or — on Kueue — its
    admission. A gang waiting in its queue for quota is not a launch that fails to start (it may
    wait hours behind a long job): None, no clock runs."""
    if seen.group is None or seen.group.get("kind") != "Workload":
        return created_at
    from trainyard.plugins.launch.kueue_queues import admitted_at

    return admitted_at(seen.group)


def _eviction(seen: Observed) -> str:
    if seen.group is None or seen.group.get("kind") != "Workload":
        return ""
    from trainyard.plugins.launch.kueue_queues import eviction_cause

    return eviction_cause(seen.group)


def _evicted(cause: str, message: str, seen: Observed, *, ranks: list[RankStatus], agents: list[AgentStatus],
             nodes: list[str], ended: dict[int, float]) -> RunStatus:
    """The status of a gang Kueue took back (module docstring): over once no pod is left; its
    exit code the first failed rank's (43: the emergency checkpoint), None where no pod's exit
    was seen (they went between two polls)."""
    alive = _alive(seen.pods)
    failed = _failed_first(ranks, ended)
    return RunStatus(state="running" if alive else "failed", evicted=cause, ranks=ranks, agents=agents, nodes=nodes,
                     exit_code=failed[0].exit_code if failed else None,
                     failed_rank=failed[0].rank if failed else None, processes_alive=alive,
                     message=f"Kueue evicted the gang: {cause}" + ("; its pods are stopping" if alive else "")
                             + f" ({message})")


def _failed_first(ranks: list[RankStatus], ended: dict[int, float]) -> list[RankStatus]:
    """The ranks that failed, the first to end first."""
    return sorted((r for r in ranks if r.exit_code not in (None, 0)),
                  key=lambda r: (ended.get(r.rank, float("inf")), r.rank))


def reads_workload(job: Mapping[str, Any], pods: list[dict[str, Any]]) -> bool:
    """Whether a poll needs Kueue's Workload of `job`: a batch Job that is not plainly running —
    waiting for admission, suspended by an eviction, ended (an evicted Job may fail by its
    backoff limit as its pods exit) — or whose pods are being deleted."""
    return is_batch_job(job) and (job_phase(job) != "Running"
                                  or any(p["metadata"].get("deletionTimestamp") for p in pods))


def _alive(pods: list[dict[str, Any]]) -> bool:
    return any((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed") for p in pods)


def _trainer(pod: Mapping[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == TRAINER), statuses[0] if statuses else {})


def _pod(pod: dict[str, Any], node: dict[str, Any] | None, own: range) -> tuple[AgentStatus, list[RankStatus]]:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    node_name = spec.get("nodeName") or ""
    ready = node_is_ready(node) if node_name else None
    phase = status.get("phase", "")
    container = _trainer(pod)
    state = container.get("state") or {}
    terminated, waiting = state.get("terminated"), state.get("waiting")
    code = terminated.get("exitCode") if terminated else None
    disruption = next((c for c in status.get("conditions") or []
                       if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None)
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    if terminated:
        reason = terminated.get("reason") or "Error"
        message = f"{reason}: {describe(code)}"
    elif disruption is not None:
        reason = f"Evicted:{disruption.get('reason', '')}"
        message = f"evicted: {disruption.get('message', '')}"
    elif node_name and ready is False:
        reason, message = "NodeNotReady", f"node {node_name} is not Ready"
    elif waiting:
        reason = waiting.get("reason", "")
        message = f"{reason}: {waiting.get('message', '')}".rstrip(": ")
    elif scheduled.get("status") == "False":
        reason, message = scheduled.get("reason", "Unschedulable"), scheduled.get("message", "")
    else:
        reason, message = "", phase
    if meta.get("deletionTimestamp") and not terminated:
        message += " (terminating)"
    agent = AgentStatus(node=node_name or meta["name"], pod=meta["name"], phase=phase, reason=reason,
                        node_ready=ready, exit_code=code, message=message,
                        alive=phase == "Running" and terminated is None)
    return agent, _ranks(pod, own, node_name, phase, terminated, reason)


def exit_records(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `exits.jsonl` lines of the trainer's termination message (a line cut short by the
    kubelet's 4096-byte limit — the first one — is skipped)."""
    terminated = (_trainer(pod).get("state") or {}).get("terminated") or {}
    out = []
    for line in (terminated.get("message") or "").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            out.append(record)
    return out


def _ranks(pod: dict[str, Any], own: range, node: str, phase: str, terminated: dict[str, Any] | None,
           reason: str) -> list[RankStatus]:
    records = exit_records(pod)
    last: dict[int, dict[str, Any]] = {}
    for record in records:
        if record["rank"] not in last or record.get("restart", 0) >= last[record["rank"]].get("restart", 0):
            last[record["rank"]] = record
    out = []
    for rank in own:
        record = last.get(rank)
        if record is not None:
            code = record.get("exit_code")
            out.append(RankStatus(rank=rank, node=node, pid=record.get("child_pid"), restart=record.get("restart", 0),
                                  exit_code=code, outcome=describe(code), phase=phase))
            continue
        code = None
        if terminated is not None:
            raw = int(terminated.get("exitCode", 0))
            code = -(raw - 128) if raw > 128 else raw
        outcome = reason if reason in ("OOMKilled", "NodeNotReady") or reason.startswith("Evicted") else describe(code)
        out.append(RankStatus(rank=rank, node=node, exit_code=code, outcome=outcome, phase=phase))
    return out


def _ended_at(pod: dict[str, Any], own: range) -> dict[int, float]:
    """Rank → when it ended: its own record's `ended_at`, else its container's `finishedAt`."""
    terminated = (_trainer(pod).get("state") or {}).get("terminated") or {}
    finished = terminated.get("finishedAt")
    when = datetime.fromisoformat(finished).timestamp() if finished else None
    out = {rank: when for rank in own if when is not None}
    for record in exit_records(pod):
        if record.get("ended_at") and record.get("exit_code") not in (None, 0):
            out[record["rank"]] = min(float(record["ended_at"]), out.get(record["rank"], float("inf")))
    return out


def _kind(job: Mapping[str, Any] | None) -> str:
    return "Job" if job is not None and is_batch_job(job) else "Volcano Job"


def _message(job: Mapping[str, Any], phase: str, agents: list[AgentStatus]) -> str:
    status = job.get("status") or {}
    if is_batch_job(job):
        counts = ", ".join(f"{status[k]} {k}" for k in ("active", "ready", "succeeded", "failed", "terminating")
                           if status.get(k))
        ended = [c for c in status.get("conditions") or [] if c.get("status") == "True"
                 and c.get("type") in ("Complete", "Failed", "Suspended")]
        why = (ended[-1].get("message") or ended[-1].get("reason") or "") if ended else ""
        message = f"Job phase {phase}"
    else:
        state = status.get("state") or {}
        counts = ", ".join(f"{status[k]} {k}" for k in ("pending", "running", "succeeded", "failed", "terminating")
                           if status.get(k))
        why = state.get("message") or state.get("reason") or ""
        message = f"Volcano phase {phase}"
    message += (f" ({counts})" if counts else "") + (f": {why}" if why else "")
    lost = sorted({a.node for a in agents if a.node_ready is False})
    if lost:
        message += f"; node(s) not Ready: {', '.join(lost)}"
    return message


def _blocked(seen: Observed, agents: list[AgentStatus]) -> str:
    """Why the attempt cannot start (empty: it may still be starting normally): a Kueue
    Workload that waits for quota (or was taken back: preempted) says so in Kueue's words."""
    if seen.group is not None and seen.group.get("kind") == "Workload":
        from trainyard.plugins.launch.kueue_queues import workload_state

        state = workload_state(seen.group)
        if state.state in ("pending", "evicted"):
            return f"Kueue: {state.describe()}"
    for condition in ((seen.group or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
            return f"Unschedulable: {condition.get('message') or condition.get('reason', '')}"
    for agent in agents:
        if agent.reason in BLOCKING_WAITS or agent.reason == "Unschedulable":
            return f"pod {agent.pod}: {agent.message}"
    return ""


def _latest_warning(seen: Observed) -> str:
    warnings = [e for e in seen.events if e.get("type") == "Warning"]
    warnings.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return f"{warnings[-1].get('reason', '')}: {warnings[-1].get('message', '')}" if warnings else ""
