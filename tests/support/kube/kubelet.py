"""A simulated node's kubelet: `python -m tests.support.kube.kubelet CONFIG.json`, started by
the harness with `ip netns exec <node ns>`, so it and every container it starts live on that
node's network (and reach the API server over the simulated network, on the bridge address).

It registers its `Node` (labels and capacity from the config), posts the node's status every
`heartbeat_s`, and runs the pods bound to it as real processes:

- **Image → this machine.** No image is pulled: every image is "this repository's venv" — the
  container's `command` + `args` run with `.venv/bin` first on `PATH`, `PYTHONPATH` = the
  repository root and the working directory the repository root (what the project's Dockerfile
  sets: `WORKDIR`/`PYTHONPATH` = the source), unless the container names a `workingDir`. An
  image listed in `missing_images` fails to pull (`ErrImagePull`, then `ImagePullBackOff`, with
  the events a real kubelet records) and the pod stays Pending.
- **A container is a process in namespaces of its own**: a PID namespace (it is PID 1 there:
  a SIGTERM it has no handler for is ignored, and when it dies every process it started dies
  with it — torchrun's workers included, though they run in sessions of their own), a mount
  namespace (its volumes bind-mounted at their `mountPath`s) and a UTS namespace (its host
  name is the pod's `hostname`, so gloo finds the pod's address from it, as in a real pod).
  It shares the node's network namespace with the other pods of the node (as with
  `hostNetwork: true`): the pod's IP is the node's, and two pods of one node cannot listen on
  one port — the gang scheduler's capacity (one pod per CPU "GPU") keeps attempts apart. A
  `hostPort` is therefore what it is on a real node: the container's port answers on the node's
  address (kube-scheduler keeps two pods asking one hostPort off one node).
- **Volumes**: `emptyDir` is a folder of the pod where a kubelet keeps it
  (`<pod>/volumes/kubernetes.io~empty-dir/<name>`, in the kubelet's pods folder, root's, 0750);
  `hostPath` a folder of the node (`<node root>/hostfs/<path>`; the kubelet's own `root_dir`,
  `/var/lib/kubelet`, is the node's folder itself, so a hostPath of `/var/lib/kubelet/pods`
  sees the pods' volumes, as the node agent's does), its `type` checked (`Directory` must
  exist). A mount point must exist on this machine or lie under the harness's folder (where it
  is made); other volume types fail the container with `CreateContainerConfigError`.
- **Env**: `value`, `valueFrom.fieldRef` (metadata.name/namespace/uid/labels[…],
  spec.nodeName, spec.serviceAccountName, status.podIP/hostIP) and `valueFrom.secretKeyRef`
  (read with the node's token, as the Node authorizer allows); `$(VAR)` references in
  command and args are expanded as Kubernetes does. The security context is enforced only
  with `Config.security_context` (the real-cluster harness): the shim sets the container's
  groups, gid and uid before exec, and its capabilities and `allowPrivilegeEscalation`
  (`capabilities.py`: the runtime's default set less `drop` plus `add`), and emptyDir volumes
  belong to the pod's fsGroup (setgid); without it (the emulator) containers run as this
  process's user with all its capabilities. Resource limits are not
  enforced — `OOMKilled` is what the harness reports when it kills a container
  "for memory" (`Harness.kill_pod(..., oom=True)` leaves a marker before its SIGKILL).
- **Init containers** run one at a time, each to a zero exit, before the main containers
  (`initContainerStatuses`, condition `Initialized`); a failed one fails the pod.
- **Real API server** (`Config.real_api`): HTTPS with `ca_file`, the node registers tainted
  `node.kubernetes.io/not-ready:NoSchedule` and renews its Lease in kube-node-lease.
- **Probes**: readiness and liveness (`probes.py`: httpGet and tcpSocket): a container is
  ready once its readiness probe passes (at once without one); a failed liveness probe gets it
  killed and restarted.
- **Restarts**: under restartPolicy Always (a DaemonSet's pods) or OnFailure, an ended main
  container starts again after the kubelet's back-off (CrashLoopBackOff meanwhile; 10 s,
  doubled, at most 300 s), `restartCount` and `lastState` reported; the pod stays Running.
- **Exit**: phase Succeeded / Failed (restartPolicy Never, or OnFailure with every container
  succeeded), exit code (128 + signal when killed), reason `Completed` / `Error` / `OOMKilled`, and the
  termination message: the file at `terminationMessagePath` when it lies in a volume (the
  last 4096 bytes, as the kubelet reads it), else with `FallbackToLogsOnError` the log's tail.
- **Deletion**: a pod marked for deletion gets SIGTERM, then SIGKILL at its deadline
  (`deletionTimestamp`); once its containers are gone the kubelet reports them and finishes the
  deletion (grace 0, uid precondition). A running pod that vanished from the API is killed.

How a container starts: the kubelet forks a shim (like containerd's), which enters new mount
and UTS namespaces, bind-mounts the volumes, sets the host name, unshares the PID namespace and
forks the container's first process (PID 1 there; it dies with the shim: PDEATHSIG), then waits
for it and writes its exact wait status (`<container>.status`: negative = the signal) for the
kubelet. The container's host pid is in `<container>.pid`; signals go to it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.kube import capabilities
from tests.support.kube.probes import Prober
from tests.support.kube.rest import Rest, RestError
from tests.support.kube.store import now_rfc3339, parse_time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWPID = 0x00020000, 0x04000000, 0x20000000
PR_SET_PDEATHSIG = 1
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
TERMINATION_MESSAGE_BYTES = 4096
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
"""The kubelet's default `nodeLeaseDurationSeconds`."""
BACKOFF_S, MAX_BACKOFF_S = 10.0, 300.0
"""The kubelet's restart back-off (CrashLoopBackOff): 10 s, doubled each restart, at most 300 s."""
_libc = ctypes.CDLL(None, use_errno=True)
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables are replaced, `$$` is `$`, the rest stays."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


@dataclass
class Config:
    node: str
    api: str
    token: str
    root: str
    """The node's folder (pods, logs, hostPath volumes)."""
    harness_root: str
    address: str
    labels: dict[str, str]
    capacity: dict[str, str]
    repo: str
    venv_bin: str
    image_env: dict[str, str] = field(default_factory=dict)
    missing_images: list[str] = field(default_factory=list)
    heartbeat_s: float = 1.0
    sync_s: float = 0.5
    ca_file: str = ""
    """The CA of a real API server (HTTPS); empty for the emulator's plain HTTP."""
    real_api: bool = False
    """A real kube-apiserver: register with the not-ready taint the node lifecycle controller
    removes, and renew the node's Lease in kube-node-lease every `heartbeat_s`."""
    security_context: bool = False
    """Run containers as their securityContext's user and groups, with its capabilities and
    `allowPrivilegeEscalation` (`capabilities.py`), emptyDir volumes owned by the pod's fsGroup
    (as a kubelet does); off, they run as root with all of root's capabilities and every volume
    mode 1777."""
    root_dir: str = "/var/lib/kubelet"
    """The kubelet's `--root-dir` as the node's filesystem has it: a hostPath there (the node
    agent's of `<root_dir>/pods`) is this kubelet's own folder, where the pods' volumes lie."""


class CannotStart(Exception):
    """The container cannot be created: (reason, message) go into its waiting state."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass
class Shim:
    """The forked shim of one container: `pid` (ours to reap), `init_pid` (the container's PID 1
    as this machine sees it), and the exit code once known (negative = killed by that signal)."""

    pid: int
    folder: Path
    name: str
    code: int | None = None

    @property
    def init_pid(self) -> int | None:
        try:
            return int((self.folder / f"{self.name}.pid").read_text())
        except (OSError, ValueError):
            return None

    def finished_at(self) -> str:
        """When the container's PID 1 ended: the shim writes its status file then (the kubelet may
        notice later, after it has started the next container)."""
        try:
            mtime = (self.folder / f"{self.name}.status").stat().st_mtime
        except OSError:
            return now_rfc3339()
        return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def poll(self) -> int | None:
        if self.code is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                try:
                    self.code = int((self.folder / f"{self.name}.status").read_text())
                except (OSError, ValueError):  # the shim itself died: report how
                    self.code = os.waitstatus_to_exitcode(status)
        return self.code


@dataclass
class Container:
    name: str
    image: str
    proc: Shim
    started_at: str
    log: Path
    termination_file: Path | None
    fallback_to_logs: bool
    oom_marker: Path
    term_sent: bool = False
    finished_at: str = ""
    prober: Prober | None = None
    kill_at: float | None = None
    """Set when the liveness probe failed: SIGTERM sent, SIGKILL at this monotonic time."""

    def state(self) -> dict[str, Any]:
        code = self.proc.poll()
        if code is None:
            return {"running": {"startedAt": self.started_at}}
        self.finished_at = self.finished_at or self.proc.finished_at()
        exit_code = 128 - code if code < 0 else code
        reason = ("OOMKilled" if self.oom_marker.exists() and exit_code == 137
                  else "Completed" if exit_code == 0 else "Error")
        terminated = {"exitCode": exit_code, "reason": reason, "startedAt": self.started_at,
                      "finishedAt": self.finished_at, "containerID": f"trainyard://{self.proc.init_pid or self.proc.pid}"}
        if code < 0:
            terminated["signal"] = -code
        message = self._message(exit_code)
        if message:
            terminated["message"] = message
        return {"terminated": terminated}

    def _message(self, exit_code: int) -> str:
        text = ""
        if self.termination_file is not None and self.termination_file.exists():
            data = self.termination_file.read_bytes()[-TERMINATION_MESSAGE_BYTES:]
            text = data.decode(errors="replace")
        if not text and self.fallback_to_logs and exit_code != 0 and self.log.exists():
            lines = self.log.read_bytes().splitlines()[-80:]
            text = b"\n".join(lines)[-2048:].decode(errors="replace")
        return text


@dataclass
class PodRun:
    uid: str
    dir: Path
    containers: dict[str, Container] = field(default_factory=dict)
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    events_sent: set[str] = field(default_factory=set)
    reported_final: bool = False
    restarts: dict[str, int] = field(default_factory=dict)
    last_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    restart_at: dict[str, float] = field(default_factory=dict)
    """Container → when it restarts (restartPolicy Always/OnFailure), in CrashLoopBackOff till then."""

    @property
    def running(self) -> bool:
        return any(c.proc.poll() is None for c in self.containers.values())


class Kubelet:
    def __init__(self, config: Config) -> None:
        self.c = config
        self.api = Rest(config.api, config.token, timeout_s=2.0, ca_file=config.ca_file or None)
        self.root = Path(config.root)
        # a kubelet's pods folder is root's, mode 0750: what reads pods' volumes there is root
        (self.root / "pods").mkdir(parents=True, exist_ok=True)
        (self.root / "pods").chmod(0o750)
        self.pods: dict[str, PodRun] = {}
        self.last_beat = 0.0
        self.ready_since = now_rfc3339()
        self.node_uid = ""

    # --- the node ---

    def node_status(self) -> dict[str, Any]:
        now = now_rfc3339()

        def condition(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {"type": type_, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": self.ready_since}

        return {
            "capacity": self.c.capacity, "allocatable": self.c.capacity,
            "addresses": [{"type": "InternalIP", "address": self.c.address}, {"type": "Hostname", "address": self.c.node}],
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": "amd64", "bootID": self.c.node, "containerRuntimeVersion": "trainyard://0.1",
                         "kernelVersion": os.uname().release, "kubeProxyVersion": "", "kubeletVersion": "v1.33.0",
                         "machineID": self.c.node, "operatingSystem": "linux", "osImage": "trainyard kube emulator",
                         "systemUUID": self.c.node},
        }

    def register(self) -> None:
        # a real kubelet registers tainted not-ready; the node lifecycle controller lifts it once Ready
        spec = {"taints": [{"key": NOT_READY_TAINT, "effect": "NoSchedule"}]} if self.c.real_api else {}
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.c.node, "labels": self.c.labels}, "spec": spec, "status": self.node_status()}
        try:
            self.node_uid = self.api.create("v1", "nodes", None, body)["metadata"]["uid"]
        except RestError as e:
            if e.status != 409:
                raise
            node = self.api.patch("v1", "nodes", None, self.c.node, {"status": self.node_status()}, status=True)
            self.node_uid = node["metadata"]["uid"]
        self.renew_lease()
        self.last_beat = time.monotonic()
        print(f"{now_rfc3339()} kubelet {self.c.node}: registered, taints {spec.get('taints', [])}", flush=True)

    def renew_lease(self) -> None:
        """The node's heartbeat on a real cluster: `kube-node-lease/<node>`, owned by the Node."""
        if not self.c.real_api:
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # a MicroTime
        try:
            self.api.patch("coordination.k8s.io/v1", "leases", LEASE_NAMESPACE, self.c.node,
                           {"spec": {"holderIdentity": self.c.node, "renewTime": now}})
        except RestError as e:
            if e.status != 404:
                raise
            self.api.create("coordination.k8s.io/v1", "leases", LEASE_NAMESPACE, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.c.node, "namespace": LEASE_NAMESPACE, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.c.node, "uid": self.node_uid}]},
                "spec": {"holderIdentity": self.c.node, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": now}})

    def heartbeat(self) -> None:
        if time.monotonic() - self.last_beat < self.c.heartbeat_s:
            return
        self.renew_lease()
        self.api.patch("v1", "nodes", None, self.c.node, {"status": {"conditions": self.node_status()["conditions"]}},
                       status=True)
        self.last_beat = time.monotonic()

    # --- pods ---

    def sync(self) -> None:
        pods = self.api.list("v1", "pods", fields=f"spec.nodeName={self.c.node}")
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            run = self.pods.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod, run)
                continue
            if run is None and pod["status"].get("phase") == "Pending":
                run = self.pods[uid] = PodRun(uid=uid, dir=self._pod_dir(pod))
            if run is not None and not run.reported_final:
                self._start_waiting(pod, run)
                self._probe(pod, run)
                self._report(pod, run)
        for uid, run in list(self.pods.items()):
            if uid not in seen:  # force-deleted, or gone with the node's replacement
                self._kill(run, signal.SIGKILL)
                if not run.running:
                    del self.pods[uid]

    def _pod_dir(self, pod: dict[str, Any]) -> Path:
        meta = pod["metadata"]
        path = self.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _start_waiting(self, pod: dict[str, Any], run: PodRun) -> None:
        """Init containers one at a time, each to a zero exit, then every main container."""
        for spec in pod["spec"].get("initContainers") or []:
            container = run.containers.get(spec["name"])
            if container is None:
                self._start_one(pod, run, spec)
                return
            if container.proc.poll() != 0:  # running, or failed: the pod fails (restartPolicy Never)
                return
        policy = pod["spec"].get("restartPolicy", "Always")
        for spec in pod["spec"]["containers"]:
            if spec["name"] not in run.containers:
                self._start_one(pod, run, spec)
            else:
                self._restart_ended(pod, run, spec, policy)

    def _restart_ended(self, pod: dict[str, Any], run: PodRun, spec: dict[str, Any], policy: str) -> None:
        """A main container that ended, under restartPolicy Always (or OnFailure, after a failure):
        in CrashLoopBackOff for 10 s, doubled each restart up to 300 s, then started again."""
        name, container = spec["name"], run.containers[spec["name"]]
        code = container.proc.poll()
        if code is None or policy == "Never" or (policy == "OnFailure" and code == 0):
            return
        now = time.monotonic()
        backoff = min(BACKOFF_S * 2 ** run.restarts.get(name, 0), MAX_BACKOFF_S)
        if now < run.restart_at.setdefault(name, now + backoff):
            return
        del run.restart_at[name]
        run.last_state[name] = container.state()
        run.restarts[name] = run.restarts.get(name, 0) + 1
        del run.containers[name]
        run.events_sent.discard(f"started-{name}")
        self._start_one(pod, run, spec)

    def _probe(self, pod: dict[str, Any], run: PodRun) -> None:
        """The running containers' due probes (`probes.py`); a failed liveness probe gets the
        container SIGTERM, SIGKILL after the pod's grace, and the restart policy's restart."""
        now = time.monotonic()
        for name, container in run.containers.items():
            if container.prober is None or container.proc.poll() is not None:
                continue
            pid = container.proc.init_pid
            if container.kill_at is not None:
                if now >= container.kill_at and pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                continue
            for kind, passed, error in container.prober.due(now):
                if not passed:
                    what = "Readiness" if kind == "readinessProbe" else "Liveness"
                    self.api.event(pod, "Unhealthy", f"{what} probe failed: {error}", component="kubelet")
            if container.prober.dead and pid is not None:
                self.api.event(pod, "Killing", f"Container {name} failed liveness probe, will be restarted",
                               type_="Normal", component="kubelet")
                container.kill_at = now + pod["spec"].get("terminationGracePeriodSeconds", 30)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def _start_one(self, pod: dict[str, Any], run: PodRun, spec: dict[str, Any]) -> None:
        try:
            self._pull(pod, run, spec)
            run.containers[spec["name"]] = self._start(pod, run, spec)
            run.waiting.pop(spec["name"], None)
            self._event_once(pod, run, f"started-{spec['name']}", "Started",
                             f"Started container {spec['name']}", "Normal")
        except CannotStart as e:
            run.waiting[spec["name"]] = (e.reason, e.message)
            if e.reason not in ("ErrImagePull", "ImagePullBackOff"):
                self._event_once(pod, run, e.reason + spec["name"], "Failed", f"Error: {e.message}")

    def _pull(self, pod: dict[str, Any], run: PodRun, spec: dict[str, Any]) -> None:
        image = spec["image"]
        if image not in self.c.missing_images:
            return
        self._event_once(pod, run, f"pull-{image}", "Failed",
                         f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and '
                         f'unpack image "{image}": not found')
        if f"errimagepull-{spec['name']}" not in run.events_sent:
            run.events_sent.add(f"errimagepull-{spec['name']}")
            raise CannotStart("ErrImagePull", f'failed to pull and unpack image "{image}": not found')
        self._event_once(pod, run, f"backoff-{image}", "BackOff", f'Back-off pulling image "{image}"', "Normal")
        raise CannotStart("ImagePullBackOff", f'Back-off pulling image "{image}"')

    def _env(self, pod: dict[str, Any], spec: dict[str, Any]) -> dict[str, str]:
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
                  "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": self.c.node,
                  "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
                  "status.podIP": self.c.address, "status.hostIP": self.c.address}
        env = {"PATH": f"{self.c.venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "PYTHONPATH": self.c.repo, "HOSTNAME": self._hostname(pod), **self.c.image_env}
        for item in spec.get("env") or []:
            if "value" in item or "valueFrom" not in item:  # an empty value goes over the wire as none
                env[item["name"]] = expand(item.get("value", ""), env)
                continue
            secret_ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if secret_ref is not None:
                env[item["name"]] = self._secret_value(pod, secret_ref)
                continue
            ref = (item.get("valueFrom") or {}).get("fieldRef")
            if ref is None:
                raise CannotStart("CreateContainerConfigError",
                                  f"env {item['name']}: only value, fieldRef and secretKeyRef are emulated")
            path = ref["fieldPath"]
            if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
                env[item["name"]] = (pod["metadata"].get(m.group(1)) or {}).get(m.group(2), "")
            elif path in fields:
                env[item["name"]] = fields[path]
            else:
                raise CannotStart("CreateContainerConfigError", f"env {item['name']}: fieldPath {path} is not emulated")
        return env

    def _secret_value(self, pod: dict[str, Any], ref: dict[str, Any]) -> str:
        """A `secretKeyRef`'s value, read with the node's own token (the Node authorizer lets a
        kubelet read a Secret only once a pod bound to it names it); a missing Secret or key is
        `CreateContainerConfigError`, as a kubelet reports it, unless the reference is optional."""
        import base64

        namespace, name, key = pod["metadata"]["namespace"], ref["name"], ref["key"]
        try:
            data = self.api.get("v1", "secrets", namespace, name).get("data") or {}
        except RestError as e:
            if e.status == 404 and ref.get("optional"):
                return ""
            raise CannotStart("CreateContainerConfigError", f'secret "{name}" not found' if e.status == 404
                              else f'cannot read secret "{name}": {e}') from None
        if key not in data:
            if ref.get("optional"):
                return ""
            raise CannotStart("CreateContainerConfigError", f"couldn't find key {key} in Secret {namespace}/{name}")
        return base64.b64decode(data[key]).decode()

    @staticmethod
    def _hostname(pod: dict[str, Any]) -> str:
        return pod["spec"].get("hostname") or pod["metadata"]["name"]

    def _mounts(self, pod: dict[str, Any], run: PodRun, spec: dict[str, Any]) -> list[tuple[str, str, bool]]:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts = []
        for mount in spec.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise CannotStart("CreateContainerConfigError", f"volume {mount['name']!r} is not in the pod")
            if "emptyDir" in volume:  # where a kubelet keeps it: what the node agent's glob reads
                source = run.dir / "volumes" / "kubernetes.io~empty-dir" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
            elif "hostPath" in volume:
                source = self._host_path(mount["name"], volume["hostPath"])
            else:
                raise CannotStart("CreateContainerConfigError",
                                  f"volume {mount['name']!r}: only emptyDir and hostPath are emulated")
            self._own(pod, volume, source)
            target = Path(mount["mountPath"])
            if not target.exists():
                if not target.is_relative_to(self.c.harness_root):
                    raise CannotStart("CreateContainerError",
                                      f"mount point {target} does not exist on this machine; the emulator mounts only "
                                      "over existing paths or under its own folder (give the option a path there)")
                target.mkdir(parents=True, exist_ok=True)
            mounts.append((str(source), str(target), bool(mount.get("readOnly"))))
        return mounts

    def _host_path(self, name: str, host_path: dict[str, Any]) -> Path:
        """Where a hostPath lies on this node: under the node's `hostfs/`, except the kubelet's own
        `root_dir`, which is this kubelet's folder. Its `type` is checked as a kubelet does:
        `Directory` must exist (else the pod waits in ContainerCreating, saying why); `""` and
        `DirectoryOrCreate` make a missing folder (root's, 0755); other types are not emulated."""
        path = Path(host_path["path"])
        own = Path(self.c.root_dir)
        source = self.root / path.relative_to(own) if path.is_relative_to(own) else self.root / "hostfs" / path.relative_to("/")
        kind = host_path.get("type", "")
        if kind == "Directory" and not source.is_dir():
            raise CannotStart("ContainerCreating", f'MountVolume.SetUp failed for volume "{name}" : hostPath type '
                              f"check failed: {path} is not a directory")
        if kind not in ("", "Directory", "DirectoryOrCreate"):
            raise CannotStart("CreateContainerConfigError", f"volume {name!r}: hostPath type {kind} is not emulated")
        source.mkdir(mode=0o755, parents=True, exist_ok=True)
        return source

    def _own(self, pod: dict[str, Any], volume: dict[str, Any], source: Path) -> None:
        """Without `security_context`, every volume is mode 1777 (containers run as root anyway).
        With it, as a kubelet does: an emptyDir is mode 0777, and with the pod's fsGroup its group
        is that group with the setgid bit (files made in it get the group); a hostPath is left as
        it is on the node."""
        if not self.c.security_context:
            source.chmod(0o1777)
            return
        if "emptyDir" not in volume:
            return
        fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
        if fs_group is None:
            source.chmod(0o777)
            return
        os.chown(source, -1, int(fs_group))
        source.chmod(0o2777)

    def _identity(self, pod: dict[str, Any], spec: dict[str, Any]) -> tuple[int, int, list[int]] | None:
        """(uid, gid, supplementary groups) the container runs as, or None (as the kubelet's user).
        The container's securityContext wins over the pod's; an unset user is the image's, root
        here; the groups are the pod's fsGroup and supplementalGroups."""
        if not self.c.security_context:
            return None
        pod_context = pod["spec"].get("securityContext") or {}
        context = {**pod_context, **{k: v for k, v in (spec.get("securityContext") or {}).items() if v is not None}}
        uid, gid = int(context.get("runAsUser", 0)), int(context.get("runAsGroup", 0))
        if context.get("runAsNonRoot") and uid == 0:
            raise CannotStart("CreateContainerConfigError", "container has runAsNonRoot and image will run as root "
                              f"(pod: \"{pod['metadata']['name']}\", container: {spec['name']})")
        groups = [int(g) for g in pod_context.get("supplementalGroups") or []]
        if pod_context.get("fsGroup") is not None:
            groups.insert(0, int(pod_context["fsGroup"]))
        return uid, gid, groups

    def _privileges(self, pod: dict[str, Any], spec: dict[str, Any]) -> tuple[frozenset[str], bool] | None:
        """(the capabilities it keeps, no_new_privs) the container runs with (`capabilities.py`),
        or None (as the kubelet's user, every capability: without `security_context`)."""
        if not self.c.security_context:
            return None
        context = spec.get("securityContext") or {}
        try:
            keep = capabilities.container_set(context)
        except ValueError as e:
            raise CannotStart("CreateContainerConfigError", str(e)) from None
        return keep, context.get("allowPrivilegeEscalation") is False

    def _termination_file(self, spec: dict[str, Any], mounts: list[tuple[str, str, bool]]) -> Path | None:
        path = spec.get("terminationMessagePath") or "/dev/termination-log"
        for source, target, _ in mounts:
            if path.startswith(target.rstrip("/") + "/"):
                return Path(source) / path[len(target.rstrip("/")) + 1:]
        return None

    def _start(self, pod: dict[str, Any], run: PodRun, spec: dict[str, Any]) -> Container:
        env = self._env(pod, spec)
        argv = [expand(a, env) for a in [*(spec.get("command") or []), *(spec.get("args") or [])]]
        if not spec.get("command"):
            raise CannotStart("CreateContainerError", "the emulator knows no image entrypoint: give command")
        privileges = self._privileges(pod, spec)
        cwd = spec.get("workingDir") or self.c.repo
        mounts = self._mounts(pod, run, spec)
        if not Path(cwd).is_dir():
            raise CannotStart("CreateContainerError", f"working directory {cwd} does not exist")
        log = run.dir / f"{spec['name']}.log"
        identity = self._identity(pod, spec)
        if identity is not None and identity[0] != 0 and env.get("HOME") == "/root":
            env["HOME"] = "/"  # a user the image's /etc/passwd does not list: the runtime's HOME
        shim = _start_shim(argv, cwd, env, mounts, self._hostname(pod), run.dir, spec["name"], log, identity,
                           privileges, image_workdir=not spec.get("workingDir"))
        return Container(name=spec["name"], image=spec["image"], proc=shim, started_at=now_rfc3339(), log=log,
                         prober=Prober(spec, self.c.address),
                         termination_file=self._termination_file(spec, mounts),
                         fallback_to_logs=spec.get("terminationMessagePolicy") == "FallbackToLogsOnError",
                         oom_marker=run.dir / f"{spec['name']}.oom")

    def _container_status(self, spec: dict[str, Any], run: PodRun, initialized: bool = True) -> dict[str, Any]:
        name, image = spec["name"], spec["image"]
        status: dict[str, Any] = {"name": name, "image": image, "imageID": "",
                                  "restartCount": run.restarts.get(name, 0), "ready": False, "started": False}
        if name in run.last_state:
            status["lastState"] = run.last_state[name]
        container = run.containers.get(name)
        if container is not None and name in run.restart_at:  # ended, restarting after its back-off
            status.update(lastState=container.state(), state={"waiting": {
                "reason": "CrashLoopBackOff", "message": f"back-off restarting failed container={name}"}})
            return status
        if container is None:
            reason, message = run.waiting.get(name, ("ContainerCreating" if initialized else "PodInitializing", ""))
            status["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
            return status
        status.update(imageID=f"trainyard-venv://{image}",
                      containerID=f"trainyard://{container.proc.init_pid or container.proc.pid}",
                      state=container.state())
        running = "running" in status["state"]
        status.update(ready=running and (container.prober is None or container.prober.ready), started=running)
        return status

    def _report(self, pod: dict[str, Any], run: PodRun) -> None:
        specs = pod["spec"]["containers"]
        init_statuses = [self._container_status(s, run) for s in pod["spec"].get("initContainers") or []]
        init_codes = [s["state"]["terminated"]["exitCode"] if "terminated" in s["state"] else None
                      for s in init_statuses]
        initialized = all(code == 0 for code in init_codes)
        statuses = [self._container_status(s, run, initialized) for s in specs]
        states = [s["state"] for s in statuses]
        if any(code not in (None, 0) for code in init_codes):
            phase = "Failed"  # restartPolicy Never: a failed init container fails the pod
        elif not initialized:
            phase = "Pending"
        elif all("terminated" in s for s in states) and not _restarts(pod["spec"].get("restartPolicy", "Always"), states):
            phase = "Succeeded" if all(s["terminated"]["exitCode"] == 0 for s in states) else "Failed"
        elif all("running" in s["state"] or "terminated" in s["state"] or s["name"] in run.restart_at
                 for s in statuses):
            phase = "Running"
        else:
            phase = "Pending"
        ready = "True" if all(s["ready"] for s in statuses) else "False"
        now = now_rfc3339()
        old = {c["type"]: c for c in pod["status"].get("conditions") or []}

        def condition(type_: str, value: str) -> dict[str, Any]:
            before = old.get(type_)
            since = before["lastTransitionTime"] if before and before.get("status") == value else now
            return {"type": type_, "status": value, "lastTransitionTime": since}

        conditions = [c for t, c in old.items() if t not in ("Initialized", "ContainersReady", "Ready")]
        conditions += [condition("Initialized", "True" if initialized else "False"),
                       condition("ContainersReady", ready), condition("Ready", ready)]
        status = {"phase": phase, "hostIP": self.c.address, "hostIPs": [{"ip": self.c.address}],
                  "podIP": self.c.address, "podIPs": [{"ip": self.c.address}],
                  "startTime": pod["status"].get("startTime") or now, "conditions": conditions,
                  "containerStatuses": statuses, **({"initContainerStatuses": init_statuses} if init_statuses else {})}
        if phase in ("Succeeded", "Failed"):
            run.reported_final = True
        if _differs(pod["status"], status):
            self.api.patch("v1", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"], {"status": status},
                           status=True)

    def _terminate(self, pod: dict[str, Any], run: PodRun | None) -> None:
        meta = pod["metadata"]
        if run is not None and run.running:
            deadline = parse_time(meta["deletionTimestamp"])
            if datetime.now(UTC) >= deadline:
                self._kill(run, signal.SIGKILL)
            elif not any(c.term_sent for c in run.containers.values()):
                self._kill(run, signal.SIGTERM)
                self._event_once(pod, run, "killing", "Killing", "Stopping container "
                                 + ", ".join(run.containers), "Normal")
            return
        if run is not None and run.containers:
            self._report(pod, run)
        try:
            self.api.delete("v1", "pods", meta["namespace"], meta["name"],
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except RestError as e:
            if e.status not in (404, 409):
                raise
        self.pods.pop(meta["uid"], None)

    @staticmethod
    def _kill(run: PodRun, sig: signal.Signals) -> None:
        for container in run.containers.values():
            pid = container.proc.init_pid
            if container.proc.poll() is None and pid is not None:
                container.term_sent = container.term_sent or sig == signal.SIGTERM
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def _event_once(self, pod: dict[str, Any], run: PodRun, key: str, reason: str, message: str,
                    type_: str = "Warning") -> None:
        if key in run.events_sent:
            return
        run.events_sent.add(key)
        self.api.event(pod, reason, message, type_=type_, component="kubelet")

    def run_forever(self) -> None:
        self.register()
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        while not stop["now"]:
            try:
                self.heartbeat()
                self.sync()
            except (RestError, OSError, ValueError) as e:  # the API is away (a lost link): keep the pods
                print(f"{now_rfc3339()} kubelet {self.c.node}: {type(e).__name__}: {e}", flush=True)
                time.sleep(self.c.sync_s)
            except Exception as e:  # noqa: BLE001 - log, keep serving the node
                print(f"{now_rfc3339()} kubelet {self.c.node}: {type(e).__name__}: {e}", flush=True)
            time.sleep(self.c.sync_s)
        for run in self.pods.values():
            self._kill(run, signal.SIGKILL)


def _traversable_root(folder: Path) -> None:
    """In the container's mount namespace, `/root` as an image would have it for a non-root
    user: traversable (0711). The "image" is this machine's venv, whose interpreter lives under
    `/root` (0700 here): a tmpfs of mode 0711 goes over `/root` and each of its entries is bound
    back from a second view of the real one — nothing changes outside the container."""
    home = Path("/root")
    if home.stat().st_mode & 0o001:
        return
    real = folder / "root-real"
    real.mkdir(exist_ok=True)
    _check(_libc.mount(b"/root", str(real).encode(), None, MS_BIND | MS_REC, None), "bind /root aside")
    _check(_libc.mount(b"tmpfs", b"/root", b"tmpfs", 0, b"mode=0711"), "tmpfs over /root")
    for entry in os.scandir(real):
        target = home / entry.name
        if entry.is_dir(follow_symlinks=False):
            target.mkdir()
        elif entry.is_symlink():
            target.symlink_to(os.readlink(entry.path))
            continue
        else:
            target.touch()
        _check(_libc.mount(entry.path.encode(), str(target).encode(), None, MS_BIND | MS_REC, None),
               f"bind {target}")


def _start_shim(argv: list[str], cwd: str, env: dict[str, str], mounts: list[tuple[str, str, bool]],
                hostname: str, folder: Path, name: str, log: Path,
                identity: tuple[int, int, list[int]] | None = None,
                privileges: tuple[frozenset[str], bool] | None = None, *, image_workdir: bool = False) -> Shim:
    """Fork the shim (see the module docstring); it never returns into the kubelet's loop."""
    for stale in (f"{name}.pid", f"{name}.status"):
        (folder / stale).unlink(missing_ok=True)
    pid = os.fork()
    if pid:
        return Shim(pid=pid, folder=folder, name=name)
    code = 127
    try:
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.setsid()
        # The image's working directory (this checkout) is the image's: a volume mounted over one
        # of its parents (an init container's emptyDir on /tmp, the checkout under /tmp) must not
        # hide it, so it is held open before the mounts. A `workingDir` the pod names is looked
        # up after them, in the container's own view, as a runtime does.
        workdir = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY) if image_workdir else None
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
        _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        _check(_libc.sethostname(hostname.encode(), len(hostname.encode())), "sethostname")
        for source, target, read_only in mounts:
            _check(_libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {target}")
            if read_only:
                _check(_libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None),
                       f"read-only {target}")
        if identity is not None and identity[0] != 0:
            _traversable_root(folder)
        child = os.fork()
        if child == 0:  # the container's PID 1
            try:
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                if privileges is not None:  # the bounding set while still root; user changes below keep working
                    capabilities.restrict(privileges[0], no_new_privs=privileges[1])
                if identity is not None:  # groups first: after setuid there is no right to change them
                    uid, gid, groups = identity
                    os.setgroups(groups)
                    os.setgid(gid)
                    os.setuid(uid)
                if workdir is None:
                    os.chdir(cwd)
                else:
                    os.fchdir(workdir)
                os.execvpe(argv[0], argv, env)
            except BaseException as e:  # noqa: BLE001 - say why in the container's log
                os.write(2, f"exec {argv[0]}: {e}\n".encode())
                os._exit(127)
        (folder / f"{name}.pid").write_text(str(child))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        (folder / f"{name}.status").write_text(str(code))
    except BaseException as e:  # noqa: BLE001 - the shim must never return into the kubelet
        try:
            os.write(2, f"container shim: {e}\n".encode())
        finally:
            os._exit(127)
    os._exit(code if code >= 0 else 128 - code)


def _restarts(policy: str, states: list[dict[str, Any]]) -> bool:
    """Whether ended containers are restarted: Always, or OnFailure after a failure."""
    return policy == "Always" or (policy == "OnFailure" and any(s["terminated"]["exitCode"] != 0 for s in states))


def _differs(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items())


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    config = Config(**json.loads(Path(args[0]).read_text()))
    Kubelet(config).run_forever()


if __name__ == "__main__":
    main()
