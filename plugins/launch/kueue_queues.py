"""Team quotas and fair share as Kueue objects (issue 55: Kueue and kube-scheduler replace Volcano
where the Go module proxy refuses Volcano; issue 56: one queue per team, enforced by the cluster).

Why Kueue's own objects rather than our numbers in an admission check of ours: Kueue admits a
job only when its whole gang fits the team's quota (a suspended Job is unsuspended, all pods at
once), preempts by priority inside a team's queue and reclaims lent quota across teams, and says
why a workload waits in the Workload's conditions — the reason the DAG run's note and the
Trainyard view then show as they are (`workload_state`).

Per cluster: one `ResourceFlavor` (`FLAVOR`: every accelerator node; topology stays with the
placer) and a `WorkloadPriorityClass` per seed §4 priority, with the values of the Kubernetes
PriorityClasses (`manifests.PRIORITY_VALUES`). Per team (from `config/teams.yaml`):
- a `ClusterQueue` named after the team: `nominalQuota` = its guaranteed share of the cluster
  (`share × total`), `borrowingLimit` up to its hard quota (`quotaGpus`) when it may borrow
  (0 when it may not); all teams in one cohort (`COHORT`), so idle quota is lent and reclaimed
  (`reclaimWithinCohort: Any`), and inside a team a higher priority preempts a lower one
  (`withinClusterQueue: LowerPriority`). Its `namespaceSelector` admits only the team's own
  namespace (`tenancy.team_namespace`): another team's LocalQueue cannot draw on it.
- a `LocalQueue` (`LOCAL_QUEUE`) in the team's namespace pointing at it: what a job names in its
  `kueue.x-k8s.io/queue-name` label.
The covered resources are what a job's pods request (`manifests.pod_spec`): `nvidia.com/gpu`
(with the RDMA device resource where the cluster has one) on GPU clusters, `cpu` on CPU clusters
(a slot is a core) — Kueue refuses a workload requesting a resource its ClusterQueue does not
cover, so the two lists must stay the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainyard.plugins.launch.manifests import GPU_RESOURCE, PRIORITY_VALUES
from trainyard.plugins.launch.tenancy import MANAGED, team_namespace

if TYPE_CHECKING:
    from trainyard.config.teams import Team, Teams

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
QUEUE_NAME_LABEL = f"{KUEUE_GROUP}/queue-name"
PRIORITY_CLASS_LABEL = f"{KUEUE_GROUP}/priority-class"
FLAVOR = "trainyard-accelerators"
COHORT = "trainyard"
LOCAL_QUEUE = "training"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
PLURALS = {"ResourceFlavor": "resourceflavors", "WorkloadPriorityClass": "workloadpriorityclasses",
           "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues", "Workload": "workloads"}
"""The API's resource name of each Kueue kind this module renders or reads."""


def workload_priority_class_name(priority: str) -> str:
    return f"trainyard-{priority}"


def covered_resources(*, cpu_cluster: bool, rdma_resource: str | None = None) -> list[str]:
    """What a job's pods request, hence what each ClusterQueue must cover."""
    if cpu_cluster:
        return ["cpu"]
    return [GPU_RESOURCE, *([rdma_resource] if rdma_resource else [])]


def render_flavor() -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR, "labels": dict(MANAGED)}, "spec": {}}


def render_workload_priority_classes() -> list[dict[str, Any]]:
    return [{"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass",
             "metadata": {"name": workload_priority_class_name(name), "labels": dict(MANAGED)},
             "value": value, "description": f"Trainyard {name} training jobs (seed §4 base priority {value})."}
            for name, value in PRIORITY_VALUES.items()]


def guaranteed_shares(teams: Teams, total: int) -> dict[str, int]:
    """Each team's guaranteed share of `total` accelerators in whole ones, apportioned by largest
    remainder (ties by name), so that they add up to the shares' part of the cluster. Rounding
    each share down alone lost up to one accelerator per team from the cohort: on 3 CPUs and the
    six teams of `config/teams.yaml` the cohort held 1, and no team's 2-node gang was ever
    admitted (the e2e tests on the real control plane, issue 55)."""
    exact = {name: team.share * total for name, team in teams.teams.items()}
    whole = {name: int(value) for name, value in exact.items()}
    spare = round(sum(exact.values())) - sum(whole.values())
    for name in sorted(exact, key=lambda n: (whole[n] - exact[n], n))[:max(spare, 0)]:
        whole[name] += 1
    return whole


def team_quota(team: Team, total: int, share: int | None = None) -> tuple[int, int]:
    """(nominal quota, borrowing limit) of a team on a cluster of `total` accelerators: its
    guaranteed share (`share`, from `guaranteed_shares`; alone: rounded down), and what it may
    borrow beyond it up to its hard quota (the cluster when it has none); nothing borrowed when
    it may not borrow."""
    nominal = int(team.share * total) if share is None else share
    cap = total if team.quota_gpus is None else min(team.quota_gpus, total)
    nominal = min(nominal, cap)
    return nominal, (cap - nominal) if team.can_borrow else 0


def render_cluster_queue(name: str, team: Team, *, total: int, cpu_cluster: bool,
                         rdma_resource: str | None = None, share: int | None = None) -> dict[str, Any]:
    nominal, borrow = team_quota(team, total, share)
    resources = []
    for resource in covered_resources(cpu_cluster=cpu_cluster, rdma_resource=rdma_resource):
        # The RDMA device is one per pod, so never more than accelerators: the same numbers.
        resources.append({"name": resource, "nominalQuota": str(nominal), "borrowingLimit": str(borrow)})
    return {
        "apiVersion": API_VERSION, "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": MANAGED | {"trainyard.io/team": name}},
        "spec": {
            "cohortName": COHORT,
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: team_namespace(name)}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{
                "coveredResources": [r["name"] for r in resources],
                "flavors": [{"name": FLAVOR, "resources": resources}],
            }],
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority",
                           "borrowWithinCohort": {"policy": "Never"}},
        },
    }


def render_local_queue(name: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": team_namespace(name),
                         "labels": MANAGED | {"trainyard.io/team": name}},
            "spec": {"clusterQueue": name}}


def render_kueue_queues(teams: Teams, total: int, *, cpu_cluster: bool,
                        rdma_resource: str | None = None) -> list[dict[str, Any]]:
    """Every queueing object, in apply order (the LocalQueues need their team namespaces first:
    `tenancy.render_teams`)."""
    docs = [render_flavor(), *render_workload_priority_classes()]
    shares = guaranteed_shares(teams, total)
    for name, team in sorted(teams.teams.items()):
        docs.append(render_cluster_queue(name, team, total=total, cpu_cluster=cpu_cluster,
                                         rdma_resource=rdma_resource, share=shares[name]))
    docs.extend(render_local_queue(name) for name in sorted(teams.teams))
    return docs


def workload_selector(job: Mapping[str, Any]) -> str:
    """The label selector of the Workload Kueue made for the batch Job `job` (wire form)."""
    return f"{KUEUE_GROUP}/job-uid={job['metadata']['uid']}"


@dataclass(frozen=True)
class WorkloadState:
    """Where Kueue has a job's workload: `admitted`, `pending` (waiting for quota, with Kueue's
    reason), `evicted` (preempted or otherwise taken back: its pods are being stopped) or
    `finished`."""

    state: str
    reason: str = ""
    message: str = ""

    def describe(self) -> str:
        return f"{self.state}: {self.message or self.reason}" if (self.message or self.reason) else self.state


def workload_state(workload: Mapping[str, Any]) -> WorkloadState:
    """Read a Workload's conditions as Kueue writes them (`Finished`, `Evicted`, `Admitted`,
    `QuotaReserved`): the newest that holds decides, and its own reason and message are kept
    word for word (a pending gang's "couldn't assign flavors to pod set …: insufficient quota
    for nvidia.com/gpu in flavor …", a preemption's "Preempted to accommodate a workload …")."""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}

    def holds(kind: str) -> Mapping[str, Any] | None:
        c = conditions.get(kind)
        return c if c is not None and c.get("status") == "True" else None

    for kind, state in (("Finished", "finished"), ("Evicted", "evicted"), ("Admitted", "admitted")):
        if (c := holds(kind)) is not None:
            return WorkloadState(state, c.get("reason", ""), c.get("message", ""))
    reserved = conditions.get("QuotaReserved")
    if reserved is not None:
        return WorkloadState("pending", reserved.get("reason", ""), reserved.get("message", ""))
    return WorkloadState("pending", "", "not yet considered by Kueue")


def eviction_cause(workload: Mapping[str, Any] | None) -> str:
    """Why Kueue took a workload back, in its own words, or '' while it has not: the `Evicted`
    condition's reason (`Preempted`, `PodsReadyTimeout`, `ClusterQueueStopped`, …), the
    `Preempted` condition's finer reason where Kueue gives one (`InClusterQueue`,
    `InCohortReclamation`, `InCohortFairSharing`, …) and the message, e.g. `Preempted
    (InCohortReclamation): Preempted to accommodate a workload (UID: …) due to reclamation within
    the cohort`. Kueue clears `Evicted` when it admits the workload again; an evicted batch Job
    whose pods exited may end `Failed` meanwhile (its backoff limit): the condition stays, so the
    eviction, not the backoff limit, is the cause read."""
    if not workload:
        return ""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    evicted = conditions.get("Evicted")
    if evicted is None or evicted.get("status") != "True":
        return ""
    reason = str(evicted.get("reason") or "Evicted")
    preempted = conditions.get("Preempted")
    if preempted is not None and preempted.get("status") == "True" and preempted.get("reason") not in (None, "", reason):
        reason += f" ({preempted['reason']})"
    message = evicted.get("message") or (preempted or {}).get("message") or ""
    return f"{reason}: {message}" if message else reason


def admitted_at(workload: Mapping[str, Any]) -> datetime | None:
    """When Kueue admitted the workload (its `Admitted` condition's transition), None while it
    is not admitted: from then on the gang's pods should start."""
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Admitted" and condition.get("status") == "True":
            when = condition.get("lastTransitionTime")
            return datetime.fromisoformat(str(when).replace("Z", "+00:00")) if when else None
    return None
