"""Key-value stores that listen on loopback when their clients are told to reach them there.

Why: torch's `TCPStore` server binds the wildcard address whatever host it is given. Measured
with torch 2.13 on this machine: `TCPStore("127.0.0.1", 0, is_master=True)` listens on `*:PORT`
with either backend (libuv and the legacy one; torch's C++ source is not in the wheel), so
a local run's stores — torchrun's c10d rendezvous store in the node-rank-0 agent, and the store
rank 0 hosts for `init_process_group` (`MASTER_ADDR`/`MASTER_PORT`; one per round, since
`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`) — took connections from any machine that could reach
this one, although every client is given `127.0.0.1`.

How: the constructor also takes `master_listen_fd`, a socket already bound, which both backends
listen on instead of binding their own. `tcp_store` binds that socket to the host the clients
are given when it is a loopback address, and `apply` puts `tcp_store` where torch constructs
its store servers (the three places below); everything else about the store is torch's. A host
that is not a loopback literal (a Kubernetes pod's address, a hostname) keeps torch's wildcard
bind, which multi-host runs need: the rule holds on every launcher.

Applied in every process of a local run that may host a store before it builds one: the torchrun
agent (`agent.main`), the attempt's rank starter before it forks agents and ranks
(`rank_zygote.main`), and a rank started as a plain child (`rank_exec` runs it under this module's
`main`), lazily: the script imports torch itself, when it would have (before it, the child imports
only this module and the `trainyard` package: 35 ms here, `python -X importtime`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import ipaddress
import socket
import sys
from collections.abc import Sequence
from datetime import timedelta
from types import ModuleType
from typing import Any

PATCHED = "_trainyard_loopback"
"""Set on each patched module, so applying twice changes nothing."""

RENDEZVOUS_MODULES = ("torch.distributed.rendezvous", "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend")
"""The modules that construct store servers through a `TCPStore` name of their own (imported
from `torch.distributed` at their import): `init_process_group`'s `env://` and `tcp://`
stores, and torchrun's c10d rendezvous store. The third place, the rendezvous handler's shared
store (`DynamicRendezvousHandler._create_tcp_store_server`, off while
`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`), reads `torch.distributed.TCPStore` at call time and is
patched as a method: the class itself stays torch's, for every `isinstance`."""


def is_loopback(host: str) -> bool:
    """`host` is a loopback IP literal (`127.0.0.0/8`, `::1`); names are not resolved."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (0: a free port) and listening, for a store to serve.
    A port already taken raises torch's `DistNetworkError` (a `RuntimeError`), as torch's own
    bind would: c10d's rendezvous then retries as a client — every local agent tries to host
    the store, and the first one wins."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        from torch.distributed import DistNetworkError

        raise DistNetworkError(f"the store cannot listen on {host}:{port}: {e}") from e
    return sock


def tcp_store(host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
              timeout: timedelta = timedelta(seconds=300), wait_for_workers: bool = True,
              multi_tenant: bool = False, master_listen_fd: int | None = None, use_libuv: bool = True) -> Any:
    """`torch.distributed.TCPStore` with its arguments, whose server listens on `host_name`
    alone when that is a loopback address (see the module docstring)."""
    from torch.distributed import TCPStore

    if is_master and master_listen_fd is None and is_loopback(host_name):
        sock = bound_socket(host_name, port)
        port = sock.getsockname()[1]
        master_listen_fd = sock.detach()  # the store owns it now, and closes it with its server
    return TCPStore(host_name, port, world_size, is_master, timeout, wait_for_workers, multi_tenant,
                    master_listen_fd, use_libuv)


def _shared_store_server(self: Any, master_addr: str, master_port: int) -> Any:
    """`DynamicRendezvousHandler._create_tcp_store_server`, through `tcp_store`."""
    return tcp_store(master_addr, master_port, is_master=True, multi_tenant=True)


def apply() -> None:
    """Have torch's store servers built by `tcp_store` in this process (and what it forks)."""
    for name in RENDEZVOUS_MODULES:
        _patch(importlib.import_module(name))
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server = _shared_store_server  # type: ignore[method-assign]


def apply_when_imported() -> None:
    """`apply`'s `env://` part once the program itself imports `torch.distributed.rendezvous`
    (which `import torch` does), not before: a rank started as a plain child imports torch when
    its script does, after whatever the script sets first (`OMP_NUM_THREADS`, devices)."""
    module = sys.modules.get(RENDEZVOUS_MODULES[0])
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _patch(module: Any) -> None:
    if not getattr(module, PATCHED, False):
        module.TCPStore = tcp_store
        setattr(module, PATCHED, True)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `torch.distributed.rendezvous` is looked up, it finds the
    module through the path finder and wraps its loader so that `_patch` runs right after the
    module has executed; then it leaves `sys.meta_path`."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != RENDEZVOUS_MODULES[0]:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _PatchingLoader(spec.loader.name, spec.loader.path)
        return spec


class _PatchingLoader(importlib.machinery.SourceFileLoader):
    def exec_module(self, module: ModuleType) -> None:
        super().exec_module(module)
        _patch(module)


def main(argv: list[str] | None = None) -> None:
    """`python -m trainyard.plugins.launch.loopback [-m] ENTRY ARGS…`: run `ENTRY` as `python -u
    [-m] ENTRY ARGS…` would (`__main__`, `sys.argv`, `sys.path[0]`), its `env://` store on
    loopback. What `rank_exec` starts for a rank no warm starter forks."""
    argv = list(sys.argv[1:] if argv is None else argv)
    module = bool(argv) and argv[0] == "-m"
    if module:
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: loopback [-m] ENTRYPOINT [ARGS…]")
    import os
    import runpy

    apply_when_imported()
    if module:
        sys.argv, sys.path[0] = list(argv), os.getcwd()
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
