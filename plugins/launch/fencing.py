"""A lost node's pods ended as a real cluster ends them: Kubernetes' non-graceful node shutdown.

Why this exists. When a node's link goes down its kubelet can no longer confirm anything, so a
pod there that is deleted stays `Terminating` for good — and with it the gang's Job (deleted in
the foreground, it waits for its pods) and, with Kueue, the gang's quota, so the next attempt on
the spare node is never admitted. Forcing the deletion (`gracePeriodSeconds: 0`, what `kubectl
delete --force` sends, and what the stop did before) makes the API server forget the pod at once
while its containers may still run behind the cut link: Kubernetes' own docs warn against it. Its
documented way is the `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` taint on a node
that is NotReady: kube-controller-manager's pod garbage collector then marks the node's terminating
pods Failed and deletes them (every 20 s, `podgc`'s period), the attach-detach controller detaches
their volumes, and the taint evicts what else runs there. The Job then goes, and Kueue frees its
quota.

The policy (`KubernetesOptions.fence_lost_nodes`, on by default; off: the old forced deletion):
- only nodes the control plane itself judged lost — the health watch's verdict (`lost_nodes` of
  the stop) or a node already NotReady when the stop began — or on which a pod the stop deleted
  is still waiting (a stop that began, for another reason, before either verdict);
- and only once Kubernetes agrees: its node lifecycle controller has set the node's `Ready`
  condition to False or Unknown (`--node-monitor-grace-period`, 50 s by default in v1.37). Two
  independent verdicts: a node whose agent alone went silent keeps a kubelet that ends the pods
  itself, and is never tainted;
- the taint is never taken off by Trainyard: a node that comes back is a person's call
  (`kubectl taint nodes NODE node.kubernetes.io/out-of-service-`, then `trainyard nodes
  uncordon NODE`), as Kubernetes' docs ask once the node is verified healthy.

The control plane's role grants `patch` on Nodes for this (`rbac.py`); the taint is written with
the Node's `resourceVersion` as a precondition, so a concurrent change (the node lifecycle
controller's own taints) is never overwritten: the write is tried again at the next look.
Pure functions here; `KubernetesLauncher.stop` does the I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from trainyard.plugins.launch.kube_status import Observed, node_is_ready

OUT_OF_SERVICE_KEY = "node.kubernetes.io/out-of-service"
OUT_OF_SERVICE_TAINT = {"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown", "effect": "NoExecute"}
"""The taint kube-controller-manager's pod GC and attach-detach controller act on (Kubernetes
docs, "Non-graceful node shutdown handling"; GA in v1.28)."""
LOST_POD_GRACE_S = 1
"""The grace a lost node's pods are deleted with when fencing: graceful (0 would force the API
object away at once), and short: no kubelet will use it, the taint ends them."""


def is_out_of_service(node: Mapping[str, Any] | None) -> bool:
    return any(t.get("key") == OUT_OF_SERVICE_KEY for t in ((node or {}).get("spec") or {}).get("taints") or [])


def nodes_to_fence(seen: Observed, lost: Collection[str]) -> list[str]:
    """The nodes of `lost` that still hold a pod of the gang, that Kubernetes marks NotReady (its
    `Ready` condition False or Unknown) and that are not tainted out-of-service yet."""
    holding = {node for pod in seen.pods if (node := (pod.get("spec") or {}).get("nodeName"))}
    return sorted(node for node in holding & set(lost)
                  if node_is_ready(seen.nodes.get(node)) is False and not is_out_of_service(seen.nodes.get(node)))


def out_of_service_patch(node: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch adding the out-of-service taint to `node`'s taints, valid only for the
    version read (`metadata.resourceVersion`: 409 if the Node changed meanwhile)."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != OUT_OF_SERVICE_KEY]
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
            "spec": {"taints": [*taints, dict(OUT_OF_SERVICE_TAINT)]}}
