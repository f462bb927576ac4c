"""The node lifecycle controller and the cluster DNS of the emulated cluster.

**Node lifecycle** (what kube-controller-manager does, with this harness's shorter timings):
a node whose kubelet has not posted status for `grace_s` (Kubernetes' node-monitor-grace-period,
40 s by default) gets `Ready=Unknown` ("Kubelet stopped posting node status."), the
`node.kubernetes.io/unreachable` taints (NoSchedule and NoExecute) and a `NodeNotReady` event;
its pods get `Ready=False`. After `eviction_s` more (the DefaultTolerationSeconds admission's
300 s in Kubernetes) each pod that has not ended is evicted the way the taint manager does it:
a `DisruptionTarget` condition (reason `DeletionByTaintManager`), a `TaintManagerEviction` event,
then a graceful delete — which the lost node's kubelet cannot finish, so the pod stays
Terminating (its processes keep running behind the cut link, as on a real partitioned node)
until someone force-deletes it — or, as kube-controller-manager's pod GC does on a node that is
not Ready and carries the `node.kubernetes.io/out-of-service` taint (non-graceful node shutdown;
what the launcher's stop applies to a lost node, `plugins/launch/fencing.py`), until that taint
is there: the terminating pods are then marked Failed and deleted (at once here; every 20 s in
Kubernetes). When the kubelet posts status again, the unreachable taints are removed (the
out-of-service taint is a person's to remove, as on a real cluster).

**DNS**: a pod with `hostname` and `subdomain`, bound to a node, in a namespace with a Service
named like the subdomain, resolves as `<hostname>.<subdomain>.<namespace>.svc.cluster.local`,
`<hostname>.<subdomain>` and `<hostname>` to its node's address, on every node (`netns.Network.
write_hosts`). The gang scheduler calls `write` just before it binds, so a pod never starts
before its peers' names resolve.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tests.support.kube.rest import Rest, RestError
from tests.support.kube.store import now_rfc3339, parse_time

UNREACHABLE = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


def node_ready(node: dict[str, Any]) -> bool:
    ready = next((c for c in node["status"].get("conditions") or [] if c["type"] == "Ready"), {})
    return ready.get("status") == "True"


class NodeLifecycle:
    def __init__(self, api: Rest, *, grace_s: float, eviction_s: float) -> None:
        self.api = api
        self.grace_s = grace_s
        self.eviction_s = eviction_s

    def tick(self) -> None:
        now = datetime.now(UTC)
        pods = self.api.list("v1", "pods")
        for node in self.api.list("v1", "nodes"):
            conditions = node["status"].get("conditions") or []
            ready = next((c for c in conditions if c["type"] == "Ready"), None)
            if ready is None:
                continue
            taints = node["spec"].get("taints") or []
            tainted = any(t["key"] == UNREACHABLE for t in taints)
            on_node = [p for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"]]
            if ready["status"] == "True":
                stale = (now - parse_time(ready["lastHeartbeatTime"])).total_seconds() > self.grace_s
                if stale:
                    self._mark_unknown(node, conditions, taints, on_node)
                elif tainted:
                    self.api.patch("v1", "nodes", None, node["metadata"]["name"],
                                   {"spec": {"taints": [t for t in taints if t["key"] != UNREACHABLE] or None}})
                continue
            if any(t["key"] == OUT_OF_SERVICE for t in taints):
                for pod in on_node:
                    self._gc_terminating(pod)
            added = next((t.get("timeAdded") for t in taints if t["key"] == UNREACHABLE and t["effect"] == "NoExecute"),
                         None)
            if added and (now - parse_time(added)).total_seconds() >= self.eviction_s:
                for pod in on_node:
                    self._evict(pod)

    def _mark_unknown(self, node: dict[str, Any], conditions: list[dict[str, Any]], taints: list[dict[str, Any]],
                      pods: list[dict[str, Any]]) -> None:
        now = now_rfc3339()
        unknown = [dict(c, status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.",
                        lastTransitionTime=now) for c in conditions]
        name = node["metadata"]["name"]
        self.api.patch("v1", "nodes", None, name, {"status": {"conditions": unknown}}, status=True)
        self.api.patch("v1", "nodes", None, name, {"spec": {"taints": [
            *[t for t in taints if t["key"] != UNREACHABLE],
            {"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now},
            {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now}]}})
        self.api.event(node, "NodeNotReady", f"Node {name} status is now: NodeNotReady", type_="Normal",
                       component="node-controller")
        for pod in pods:
            if pod["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            conditions = [c for c in pod["status"].get("conditions") or [] if c["type"] not in ("Ready",)]
            conditions.append({"type": "Ready", "status": "False", "lastTransitionTime": now})
            self.api.patch("v1", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                           {"status": {"conditions": conditions}}, status=True)

    def _gc_terminating(self, pod: dict[str, Any]) -> None:
        """The pod GC on an out-of-service node: a terminating pod is marked Failed, then deleted."""
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        try:
            if pod["status"].get("phase") not in ("Succeeded", "Failed"):
                self.api.patch("v1", "pods", meta["namespace"], meta["name"], {"status": {"phase": "Failed"}},
                               status=True)
            self.api.delete("v1", "pods", meta["namespace"], meta["name"], {"gracePeriodSeconds": 0})
        except RestError as e:
            if e.status != 404:
                raise

    def _evict(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or pod["status"].get("phase") in ("Succeeded", "Failed"):
            return
        conditions = [c for c in pod["status"].get("conditions") or [] if c["type"] != "DisruptionTarget"]
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                           "message": "Taint manager: deleting due to NoExecute taint",
                           "lastTransitionTime": now_rfc3339()})
        try:
            self.api.patch("v1", "pods", meta["namespace"], meta["name"], {"status": {"conditions": conditions}},
                           status=True)
            self.api.event(pod, "TaintManagerEviction", f"Marking for deletion Pod {meta['namespace']}/{meta['name']}",
                           type_="Normal", component="taint-eviction-controller")
            self.api.delete("v1", "pods", meta["namespace"], meta["name"])
        except RestError as e:
            if e.status != 404:
                raise


class ClusterDns:
    def __init__(self, api: Rest, write_hosts: Callable[[dict[str, str]], None], *,
                 addressed_only: bool = False) -> None:
        """`addressed_only`: publish a pod only once its kubelet reported `status.podIP`, under
        that address (the real-cluster harness: no gang scheduler writes names before binding)."""
        self.api = api
        self.write_hosts = write_hosts
        self.addressed_only = addressed_only

    def entries(self, assignment: dict[str, str] | None = None) -> dict[str, str]:
        """host names → address, for bound pods (and those `assignment` is about to bind)."""
        addresses = {n["metadata"]["name"]: next((a["address"] for a in n["status"].get("addresses") or []
                                                   if a["type"] == "InternalIP"), "")
                     for n in self.api.list("v1", "nodes")}
        services = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in self.api.list("v1", "services")}
        out = {}
        for pod in self.api.list("v1", "pods"):
            spec, meta = pod["spec"], pod["metadata"]
            node = spec.get("nodeName") or (assignment or {}).get(meta["name"])
            hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
            if not node or not hostname or not subdomain or (meta["namespace"], subdomain) not in services:
                continue
            names = f"{hostname}.{subdomain}.{meta['namespace']}.svc.cluster.local {hostname}.{subdomain} {hostname}"
            out[names] = (pod.get("status") or {}).get("podIP", "") if self.addressed_only else addresses.get(node, "")
        return {k: v for k, v in out.items() if v}

    def write(self, assignment: dict[str, str] | None = None) -> None:
        self.write_hosts(self.entries(assignment))
