"""Every port the embedded stack opens listens on the loopback address (DESIGN §12): the Airflow
api-server, MLflow's UI, the node agents — and no Airflow log server (they listen on every
interface, so the stack runs none). Read from the kernel's own tables (`/proc/net/tcp`, `tcp6`)
for the sockets the stack's processes hold, not from the configuration.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from tests.e2e.airflow_stack import RunningStack

LISTEN = "0A"
"""The TCP state LISTEN in /proc/net/tcp."""


def _listening() -> dict[int, tuple[str, int]]:
    """Socket inode → (address, port) of every TCP socket listening on this machine."""
    found = {}
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state != LISTEN:
                continue
            raw, port = local.split(":")
            data = bytes.fromhex(raw)
            # the kernel prints each 32-bit word of the address in host (little-endian) order
            words = b"".join(data[i:i + 4][::-1] for i in range(0, width, 4))
            found[inode] = (str(ipaddress.ip_address(words)), int(port, 16))
    return found


def _sockets_of(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # ended meanwhile
        pass
    return inodes


def test_every_port_the_stack_opens_listens_on_loopback_only(shared: RunningStack) -> None:
    from trainyard.plugins.run import processes

    listening = _listening()
    held = {pid: [listening[i] for i in _sockets_of(pid) if i in listening]
            for pid in processes.of_home(shared.stack.home)}
    held = {pid: found for pid, found in held.items() if found}
    assert shared.stack.port in {port for found in held.values() for _, port in found}, held  # the api-server
    agent_ports = {int(url.rsplit(":", 1)[1]) for url in shared.settings.node_agents.values()}
    agents = [(addr, port) for addr, port in listening.values() if port in agent_ports]
    assert {port for _, port in agents} == agent_ports, (agents, agent_ports)  # every node agent listens
    wide = {pid: found for pid, found in held.items()
            if any(not ipaddress.ip_address(addr).is_loopback for addr, _ in found)}
    assert wide == {}, {pid: (Path(f"/proc/{pid}/cmdline").read_bytes()[:160], found) for pid, found in wide.items()}
    assert all(ipaddress.ip_address(addr).is_loopback for addr, _ in agents), agents
