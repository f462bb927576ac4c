"""A job's rendered NetworkPolicy enforced on the simulated nodes (issue 56, item 2): the
product's policy (`plugins/launch/netpol.py`) applied by the administrator to a real
kube-apiserver, and `tests/support/kube/netpol_enforcer.py` — the network plugin this machine
lacks — dropping what it denies in the nodes' fabric.

Three nodes, one pod each, kube-scheduler placing them by `nodeSelector`: run A's pods on nodes
0 and 1, run B's on node 2, each a small TCP server carrying its run's labels; the object store
is a server on the fabric's address (`http://10.213.0.1:<port>`, an `ipBlock` of that address
and port in the policy). Connections are made from inside the source pod's node namespace — in
this simulation the pod's own network namespace (one address per node) — and the enforcer
polices nothing but those addresses and ports (its docstring says what that cannot express).

Checked, in order: with no policy every connection is made (the listeners work); with run A's
policy applied, A's pod on node 1 reaches A's pod on node 0 and A's pod reaches the object
store, while B's pod cannot reach A's (ingress), and A's pod cannot reach B's pod or another port
of the object store's address (egress): each dropped, the connect times out; with the policy
deleted, the dropped ones are made again (the control). Without enforcement the second step
fails.
"""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kube import netns
from tests.support.kube.harness import NODES_WITH_SPARE
from tests.support.kube.netpol_enforcer import NETPOL, NetpolEnforcer, enforcing
from tests.support.kube.real_cluster import binaries_missing
from tests.support.kube.real_harness import RealKubeHarness
from tests.support.require import missing
from trainyard.plugins.launch.netpol import render_network_policy
from trainyard.plugins.launch.tenancy import PLATFORM_NAMESPACE

pytestmark = pytest.mark.slow
NAMESPACE = "team-a"
POD_PORT = 7101
STORE_PORT, OTHER_PORT = 7102, 7103
DROP_S = 1.5
"""How long a connect waits before it counts as dropped (the kernel answers an allowed one in
milliseconds, whatever the load: no process is involved until the connection is made)."""
ANSWER_S = 10.0
RUNS = {"a": {"trainyard.io/job": "gpt", "trainyard.io/run": "r-a"},
        "b": {"trainyard.io/job": "gpt", "trainyard.io/run": "r-b"}}
PLACED = {"a-0": ("a", 0), "a-1": ("a", 1), "b-2": ("b", 2)}
"""pod → (run, node index)."""
SERVE = """import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {port})); s.listen(16)
while True:
    c, _ = s.accept(); c.sendall(b"hi"); c.close()
"""


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeHarness]:
    if binaries_missing():
        missing("kube", f"the Kubernetes binaries are not built: {', '.join(binaries_missing())}")
    if shutil.which("nft") is None:
        missing("nft", "the policy enforcer programs the simulated network with nftables' `nft`")
    try:
        harness = RealKubeHarness(tmp_path_factory.mktemp("kube"), nodes=NODES_WITH_SPARE).__enter__()
    except netns.NetnsUnavailable as e:
        missing("netns", f"the simulated nodes need network namespaces: {e}")
    with harness:
        yield harness


def server_pod(name: str, run: str, node: str) -> dict[str, Any]:
    """A pod of `run` (the labels the run's policy selects on) serving TCP on `POD_PORT` on `node`."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": RUNS[run]},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                     "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                     "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True},
                     "containers": [{"name": "serve", "image": "trainyard:test", "workingDir": "/",
                                     "command": ["python", "-c", SERVE.format(port=POD_PORT)]}]}}


def connects(network: netns.Network, node: str, address: str, port: int) -> bool:
    """Whether a TCP connection from `node` to `address:port` is made (and answered) in `DROP_S`;
    a refusal raises: the enforcer drops, so a refusal means the listener is gone."""
    try:
        sock = network.dial_from_node(node, address, port, DROP_S)
    except TimeoutError:
        return False
    with sock:  # connected: the kernel answered; the server's greeting may take longer under load
        sock.settimeout(ANSWER_S)
        return sock.recv(2) == b"hi"


def serving(network: netns.Network, node: str, address: str) -> bool:
    """Whether a pod's server answers yet (its kubelet reports the address before it binds)."""
    try:
        return connects(network, node, address, POD_PORT)
    except ConnectionRefusedError:
        return False


def test_the_rendered_policy_drops_what_it_denies_and_only_while_it_exists(kube: RealKubeHarness) -> None:
    rest, network = kube.rest(), kube.network
    nodes = kube.node_names
    address = {pod: network.nodes[nodes[i]].address for pod, (_, i) in PLACED.items()}
    rest.create("v1", "namespaces", None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for pod, (run, i) in PLACED.items():
        rest.create("v1", "pods", NAMESPACE, server_pod(pod, run, nodes[i]))
    store, other = network.listen_in_fabric(STORE_PORT), network.listen_in_fabric(OTHER_PORT)
    for listener in (store, other):  # answers each connection the kernel accepts, as the pods do
        _serve_in_background(listener)
    kube.wait_for(lambda: all((p.get("status") or {}).get("podIP") for p in rest.list("v1", "pods", NAMESPACE))
                  and all(serving(network, nodes[1], address[p]) for p in ("a-0", "b-2")), 90,
                  "the pods to report their addresses and serve")

    def paths() -> dict[str, bool]:
        return {
            "a-1 -> a-0 (same run)": connects(network, nodes[1], address["a-0"], POD_PORT),
            "a-0 -> object store": connects(network, nodes[0], netns.FABRIC_ADDRESS, STORE_PORT),
            "b-2 -> a-0 (ingress)": connects(network, nodes[2], address["a-0"], POD_PORT),
            "a-0 -> b-2 (egress)": connects(network, nodes[0], address["b-2"], POD_PORT),
            "a-0 -> other port (egress)": connects(network, nodes[0], netns.FABRIC_ADDRESS, OTHER_PORT),
        }

    everything = dict.fromkeys(paths(), True)
    with enforcing(kube.rest, network) as enforcer:
        assert paths() == everything  # no policy yet: the enforcer isolates nothing
        policy = render_network_policy("gpt-r-a", NAMESPACE, RUNS["a"], platform_namespace=PLATFORM_NAMESPACE,
                                       endpoints=[f"http://{netns.FABRIC_ADDRESS}:{STORE_PORT}/"])
        rest.create(NETPOL, "networkpolicies", NAMESPACE, policy)
        _wait_programmed(kube, enforcer, present=True)
        assert paths() == {**everything, "b-2 -> a-0 (ingress)": False, "a-0 -> b-2 (egress)": False,
                           "a-0 -> other port (egress)": False}, enforcer.ruleset

        rest.delete(NETPOL, "networkpolicies", NAMESPACE, "gpt-r-a")
        _wait_programmed(kube, enforcer, present=False)
        assert paths() == everything
        assert enforcer.errors == []


def _wait_programmed(kube: RealKubeHarness, enforcer: NetpolEnforcer, *, present: bool) -> None:
    key = f"{NAMESPACE}/gpt-r-a"
    kube.wait_for(lambda: (key in enforcer.programmed) == present, 30,
                  f"the enforcer to {'load' if present else 'drop'} {key} (errors: {enforcer.errors})")


def _serve_in_background(listener: socket.socket) -> None:
    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"hi")

    threading.Thread(target=serve, name="fabric-server", daemon=True).start()
