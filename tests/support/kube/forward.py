"""This machine's ways to the simulated nodes' addresses, across each node's link, without
giving this machine's own network an address on the simulated one:

- `Forwarder`: a loopback port that reaches one port of one node (the emulated harness's node
  agents: `KubeHarness.node_agents`, node → URL);
- `NodeProxy`: an HTTP proxy on loopback for every node address (the real control plane's
  harness): a client configured with it (`http_proxy`, `no_proxy` for loopback: `env()`) asks
  `http://<node's InternalIP>:<port>/…` as it would on the cluster's network — what the health
  watch does with the addresses `KubernetesLauncher.node_agents` reads from the Node objects.

Either way each connection is dialled anew from inside the fabric namespace
(`netns.Network.dial_in_fabric`), so when the node's link is down the dial times out and the
caller's connection is closed unanswered — no HTTP error from a proxy, which a client would
take for the agent's own answer: the agent is unreachable as behind a dead cable (its process
keeps running, and answers again when the link comes back), not killed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit

from tests.support.kube.netns import Network

DIAL_TIMEOUT_S = 3.0
"""Like the health watch's probe timeout: a dead link costs a probe that long, not longer."""


class Forwarder:
    def __init__(self, network: Network, address: str, port: int) -> None:
        self.network, self.address, self.port = network, address, port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"forward-{address}:{port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = self.network.dial_in_fabric(self.address, self.port, DIAL_TIMEOUT_S)
        except OSError:
            client.close()  # the link is down (or the agent not listening): unanswered
            return
        _splice(client, upstream)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()


HEAD_LIMIT = 65536


class NodeProxy(Forwarder):
    """An HTTP/1.1 forward proxy on loopback for `addresses` (the nodes'): a request in absolute
    form (`GET http://10.213.0.11:9400/health HTTP/1.1`) is sent on in origin form to that
    address, dialled across its node's link. Any other address is refused (403): the proxy is
    a way to the simulated nodes, nowhere else."""

    def __init__(self, network: Network, addresses: set[str]) -> None:
        self.addresses = addresses
        super().__init__(network, "", 0)

    def env(self) -> dict[str, str]:
        """The environment that sends a client's plain-HTTP requests through the proxy and keeps
        loopback (the API server, Airflow, the store, MLflow) direct."""
        return {"http_proxy": self.url, "no_proxy": "127.0.0.1,localhost"}

    def _serve(self, client: socket.socket) -> None:
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < HEAD_LIMIT:
                if not (data := client.recv(65536)):
                    break
                head += data
        try:
            line, rest = head.split(b"\r\n", 1)
            method, target, version = line.decode("latin-1").split(" ")
            url = urlsplit(target)
            host, port = url.hostname, url.port or 80
        except ValueError:
            host = None
        if host not in self.addresses or url.scheme != "http":
            with contextlib.suppress(OSError):
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            client.close()
            return
        try:
            upstream = self.network.dial_in_fabric(host, port, DIAL_TIMEOUT_S)
        except OSError:
            client.close()  # the link is down (or nothing listens): unanswered
            return
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        try:
            upstream.sendall(f"{method} {path} {version}\r\n".encode("latin-1") + rest)
        except OSError:
            client.close()
            upstream.close()
            return
        _splice(client, upstream)


def _splice(client: socket.socket, upstream: socket.socket) -> None:
    """Copy both ways until either side is done, then close both (a shutdown wakes the other recv)."""
    def pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
    pipe(client, upstream)
