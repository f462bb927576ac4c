"""One embedded stack for every test of this folder: training, recovery, retraining.

Starting a stack costs a migration and four Airflow processes warming up; the tests here only
need a stack, not a fresh one, so they share it. It has a real node agent per local node (fault
injection on) that the health watches poll. Each test module adds its own job specs
(`RunningStack.add_jobs`) and leaves the stack as it found it: no cordoned node, no injected
fault (the recovery tests undo theirs). The stack is stopped after the last test of this folder
(package scope), before the rest of the suite runs — and then nothing of its home may be left
running.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.airflow_stack import RunningStack, running_stack
from tests.support.node_agents import node_agents

NODES = ("local-0", "local-1")
"""The local cluster's nodes (`config/clusters/local.yaml`)."""


@pytest.fixture(scope="package")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    from trainyard.plugins.run import processes

    home = tmp_path_factory.mktemp("airflow-shared") / "home"
    with node_agents(NODES, home / "runs", home.parent / "agents") as agents, \
            running_stack(home, agents=agents) as stack:
        yield stack
    # `make down` leaves nothing of the home running: no orphaned worker, no log server, no rank
    left = processes.of_home(home)
    assert left == [], {pid: (processes.PROC / str(pid) / "cmdline").read_bytes()[:200] for pid in left}
