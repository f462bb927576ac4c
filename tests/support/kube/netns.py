"""The simulated nodes' network: one namespace per node, all on a bridge inside a "fabric"
namespace the harness makes, on 10.213.0.0/24 (only inside those namespaces: nothing is added
to this machine's own interfaces).

    fabric ns  (br0 10.213.0.1/24: the API server listens here too)
      ├─ veth p0 ── eth0 10.213.0.10   node ns 0
      └─ veth p1 ── eth0 10.213.0.11   node ns 1

Host names resolve through `/etc/netns/<node ns>/hosts`, which `ip netns exec` bind-mounts over
`/etc/hosts` for what it starts; the file is rewritten in place (never renamed), so processes
already running see the new entries. Losing a node takes its bridge port down: packets to and
from it are dropped, like a pulled cable (connections time out, they are not refused).

Every name carries a per-harness prefix, so two harnesses (other engineers' test runs) never
meet; `Network.close` removes what it made even after a failed test, and `sweep(prefix)` what a
killed harness left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.213.0"
FABRIC_ADDRESS = f"{SUBNET}.1"
NETNS_ETC = Path("/etc/netns")
CLONE_NEWNET = 0x40000000


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, a locked-down container)."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")


def check_available() -> None:
    """Raise `NetnsUnavailable` saying why, unless `ip netns add` works here."""
    if shutil.which("ip") is None:
        raise NetnsUnavailable("iproute2's `ip` is not installed")
    if os.geteuid() != 0:
        raise NetnsUnavailable(f"network namespaces need root (running as uid {os.geteuid()})")
    probe = f"typrobe{os.getpid()}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise NetnsUnavailable(f"`ip netns add` fails here: {result.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30, check=False)


def _enter(netns: str) -> None:
    """Move the calling thread (only it: `setns`) into network namespace `netns`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into the {netns} namespace")
    finally:
        os.close(fd)


def _in_namespace(netns: str, make: Callable[[], socket.socket]) -> socket.socket:
    """`make()` run inside network namespace `netns`: `setns` moves only the calling thread, so a
    short-lived thread enters the namespace, makes the socket and ends; the socket stays in that
    namespace and any thread may use it."""
    made: dict[str, object] = {}

    def enter_and_make() -> None:
        try:
            _enter(netns)
            made["socket"] = make()
        except OSError as e:
            made["error"] = e

    thread = threading.Thread(target=enter_and_make, name=f"in-netns-{netns}")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]  # type: ignore[misc]
    return made["socket"]  # type: ignore[return-value]


@dataclass
class NodeNet:
    name: str
    """The Kubernetes node name."""
    netns: str
    address: str
    port: str
    """The bridge port (in the fabric namespace) whose link is this node's cable."""


@dataclass
class Network:
    prefix: str
    fabric: str = ""
    nodes: dict[str, NodeNet] = field(default_factory=dict)
    _made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fabric = f"{self.prefix}-fab"

    def create(self, node_names: list[str]) -> None:
        self._add_netns(self.fabric)
        _ip("-n", self.fabric, "link", "set", "lo", "up")
        _ip("-n", self.fabric, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.fabric, "addr", "add", f"{FABRIC_ADDRESS}/24", "dev", "br0")
        _ip("-n", self.fabric, "link", "set", "br0", "up")
        for i, name in enumerate(node_names):
            node = NodeNet(name=name, netns=f"{self.prefix}-n{i}", address=f"{SUBNET}.{10 + i}", port=f"p{i}")
            self._add_netns(node.netns)
            _ip("link", "add", "eth0", "netns", node.netns, "type", "veth", "peer", "name", node.port,
                "netns", self.fabric)
            _ip("-n", self.fabric, "link", "set", node.port, "master", "br0", "up")
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "eth0", "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
            self.nodes[name] = node
        self.write_hosts({})

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        (NETNS_ETC / name).mkdir(parents=True, exist_ok=True)

    def listen_in_fabric(self, port: int) -> socket.socket:
        """A TCP socket listening on the bridge's address inside the fabric namespace."""
        def bind() -> socket.socket:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((FABRIC_ADDRESS, port))
            sock.listen(64)
            return sock

        return _in_namespace(self.fabric, bind)

    def dial_in_fabric(self, address: str, port: int, timeout_s: float) -> socket.socket:
        """A TCP connection made from inside the fabric namespace to `address:port` (a node's):
        it crosses the node's link, so a link that is down drops it — a connect that times out,
        as a cut cable does — where a loopback connection would not notice."""
        def connect() -> socket.socket:
            sock = socket.create_connection((address, port), timeout=timeout_s)
            sock.settimeout(None)
            return sock

        return _in_namespace(self.fabric, connect)

    def dial_from_node(self, node: str, address: str, port: int, timeout_s: float) -> socket.socket:
        """A TCP connection made from inside `node`'s namespace, as its pods' processes make them
        (they share it): from the node's address, across the bridge unless `address` is its own."""
        return _in_namespace(self.nodes[node].netns,
                             lambda: socket.create_connection((address, port), timeout=timeout_s))

    def write_hosts(self, entries: dict[str, str]) -> None:
        """Every node's `/etc/hosts`: localhost, the nodes, then `entries` (name → address)."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{n.address}\t{n.name}" for n in self.nodes.values()]
        lines += [f"{address}\t{names}" for names, address in sorted(entries.items())]
        text = "\n".join(lines) + "\n"
        for node in self.nodes.values():
            path = NETNS_ETC / node.netns / "hosts"
            if path.exists() and path.read_text() == text:
                continue
            with path.open("a+") as f:  # in place: the bind mounts keep pointing at this inode
                f.seek(0)
                f.truncate()
                f.write(text)

    def set_link(self, node: str, up: bool) -> None:
        _ip("-n", self.fabric, "link", "set", self.nodes[node].port, "up" if up else "down")

    def pids(self, netns: str) -> list[int]:
        result = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30,
                                check=False)
        return [int(p) for p in result.stdout.split()]

    def close(self) -> list[str]:
        """Kill what still runs in the namespaces, delete them and their /etc/netns folders;
        returns what could not be removed (empty when all is gone)."""
        return sweep_namespaces(self._made)


def sweep_namespaces(names: list[str]) -> list[str]:
    left = []
    for name in names:
        for _ in range(3):
            result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30,
                                    check=False)
            pids = [int(p) for p in result.stdout.split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            import time

            time.sleep(0.2)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
        if Path(f"/run/netns/{name}").exists():
            left.append(name)
    return left


def sweep(prefix: str) -> list[str]:
    """Remove every namespace whose name starts with `prefix` (what a killed harness left)."""
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    names = [line.split()[0] for line in result.stdout.splitlines() if line.startswith(prefix)]
    return sweep_namespaces(names)
