"""The control plane's identity on a cluster: a ServiceAccount with least privilege (issue 55).

What the Kubernetes launcher calls (`volcano.py`, `kube_status.py`) and nothing more: in the jobs'
namespaces (each team's, `tenancy.py`; issue 56) it creates, reads and deletes Volcano Jobs and
reads their PodGroups — with Kueue (`queueing="kueue"`) batch Jobs, their headless Services
(create only) and Kueue's Workloads (list) instead — lists pods and events
and reads pod logs; across the cluster it reads Nodes (the inventory and where node agents run).
Queues, PriorityClasses and the node-agent DaemonSet are applied once by an administrator
(`trainyard render k8s`), never by the control plane, so it gets no verb on them; of Secrets it
may only create (each attempt's storage keys, owned by its Job: never read, listed or changed), no
pod creation (pods come from the Volcano Job's controller); pods it may delete (the stop ends each
with its grace). Of Nodes it may write only by `patch`, and only with `fence_lost_nodes` (the
default): a lost, NotReady node's out-of-service taint (`fencing.py`); RBAC cannot narrow a patch
to one field, so the opt-out (`KubernetesOptions.fence_lost_nodes=False`) renders no write to
Nodes at all. It may never delete a Node.

The namespaced rules are one ClusterRole (`<account>-jobs`) that grants nothing by itself: a
RoleBinding in each jobs' namespace grants it there, so the account may create Volcano Jobs in
the team namespaces only, not in its own, `kube-system` or any other.

`RULES` is the one list: the rendered ClusterRoles are made from it, and a test holds it
against a real kube-apiserver with RBAC on (each call the launcher makes is allowed with the
account's own token; the rest is refused).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainyard.plugins.launch.manifests import QUEUE_GROUP, VOLCANO_GROUP, VOLCANO_PLURAL

ACCOUNT = "trainyard-control-plane"
"""The ServiceAccount (in the platform's namespace), and the name of its ClusterRoles and bindings."""
JOBS_ROLE = f"{ACCOUNT}-jobs"
"""The ClusterRole of the namespaced rules, bound per jobs' namespace."""

RULES: tuple[tuple[str, str, tuple[str, ...], bool, str], ...] = (
    # (API group, resource, verbs, cluster-wide, when: '' always, `volcano` or `kueue` (the
    # queueing) only, `fence`: only with `fence_lost_nodes`)
    (VOLCANO_GROUP, VOLCANO_PLURAL, ("create", "get", "delete"), False, "volcano"),  # submit, poll, stop
    (QUEUE_GROUP, "podgroups", ("get",), False, "volcano"),  # why a gang is pending
    ("batch", "jobs", ("create", "get", "delete"), False, "kueue"),  # submit, poll, stop (kueue_job.py)
    ("", "services", ("create",), False, "kueue"),  # the pods' DNS names, owned by the Job
    ("kueue.x-k8s.io", "workloads", ("list",), False, "kueue"),  # why a gang waits (its quota, a preemption)
    ("", "pods", ("list", "delete"), False, ""),  # the gang's pods (by label); stop ends each with its grace
    ("", "pods/log", ("get",), False, ""),  # rank logs, failed ranks' tails
    ("", "events", ("list",), False, ""),  # why a pod does not start
    ("", "secrets", ("create",), False, ""),  # an attempt's storage keys (plugins/storage/credentials.py)
    ("", "nodes", ("get", "list", "watch"), True, ""),  # the inventory, node health, node agents
    ("", "nodes", ("patch",), True, "fence"),  # a lost NotReady node's out-of-service taint (fencing.py)
)


def rules_for(queueing: str, *, fence_lost_nodes: bool = True) -> list[tuple[str, str, tuple[str, ...], bool]]:
    """(group, resource, verbs, cluster-wide) of the rules the launcher needs with `queueing`
    (and `fence_lost_nodes`: `KubernetesOptions`' fields of the same names)."""
    wanted = ("", queueing, *(("fence",) if fence_lost_nodes else ()))
    return [(group, resource, verbs, wide) for group, resource, verbs, wide, only in RULES if only in wanted]


def _rules(cluster_wide: bool, queueing: str, fence_lost_nodes: bool) -> list[dict[str, Any]]:
    return [{"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
            for group, resource, verbs, wide in rules_for(queueing, fence_lost_nodes=fence_lost_nodes)
            if wide == cluster_wide]


def render_rbac(namespace: str, job_namespaces: Iterable[str] | None = None, *,
                queueing: str = "volcano", fence_lost_nodes: bool = True) -> list[dict[str, Any]]:
    """ServiceAccount (in `namespace`, the platform's), the ClusterRole of the namespaced rules with
    a RoleBinding in each of `job_namespaces` (default: `namespace` alone), and the ClusterRole of
    the cluster-wide rules with its ClusterRoleBinding — the rules the launcher needs with
    `queueing` and `fence_lost_nodes` (`KubernetesOptions`)."""
    meta = {"name": ACCOUNT, "labels": {"app.kubernetes.io/part-of": "trainyard"}}
    subject = [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}]
    rbac = "rbac.authorization.k8s.io"
    bindings = [{"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": {**meta, "namespace": ns},
                 "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": JOBS_ROLE}, "subjects": subject}
                for ns in dict.fromkeys(job_namespaces if job_namespaces is not None else (namespace,))]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": namespace}},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {**meta, "name": JOBS_ROLE},
         "rules": _rules(False, queueing, fence_lost_nodes)},
        *bindings,
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": meta, "rules": _rules(True, queueing, fence_lost_nodes)},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": ACCOUNT}, "subjects": subject},
    ]
