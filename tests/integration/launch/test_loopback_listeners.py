"""Nothing a local run starts listens beyond loopback (issue 56): a real torchrun gang of two
nodes on this host — its agents, its warm rank starter, its ranks — watched while it trains,
every listening TCP socket its processes hold read from the kernel's tables (`tests.support.sockets`).

Without `loopback`, torchrun's c10d rendezvous store (in the node-rank-0 agent) and rank 0's
`init_process_group` store listen on `::` (seen in the issue, and in `tests/unit/launch/test_loopback.py`'s
check of torch alone); gloo's pairs listen where the host name resolves unless
`GLOO_SOCKET_IFNAME` says otherwise.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.launch.test_local_launcher import start
from tests.support import procs, sockets
from trainyard.plugins.launch.local import RUN_MARKER
from trainyard.plugins.run import processes

pytestmark = [pytest.mark.slow, pytest.mark.waits]


@pytest.mark.parametrize("warm", ["1", "0"], ids=["forked-ranks", "plain-ranks"])
def test_a_local_gang_listens_on_loopback_only(tmp_path: Path, warm: str) -> None:
    """Both ways a rank starts: forked by the attempt's warm starter (agents too), or as a plain
    child of its wrapper (`TRAINYARD_WARM_RANKS=0`), each with its own way of applying `loopback`."""
    launcher, handle = start(tmp_path, f"tiny-listen-{warm}", ["--steps", "8", "--sleep", "0.4"],
                             env={"TRAINYARD_WARM_RANKS": warm})
    seen: dict[int, list[tuple[str, int]]] = {}
    try:
        deadline = time.monotonic() + 180
        while (status := launcher.poll(handle)).state not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, launcher.logs(handle)
            for pid, found in sockets.listeners_of(processes.marked_processes(RUN_MARKER, handle.run_dir)).items():
                seen[pid] = sorted(set(seen.get(pid, [])) | set(found))
            time.sleep(0.1)
        assert status.state == "succeeded", f"{status}\n{launcher.logs(handle)}"
    finally:
        launcher.stop(handle, grace_s=0)
    rendezvous_port = int(handle.rdzv_endpoint.rsplit(":", 1)[1])
    agent = handle.agents[0].pid
    assert ("127.0.0.1", rendezvous_port) in seen.get(agent, []), seen  # the run was watched while it listened
    rank_pids = {r.pid for r in status.ranks if r.pid}
    assert {pid for pid in seen if pid in rank_pids}, seen  # the ranks' own listeners were seen too
    assert sockets.beyond_loopback(seen) == {}, seen


def test_the_plain_rank_runner_runs_a_script_as_python_would(tmp_path: Path) -> None:
    """`python -m trainyard.plugins.launch.loopback script.py ARGS` (what `rank_exec` starts):
    the script is `__main__` with its own `sys.argv` and folder on the path, nothing of torch is
    imported before it asks, and the `env://` store rank 0 builds listens on loopback."""
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(
        "import sys\n"
        "print('torch before:', 'torch' in sys.modules)\n"
        "print('argv:', sys.argv, 'path0:', sys.path[0], 'name:', __name__)\n"
        "import importlib, os, datetime\n"
        "import torch.distributed\n"
        "from tests.support import sockets\n"
        "store = importlib.import_module('torch.distributed.rendezvous')._create_c10d_store(\n"
        "    '127.0.0.1', 0, 0, 1, datetime.timedelta(seconds=10))\n"
        "print('bound:', [f for f in sockets.listeners_of([os.getpid()])[os.getpid()] if f[1] == store.port])\n")
    result = subprocess.run([sys.executable, "-u", "-m", "trainyard.plugins.launch.loopback", str(script), "a", "b"],
                            cwd=tmp_path, env=procs.test_env(), capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "torch before: False"
    assert lines[1] == f"argv: {[str(script), 'a', 'b']} path0: {script.parent} name: __main__"
    assert lines[2].startswith("bound: [('127.0.0.1', ") and lines[2].endswith(")]"), lines
