"""The plain script's hang watch (`trainyard.plugins.launch.activity`): busy, printing and
still processes told apart from `/proc`, and the heartbeat it writes a valid `Heartbeat` that
steps aside for the rank's own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.plugins.launch import activity
from trainyard.plugins.run.heartbeat import (
    Heartbeat,
    heartbeat_path,
    read_heartbeats,
    write_heartbeat,
)


@pytest.fixture
def child() -> Iterator[callable]:
    started: list[subprocess.Popen[bytes]] = []

    def run(code: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, start_new_session=True)
        started.append(p)
        return p

    yield run
    for p in started:  # the whole group: a grandchild must not outlive the test, spinning
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def settled(pid: int) -> activity.Activity:
    """A watch past the child's own start-up (the interpreter's imports are activity)."""
    watch = activity.Activity(pid)
    time.sleep(1.0)
    watch.look()
    return watch


def test_a_sleeping_process_is_still_and_a_busy_or_printing_one_is_not(child) -> None:
    still = settled(child("import time; print('ready', flush=True); time.sleep(60)").pid)
    busy = settled(child("while True: pass").pid)
    printing = settled(child("import sys, time\nwhile True:\n    print('.', flush=True); time.sleep(0.05)").pid)
    time.sleep(1.0)
    assert not still.look()
    assert busy.look()
    assert printing.look()  # nearly no CPU, but output


def test_a_child_process_s_work_counts_for_the_rank(child) -> None:
    parent = child("import subprocess, sys, time\n"
                   "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\ntime.sleep(60)")
    watch = settled(parent.pid)
    time.sleep(1.0)
    assert watch.look()
    assert len(activity.tree(parent.pid)) == 2


def test_the_watch_writes_a_heartbeat_dated_by_the_last_activity(child, tmp_path: Path) -> None:
    sleeper = child("import time; time.sleep(60)")
    time.sleep(0.5)
    stop = threading.Event()
    identity = {"job": "plain", "run": "r1", "attempt": 0, "rank": 3, "local_rank": 1, "node": "n1", "restart": 0}
    thread = threading.Thread(target=activity.watch, args=(sleeper.pid, heartbeat_path(tmp_path, 3), identity, 1.0,
                                                             stop))
    thread.start()
    time.sleep(1.0)
    first = read_heartbeats(tmp_path, [3])[3]
    time.sleep(1.0)
    beat = read_heartbeats(tmp_path, [3])[3]
    stop.set()
    thread.join(5)
    assert (beat.job, beat.run, beat.rank, beat.node, beat.pid) == ("plain", "r1", 3, "n1", sleeper.pid)
    assert beat.signal == "activity" and beat.progress_step is None and beat.hang_timeout_s == 1.0
    assert beat.time == first.time, "a still process's beat keeps the time it was last active"
    assert beat.frozen(time.time() + 1.0)


def test_the_watch_steps_aside_once_the_rank_writes_its_own_beat(child, tmp_path: Path) -> None:
    busy = child("while True: pass")
    stop = threading.Event()
    identity = {"job": "managed", "run": "r1", "attempt": 0, "rank": 0, "local_rank": 0, "node": "", "restart": 0}
    thread = threading.Thread(target=activity.watch, args=(busy.pid, heartbeat_path(tmp_path, 0), identity, 2.0, stop))
    thread.start()
    time.sleep(0.3)
    write_heartbeat(tmp_path, Heartbeat(job="managed", rank=0, pid=busy.pid, step=7, time=time.time()))
    thread.join(5)
    assert not thread.is_alive()
    beat = read_heartbeats(tmp_path, [0])[0]
    assert (beat.signal, beat.progress_step) == ("steps", 7)


def test_no_watch_without_a_heartbeat_folder_or_a_job() -> None:
    assert activity.start(1, {}, 0, 0) is None
    assert activity.start(1, {"TRAINYARD_HEARTBEAT_DIR": "/tmp"}, 0, 0) is None


def test_the_stdlib_copies_stay_in_step_with_the_heartbeat_module() -> None:
    """The wrapper cannot import `plugins.run.heartbeat` (pydantic, in every rank's start): its
    pulse and file name are copies, held to the originals here."""
    from trainyard.plugins.run.heartbeat import pulse_interval_s

    for timeout in (1.0, 6.0, 600.0):
        assert activity.pulse_s(timeout) == pulse_interval_s(timeout)
    assert activity.beat_path("/d", 7) == heartbeat_path("/d", 7)
