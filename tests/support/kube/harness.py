"""`KubeHarness`: a small Kubernetes with Volcano on this machine, for tests only.

    with KubeHarness(tmp_path / "kube") as kube:          # 2 nodes × 1 CPU "GPU"
        launcher = KubernetesLauncher.from_kubeconfig(str(kube.kubeconfig),
                                                      options=kube.launcher_options())
        ...
        kube.kill_pod("job-abc123-worker-1")               # SIGKILL the container (oom=True: OOMKilled)
        kube.kill_rank("job-abc123-worker-1")              # SIGKILL one rank: torchrun restarts it in place
        kube.lose_node("kube-sim-1")                       # its link down: kubelet and agent cut off

Parts (each module's docstring says what it emulates and what not):
- `apiserver.py` + `store.py`: the API over real HTTP, every write checked against the real
  schemas (`schemas.py`), on 127.0.0.1 for the tests and on the simulated network's bridge for
  the kubelets;
- `volcano.py`: the job controller, its admission checks and the gang scheduler;
- `lifecycle.py`: node lifecycle (NotReady, taints, eviction) and the cluster DNS;
- `netns.py` + `kubelet.py`: each node a network namespace on a bridge in a namespace of the
  harness, its kubelet a process in it (`ip netns exec`) that runs the pods' containers;
- one node agent per node (`python -m node_agent`) on its node — in the node's namespace, on the
  node's address and `AGENT_PORT`, as the DaemonSet's hostPort — reading that node's heartbeats;
  this machine reaches it through a loopback forwarder across the node's link (`forward.py`;
  `node_agents`: node → URL), so a lost node's agent is cut off with it, not killed.

Timings (shorter than Kubernetes' so tests stay quick): a node is NotReady `node_grace_s`
(default 10 s) after its kubelet's last status, its pods are evicted `eviction_s` (default 1 s)
after that. The controllers run every 0.25 s, the kubelets every 0.5 s (`CONTROLLER_TICK_S`,
`kubelet.Config.sync_s`: they poll over HTTP; an idle harness of three nodes — this process,
its kubelets and node agents — took 6.5 CPU-s a minute at 0.1 and 0.2 s, 3.2 at these). The
grace was 3 s; on the 2-core machine with the whole suite running, a healthy node's status once
came more than 3 s late, and its training pod was evicted mid-test (a CI failure that was no
failure of ours).

Images: every image is this repository's venv (see `kubelet.py`); `missing_images` lists
images that fail to pull. The launcher options that fit the harness are `launcher_options()`:
the heartbeat hostPath and the run folder under the harness's folder (the mount points must
exist on this machine), no RDMA device.

Cleaning up: `close()` (the context manager's exit, also registered with `atexit`) stops the
controllers, kills every process in the nodes' namespaces, the kubelets and the node agents,
deletes the namespaces and their `/etc/netns/<ns>` folders; and a new harness first removes
the namespaces of harnesses whose process is gone (`tyk<pid>x…`). Where namespaces cannot be
made, `KubeHarness(...)` raises `netns.NetnsUnavailable` saying why (tests: `harness_or_skip`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.kube import netns, schemas
from tests.support.kube.apiserver import ApiServer
from tests.support.kube.control_plane import ControlPlane
from tests.support.kube.kubelet import Config
from tests.support.kube.lifecycle import node_ready
from tests.support.kube.rest import Rest, RestError

if TYPE_CHECKING:
    from tests.support.kube.forward import Forwarder

REPO_ROOT = schemas.REPO_ROOT
NAMESPACE_PATTERN = re.compile(r"^tyk(\d+)x[0-9a-f]+-")
FABRIC_PORT = 6443
AGENT_PORT = 9400
"""The node agents' port on their nodes (`KubernetesOptions.node_agent_port`'s default)."""
CONTROLLER_TICK_S = 0.25
"""How often the control plane's controllers (jobs, gang scheduler, node lifecycle, DNS) run."""
DEFAULT_NODES = ("kube-sim-0", "kube-sim-1")
"""The node names of `config/clusters/kube-sim.yaml`."""
NODES_WITH_SPARE = (*DEFAULT_NODES, "kube-sim-2")
"""Two for a 2-rank gang, one spare for the node a test or benchmark takes down."""
RACK = "sim-rack"


@dataclass
class SimNode:
    name: str
    netns: str
    address: str
    root: Path
    heartbeat_dir: Path
    """Where this node's workers' heartbeats land on this machine (the hostPath's backing folder)."""
    agent_url: str = ""
    kubelet: subprocess.Popen[bytes] | None = None
    agent: subprocess.Popen[bytes] | None = None
    forwarder: Forwarder | None = None
    lost: bool = False


def sweep_stale() -> list[str]:
    """Remove the namespaces of harnesses whose process no longer exists."""
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    stale = []
    for line in result.stdout.splitlines():
        m = NAMESPACE_PATTERN.match(line.split()[0] if line.split() else "")
        if m and not Path(f"/proc/{m.group(1)}").exists():
            stale.append(line.split()[0])
    return netns.sweep_namespaces(stale)


class KubeHarness:
    def __init__(self, root: Path, nodes: Sequence[str] = DEFAULT_NODES, *, cpus_per_node: int = 1,
                 gpu_product: str = "cpu", rack: str = RACK, namespace: str = "trainyard",
                 missing_images: Sequence[str] = (), node_grace_s: float = 10.0, eviction_s: float = 1.0,
                 node_agents: bool = True) -> None:
        self.check_prerequisites()
        self.root = Path(root).resolve()
        self.node_names = list(nodes)
        self.cpus_per_node = cpus_per_node
        self.gpu_product = gpu_product
        self.rack = rack
        self.namespace = namespace
        self.missing_images = list(missing_images)
        self.node_grace_s = node_grace_s
        self.eviction_s = eviction_s
        self.with_agents = node_agents
        self.prefix = f"tyk{os.getpid()}x{secrets.token_hex(2)}"
        self.network = netns.Network(self.prefix)
        self.plane: ControlPlane | None = None
        self.nodes: dict[str, SimNode] = {}
        self._stop = threading.Event()
        self._controllers: threading.Thread | None = None
        self.controller_errors: list[str] = []
        self._closed = False

    @staticmethod
    def check_prerequisites() -> None:
        """Raise `NetnsUnavailable` or `SchemaMissing` (the emulator validates against the
        Volcano schemas) saying why this harness cannot run here."""
        netns.check_available()
        schemas.check_crds_present()

    # --- start / stop ---

    def __enter__(self) -> KubeHarness:
        if self.plane is not None:  # started already (`harness_or_skip`)
            return self
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> KubeHarness:
        atexit.register(self.close)
        sweep_stale()
        self.root.mkdir(parents=True, exist_ok=True)
        self.network.create(self.node_names)
        self.plane = ControlPlane(self.root, namespace=self.namespace, node_grace_s=self.node_grace_s,
                                  eviction_s=self.eviction_s, log_path=self._log_path,
                                  write_hosts=self.network.write_hosts)
        fabric_url = self.plane.server.listen(self.network.listen_in_fabric(FABRIC_PORT))
        self._controllers = threading.Thread(target=self._run_controllers, name="kube-controllers", daemon=True)
        self._controllers.start()
        for name in self.node_names:
            self._start_node(name, fabric_url)
        self.wait_for(lambda: all(n.name in self.ready_nodes() for n in self.nodes.values()), 60,
                      "the simulated nodes to register and become Ready")
        if self.with_agents:
            for node in self.nodes.values():
                self._start_agent(node)
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._controllers is not None:
            self._controllers.join(timeout=10)
        for node in self.nodes.values():
            if node.forwarder is not None:
                node.forwarder.close()
            for proc in (node.kubelet, node.agent):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                if proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=10)
        left = self.network.close()
        if self.plane is not None:
            self.plane.close()
        atexit.unregister(self.close)
        if left:
            raise RuntimeError(f"the harness could not remove network namespaces {left}")

    # --- nodes ---

    def _start_node(self, name: str, fabric_url: str) -> None:
        net = self.network.nodes[name]
        root = self.root / "nodes" / name
        root.mkdir(parents=True, exist_ok=True)
        heartbeats = root / "hostfs" / self.heartbeat_root.lstrip("/")
        heartbeats.mkdir(parents=True, exist_ok=True)
        node = self.nodes[name] = SimNode(name=name, netns=net.netns, address=net.address, root=root,
                                          heartbeat_dir=heartbeats)
        config = self._kubelet_config(name, fabric_url, root)
        path = root / "kubelet.json"
        path.write_text(json.dumps(asdict(config)))
        with (root / "kubelet.log").open("ab") as log:
            node.kubelet = subprocess.Popen(
                ["ip", "netns", "exec", net.netns, sys.executable, "-m", "tests.support.kube.kubelet", str(path)],
                cwd=REPO_ROOT, env=_child_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def node_labels(self, name: str) -> dict[str, str]:
        return {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "topology.kubernetes.io/rack": self.rack,
                "nvidia.com/gpu.count": str(self.cpus_per_node), "nvidia.com/gpu.product": self.gpu_product}

    def _kubelet_config(self, name: str, api_url: str, root: Path) -> Config:
        net = self.network.nodes[name]
        return Config(
            node=name, api=api_url, token=self.token, root=str(root), harness_root=str(self.root),
            address=net.address, repo=str(REPO_ROOT), venv_bin=str(Path(sys.executable).parent),
            labels=self.node_labels(name),
            capacity={"cpu": str(self.cpus_per_node), "memory": "4Gi", "pods": "110", "ephemeral-storage": "10Gi"},
            image_env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}, missing_images=self.missing_images)

    def _start_agent(self, node: SimNode) -> None:
        """The node's agent runs on the node — in its network namespace, on its address and the
        DaemonSet's port (`AGENT_PORT`, as a hostPort) — and this machine reaches it through a
        loopback `Forwarder` across the node's link: a lost node's agent is cut off, not killed."""
        from tests.support.kube.forward import Forwarder

        with (node.root / "node-agent.log").open("ab") as log:
            node.agent = subprocess.Popen(
                ["ip", "netns", "exec", node.netns, sys.executable, "-m", "node_agent", "--node", node.name,
                 "--host", node.address, "--port", str(AGENT_PORT), "--heartbeat-dir", str(node.heartbeat_dir),
                 "--cpu-slots", str(self.cpus_per_node), "--poll-interval-s", "1", "--enable-fault-injection"],
                cwd=REPO_ROOT, env=_child_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        if node.forwarder is None:
            node.forwarder = Forwarder(self.network, node.address, AGENT_PORT)
        node.agent_url = node.forwarder.url

        def live() -> bool:
            try:
                with urllib.request.urlopen(node.agent_url + "/livez", timeout=2) as r:
                    return r.status == 200
            except OSError:
                if node.agent is not None and node.agent.poll() is not None:
                    raise AssertionError(f"node agent of {node.name} exited:\n"
                                         + (node.root / "node-agent.log").read_text(errors="replace")) from None
                return False

        self.wait_for(live, 60, f"the node agent of {node.name}")

    @property
    def node_agents(self) -> dict[str, str]:
        """node → node agent URL (`Settings.node_agents`' shape), every node's — a lost node's too:
        its agent is there, behind a link that drops what is sent to it."""
        return {n.name: n.agent_url for n in self.nodes.values() if n.agent_url}

    def lose_node(self, name: str) -> None:
        """Cut the node's link: its pods and its node agent keep running behind it, unreachable —
        the kubelet's status, the agent's answers and the pods' traffic are dropped."""
        self.network.set_link(name, up=False)
        self.nodes[name].lost = True

    def restore_node(self, name: str) -> None:
        """Plug the link back in (the kubelet posts status again; the agent answers again)."""
        self.network.set_link(name, up=True)
        self.nodes[name].lost = False

    # --- pods ---

    def pod_dir(self, pod: str, namespace: str | None = None) -> Path:
        found = self.rest().get("v1", "pods", namespace or self.namespace, pod)
        meta = found["metadata"]
        return self.root / "nodes" / found["spec"]["nodeName"] / "pods" / f"{meta['namespace']}_{pod}_{meta['uid']}"

    def kill_pod(self, pod: str, sig: int = signal.SIGKILL, *, container: str = "trainer", oom: bool = False,
                 namespace: str | None = None) -> None:
        """Signal the container's PID 1 (SIGKILL ends every process of the container); `oom=True`
        makes the kubelet report the SIGKILL as `OOMKilled`, as when the kernel kills for memory."""
        folder = self.pod_dir(pod, namespace)
        if oom:
            (folder / f"{container}.oom").write_text("killed for memory by the harness\n")
        pid = int((folder / f"{container}.pid").read_text())
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            status = self.rest().get("v1", "pods", namespace or self.namespace, pod).get("status")
            log = (folder / f"{container}.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"container {container} of {pod} (pid {pid}) is not running; pod status "
                                 f"{status}\n{log}") from None

    def kill_rank(self, pod: str, local_rank: int = 0, sig: int = signal.SIGKILL, *,
                  namespace: str | None = None) -> int:
        """Signal one rank's process inside a pod (the container's torchrun and the rank's exit
        recorder live on, as when a rank crashes); returns its pid on this machine."""
        from trainyard.plugins.run.processes import marked_processes

        init = int((self.pod_dir(pod, namespace) / "trainer.pid").read_text())
        marked = set(marked_processes("LOCAL_RANK", str(local_rank)))
        # the rank's exit recorder, then the rank itself (parents come before their children)
        chain = [pid for pid in _descendants(init) if pid in marked]
        if not chain:
            raise AssertionError(f"no process of local rank {local_rank} runs in pod {pod} (container pid {init})")
        os.kill(chain[-1], sig)
        return chain[-1]

    def _log_path(self, pod: dict[str, Any], container: str) -> Path | None:
        meta, node = pod["metadata"], pod["spec"].get("nodeName")
        if not node:
            return None
        return self.root / "nodes" / node / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / f"{container}.log"

    # --- clients and options ---

    @property
    def api(self) -> ApiServer:
        assert self.plane is not None, "the harness is not started"
        return self.plane.server

    @property
    def url(self) -> str:
        """The API server's address on this machine (what the kubeconfig names)."""
        return self.plane.url if self.plane else ""

    @property
    def token(self) -> str:
        return self.plane.token if self.plane else ""

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def connection_uri(self) -> str:
        """An Airflow connection for the cncf-kubernetes provider (`AIRFLOW_CONN_<ID>`)."""
        assert self.plane is not None
        return self.plane.connection_uri

    @property
    def connection_json(self) -> str:
        assert self.plane is not None
        return self.plane.connection_json

    def rest(self) -> Rest:
        return Rest(self.url, self.token)

    @property
    def heartbeat_root(self) -> str:
        return str(self.root / "mnt" / "heartbeats")

    def launcher_options(self, **overrides: Any) -> Any:
        """`KubernetesOptions` for this cluster: its namespace, mount points under the harness's
        folder (heartbeats on the node's hostPath, which the emulated kubelet and its node agent
        share; the run folder and the data cache), no RDMA device, a short SIGTERM grace."""
        from trainyard.plugins.launch.manifests import KubernetesOptions

        values: dict[str, Any] = {"namespace": self.namespace, "rdma_resource": None,
                                  "heartbeat_root": self.heartbeat_root, "heartbeat_volume": "hostPath",
                                  "run_dir": str(self.root / "mnt" / "run"),
                                  "data_cache_dir": str(self.root / "mnt" / "data-cache"),
                                  "termination_grace_s": 10, "shared_filesystem": True}
        return KubernetesOptions(**(values | overrides))

    def airflow_overrides(self, folder: Path) -> dict[str, str]:
        """What an embedded stack needs to launch on this cluster: `config/clusters/kube-sim.yaml`
        with this harness's nodes and launcher options (its mount points are known only now),
        written into `folder`, and the cncf-kubernetes connection; plus the cluster admin's part,
        one Volcano queue per team (`trainyard render` writes them too)."""
        import yaml

        from trainyard.config.cluster import CLUSTERS_DIR
        from trainyard.config.teams import load_teams
        from trainyard.plugins.launch.volcano import KubernetesLauncher

        KubernetesLauncher.from_kubeconfig(str(self.kubeconfig), options=self.launcher_options()
                                           ).ensure_queues(load_teams(), total_gpus=len(self.node_names))
        doc = yaml.safe_load((CLUSTERS_DIR / "kube-sim.yaml").read_text())
        doc["spec"]["racks"][0]["nodes"][0]["count"] = len(self.node_names)
        doc["spec"]["launcher"] = self.launcher_options().model_dump(mode="json")
        path = Path(folder) / "kube-sim.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return {"TRAINYARD_CLUSTER": str(path), "AIRFLOW_CONN_KUBERNETES_DEFAULT": self.connection_uri}

    # --- waiting ---

    def ready_nodes(self) -> set[str]:
        try:
            return {n["metadata"]["name"] for n in self.rest().list("v1", "nodes") if node_ready(n)}
        except (RestError, OSError):
            return set()

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Poll `predicate` until it is truthy; on timeout fail with the kubelets' logs."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.diagnostics()}")
            time.sleep(0.1)

    def diagnostics(self) -> str:
        parts = [f"controller errors: {self.controller_errors[-5:]}"]
        for node in self.nodes.values():
            log = node.root / "kubelet.log"
            text = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            parts.append(f"--- kubelet {node.name} (exit {node.kubelet.poll() if node.kubelet else None}) ---\n{text}")
        return "\n".join(parts)

    def _run_controllers(self) -> None:
        assert self.plane is not None
        plane = self.plane
        while not self._stop.wait(CONTROLLER_TICK_S):
            for part in (plane.server.store.collect_garbage, plane.jobs.tick, plane.scheduler.tick,
                         plane.lifecycle.tick, plane.dns.write):
                try:
                    part()
                except Exception as e:  # noqa: BLE001 - keep the control plane up, report through diagnostics
                    self.controller_errors.append(f"{getattr(part, '__qualname__', part)}: {type(e).__name__}: {e}")


def _descendants(pid: int) -> list[int]:
    """The processes under `pid`, parents before children (from /proc's `children` lists)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += [int(child), *_descendants(int(child))]
    return out


def _child_env() -> dict[str, str]:
    from tests.support.procs import test_env

    return test_env()


def harness_or_skip(root: Path, **kwargs: Any) -> KubeHarness:
    """A started harness, or the test skips (fails where `TRAINYARD_REQUIRE` names `netns` or
    `schemas`) saying why namespaces or the Volcano schemas are not available."""
    from tests.support.require import missing

    try:
        return KubeHarness(root, **kwargs).__enter__()
    except netns.NetnsUnavailable as e:
        missing("netns", f"the Kubernetes harness needs network namespaces: {e}")
    except schemas.SchemaMissing as e:
        missing("schemas", str(e))
