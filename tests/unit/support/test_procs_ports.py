"""`free_ports`: a block of ports a test's servers can listen on, away from the ports the kernel
lends outgoing connections."""

from __future__ import annotations

import socket

from tests.support.procs import ephemeral_ports_start, free_ports


def test_a_free_block_is_bindable_and_below_the_ephemeral_range() -> None:
    low = ephemeral_ports_start()
    for _ in range(20):
        base = free_ports(3)
        assert base >= 10_000 and base + 3 <= low
        with socket.socket() as a, socket.socket() as b, socket.socket() as c:
            for sock, port in zip((a, b, c), range(base, base + 3), strict=True):
                sock.bind(("127.0.0.1", port))
                sock.listen()
