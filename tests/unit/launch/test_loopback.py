"""`loopback`: a store whose clients are given a loopback address listens there only, on both
of torch's store backends, and only there (other hosts keep torch's wildcard bind)."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from tests.support import sockets
from trainyard.plugins.launch import loopback

TIMEOUT = timedelta(seconds=10)


def _bound(store: dist.TCPStore) -> list[tuple[str, int]]:
    import os

    return [found for found in sockets.listeners_of([os.getpid()]).get(os.getpid(), []) if found[1] == store.port]


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv", "legacy"])
def test_a_loopback_store_listens_on_loopback_only_and_serves(libuv: bool) -> None:
    server = loopback.tcp_store("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT,
                                multi_tenant=True, use_libuv=libuv)
    assert server.libuvBackend is libuv
    assert _bound(server) == [("127.0.0.1", server.port)]
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT, use_libuv=libuv)
    client.set("k", "v")
    assert server.get("k") == b"v"


def test_torch_alone_listens_on_every_interface() -> None:
    """Why the module exists: if this fails, torch binds the host it is given and `loopback`
    may go."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    assert [addr for addr, _ in _bound(server)] in (["::"], ["0.0.0.0"])


def test_a_store_for_other_hosts_is_torchs_own() -> None:
    server = loopback.tcp_store("localhost", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    assert [addr for addr, _ in _bound(server)] in (["::"], ["0.0.0.0"])  # names are not resolved
    assert not loopback.is_loopback("10.0.0.1") and not loopback.is_loopback("localhost")
    assert loopback.is_loopback("127.0.0.1") and loopback.is_loopback("::1") and loopback.is_loopback("127.0.1.1")


def test_a_taken_port_is_the_error_c10d_retries_as_a_client() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(RuntimeError, match=r"cannot listen on 127\.0\.0\.1") as raised:
            loopback.tcp_store("127.0.0.1", taken.getsockname()[1], is_master=True, timeout=TIMEOUT)
    assert isinstance(raised.value, dist.DistNetworkError)


def test_apply_puts_the_loopback_store_where_torch_builds_its_servers() -> None:
    import importlib

    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous

    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module: the package's name is a function
    saved = (rendezvous.TCPStore, c10d_rendezvous_backend.TCPStore,
             dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server)
    try:
        loopback.apply()
        loopback.apply()  # twice changes nothing
        assert rendezvous.TCPStore is loopback.tcp_store is c10d_rendezvous_backend.TCPStore
        assert dist.TCPStore is saved[0]  # the class itself stays torch's, for isinstance
        # init_process_group's env:// store, as rank 0 builds it
        server = rendezvous._create_c10d_store("127.0.0.1", 0, 0, 1, TIMEOUT)
        assert _bound(server) == [("127.0.0.1", server.port)]
        shared = dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server(None, "127.0.0.1", 0)
        assert _bound(shared) == [("127.0.0.1", shared.port)]
    finally:
        for module in (rendezvous, c10d_rendezvous_backend):
            module.TCPStore = saved[0]
            delattr(module, loopback.PATCHED)
        dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server = saved[2]
