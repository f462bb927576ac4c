"""Preemption (seed §4, DESIGN §5 `preempted`): make room for a gang that does not fit by evicting
whole lower-priority gangs — each after an emergency checkpoint — and place it.

`place_preempting` is what the `place_gang` step calls:

1. place and reserve as usual (`place_and_reserve`); done if it fits;
2. otherwise ask the fair-share engine (`trainyard.plugins.placement.fairshare.plan_preemption`) which
   running gangs to evict: only gangs strictly below the pending one's effective priority, the
   fewest that make room, those that lose the least work first. Only gangs the control plane can
   stop are candidates — a live attempt whose launcher handle is in the job state; a reservation
   without one (placed, not launched yet) is left alone, so a device is never freed while
   something still runs on it;
3. stop each victim the one way the control plane stops gangs (`plugins.attempt.watching.stop_gang`) with the reason
   `preempted`: SIGTERM, the worker commits an emergency checkpoint of its last completed step
   and exits 43 (`trainyard.plugins.run.exit_codes.PREEMPTED`), SIGKILL after `grace_s`. A victim so loses at
   most the time since that checkpoint (the step in flight). Its reservation is released here,
   so the pending gang can take the devices at once;
4. place and reserve again.

The victim's own DAG sees its gang end: `classify` reads the stop reason (`preempted`), `decide`
requeues it (not counted against its restart budget), and its next attempt's `place_gang` waits
for capacity (`wait_s`) instead of failing, then resumes from the emergency checkpoint.

**On a Kueue cluster** (`spec.launcher.queueing: kueue`, `queue_admits`) Kueue is the one
preemptor, so that two never fight over a gang: it admits a gang only within its team's quota,
reclaims lent quota and preempts by priority in its queues (`kueue_queues`). There this engine
never evicts: a gang that does not fit the devices nobody reserved is placed on the healthy
fleet without a reservation (`PlaceResult.queued`) and launched, and waits in its team's queue
with Kueue's reason; Kueue evicts whom it must, and the evicted attempt ends with Kueue's cause
(`RunStatus.evicted`), classified `preempted` and requeued the same way. The reservation is
only the placer's preference for idle nodes there: losing it stops nothing
(`steps.watch_state`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from trainyard.plugins.placement.model import NotSchedulableNow, Placement
from trainyard.plugins.state.reservations import RESERVATION_LEASE_S

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster
    from trainyard.config.spec import TrainingJob
    from trainyard.config.teams import Teams
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.placement.fairshare import RunningGang, Victim
    from trainyard.plugins.run.model import RunHandle, RunStatus
    from trainyard.plugins.state.jobs import JobStateStore
    from trainyard.plugins.state.reservations import StateStore

log = logging.getLogger(__name__)

PREEMPT_GRACE_S = 60.0
"""SIGTERM → SIGKILL: time for the victim's emergency checkpoint (a save of the last step)."""


@dataclass(frozen=True)
class Eviction:
    victim: Victim
    status: RunStatus | None
    """The victim's gang once stopped (its ranks' exit codes say whether the checkpoint landed)."""
    freed: int
    """Devices released from its reservation."""


@dataclass(frozen=True)
class PlaceResult:
    placement: Placement
    evicted: list[Eviction] = field(default_factory=list)
    waited_s: float = 0.0
    queued: bool = False
    """Placed without a reservation for the cluster's queue to admit when it can (Kueue)."""


def queue_admits(cluster: Cluster) -> bool:
    """Whether the cluster's own queue admits and preempts gangs: Kubernetes with Kueue
    (`spec.launcher.queueing: kueue`). Then Kueue is the one preemptor (module docstring)."""
    return cluster.spec.mode == "kubernetes" and str(cluster.spec.launcher.get("queueing") or "") == "kueue"


def place_preempting(job: TrainingJob, plan: Plan, cluster: Cluster, store: StateStore, jobs: JobStateStore,
                     teams: Teams, runtime: Runtime, *, run: str, attempt: int, exclude: Iterable[str] = (),
                     lease_s: float = RESERVATION_LEASE_S, grace_s: float = PREEMPT_GRACE_S, wait_s: float = 0.0,
                     poll_s: float = 5.0, now: datetime | None = None) -> PlaceResult:
    """Place and reserve the gang, evicting lower-priority gangs when it does not fit (see the
    module docstring). With `wait_s`, a gang that fits neither way (nothing lower to evict) is
    tried again every `poll_s` until it fits or `wait_s` has passed — a requeued attempt waits for
    capacity instead of failing. Raises `NotSchedulableNow` / `NeverSchedulable` otherwise."""
    from trainyard.plugins.attempt.reserve import place_and_reserve

    exclude = frozenset(exclude)
    started = time.monotonic()
    while True:
        try:
            placement = place_and_reserve(job, plan, cluster, store, run=run, attempt=attempt,
                                          exclude=exclude, lease_s=lease_s)
            return PlaceResult(placement, waited_s=time.monotonic() - started)
        except NotSchedulableNow:
            if queue_admits(cluster):  # Kueue decides when it runs, and whom to preempt
                return PlaceResult(place_for_queue(job, plan, cluster, run=run, attempt=attempt, exclude=exclude),
                                   queued=True)
            try:
                evicted = make_room(job, plan, cluster, store, jobs, teams, runtime, run=run, attempt=attempt,
                                    exclude=exclude, grace_s=grace_s, now=now)
            except NotSchedulableNow:  # its message: what is busy, and why preempting cannot help
                if time.monotonic() - started + poll_s > wait_s:
                    raise
                log.info("%s run %s attempt %d: no capacity and nothing to preempt; waiting %.0f s",
                         job.name, run, attempt, poll_s)
                time.sleep(poll_s)
                continue
        placement = place_and_reserve(job, plan, cluster, store, run=run, attempt=attempt,
                                      exclude=exclude, lease_s=lease_s)
        return PlaceResult(placement, evicted, waited_s=time.monotonic() - started)


def place_for_queue(job: TrainingJob, plan: Plan, cluster: Cluster, *, run: str, attempt: int,
                    exclude: frozenset[str] = frozenset()) -> Placement:
    """The gang on the healthy fleet as if it were idle, reserving nothing: the cluster's queue
    admits it once its quota allows, and the pods wait for the nodes the placement chose.
    Raises `NeverSchedulable` when even the idle fleet cannot hold it."""
    from trainyard.plugins.placement.gang import place_gang
    from trainyard.plugins.placement.inventory import Inventory
    from trainyard.plugins.placement.model import GangRequest

    request = GangRequest.for_job(job, plan, run=run, attempt=attempt, exclude=exclude)
    return place_gang(request, Inventory.from_cluster(cluster))


def make_room(job: TrainingJob, plan: Plan, cluster: Cluster, store: StateStore, jobs: JobStateStore,
              teams: Teams, runtime: Runtime, *, run: str, attempt: int, exclude: frozenset[str] = frozenset(),
              grace_s: float = PREEMPT_GRACE_S, now: datetime | None = None) -> list[Eviction]:
    """Decide the victims for the gang (fair share) and evict them. Raises `Unschedulable` when
    evicting every stoppable lower-priority gang would not make room (then nothing is evicted)."""
    from trainyard.plugins.placement.fairshare import plan_preemption
    from trainyard.plugins.placement.inventory import Inventory
    from trainyard.plugins.placement.model import GangRequest
    from trainyard.plugins.state.reservations import free_devices

    inventory = Inventory.from_cluster(cluster)
    request = GangRequest.for_job(job, plan, run=run, attempt=attempt, exclude=exclude)
    handles = {(g.job, g.run, g.attempt): h for g in store.running_gangs() if (h := live_handle(jobs, g))}
    candidates = [g for g in store.running_gangs() if (g.job, g.run, g.attempt) in handles]
    free = free_devices(store, {n.name: n.gpus for n in inventory.nodes})
    decision = plan_preemption(request, inventory, free, candidates, teams, now=now)
    by = f"{job.name} run {run} (priority {job.metadata.priority}, effective {decision.pending_priority:g})"
    return [evict(v, handles[(v.job, v.run, v.attempt)], store, runtime, by=by, grace_s=grace_s)
            for v in decision.victims]


def live_handle(jobs: JobStateStore, gang: RunningGang) -> RunHandle | None:
    """The launcher handle of the attempt holding `gang`'s reservation, if the job state has it."""
    from trainyard.plugins.state.jobs import RunNotFound

    try:
        live = jobs.live_attempt(gang.job, gang.run)
    except RunNotFound:
        return None
    return live.run_handle if live is not None and live.attempt == gang.attempt else None


def evict(victim: Victim, handle: RunHandle, store: StateStore, runtime: Runtime, *, by: str,
          grace_s: float = PREEMPT_GRACE_S) -> Eviction:
    """Stop the victim's gang (`preempted`: SIGTERM → emergency checkpoint → exit 43), then free
    its reservation."""
    from trainyard.plugins.attempt.watching import stop_gang
    from trainyard.plugins.run.records import StopReason

    reason = StopReason(reason="preempted", detail=f"evicted for {by}", nodes=sorted(victim.nodes))
    status = stop_gang(handle, reason, runtime, grace_s=grace_s)
    freed = store.release(victim.job, victim.attempt, run=victim.run)
    log.warning("preempted %s run %s attempt %d (%d devices, effective priority %g) for %s: %s",
                victim.job, victim.run, victim.attempt, victim.gpus, victim.effective_priority, by,
                status.message)
    return Eviction(victim, status, freed)
