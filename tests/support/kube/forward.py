"""A loopback port of this machine that reaches a port on a simulated node, across that node's
link: what lets the control plane (Airflow's triggerer, a test) talk to a node agent that runs
*on its node* — in the node's network namespace, listening on the node's address, as the
rendered DaemonSet's hostPort does — without giving this machine's own network an address on
the simulated one.

Each accepted connection is dialled anew from inside the fabric namespace
(`netns.Network.dial_in_fabric`), so when the node's link is down the dial times out and the
caller's connection is closed unanswered: the agent is unreachable as behind a dead cable (its
process keeps running, and answers again when the link comes back), not killed.
"""

from __future__ import annotations

import contextlib
import socket
import threading

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
        def pipe(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            for end in (src, dst):  # either side done: both go (a shutdown wakes the other recv)
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
