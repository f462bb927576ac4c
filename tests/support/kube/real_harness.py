"""`RealKubeHarness`: the simulated nodes (`netns.py` + `kubelet.py`) on the real control plane
of `real_cluster.py` — kube-apiserver, kube-controller-manager, kube-scheduler and Kueue —
instead of the emulator (issue 55, Build 2).

    with RealKubeHarness(tmp_path / "kube") as kube:        # 2 nodes × 1 CPU
        kube.cluster.rest().create("batch/v1", "jobs", "default", job)

What the nodes do against the real API server (the kubelet's `real_api` and `security_context`):
each registers its Node as `system:node:<name>` (Node authorizer + NodeRestriction judge every
write), tainted `node.kubernetes.io/not-ready:NoSchedule` until kube-controller-manager's node
lifecycle controller sees it Ready; renews its Lease in kube-node-lease; runs init containers
first; runs containers as their securityContext user and groups, with the capabilities it
leaves them, with emptyDir volumes owned by the pod's fsGroup; honours readiness and liveness
probes and restarts a restartPolicy Always container. Labels a kubelet may not set on itself under NodeRestriction
(`topology.kubernetes.io/rack`, the GPU labels) are set by the administrator after registration,
as on a real cluster.

Reaching the API server: it listens on 127.0.0.1 of this machine; the nodes live on a bridge in
namespaces of their own (`netns.py`: nothing is added to this machine's interfaces), so this
process listens on the bridge address inside the fabric namespace and relays each connection,
bytes only, to the API server's loopback port: TLS runs end to end between the kubelet and the
API server, whose certificate names the bridge address.

Node agents (`node_agents=True`): the administrator applies the platform's namespace (Pod
Security `privileged`) and the node-agent DaemonSet exactly as `render_node_agent_daemonset`
renders it for this cluster's options (`launcher_options()`: emptyDir heartbeats, read through
the kubelet's pods folder as root with only `DAC_READ_SEARCH`); kube-controller-manager's
DaemonSet controller makes one pod per node, each node's kubelet runs it — on the node's
network, its hostPort answering on the node's address, its readiness probe deciding Ready —
and the harness waits until every node's pod is Ready. Nothing of this machine reaches the
nodes' addresses by itself: `proxy` (`forward.NodeProxy`, `proxy.env()`, `reaching_nodes()`)
carries plain HTTP to them across each node's link, so a client asks an agent where
`KubernetesLauncher.node_agents` found it, at its Node's InternalIP, and a lost node's agent is
cut off with its link. Each node's cpu capacity leaves room for such daemons beside one
trainer pod per slot (`DAEMON_CPU_M`).

DNS: `lifecycle.ClusterDns` from the emulator, on a thread, publishing a pod only once its
kubelet reported its address: `<hostname>.<subdomain>[.<namespace>.svc.cluster.local]` in every
node's /etc/hosts, for pods whose subdomain is a Service of their namespace (no CoreDNS: ready
or not, a pod with an address is published, as with `publishNotReadyAddresses`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from tests.support.environ import environment
from tests.support.kube import netns
from tests.support.kube.forward import NodeProxy
from tests.support.kube.harness import DEFAULT_NODES, FABRIC_PORT, KubeHarness, sweep_stale
from tests.support.kube.kubelet import NOT_READY_TAINT, Config
from tests.support.kube.lifecycle import ClusterDns, node_ready
from tests.support.kube.real_cluster import RealCluster, real_cluster, write_kubeconfig
from tests.support.kube.rest import Rest, RestError
from trainyard.plugins.launch.tenancy import PLATFORM_NAMESPACE

if TYPE_CHECKING:
    from trainyard.config.teams import Teams

SELF_LABELS = ("kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch")
"""Labels a kubelet sets on its own Node; NodeRestriction refuses it other `kubernetes.io` ones."""
HEARTBEAT_S = 10.0
"""The kubelet's default nodeStatusUpdateFrequency and Lease renew interval."""
DNS_TICK_S = 0.5
TOKEN_LIFETIME_S = 6 * 3600
"""The control plane's token outlives any test module (a TokenRequest's default is 1 h)."""
DAEMON_CPU_M = 250
"""Millicores each node has beyond its slots, for the node's daemons (the node agent's pod
requests 50m): a trainer pod asks a whole core per slot, so without it the DaemonSet's pod
would keep the node's trainer unschedulable; less than a core, so still one trainer per slot."""
AGENTS_READY_S = 120
"""The DaemonSet's pods: created, bound, started and probed (readiness every 10 s)."""


class RealKubeHarness(KubeHarness):
    def __init__(self, root: Path, nodes: tuple[str, ...] = DEFAULT_NODES, **kwargs: Any) -> None:
        kwargs.setdefault("node_agents", False)
        super().__init__(root, nodes, **kwargs)
        self.cluster: RealCluster | None = None
        self._stack = ExitStack()
        self._relay: socket.socket | None = None
        self.proxy: NodeProxy | None = None
        self._platform_namespace = False

    @staticmethod
    def check_prerequisites() -> None:
        """Network namespaces only: the real API server validates, no shared schemas needed."""
        netns.check_available()

    # --- start / stop ---

    def __enter__(self) -> RealKubeHarness:
        if self.cluster is not None:  # started already (entered once to tell a skip from a failure)
            return self
        super().__enter__()
        return self

    def start(self) -> RealKubeHarness:
        import atexit

        atexit.register(self.close)
        sweep_stale()
        self.root.mkdir(parents=True, exist_ok=True)
        self.network.create(self.node_names)
        self.cluster = self._stack.enter_context(real_cluster(
            self.root / "plane", nodes=tuple(self.node_names), extra_ips=(netns.FABRIC_ADDRESS,)))
        self._relay = self.network.listen_in_fabric(FABRIC_PORT)
        threading.Thread(target=_relay, args=(self._relay, self.cluster.secure_port, self._stop),
                         name="apiserver-relay", daemon=True).start()
        dns = ClusterDns(self.rest(), self.network.write_hosts, addressed_only=True)
        threading.Thread(target=self._run_dns, args=(dns,), name="cluster-dns", daemon=True).start()
        for name in self.node_names:
            self._start_node(name, f"https://{netns.FABRIC_ADDRESS}:{FABRIC_PORT}")
        self.wait_for(lambda: self.schedulable_nodes() >= set(self.node_names), 90,
                      "the nodes to register, be Ready and lose the not-ready taint")
        self._label_nodes()
        self.proxy = NodeProxy(self.network, {n.address for n in self.network.nodes.values()})
        self._stack.callback(self.proxy.close)
        if self.with_agents:
            self._apply_node_agents()
        return self

    def close(self) -> None:
        if self._closed:
            return
        try:
            super().close()  # the kubelets and the namespaces first, while the API server still answers
        finally:
            if self._relay is not None:
                with contextlib.suppress(OSError):
                    self._relay.close()
            self._stack.close()

    def _run_dns(self, dns: ClusterDns) -> None:
        while not self._stop.wait(DNS_TICK_S):
            try:
                dns.write()
            except Exception as e:  # noqa: BLE001 - keep serving, report through diagnostics
                self.controller_errors.append(f"cluster DNS: {type(e).__name__}: {e}")

    # --- nodes ---

    def _kubelet_config(self, name: str, api_url: str, root: Path) -> Config:
        config = super()._kubelet_config(name, api_url, root)
        assert self.cluster is not None
        config.token = self.cluster.node_tokens[name]
        config.ca_file = str(self.cluster.ca_file)
        config.labels = {k: v for k, v in config.labels.items() if k in SELF_LABELS}
        config.real_api, config.security_context, config.heartbeat_s = True, True, HEARTBEAT_S
        config.capacity = config.capacity | {"cpu": f"{self.cpus_per_node * 1000 + DAEMON_CPU_M}m"}
        return config

    # --- node agents: the rendered DaemonSet ---

    def _apply_node_agents(self) -> None:
        """The platform's namespace and the rendered DaemonSet (as the administrator), then wait
        until each node runs a Ready pod of it."""
        from kubernetes import utils

        from trainyard.plugins.launch.manifests import render_node_agent_daemonset
        from trainyard.plugins.launch.tenancy import render_platform_namespace

        assert self.cluster is not None, "the harness is not started"
        admin = self.cluster.client()
        utils.create_from_dict(admin, render_platform_namespace())
        self._platform_namespace = True
        utils.create_from_dict(admin, render_node_agent_daemonset(self.launcher_options()))
        try:
            self.wait_for(lambda: self.agent_pods_ready() >= set(self.node_names), AGENTS_READY_S,
                          "the node agents' DaemonSet to run a Ready pod on every node")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self._agents_said()}") from None

    def _agents_said(self) -> str:
        """The DaemonSet's status, its pods' and their events, and the agents' logs."""
        rest = self.rest()
        parts = [f"daemonset status: {rest.get('apps/v1', 'daemonsets', PLATFORM_NAMESPACE, 'trainyard-node-agent').get('status')}"]
        for pod in self.agent_pods():
            parts.append(f"pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')}: {pod.get('status')}")
        for event in rest.list("v1", "events", PLATFORM_NAMESPACE):
            parts.append(f"event {event['involvedObject']['name']}: {event.get('reason')}: {event.get('message')}")
        for log in sorted(self.root.glob(f"nodes/*/pods/{PLATFORM_NAMESPACE}_*/*.log")):
            parts.append(f"--- {log.relative_to(self.root)} ---\n{log.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def agent_pods(self) -> list[dict[str, Any]]:
        """The node-agent DaemonSet's pods (the platform namespace's, by the DaemonSet's selector)."""
        return self.rest().list("v1", "pods", PLATFORM_NAMESPACE, labels="app.kubernetes.io/name=trainyard-node-agent")

    def agent_pods_ready(self) -> set[str]:
        """The nodes whose node-agent pod is Ready."""
        try:
            pods = self.agent_pods()
        except (RestError, OSError):
            return set()
        return {p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])}

    @property
    def node_agents(self) -> dict[str, str]:
        """Not here: the agents are the DaemonSet's pods, found where the product finds them
        (`KubernetesLauncher.node_agents`: each Node's InternalIP) and reached through `proxy`."""
        raise AttributeError("RealKubeHarness has no static map of node agents: ask "
                             "KubernetesLauncher.node_agents(handle), within reaching_nodes()")

    @contextlib.contextmanager
    def reaching_nodes(self) -> Iterator[dict[str, str]]:
        """This process's plain-HTTP clients (`urllib`'s default opener: the node-agent client)
        reach the nodes' addresses through `proxy` while inside; yields the environment that does
        it (for child processes), restored on exit."""
        assert self.proxy is not None, "the harness is not started"
        env = self.proxy.env()
        with environment(env):
            yield env

    def _label_nodes(self) -> None:
        """The administrator's part: the labels NodeRestriction keeps a kubelet from setting."""
        for name in self.node_names:
            self.rest().patch("v1", "nodes", None, name, {"metadata": {"labels": self.node_labels(name)}})

    def schedulable_nodes(self) -> set[str]:
        """Nodes Ready and without the not-ready taint (lifted by the node lifecycle controller)."""
        try:
            nodes = self.rest().list("v1", "nodes")
        except (RestError, OSError):
            return set()
        return {n["metadata"]["name"] for n in nodes if node_ready(n)
                and not any(t["key"] == NOT_READY_TAINT for t in n["spec"].get("taints") or [])}

    # --- clients ---

    @property
    def url(self) -> str:
        return self.cluster.url if self.cluster else ""

    @property
    def token(self) -> str:
        return self.cluster.admin_token if self.cluster else ""

    @property
    def kubeconfig(self) -> Path:
        assert self.cluster is not None, "the harness is not started"
        return self.cluster.kubeconfig

    def rest(self) -> Rest:
        assert self.cluster is not None, "the harness is not started"
        return self.cluster.rest()

    # --- the DAG's view: Airflow on this machine, the pods on the simulated network ---

    def relay_into_fabric(self, port: int) -> str:
        """A server of this machine on 127.0.0.1:`port`, reached by the pods at
        `<fabric address>:port` (bytes relayed, as for the API server); returns that host:port."""
        listener = self.network.listen_in_fabric(port)
        self._stack.callback(listener.close)
        threading.Thread(target=_relay, args=(listener, port, self._stop), name=f"relay-{port}", daemon=True).start()
        return f"{netns.FABRIC_ADDRESS}:{port}"

    def apply_platform(self, teams: Teams) -> None:
        """The cluster administrator's part of `trainyard render k8s` for this cluster: the
        platform's and the teams' namespaces (quota, data account, Pod Security `restricted`),
        the control plane's RBAC for Kueue, the PriorityClasses and the teams' Kueue queues.
        (The node-agent DaemonSet is applied at the start, with `node_agents=True`, the
        platform's namespace with it; not a job's NetworkPolicy: nothing here enforces one.)"""
        from kubernetes import utils

        from trainyard.plugins.launch.kube_clients import KubeClients
        from trainyard.plugins.launch.manifests import render_priority_classes
        from trainyard.plugins.launch.rbac import render_rbac
        from trainyard.plugins.launch.tenancy import (
            render_platform_namespace,
            render_teams,
            team_namespace,
        )
        from trainyard.plugins.launch.volcano import KubernetesLauncher

        assert self.cluster is not None, "the harness is not started"
        admin = self.cluster.client()
        namespaces = [team_namespace(name) for name in sorted(teams.teams)]
        platform = [] if self._platform_namespace else [render_platform_namespace()]
        self._platform_namespace = True
        for doc in [*platform, *render_teams(teams, cpu_cluster=True),
                    *render_rbac(PLATFORM_NAMESPACE, namespaces, queueing="kueue"), *render_priority_classes()]:
            utils.create_from_dict(admin, doc)
        KubernetesLauncher.from_clients(KubeClients.from_api_client(admin), options=self.launcher_options(
            queueing="kueue")).ensure_queues(teams, total_gpus=len(self.node_names) * self.cpus_per_node,
                                             cpu_cluster=True)

    def control_plane_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig with the control plane's own ServiceAccount token (a TokenRequest, as a
        projected token is): every call the DAG makes is judged by RBAC, not made as admin."""
        from kubernetes import client

        from trainyard.plugins.launch.rbac import ACCOUNT

        assert self.cluster is not None, "the harness is not started"
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=TOKEN_LIFETIME_S))
        token = client.CoreV1Api(self.cluster.client()).create_namespaced_service_account_token(
            ACCOUNT, PLATFORM_NAMESPACE, request).status.token
        return write_kubeconfig(path, self.url, self.cluster.ca_file, token)

    def airflow_overrides(self, folder: Path, *, s3_endpoint_url: str = "", mlflow_url: str = "",
                          teams: Teams | None = None) -> dict[str, str]:
        """What an embedded stack needs to run the DAG on this cluster: the administrator's
        objects applied (`apply_platform`, teams default: `config/teams.yaml`), a kubeconfig with
        the control plane's own token as the cncf-kubernetes connection, and the cluster file
        (`kube-sim` with these nodes) whose `spec.launcher` has `queueing: kueue`, the team's
        namespace, emptyDir heartbeats, no shared filesystem — and the store and the tracker
        as the pods reach them: this machine's servers on 127.0.0.1 (`s3_endpoint_url`,
        `mlflow_url`), relayed into the simulated network (`relay_into_fabric`)."""
        import yaml

        from trainyard.config.cluster import CLUSTERS_DIR
        from trainyard.config.teams import load_teams

        self.apply_platform(teams or load_teams())
        pods_see: dict[str, Any] = {}
        overrides: dict[str, str] = {}
        if s3_endpoint_url:
            pods_see["pod_s3_endpoint_url"] = f"http://{self.relay_into_fabric(_port(s3_endpoint_url))}"
            overrides["TRAINYARD_S3_ENDPOINT_URL"] = s3_endpoint_url
        if mlflow_url:
            pods_see["pod_mlflow_tracking_uri"] = f"http://{self.relay_into_fabric(_port(mlflow_url))}"
            overrides["TRAINYARD_MLFLOW_TRACKING_URI"] = mlflow_url
        doc = yaml.safe_load((CLUSTERS_DIR / "kube-sim.yaml").read_text())
        doc["spec"]["racks"][0]["nodes"][0]["count"] = len(self.node_names)
        doc["spec"]["racks"][0]["nodes"][0]["gpusPerNode"] = self.cpus_per_node
        doc["spec"]["launcher"] = self.launcher_options(**pods_see).model_dump(mode="json", exclude_defaults=True)
        path = Path(folder) / "kube-sim.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        kubeconfig = self.control_plane_kubeconfig(Path(folder) / "kubeconfig")
        conn = f"kubernetes://?kube_config_path={quote(str(kubeconfig), safe='')}"
        return {"TRAINYARD_CLUSTER": str(path), "AIRFLOW_CONN_KUBERNETES_DEFAULT": conn, **overrides}

    def launcher_options(self, **overrides: Any) -> Any:
        """The base harness's mount points, on a real cluster's terms: the job in its team's
        namespace (None), queued by Kueue, heartbeats in an `emptyDir` (Pod Security
        `restricted`), nothing shared with this machine's filesystem."""
        values = {"namespace": None, "queueing": "kueue", "heartbeat_volume": "emptyDir", "shared_filesystem": False,
                  "kubelet_pods_mount": str(self.root / "mnt" / "kubelet-pods")}
        return super().launcher_options(**(values | overrides))

    def diagnostics(self) -> str:
        parts = [super().diagnostics()]
        if self.cluster is not None:
            for name in self.cluster.processes:
                log = self.cluster.folder / f"{name}.log"
                if log.exists():
                    parts.append(f"--- {name} ---\n{log.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)


def _port(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"{url}: a server of this machine names its port")
    return port


def _relay(listener: socket.socket, port: int, stop: threading.Event) -> None:
    """Accept on `listener` (in the fabric namespace), relay each connection to 127.0.0.1:`port`."""
    listener.settimeout(0.5)
    while not stop.is_set():
        try:
            inbound, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        try:
            outbound = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            inbound.close()
            continue
        outbound.settimeout(None)
        inbound.settimeout(None)
        pumps = [threading.Thread(target=_pump, args=pair, name="apiserver-relay-pump", daemon=True)
                 for pair in ((inbound, outbound), (outbound, inbound))]
        for pump in pumps:
            pump.start()
        threading.Thread(target=_close_after, args=(pumps, inbound, outbound), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until `source` ends, then end `sink`'s sending side (a half-close, as TCP has it)."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _close_after(pumps: list[threading.Thread], *sockets: socket.socket) -> None:
    for pump in pumps:
        pump.join()
    for sock in sockets:
        sock.close()
