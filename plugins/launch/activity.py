"""The hang watch for a plain script: its ranks' activity stands in for the heartbeats it never writes.

A managed script (`trainyard.init()`) writes a heartbeat every step, and a rank without step
progress for `hangTimeout` is hung. A plain torchrun script writes none, and nothing was ever
judged hung. So the rank wrapper (`rank_exec`) watches its rank from outside, with no change to
the script: every pulse it reads the rank's process tree's CPU time (the script and its
children, DataLoader workers included) and bytes read and written (`/proc/<pid>/io`: files,
sockets and its own output), and writes the rank's heartbeat file with `signal: "activity"`,
dated by the last pulse at which either moved. The hang rule is then the usual one, unchanged:
a rank whose CPU time and I/O both stand still for `hangTimeout` is hung, and the launcher,
the node agent and `classify` treat it as any hang.

The threshold: a rank blocked in a gloo collective (a peer gone or asleep) used 2–3 clock ticks
of CPU in 8 s on this machine (0.3 % of a core) and no I/O at all; a training or evaluating
rank uses most of a core. `MIN_BUSY` (2 % of a core, and at least `MIN_TICKS` clock ticks, over
at least a second) sits between.

The wrapper steps aside for good once the rank writes a heartbeat of its own (a managed script,
or Trainyard's worker): the steps are the better signal. It cannot see: a rank spinning while
stuck (CUDA's default synchronisation spins a core inside a stuck NCCL collective — NCCL's own
timeout ends those), or a script that keeps printing while making no progress.

Stdlib only: it runs in every rank's wrapper, which must start fast. Its JSON is a
`trainyard.plugins.run.heartbeat.Heartbeat` (a unit test holds the fields in step).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.plugins.files import write_atomic
from trainyard.plugins.run.processes import PROC, stat_fields

SIGNAL = "activity"
"""The heartbeat's `signal` when the wrapper wrote it; `steps` (the default) when the rank did."""
MIN_BUSY = 0.02
"""Share of one core, over a look's window, above which the rank counts as busy."""
MIN_TICKS = 3
"""And never fewer clock ticks (10 ms each): the kernel counts CPU time in ticks, and one tick
of a waiting rank's poll thread landing in a short window would read as several percent."""
MIN_WINDOW_S = 1.0
"""CPU time is compared over at least this long (a short pulse looks at I/O only in between)."""
PULSE_EVERY_S = 5.0
"""As the worker's writer thread (`trainyard.plugins.run.heartbeat.PULSE_EVERY_S`)."""


def tree(pid: int) -> list[int]:
    """`pid` and its descendants, from each thread's `children` list (Linux ≥ 3.5)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in (PROC / str(p) / "task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def cpu_and_io(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system, reaped children's included) and bytes read plus written
    (`rchar` + `wchar`) of `pid`'s process tree so far; (0, 0) once it is gone."""
    ticks, io = 0, 0
    for p in tree(pid):
        fields = stat_fields(p)
        if fields and len(fields) > 14:
            ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        try:
            for line in (PROC / str(p) / "io").read_text().splitlines():
                name, _, value = line.partition(":")
                if name in ("rchar", "wchar"):
                    io += int(value)
        except (OSError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK"), io


@dataclass
class Activity:
    """What one rank did since the last look: `look` says whether it moved."""

    pid: int
    last: tuple[float, int] = (0.0, 0)
    looked_at: float = field(default_factory=time.monotonic)

    def look(self) -> bool:
        now, seen = time.monotonic(), cpu_and_io(self.pid)
        cpu, io, window = seen[0] - self.last[0], seen[1] - self.last[1], now - self.looked_at
        if io > 0:
            busy = True
        elif window < MIN_WINDOW_S:
            return False  # too short to judge the CPU time: the next look compares from the same start
        else:
            busy = cpu > max(MIN_BUSY * window, MIN_TICKS / os.sysconf("SC_CLK_TCK"))
        self.last, self.looked_at = seen, now
        return busy


def beat_path(directory: str | Path, rank: int) -> Path:
    """`trainyard.plugins.run.heartbeat.heartbeat_path`, without its pydantic import."""
    return Path(directory) / f"rank-{rank:05d}.json"


def pulse_s(hang_timeout_s: float) -> float:
    return min(PULSE_EVERY_S, hang_timeout_s / 10)


def _own_beat(path: Path) -> bool:
    """The rank wrote its heartbeat itself (any file at `path` not written by this watch)."""
    try:
        return json.loads(path.read_bytes()).get("signal", "steps") != SIGNAL
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError):
        return True  # not ours to overwrite


def watch(pid: int, path: Path, beat: dict[str, object], hang_timeout_s: float,
          stop: threading.Event) -> None:
    """Rewrite the heartbeat at `path` every pulse until `stop` is set or the rank writes its
    own (`beat`: the identity fields of `Heartbeat`)."""
    activity = Activity(pid)
    activity.look()
    last_busy = time.time()
    pid_ns = ""
    with contextlib.suppress(OSError):
        pid_ns = os.readlink("/proc/self/ns/pid")
    while True:
        if _own_beat(path):
            return
        write_atomic(path, json.dumps({**beat, "pid": pid, "step": 0, "time": last_busy, "alive_at": last_busy,
                                       "hang_timeout_s": hang_timeout_s, "phase": "train", "signal": SIGNAL,
                                       "pid_ns": pid_ns}))
        if stop.wait(pulse_s(hang_timeout_s)):
            return
        if activity.look():
            last_busy = time.time()


def start(pid: int, environ: dict[str, str] | os._Environ[str], rank: int, restart: int) -> threading.Event | None:
    """Watch rank `rank`'s process `pid` in a daemon thread when the launcher gave it a heartbeat
    folder; set the returned event to end the watch."""
    directory = environ.get("TRAINYARD_HEARTBEAT_DIR")
    if not directory or not environ.get("TRAINYARD_JOB"):
        return None
    try:
        timeout = float(environ.get("TRAINYARD_HANG_TIMEOUT_S", "600"))
    except ValueError:
        return None
    if not timeout > 0:
        return None
    beat = {"job": environ["TRAINYARD_JOB"], "run": environ.get("TRAINYARD_RUN", ""),
            "attempt": int(environ.get("TRAINYARD_ATTEMPT", "0") or 0), "rank": rank,
            "local_rank": int(environ.get("LOCAL_RANK", "0") or 0), "node": environ.get("TRAINYARD_NODE", ""),
            "restart": restart}
    path = beat_path(directory, rank)
    stop = threading.Event()
    threading.Thread(target=watch, args=(pid, path, beat, timeout, stop), name="activity-watch", daemon=True).start()
    return stop
