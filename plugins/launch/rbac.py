"""The control plane's identity on a cluster: a ServiceAccount with least privilege (issue 55).

What the Kubernetes launcher calls (`volcano.py`, `kube_status.py`) and nothing more: in the jobs'
namespace it creates, reads and deletes Volcano Jobs, reads their PodGroups, lists pods and events
and reads pod logs; across the cluster it reads Nodes (the inventory and where node agents run).
Queues, PriorityClasses and the node-agent DaemonSet are applied once by an administrator
(`trainyard render k8s`), never by the control plane, so it gets no verb on them; of Secrets it
may only create (each attempt's storage keys, owned by its Job: never read, listed or changed), no
pod creation (pods come from the Volcano Job's controller), no writes to Nodes.

`RULES` is the one list: the rendered Role/ClusterRole are made from it, and a test holds it
against a real kube-apiserver with RBAC on (each call the launcher makes is allowed with the
account's own token; the rest is refused).
"""

from __future__ import annotations

from typing import Any

from trainyard.plugins.launch.manifests import QUEUE_GROUP, VOLCANO_GROUP, VOLCANO_PLURAL

ACCOUNT = "trainyard-control-plane"
"""The ServiceAccount (in the jobs' namespace), and the name of its Role, ClusterRole and bindings."""

RULES: tuple[tuple[str, str, tuple[str, ...], bool], ...] = (
    # (API group, resource, verbs, cluster-wide)
    (VOLCANO_GROUP, VOLCANO_PLURAL, ("create", "get", "delete"), False),  # submit, poll, stop
    (QUEUE_GROUP, "podgroups", ("get",), False),  # why a gang is pending
    ("", "pods", ("list",), False),  # the gang's pods (by label)
    ("", "pods/log", ("get",), False),  # rank logs, failed ranks' tails
    ("", "events", ("list",), False),  # why a pod does not start
    ("", "secrets", ("create",), False),  # an attempt's storage keys (plugins/storage/credentials.py)
    ("", "nodes", ("get", "list", "watch"), True),  # the inventory, node health, node agents
)


def _rules(cluster_wide: bool) -> list[dict[str, Any]]:
    return [{"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
            for group, resource, verbs, wide in RULES if wide == cluster_wide]


def render_rbac(namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role + RoleBinding (the jobs' namespace), ClusterRole + ClusterRoleBinding."""
    meta = {"name": ACCOUNT, "labels": {"app.kubernetes.io/part-of": "trainyard"}}
    subject = [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}]
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": namespace}},
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": {**meta, "namespace": namespace},
         "rules": _rules(False)},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": {**meta, "namespace": namespace},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": ACCOUNT}, "subjects": subject},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": meta, "rules": _rules(True)},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": ACCOUNT}, "subjects": subject},
    ]
