"""Nothing a local run starts listens beyond loopback (issue 56): a real torchrun gang of two
nodes on this host — its agents, its warm rank starter, its ranks — watched while it trains,
every listening TCP socket its processes hold read from the kernel's tables (`tests.support.sockets`).

Without `loopback`, torchrun's c10d rendezvous store (in the node-rank-0 agent) and rank 0's
`init_process_group` store listen on `::` (seen in the issue, and in `tests/unit/launch/test_loopback.py`'s
check of torch alone); gloo's pairs listen where the host name resolves unless
`GLOO_SOCKET_IFNAME` says otherwise.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.launch.test_local_launcher import start
from tests.support import procs, sockets
from tests.support.require import missing
from trainyard.plugins.launch.local import LOOPBACK_ENV, RUN_MARKER
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
    # the run was watched while it listened: the rendezvous store is in an agent (whichever bound
    # its port first: every local agent's address matches the endpoint's, so each tries to host it)
    assert any(("127.0.0.1", rendezvous_port) in seen.get(a.pid, []) for a in handle.agents), (seen, handle.agents)
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


GLOO_PROBE = """
import json, os, sys
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.support import sockets
from trainyard.plugins.launch import loopback

def rank(r):
    loopback.apply()  # the store rank 0 hosts, as in a local run
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK=str(r), WORLD_SIZE="2")
    dist.init_process_group("gloo")
    dist.barrier()
    with open(os.path.join(sys.argv[2], f"rank-{r}.json"), "w") as out:
        json.dump(sockets.listeners_of([os.getpid()]).get(os.getpid(), []), out)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank, nprocs=2)
"""


def _lan_address() -> str | None:
    """This machine's address towards other hosts (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


def test_gloo_listens_on_loopback_where_the_host_name_resolves_to_a_lan_address(tmp_path: Path) -> None:
    """gloo's pairs listen where the host name resolves — 127.0.0.1 on this machine by its
    /etc/hosts, a LAN address on most — unless `GLOO_SOCKET_IFNAME` names an interface, which the
    local launcher sets (`LOOPBACK_ENV`). Two gloo ranks run in a mount namespace whose /etc/hosts
    gives the host name the LAN address: without the variable they listen there (the control),
    with it on loopback only."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        missing("mountns", "a private /etc/hosts needs root and unshare")
    lan = _lan_address()
    if lan is None:
        missing("mountns", "this machine has no address but loopback")
    hosts, probe = tmp_path / "hosts", tmp_path / "gloo_probe.py"
    hosts.write_text(f"{lan} {socket.gethostname()}\n127.0.0.1 localhost\n")
    probe.write_text(GLOO_PROBE)

    def listened(extra: dict[str, str]) -> set[str]:
        out = tmp_path / f"out-{len(extra)}"
        out.mkdir()
        command = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" /etc/hosts && exec "$2" "$3" "$4" "$5"', "sh",
                   str(hosts), sys.executable, str(probe), str(procs.free_port()), str(out)]
        env = procs.test_env()
        env.pop("GLOO_SOCKET_IFNAME", None)
        env.update(extra)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        ranks = [json.loads(path.read_text()) for path in sorted(out.glob("rank-*.json"))]
        assert len(ranks) == 2, result.stdout + result.stderr[-3000:]
        return {address for found in ranks for address, _ in found}

    assert lan in listened({})
    assert listened(LOOPBACK_ENV) == {"127.0.0.1"}
