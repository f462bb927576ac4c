"""`make down` after a crash leaves no process of the home (issue 56): a run trains, the process
that launched it dies by SIGKILL (as a scheduler does), and the stop `make down` calls ends the
run's torchrun agents, rank starter, wrappers and ranks — ranks by SIGTERM first, so they take
their emergency checkpoint — and a starter forked from the host's rank template, which ignores
SIGTERM and carries the run's environment only in the block it wrote over the template's.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import procs
from trainyard.cli.stack import EXPLICIT_DATABASE_URLS, Stack
from trainyard.plugins.run import processes
from trainyard.plugins.run.records import read_rank_records

pytestmark = [pytest.mark.slow, pytest.mark.waits]

LAUNCHER = """
import json, sys, time
from pathlib import Path
from tests.integration.launch.test_local_launcher import start, wait_for
from tests.support import procs
from trainyard.plugins.launch import rank_zygote

tmp = Path(sys.argv[1])
launcher, handle = start(tmp, "tiny-crash", ["--steps", "100000", "--sleep", "0.2"])
# a starter from the host's template, as a run of the platform's worker gets one (it waits for ranks)
env = procs.test_env({"TRAINYARD_HOME": str(tmp / "home"), "TRAINYARD_RUN_DIR": str(tmp / "home/runs/w/r/0")})
starter = rank_zygote.start(sys.executable, rank_zygote.new_address(), [], str(rank_zygote.PLATFORM_WORKER),
                            env=env, cwd=Path.cwd(), log=tmp / "home/runs/w/r/0/zygote.log")
wait_for(launcher, handle, lambda s: s.step is not None and s.step >= 2)
print(json.dumps({"run_dir": handle.run_dir, "starter": starter}), flush=True)
time.sleep(3600)
"""


def test_make_downs_stop_after_a_crash_leaves_no_process_of_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    parent = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=procs.REPO_ROOT,
                              env=procs.test_env({"TRAINYARD_HOME": str(home)}), stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(parent.stdout.readline() or "{}")  # type: ignore[union-attr]
        assert started, "the launching process ended before the run trained"
        running = processes.of_home(home)
        assert started["starter"] in running  # the template's starter is of the home by its environment
        records = read_rank_records(Path(started["run_dir"]))
        assert {r.child_pid for r in records.values()} <= set(running)  # and so are the ranks
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert set(processes.of_home(home)) >= set(running) - {parent.pid}  # the crash left the run training

    stack = Stack(home, overrides={name: f"sqlite:///{tmp_path}/{i}.db" for i, name in enumerate(EXPLICIT_DATABASE_URLS)})
    begun = time.monotonic()
    ended = stack.down(templates=False)  # `make down` also asks this user's rank templates to exit
    assert processes.of_home(home) == [], {
        pid: (processes.PROC / str(pid) / "cmdline").read_bytes()[:120] for pid in processes.of_home(home)}
    assert ended["runs"] >= len(running) - 1, ended
    codes = [r.exit_code for r in read_rank_records(Path(started["run_dir"])).values()]
    # SIGTERM came first: a rank took its "emergency checkpoint" (43); one caught in an all-reduce
    # whose peer had left may end with 1
    assert 43 in codes and set(codes) <= {43, 1}, codes
    print(f"down took {time.monotonic() - begun:.1f} s, ended {ended}")


def test_make_downs_stop_lets_a_detached_launchs_follower_conclude_and_leaves_nothing(tmp_path: Path) -> None:
    """`trainyard launch --detach` leaves a follower that concludes the attempt; `make down` ends
    the run's processes and gives the follower its grace to record the verdict, instead of
    ending it before it has."""
    from tests.integration.launch.test_local_launcher import cli, write_spec
    from trainyard.config.settings import Settings
    from trainyard.plugins.launch.local import LocalLauncher
    from trainyard.plugins.run.model import RunHandle

    home = tmp_path / "home"
    spec = write_spec(tmp_path / "long.yaml", "tiny-follow", ["--steps", "100000", "--sleep", "0.2"])
    handle = RunHandle.model_validate_json(procs.check(cli(home, "launch", "--local", "--offline", "--detach",
                                                            str(spec))).stdout)
    stack = Stack(home, overrides={name: f"sqlite:///{tmp_path}/{i}.db" for i, name in enumerate(EXPLICIT_DATABASE_URLS)})
    deadline = time.monotonic() + 120
    launcher = LocalLauncher(Settings(home=home).runs_dir)
    while not (stack.followers() and (launcher.poll(handle).step or 0) >= 2):
        assert time.monotonic() < deadline, "the run did not start training"
        time.sleep(0.2)
    ended = stack.down(templates=False)
    assert ended["followers"] == 1 and ended["runs"] >= 4, ended
    assert processes.of_home(home) == [], {
        pid: processes.command_line(pid) for pid in processes.of_home(home)}
    assert "verdict: " in (Path(handle.run_dir) / "follower.log").read_text()  # it concluded the attempt


def test_a_sweep_spares_its_callers_and_a_shell_that_names_the_home(tmp_path: Path) -> None:
    """`TRAINYARD_HOME` alone marks nothing for `make down`: a user's shell that exported it
    (here a `sleep` standing in for it) runs on, and so does whatever called the stop."""
    home = tmp_path / "home"
    shell = subprocess.Popen(["sleep", "60"], env=procs.test_env({"TRAINYARD_HOME": str(home)}))
    try:
        assert processes.of_home(home) == [shell.pid]  # what the tests count as the home's
        assert Stack(home, overrides=dict.fromkeys(EXPLICIT_DATABASE_URLS, "sqlite://")).leftovers() == []
        assert processes.ancestors() and all(processes.is_alive(pid) for pid in processes.ancestors())
    finally:
        shell.kill()
        shell.wait()
