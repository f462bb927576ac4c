"""Every port the embedded stack opens listens on the loopback address (DESIGN §12): the Airflow
api-server, MLflow's UI, the node agents — and no Airflow log server (they listen on every
interface, so the stack runs none). Read from the kernel's own tables (`/proc/net/tcp`, `tcp6`)
for the sockets the stack's processes hold, not from the configuration.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from tests.e2e.airflow_stack import RunningStack
from tests.support import sockets


def test_every_port_the_stack_opens_listens_on_loopback_only(shared: RunningStack) -> None:
    from trainyard.plugins.run import processes

    listening = sockets.listening()
    held = sockets.listeners_of(processes.of_home(shared.stack.home))
    assert shared.stack.port in {port for found in held.values() for _, port in found}, held  # the api-server
    agent_ports = {int(url.rsplit(":", 1)[1]) for url in shared.settings.node_agents.values()}
    agents = [(addr, port) for addr, port in listening.values() if port in agent_ports]
    assert {port for _, port in agents} == agent_ports, (agents, agent_ports)  # every node agent listens
    wide = sockets.beyond_loopback(held)
    assert wide == {}, {pid: (Path(f"/proc/{pid}/cmdline").read_bytes()[:160], found) for pid, found in wide.items()}
    assert all(ipaddress.ip_address(addr).is_loopback for addr, _ in agents), agents
