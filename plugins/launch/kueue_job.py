"""An attempt's gang as Kueue admits it (issue 55: the Go module proxy refuses Volcano, so Kueue
and kube-scheduler admit and place gangs where Volcano is not installed;
`KubernetesOptions.queueing = "kueue"`).

One batch/v1 **Indexed Job** per attempt — `completions` = `parallelism` = the gang's nodes, one
pod template (the Volcano path's, `manifests.pod_spec`), created **suspended** and labelled with
its team's LocalQueue (`kueue_queues.LOCAL_QUEUE`) and priority: Kueue unsuspends it once the
whole gang fits the team's quota (all pods at once, or none), and suspends it again when it
preempts it. `backoffLimit: 0`: the control plane (the job's DAG) decides every restart, as with
Volcano's `AbortJob`; the Job controller ends the other pods of a failed Job.

Names: the Job is `<name>` (`manifests.volcano_job_name`), its pods' host names `<name>-<index>`
(the Job controller's), and a headless Service `<name>` gives them DNS names
`<name>-<index>.<name>` (the pods' `subdomain`). torchrun's c10d rendezvous sorts the agents by
those names (`gang_pods.node_order`): `<name>-0` is node rank 0 and hosts the store. Each pod's
`--local-addr` is its own name, from `JOB_COMPLETION_INDEX` (the Job controller's variable,
expanded by the kubelet). One template serves every pod, so a gang whose last node holds fewer
ranks than the others cannot be one Indexed Job: it is refused (a JobSet would hold it).
Every container requests only what the teams' ClusterQueues cover (their accelerators): Kueue
leaves a workload that asks for anything else unadmitted, init containers included, so the
`source.git` fetch keeps only its covered requests here (its cpu on a CPU cluster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainyard.plugins.launch.gang_pods import INDEXED, SLOTS_ANNOTATION, gang_tasks, pod_name
from trainyard.plugins.launch.kueue_queues import (
    LOCAL_QUEUE,
    PRIORITY_CLASS_LABEL,
    QUEUE_NAME_LABEL,
    covered_resources,
    workload_priority_class_name,
)
from trainyard.plugins.launch.manifests import (
    START_TIMEOUT_ANNOTATION,
    KubernetesOptions,
    attempt_context,
    check_size,
    pod_spec,
)

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.config.worker_env import WorkerEnv
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.placement.model import Placement

OWN_HOST = "$(JOB_COMPLETION_INDEX)"


def render_kueue_job(job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv, *, attempt: int,
                     options: KubernetesOptions | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Indexed Job, its headless Service) for one attempt of a placed job; the Service is
    made owned by the Job once the Job exists (`owned_by`)."""
    options = (options or KubernetesOptions()).model_copy(update={"queueing": "kueue"})
    name, options, worker_env, labels = attempt_context(job, plan, placement, worker_env, attempt=attempt,
                                                        options=options)
    tasks = gang_tasks([n.slots for n in placement.nodes])
    if len(tasks) != 1:
        raise ValueError(f"{job.metadata.name}: a gang whose last node holds {tasks[-1].slots} ranks and the others "
                         f"{tasks[0].slots} is not one Indexed Job (one pod template); with Kueue every node must "
                         "hold the same number of ranks (a world size that is a multiple of the node's devices)")
    slots, nodes = tasks[0].slots, len(placement.nodes)
    spec = pod_spec(job, plan, placement, worker_env, slots, placement.nodes, options,
                    gpu=placement.gpu_type != "cpu", own_host=pod_name(name, INDEXED, OWN_HOST),
                    first_task=INDEXED)
    spec["subdomain"] = name
    covered = covered_resources(cpu_cluster=placement.gpu_type == "cpu", rdma_resource=options.rdma_resource)
    for init in spec.get("initContainers") or []:
        # Kueue admits a pod only if its ClusterQueue covers every resource it requests (init
        # containers count; a limit alone is a request), and the teams' queues cover their
        # accelerators alone: the source fetch keeps only those (its cpu on a CPU cluster, which
        # the team's ResourceQuota on `requests.cpu` also needs every container to state).
        resources = init.get("resources") or {}
        init["resources"] = {kind: kept for kind in ("requests", "limits")
                             if (kept := {k: v for k, v in (resources.get(kind) or {}).items() if k in covered})}
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name, "namespace": options.namespace,
            "labels": labels | {QUEUE_NAME_LABEL: LOCAL_QUEUE,
                                PRIORITY_CLASS_LABEL: workload_priority_class_name(job.metadata.priority)},
            "annotations": {
                "trainyard.io/plan": plan.describe(),
                "trainyard.io/placement-score": str(placement.score),
                START_TIMEOUT_ANNOTATION: str(options.start_timeout_s),
            },
        },
        "spec": {
            "suspend": True,
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": options.ttl_after_finished_s,
            "template": {"metadata": {"labels": dict(labels), "annotations": {SLOTS_ANNOTATION: str(slots)}},
                         "spec": spec},
        },
    }
    check_size(body, nodes, "Indexed Job")
    selector = {k: v for k, v in labels.items() if k in ("trainyard.io/job", "trainyard.io/run", "trainyard.io/attempt")}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": options.namespace, "labels": dict(labels)},
        "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": True,
                 "ports": [{"name": "rendezvous", "port": options.master_port, "targetPort": options.master_port}]},
    }
    return body, service


def owned_by(doc: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """`doc` owned by the created object `owner` (wire form): it goes when the owner goes."""
    meta = owner.get("metadata") or {}
    reference = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"],
                 "controller": False, "blockOwnerDeletion": True}
    return doc | {"metadata": doc["metadata"] | {"ownerReferences": [reference]}}
