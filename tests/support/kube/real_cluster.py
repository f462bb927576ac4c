"""A whole real control plane on 127.0.0.1 (issue 55, Build 2): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and Kueue's manager, all built by `make kube-components`.

    with real_cluster(tmp_path / "kube", nodes=("kube-sim-0", "kube-sim-1"),
                      extra_ips=("10.213.0.1",)) as cluster:
        cluster.rest().list("v1", "nodes")

What differs from `real.py` (the API server alone) and why:
- **One CA** (`certs.py`) signs the API server's certificate, for 127.0.0.1 and `extra_ips`
  (the simulated network's bridge, where the nodes' kubelets reach it), and Kueue's webhook
  certificate, so one CA file is what every client and the API server trust.
- **Node identities**: a static token per node, user `system:node:<name>` in `system:nodes`,
  with `--authorization-mode=Node,RBAC` and the `NodeRestriction` admission plugin, so a
  kubelet may write only its own Node, Lease and pods, as on a real cluster.
- **kube-controller-manager** with its default controllers and timings (node-monitor grace
  50 s, eviction by the taint-eviction controller after the pods' 300 s toleration), the
  service-account key (token controller) and the CA (`kube-root-ca.crt` publisher).
- **kube-scheduler**, default profile.
- **Kueue** (the batch admission the proxy allowed in place of Volcano, `components.py`): its
  CRDs from the module cache, applied without the conversion-webhook patches (only v1beta2,
  the storage version, is used); its manager with its internal cert manager off, serving its
  webhooks on 127.0.0.1 with a certificate from our CA; the upstream webhook configurations
  reduced to Kueue's own kinds and `batch/v1` Jobs (the only framework enabled: the others'
  webhooks would answer 404 and, failing closed, refuse every Pod) and pointed at
  `url: https://127.0.0.1:<port>/<path>` with our CA as `caBundle`. Its visibility API server
  (an aggregated API on all interfaces) is off (`VisibilityOnDemand=false`).

Every component uses the administrator's kubeconfig (`system:masters`), not its own
least-privilege identity: the test subject here is the nodes and what the product submits.
Each listens on 127.0.0.1 only; `timings` records how long each took to become ready.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.kube import certs, components
from tests.support.kube.real import (
    START_TIMEOUT_S,
    api_client,
    start_process,
    stop_process,
    wait_ready,
)
from tests.support.kube.rest import Rest, RestError
from tests.support.procs import free_port

KUEUE_NAMESPACE = "kueue-system"
KUEUE_FRAMEWORKS = ("batch/job",)
SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"


@dataclass
class RealCluster:
    url: str
    ca_file: Path
    admin_token: str
    node_tokens: dict[str, str]
    """node name → its kubelet's token (user `system:node:<name>`, group `system:nodes`)."""
    folder: Path
    kubeconfig: Path
    secure_port: int
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds each part took to be ready, in start order."""

    def rest(self, token: str | None = None, *, timeout_s: float = 10.0) -> Rest:
        return Rest(self.url, token or self.admin_token, timeout_s=timeout_s, ca_file=str(self.ca_file))

    def client(self, token: str | None = None) -> Any:
        """A `kubernetes.client.ApiClient` (default: the administrator)."""
        return api_client(self.url, self.ca_file, token or self.admin_token)

    def cpu_seconds(self) -> dict[str, float]:
        """User + system CPU seconds each component process has used so far (from /proc)."""
        ticks = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, process in self.processes.items():
            try:
                fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[name] = (int(fields[11]) + int(fields[12])) / ticks
            except (OSError, IndexError, ValueError):
                out[name] = float("nan")
        return out


def binaries_missing() -> list[str]:
    """The binaries not built, and Kueue's CRDs and webhook manifests if the Go module cache
    no longer holds them (`make kube-components` downloads them)."""
    config = kueue_config_dir()
    return components.missing() + ([] if (config / "components" / "crd" / "bases").is_dir() else [str(config)])


def kueue_config_dir() -> Path:
    """Kueue's `config/` in the Go module cache (`make kube-components` downloaded it)."""
    kueue = next(c for c in components.COMPONENTS if c.name == "kueue")
    gomodcache = os.environ.get("GOMODCACHE") or str(Path(os.environ.get("GOPATH", Path.home() / "go")) / "pkg" / "mod")
    return Path(gomodcache) / f"{kueue.module}@{kueue.version}" / "config"


def write_kubeconfig(path: Path, url: str, ca_file: Path, token: str) -> Path:
    """A kubeconfig for the API server at `url` with one bearer `token`."""
    import yaml

    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "real",
        "clusters": [{"name": "real", "cluster": {"server": url, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "admin"}}]}))
    return path


def _timed(cluster: RealCluster, name: str, started: float) -> None:
    cluster.timings[name] = round(time.monotonic() - started, 2)


@contextmanager
def real_cluster(folder: Path, *, nodes: tuple[str, ...] = (), extra_ips: tuple[str, ...] = (),
                 kueue: bool = True) -> Iterator[RealCluster]:
    """The control plane (see the module docstring), stopped (process groups) on exit."""
    from tests.support.kube.real import _service_account_key

    bin_dir = components.bin_dir()
    folder.mkdir(parents=True, exist_ok=True)
    begun = time.monotonic()
    ca = certs.make_ca(folder / "pki")
    serving = certs.issue(ca, folder / "pki", "apiserver", ips=("127.0.0.1", SERVICE_IP, *extra_ips),
                          dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                               "kubernetes.default.svc.cluster.local"))
    admin = secrets.token_hex(16)
    node_tokens = {name: secrets.token_hex(16) for name in nodes}
    (folder / "tokens.csv").write_text(f'{admin},admin,admin,"system:masters"\n' + "".join(
        f'{token},system:node:{name},node-{name},"system:nodes"\n' for name, token in node_tokens.items()))
    private, public = _service_account_key(folder)
    etcd_client, etcd_peer, secure = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{secure}"
    cluster = RealCluster(url=url, ca_file=ca.cert, admin_token=admin, node_tokens=node_tokens, folder=folder,
                          kubeconfig=write_kubeconfig(folder / "kubeconfig", url, ca.cert, admin), secure_port=secure)
    try:
        started = time.monotonic()
        cluster.processes["etcd"] = start_process([
            str(bin_dir / "etcd"), "--data-dir", str(folder / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{etcd_peer}", "--log-level", "warn"], folder / "etcd.log")
        cluster.processes["kube-apiserver"] = start_process([
            str(bin_dir / "kube-apiserver"), "--etcd-servers", f"http://127.0.0.1:{etcd_client}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(secure),
            "--tls-cert-file", str(serving.cert), "--tls-private-key-file", str(serving.key),
            "--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
            "--token-auth-file", str(folder / "tokens.csv"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(public), "--service-account-signing-key-file", str(private),
            "--service-cluster-ip-range", SERVICE_CIDR, "--allow-privileged=false",
            "--endpoint-reconciler-type", "none",  # the loopback address may not be published as an endpoint
            "--enable-priority-and-fairness=false", "--v=1"], folder / "kube-apiserver.log")
        wait_ready(url, ca.cert, admin, cluster.processes["kube-apiserver"], folder / "kube-apiserver.log")
        _timed(cluster, "etcd+kube-apiserver", started)
        _start_controllers(cluster, bin_dir, private)
        if kueue:
            _start_kueue(cluster, bin_dir, ca)
        cluster.timings["total"] = round(time.monotonic() - begun, 2)
        yield cluster
    finally:
        for process in reversed(cluster.processes.values()):
            stop_process(process)


def _start_controllers(cluster: RealCluster, bin_dir: Path, sa_key: Path) -> None:
    common = ["--kubeconfig", str(cluster.kubeconfig), "--leader-elect=false", "--bind-address", "127.0.0.1"]
    kcm_port, scheduler_port = free_port(), free_port()
    started = time.monotonic()
    cluster.processes["kube-controller-manager"] = start_process([
        str(bin_dir / "kube-controller-manager"), *common, "--secure-port", str(kcm_port),
        "--cert-dir", str(cluster.folder / "kcm-certs"), "--controllers", "*",
        "--service-account-private-key-file", str(sa_key), "--root-ca-file", str(cluster.ca_file),
        "--use-service-account-credentials=false", "--v=1"], cluster.folder / "kube-controller-manager.log")
    cluster.processes["kube-scheduler"] = start_process([
        str(bin_dir / "kube-scheduler"), *common, "--secure-port", str(scheduler_port),
        "--cert-dir", str(cluster.folder / "scheduler-certs"), "--v=1"], cluster.folder / "kube-scheduler.log")
    for name, port in (("kube-controller-manager", kcm_port), ("kube-scheduler", scheduler_port)):
        wait_ready(f"https://127.0.0.1:{port}", None, "", cluster.processes[name], cluster.folder / f"{name}.log",
                   what=name, path="/healthz")
    _timed(cluster, "kube-controller-manager+kube-scheduler", started)


def _apply_kueue_crds(rest: Rest) -> list[str]:
    import yaml

    names = []
    for path in sorted((kueue_config_dir() / "components" / "crd" / "bases").glob("*.yaml")):
        doc = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 1.6 MB: 2.6 s, 0.25 s in C
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
        names.append(doc["metadata"]["name"])
    return names


def install_kueue_crds(rest: Rest, *, created: Callable[[], None] = lambda: None) -> list[str]:
    """Create Kueue's CRDs and wait until the API server serves them (Established); `created`
    is called between the two (the start-up's timing)."""
    names = _apply_kueue_crds(rest)
    created()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _established(rest, names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kueue's CRDs not Established in {START_TIMEOUT_S:g} s")
        time.sleep(0.2)
    return names


def _established(rest: Rest, names: list[str]) -> bool:
    for name in names:
        crd = rest.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions") or []}
        if conditions.get("Established") != "True":
            return False
    return True


def webhook_configurations(port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's upstream webhook configurations, kept to Kueue's own kinds and the enabled
    frameworks, each pointed at `https://127.0.0.1:<port><path>` with `ca_pem` as its bundle."""
    import yaml

    keep = ("-kueue-x-k8s-io-", "-batch-v1-job")  # Kueue's kinds; batch/job's webhook paths
    bundle = base64.b64encode(ca_pem).decode()
    docs = []
    for doc in yaml.safe_load_all((kueue_config_dir() / "components" / "webhook" / "manifests.yaml").read_text()):
        if not doc:
            continue
        hooks = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if any(k in path for k in keep):
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
                hooks.append(hook)
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        doc["webhooks"] = hooks
        docs.append(doc)
    return docs


def _start_kueue(cluster: RealCluster, bin_dir: Path, ca: certs.Pair) -> None:
    import yaml

    rest = cluster.rest()
    started = time.monotonic()
    rest.create("v1", "namespaces", None, {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": KUEUE_NAMESPACE}})
    install_kueue_crds(rest, created=lambda: _timed(cluster, "kueue-crds-created", started))
    _timed(cluster, "kueue-crds", started)
    started = time.monotonic()
    cert_dir = cluster.folder / "kueue-certs"
    pair = certs.issue(ca, cert_dir, "webhook", ips=("127.0.0.1",), dns=("localhost",))
    pair.cert.rename(cert_dir / "tls.crt")
    pair.key.rename(cert_dir / "tls.key")
    webhook_port, health_port = free_port(), free_port()
    config = cluster.folder / "kueue.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)}}))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    log = cluster.folder / "kueue.log"
    with log.open("wb") as out:
        cluster.processes["kueue"] = subprocess.Popen(
            [*_with_metrics_certs(cluster.folder / "kueue-etc", ca), str(bin_dir / "kueue"), "--config", str(config),
             "--feature-gates", "VisibilityOnDemand=false"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    for doc in webhook_configurations(webhook_port, ca.cert.read_bytes()):
        plural = doc["kind"].lower() + "s"
        rest.request("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}", doc)
    wait_ready(f"http://127.0.0.1:{health_port}", None, "", cluster.processes["kueue"], log, what="kueue",
               path="/readyz")
    _wait_webhooks(rest)
    _timed(cluster, "kueue", started)


def _with_metrics_certs(folder: Path, ca: certs.Pair) -> list[str]:
    """A command prefix that gives Kueue `/etc/kueue/metrics/certs/tls.{crt,key}`.

    With its internal cert manager off, Kueue v0.17 loads its metrics certificate from that fixed
    path and exits without it (`cmd/kueue/main.go`), even with metrics off. Rather than write into
    this machine's /etc, Kueue runs in a mount namespace of its own where /etc is an overlay:
    this machine's /etc below, a folder holding only that certificate above."""
    upper, work = folder / "upper", folder / "work"
    certs_dir = upper / "kueue" / "metrics" / "certs"
    pair = certs.issue(ca, certs_dir, "metrics", ips=("127.0.0.1",))
    pair.cert.rename(certs_dir / "tls.crt")
    pair.key.rename(certs_dir / "tls.key")
    work.mkdir(parents=True, exist_ok=True)
    mount = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mount} && exec "$0" "$@"']


def _wait_webhooks(rest: Rest) -> None:
    """Until the API server's call to Kueue's webhook succeeds: a dry-run ResourceFlavor."""
    body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "probe"}}
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            rest.request("POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors", body, query={"dryRun": "All"})
            return
        except RestError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kueue's webhooks not reachable by the API server: {e}") from e
            time.sleep(0.2)
