"""The warm rank starter (`plugins/launch/rank_zygote.py`) with the real wrapper
(`rank_exec`): a forked rank behaves like a fresh `python -u` child — environment, directory,
exit codes, signals — and never outlives its wrapper."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT
from tests.support.waiting import wait_for
from trainyard.plugins.launch import rank_zygote
from trainyard.plugins.run import processes
from trainyard.plugins.run.records import read_rank_records

pytestmark = pytest.mark.waits

PROBE = Path(__file__).with_name("zygote_probe.py")


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """One zygote for the module, bound to this test process as if it were the agent."""
    address = rank_zygote.new_address()
    log = tmp_path_factory.mktemp("zygote") / "zygote.log"
    me = os.getpid()
    pid = rank_zygote.start(sys.executable, address, [(me, processes.start_ticks(me))], str(PROBE),
                            env=dict(os.environ), cwd=REPO_ROOT, log=log)
    assert pid is not None
    yield address, pid
    os.kill(pid, signal.SIGKILL)
    processes.reap(pid)


def wrapper(run_dir: Path, mode: str, address: str | None, *, rank: int = 3) -> subprocess.Popen[bytes]:
    env = dict(os.environ, RANK=str(rank), OMP_NUM_THREADS="1")
    env.pop(rank_zygote.ADDRESS_ENV, None)
    if address:
        env[rank_zygote.ADDRESS_ENV] = address
    return subprocess.Popen([sys.executable, "-m", "trainyard.plugins.launch.rank_exec", "--run-dir", str(run_dir), "--",
                             str(PROBE), mode, str(run_dir / "facts.json")],
                            cwd=REPO_ROOT, env=env, start_new_session=True)


def facts(run_dir: Path) -> dict:
    path = run_dir / "facts.json"
    wait_for(lambda: path.exists() and path.stat().st_size > 0, "the probe to start")
    return json.loads(path.read_text())


def test_a_forked_rank_sees_what_a_fresh_interpreter_would(zygote: tuple[str, int], tmp_path: Path) -> None:
    address, zygote_pid = zygote
    proc = wrapper(tmp_path, "7", address)
    assert proc.wait(timeout=180) == 7
    seen = facts(tmp_path)
    record = read_rank_records(tmp_path)[3]
    assert record.forked and record.exit_code == 7 and record.child_pid == seen["pid"] != record.pid
    assert seen["preloaded"]  # torch was imported in the zygote, before the script ran
    assert seen["name"] == "__main__" and seen["argv"] == [str(PROBE), "7", str(tmp_path / "facts.json")]
    assert (seen["cwd"], seen["path0"], seen["rank"]) == (str(REPO_ROOT), str(PROBE.parent), "3")
    assert seen["threads"] == 1  # OMP_NUM_THREADS of the rank, not of the zygote
    assert seen["pid"] == seen["pgid"] == seen["sid"] and seen["ppid"] == zygote_pid
    log = (tmp_path / "ranks" / "rank-00003.log").read_text()
    assert log.startswith("=== rank 3 restart 0 ") and "probe started" in log


def test_an_exception_exits_1_with_its_traceback_in_the_rank_log(zygote: tuple[str, int], tmp_path: Path) -> None:
    assert wrapper(tmp_path, "raise", zygote[0]).wait(timeout=180) == 1
    log = (tmp_path / "ranks" / "rank-00003.log").read_text()
    assert "RuntimeError: probe failed on purpose" in log and read_rank_records(tmp_path)[3].exit_code == 1


def test_sigterm_to_the_wrappers_group_reaches_the_rank_once(zygote: tuple[str, int], tmp_path: Path) -> None:
    proc = wrapper(tmp_path, "term", zygote[0])
    facts(tmp_path)
    os.killpg(proc.pid, signal.SIGTERM)  # what torchrun does to a worker
    assert proc.wait(timeout=60) == 43
    assert (tmp_path / "facts.json.terms").read_text() == "1"
    assert read_rank_records(tmp_path)[3].exit_code == 43


def test_a_killed_rank_is_reported_killed_by_its_wrapper(zygote: tuple[str, int], tmp_path: Path) -> None:
    proc = wrapper(tmp_path, "sleep", zygote[0])
    child = facts(tmp_path)["pid"]
    os.kill(child, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    record = read_rank_records(tmp_path)[3]
    assert record.exit_code == -signal.SIGKILL and record.ended_at is not None


def test_a_killed_wrapper_takes_its_rank_with_it(zygote: tuple[str, int], tmp_path: Path) -> None:
    proc = wrapper(tmp_path, "sleep", zygote[0])
    child = facts(tmp_path)["pid"]
    ticks = processes.start_ticks(child)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun's last resort; the rank is in another session
    proc.wait(timeout=60)
    wait_for(lambda: not processes.is_alive(child, ticks), "the zygote to kill the orphaned rank", 60)


def test_without_a_zygote_the_rank_is_a_plain_child_in_the_wrappers_group(tmp_path: Path) -> None:
    proc = wrapper(tmp_path, "5", "@trainyard-rank-zygote-nobody-listens")
    assert proc.wait(timeout=180) == 5
    seen, record = facts(tmp_path), read_rank_records(tmp_path)[3]
    assert not record.forked and not seen["preloaded"]
    assert seen["pgid"] == record.pgid == record.pid and seen["ppid"] == record.pid


def test_another_user_cannot_have_a_rank_started(zygote: tuple[str, int], tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("switching to another uid needs root")
    client = (
        "import json, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "s.connect('\\0' + sys.argv[1][1:])\n"
        "msg = {'entry': 'x.py', 'module': False, 'args': [], 'env': {}, 'cwd': '/'}\n"
        "try:\n"
        "    socket.send_fds(s, [json.dumps(msg).encode()], [0, 1, 2])\n"
        "    s.settimeout(60)\n"
        "    print(repr(s.recv(4096)))\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    print(repr(b''))\n"
    )
    python = shutil.which("python3", path="/usr/bin:/bin")  # the venv may not be readable to nobody
    assert python, "a system python3 (Debian's) is needed to act as another user"
    out = subprocess.run([python, "-c", client, zygote[0]], capture_output=True, text=True, timeout=120,
                         user=65534, cwd="/", check=True)
    assert out.stdout.strip() == "b''", out  # closed without an answer: nothing was forked


def test_a_detached_process_outlives_the_connection_of_whoever_asked(zygote: tuple[str, int], tmp_path: Path) -> None:
    """What the local launcher does for each torchrun agent: it asks, takes the pid and returns."""
    request = rank_zygote.Request(entry=str(PROBE), module=False, args=["sleep", str(tmp_path / "facts.json")],
                                  env=dict(os.environ), cwd=str(REPO_ROOT), detached=True)
    with open(os.devnull, "rb") as devnull, (tmp_path / "out.log").open("ab") as out:
        answer = rank_zygote.ask(zygote[0], request, [devnull.fileno(), out.fileno(), out.fileno()])
    assert answer is not None
    conn, pid = answer
    ticks = processes.start_ticks(pid)
    conn.close()
    assert facts(tmp_path)["pid"] == pid
    time.sleep(2.0)  # a rank (not detached) is killed within milliseconds of its asker going away
    assert processes.is_alive(pid, ticks)
    assert processes.stat_fields(pid)[1] == str(zygote[1])  # the zygote's child: it reaps it
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not processes.is_alive(pid, ticks), "the killed process to be reaped", 30)


def parent(pid: int) -> int:
    return int(processes.stat_fields(pid)[1])


def environ(pid: int) -> dict[str, str]:
    return dict(e.decode().split("=", 1) for e in processes.environ_entries(pid) or [] if b"=" in e)


@pytest.fixture
def probe_as_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's template starts Trainyard's worker only (`runs_platform_worker`): the probe
    stands in for it."""
    monkeypatch.setattr(rank_zygote, "PLATFORM_WORKER", PROBE.resolve())


def starter(run_dir: Path, **extra: str) -> tuple[str, int]:
    """An attempt's starter for `run_dir`, as the local launcher starts one (no agents to watch)."""
    address = rank_zygote.new_address()
    env = dict(os.environ, TRAINYARD_RUN_DIR=str(run_dir), **{rank_zygote.TEMPLATE_SWITCH_ENV: "1", **extra})
    pid = rank_zygote.start(sys.executable, address, [], str(PROBE), env=env, cwd=REPO_ROOT,
                            log=run_dir / "zygote.log")
    assert pid is not None
    return address, pid


@pytest.mark.usefixtures("probe_as_worker")
def test_attempts_starters_forked_from_the_host_template_carry_their_runs_environment(tmp_path: Path) -> None:
    """The sweeps that stop a run (`TRAINYARD_RUN_DIR`) or a home (`TRAINYARD_HOME`) find a run's
    processes by their environment in /proc: a starter forked from the shared template, and the
    ranks it forks, must show their run's, not the template's."""
    (a, pid_a), (b, pid_b) = starter(tmp_path / "a"), starter(tmp_path / "b")
    try:
        template = parent(pid_a)
        assert template == parent(pid_b) != os.getpid()  # one template, two attempts
        assert "--template" in Path(f"/proc/{template}/cmdline").read_bytes().decode()
        assert "TRAINYARD_RUN_DIR" not in environ(template)  # no sweep of a run stops it
        assert environ(pid_a) == dict(os.environ, TRAINYARD_RUN_DIR=str(tmp_path / "a"),
                                      **{rank_zygote.TEMPLATE_SWITCH_ENV: "1"})
        assert processes.marked_processes("TRAINYARD_RUN_DIR", str(tmp_path / "a")) == [pid_a], (
            processes.stat_fields(pid_a), (tmp_path / "a" / "zygote.log").read_text())
        proc = wrapper(tmp_path / "a", "sleep", a)
        rank = facts(tmp_path / "a")["pid"]
        assert parent(rank) == pid_a
        assert sorted(processes.marked_processes("TRAINYARD_RUN_DIR", str(tmp_path / "a"))) == sorted([pid_a, rank])
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert wrapper(tmp_path / "b", "6", b).wait(timeout=180) == 6
        assert facts(tmp_path / "b")["preloaded"]
    finally:
        processes.signal_pids([pid_a, pid_b], signal.SIGKILL)


def test_without_the_template_for_another_script_or_with_an_environment_too_large_the_starter_is_our_child(
    tmp_path: Path,
) -> None:
    (_, off), (_, large) = (starter(tmp_path / "off", TRAINYARD_RANK_TEMPLATE="0"),
                            starter(tmp_path / "large", BIG="x" * rank_zygote.ROOM_BYTES))
    (_, other) = starter(tmp_path / "other")  # not Trainyard's worker: never what the template preloads
    try:
        assert parent(off) == os.getpid() == parent(large) == parent(other)
        # Popen returns once the child's exec has begun (vfork), before the kernel has laid out
        # its new environment: /proc/PID/environ reads empty for a moment (~5 % of tries here)
        wait_for(lambda: processes.marked_processes("TRAINYARD_RUN_DIR", str(tmp_path / "large")) == [large],
                 f"the fresh starter to be found by its run's marker: {processes.stat_fields(large)}", 30)
    finally:
        processes.signal_pids([off, large, other], signal.SIGKILL)
        for pid in (off, large, other):
            processes.reap(pid)


@pytest.mark.usefixtures("probe_as_worker")
def test_an_idle_template_exits_and_the_attempts_it_started_run_on(tmp_path: Path) -> None:
    _, pid = starter(tmp_path, TRAINYARD_RANK_TEMPLATE_IDLE_S="1")
    try:
        template, ticks = parent(pid), processes.start_ticks(parent(pid))
        assert template != os.getpid()
        wait_for(lambda: not processes.is_alive(template, ticks), "the idle template to exit", 60)
        assert processes.is_alive(pid)
    finally:
        processes.signal_pids([pid], signal.SIGKILL)


def test_a_name_another_user_serves_is_never_handed_a_request(tmp_path: Path) -> None:
    """A template's name can be worked out; another user who binds it first must get nothing
    of ours — not the run's environment, not its log — and we start our own starter instead."""
    if os.geteuid() != 0:
        pytest.skip("switching to another uid needs root")
    name = f"@trainyard-rank-template-squatted-{os.getpid()}"
    squatter = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "s.bind('\\0' + sys.argv[1][1:])\n"
        "s.listen(1)\n"
        "print('listening', flush=True)\n"
        "c, _ = s.accept()\n"
        "c.settimeout(30)\n"
        "print(repr(c.recv(1 << 20)), flush=True)\n"
    )
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python, "a system python3 (Debian's) is needed to act as another user"
    with subprocess.Popen([python, "-c", squatter, name], stdout=subprocess.PIPE, text=True, user=65534,
                          cwd="/") as other:
        assert other.stdout is not None and other.stdout.readline().strip() == "listening"
        request = rank_zygote.Request(entry=str(PROBE), module=False, args=["0", str(tmp_path / "facts.json")],
                                      env={"SECRET": "not for them"}, cwd=str(REPO_ROOT))
        with open(os.devnull, "rb") as devnull:
            assert rank_zygote.ask(name, request, [devnull.fileno()] * 3) is None
        assert other.stdout.read().strip() == "b''"  # closed without a byte sent


@pytest.mark.usefixtures("probe_as_worker")
def test_make_down_stops_the_templates_and_the_attempts_they_started_run_on(tmp_path: Path) -> None:
    _, pid = starter(tmp_path, TRAINYARD_RANK_TEMPLATE_IDLE_S="120")  # a template of its own
    try:
        template = parent(pid)
        ticks = processes.start_ticks(template)
        assert template != os.getpid()
        assert rank_zygote.stop_templates() >= 1  # what `make down` (trainyard.cli.stack's down) calls
        wait_for(lambda: not processes.is_alive(template, ticks), "the template to stop", 30)
        assert processes.is_alive(pid)
    finally:
        processes.signal_pids([pid], signal.SIGKILL)
