"""The emulated API server with Volcano and no node processes: the part of the harness that
needs no network namespaces.

`KubeHarness` runs it with real nodes (`kubelet.py` in namespaces) and the controllers on a
thread. Unit tests use it alone: they register `Node` objects, write pod statuses the way a
kubelet would (`pod_running`, `pod_exited`, `pod_waiting` — validated by the server like any
write) and advance the controllers one `tick()` at a time, so nothing depends on timing.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.support.kube.apiserver import ApiServer, LogPath
from tests.support.kube.lifecycle import ClusterDns, NodeLifecycle, node_ready
from tests.support.kube.rest import Rest
from tests.support.kube.store import BY_PATH, now_rfc3339
from tests.support.kube.volcano import GangScheduler, JobController, admit_job


class ControlPlane:
    def __init__(self, root: Path, *, namespace: str = "trainyard", node_grace_s: float = 10.0,
                 eviction_s: float = 1.0, log_path: LogPath | None = None,
                 write_hosts: Any = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self.token = secrets.token_hex(16)
        self.server = ApiServer(self.token, log_path=log_path)
        self.url = self.server.listen()
        store = self.server.store
        store.admission["jobs.batch.volcano.sh"] = [admit_job]
        store.create(BY_PATH[("", "v1", "namespaces")], None,
                     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        store.create(BY_PATH[("scheduling.volcano.sh", "v1beta1", "queues")], None, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "default"},
            "spec": {"weight": 1, "reclaimable": True}})
        self.rest = Rest(self.url, self.token)
        self.kubeconfig = self.root / "kubeconfig"
        self._write_kubeconfig()
        self.dns = ClusterDns(self.rest, write_hosts or (lambda entries: None))
        self.jobs = JobController(self.rest, self.ready_nodes)
        self.scheduler = GangScheduler(self.rest, before_bind=self.dns.write)
        self.lifecycle = NodeLifecycle(self.rest, grace_s=node_grace_s, eviction_s=eviction_s)

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- clients ---

    def _write_kubeconfig(self) -> None:
        import yaml

        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kube-sim",
            "clusters": [{"name": "kube-sim", "cluster": {"server": self.url}}],
            "users": [{"name": "kube-sim", "user": {"token": self.token}}],
            "contexts": [{"name": "kube-sim", "context": {"cluster": "kube-sim", "user": "kube-sim",
                                                          "namespace": self.namespace}}],
        }))

    @property
    def connection_uri(self) -> str:
        """An Airflow connection for the cncf-kubernetes provider (`AIRFLOW_CONN_<ID>`)."""
        return f"kubernetes://?kube_config_path={quote(str(self.kubeconfig), safe='')}&namespace={self.namespace}"

    @property
    def connection_json(self) -> str:
        return json.dumps({"conn_type": "kubernetes",
                           "extra": {"kube_config_path": str(self.kubeconfig), "namespace": self.namespace}})

    # --- the controllers, one step at a time ---

    def tick(self, times: int = 1, *, lifecycle: bool = False) -> None:
        for _ in range(times):
            self.server.store.collect_garbage()
            self.jobs.tick()
            self.scheduler.tick()
            if lifecycle:
                self.lifecycle.tick()
            self.dns.write()

    def ready_nodes(self) -> set[str]:
        return {n["metadata"]["name"] for n in self.rest.list("v1", "nodes") if node_ready(n)}

    # --- what a kubelet would write (for tests without node processes) ---

    def add_node(self, name: str, *, cpu: str = "1", labels: dict[str, str] | None = None,
                 address: str = "10.213.0.99") -> dict[str, Any]:
        now = now_rfc3339()
        return self.rest.create("v1", "nodes", None, {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {},
            "status": {"capacity": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
                       "allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
                       "addresses": [{"type": "InternalIP", "address": address}],
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": now, "lastTransitionTime": now}]}})

    def set_node_ready(self, name: str, ready: bool) -> None:
        now = now_rfc3339()
        self.rest.patch("v1", "nodes", None, name, {"status": {"conditions": [
            {"type": "Ready", "status": "True" if ready else "Unknown", "lastHeartbeatTime": now,
             "lastTransitionTime": now, "reason": "KubeletReady" if ready else "NodeStatusUnknown"}]}}, status=True)

    def _container(self, pod: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        spec = pod["spec"]["containers"][0]
        return {"name": spec["name"], "image": spec["image"], "imageID": "", "restartCount": 0,
                "ready": "running" in state, "started": "running" in state, "state": state}

    def _pod_status(self, name: str, phase: str, state: dict[str, Any]) -> dict[str, Any]:
        pod = self.rest.get("v1", "pods", self.namespace, name)
        status = {"phase": phase, "startTime": now_rfc3339(), "containerStatuses": [self._container(pod, state)]}
        return self.rest.patch("v1", "pods", self.namespace, name, {"status": status}, status=True)

    def pod_running(self, name: str) -> dict[str, Any]:
        return self._pod_status(name, "Running", {"running": {"startedAt": now_rfc3339()}})

    def pod_exited(self, name: str, code: int, *, reason: str = "", message: str = "") -> dict[str, Any]:
        terminated = {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"),
                      "startedAt": now_rfc3339(), "finishedAt": now_rfc3339(), **({"message": message} if message else {})}
        return self._pod_status(name, "Succeeded" if code == 0 else "Failed", {"terminated": terminated})

    def pod_waiting(self, name: str, reason: str, message: str) -> dict[str, Any]:
        return self._pod_status(name, "Pending", {"waiting": {"reason": reason, "message": message}})

    def finish_deletions(self) -> None:
        """What the kubelets do for pods marked for deletion: confirm with grace 0."""
        for pod in self.rest.list("v1", "pods"):
            if pod["metadata"].get("deletionTimestamp"):
                self.rest.delete("v1", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                                 {"gracePeriodSeconds": 0})
