"""The plain script's hang signal: false alarms and detection time, against the process group's
own timeout set to the same value.

    .venv/bin/python benchmarks/hang_signal.py [--hang-timeout-s 15] [--eval-s 90]

A plain torchrun script writes no heartbeat, so Trainyard watches its ranks' activity — CPU time
and I/O of each rank's process tree (`trainyard.plugins.launch.activity`) — and calls the gang
hung when every rank has been still for `hangTimeout` (`hang_culprits`' rule for activity).
Three plain scripts, each under `torchrun --nproc-per-node 2` with gloo, sampled from outside
every pulse exactly as the rank wrapper samples them:

- `tutorial`: pytorch/examples' DDP tutorial (`tests/fixtures/ddp_tutorial`, CPU port), the
  plain-mode demo: must raise no alarm;
- `eval`: trains a few steps, then rank 0 evaluates for `--eval-s` seconds without printing while
  rank 1 waits in a barrier: must raise no alarm (the case a per-rank rule gets wrong);
- `stuck`: rank 1 sleeps after 5 steps while rank 0 waits in its next all_reduce: must be
  flagged, and how long after it went still is `detect_s` (the wrapper's pulse is in it).

The competitor: the process group's own timeout (`init_process_group(timeout=…)`, what a user
without Trainyard would set) at the same value, on `eval` and `stuck`: it detects the stuck
gang, and kills the evaluating one (a false alarm) — both measured in the same run.

Prints one JSON line: per script the alarms, `max_gang_still_s` (the longest time every rank
was still at once: the margin below the timeout), `detect_s` for `stuck`, the competitor's
outcomes, `cpu_count` and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.ddp_tutorial import adapt  # noqa: E402
from trainyard.plugins.launch.activity import Activity, pulse_s  # noqa: E402
from trainyard.plugins.run.rules import Stalled, hang_culprits  # noqa: E402

COMMON = """\
import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
timeout = float(os.environ.get("PG_TIMEOUT_S", "1800"))
dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
rank = dist.get_rank()
model = torch.nn.Linear(256, 256)
t = torch.ones(1024)
for _ in range(5):
    dist.all_reduce(t)
print(f"rank {rank}: 5 steps", flush=True)
"""

EVAL = COMMON + """\
if rank == 0:
    end = time.monotonic() + float(sys.argv[1])
    with torch.no_grad():
        while time.monotonic() < end:
            model(torch.randn(512, 256)).sum().item()
dist.barrier()
print(f"rank {rank}: evaluated", flush=True)
dist.destroy_process_group()
"""

STUCK = COMMON + """\
if rank == 1:
    open(sys.argv[1], "w").write(repr(time.time()))
    time.sleep(float(sys.argv[2]))
dist.all_reduce(t)
"""


def torchrun(script: Path, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(script), *args], cwd=script.parent,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def ranks_of(agent: int, count: int, deadline_s: float = 60) -> list[int]:
    """The rank processes torchrun started (its direct children)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        children: list[int] = []
        try:
            for task in Path(f"/proc/{agent}/task").iterdir():
                children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            return []
        if len(children) >= count:
            return sorted(children)
        time.sleep(0.05)
    return []


def watch(proc: subprocess.Popen[bytes], hang_timeout_s: float, limit_s: float) -> dict[str, object]:
    """Sample the gang every pulse as the rank wrappers do; the first alarm ends the watch."""
    pulse = pulse_s(hang_timeout_s)
    pids = ranks_of(proc.pid, 2)
    looks = {pid: Activity(pid) for pid in pids}
    busy = {pid: time.time() for pid in pids}
    for a in looks.values():
        a.look()
    started, alarm, longest = time.time(), None, 0.0
    while proc.poll() is None and time.time() - started < limit_s:
        time.sleep(pulse)
        now = time.time()
        for pid, a in looks.items():
            if a.look():
                busy[pid] = now
        longest = max(longest, now - max(busy.values()))
        if hang_culprits(Stalled(i, None, now - busy[p] > hang_timeout_s / 2, now - busy[p] > hang_timeout_s, True)
                         for i, p in enumerate(pids)):
            alarm = now
            break
    return {"alarm_at": alarm, "max_gang_still_s": round(longest, 1), "ran_s": round(time.time() - started, 1)}


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    proc.wait()


def run(script: Path, args: list[str], hang_timeout_s: float, limit_s: float,
        env: dict[str, str] | None = None) -> tuple[dict[str, object], int | None]:
    proc = torchrun(script, args, env or {})
    try:
        seen = watch(proc, hang_timeout_s, limit_s)
        if seen["alarm_at"] is None and proc.poll() is None:
            proc.wait(timeout=max(limit_s - float(seen["ran_s"]), 1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        code = proc.poll()
        stop(proc)
    return seen, code


def unwatched(script: Path, args: list[str], limit_s: float, env: dict[str, str]) -> int | None:
    """The script's exit code under torchrun alone (None: still running at `limit_s`)."""
    proc = torchrun(script, args, env)
    try:
        return proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        stop(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hang-timeout-s", type=float, default=15.0)
    p.add_argument("--eval-s", type=float, default=90.0)
    args = p.parse_args()
    h = args.hang_timeout_s
    out: dict[str, object] = {"benchmark": "hang_signal", "hang_timeout_s": h, "pulse_s": pulse_s(h),
                              "eval_s": args.eval_s}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tutorial = adapt.write(folder / "tutorial", adapt.cpu_port())
        (folder / "eval.py").write_text(EVAL)
        (folder / "stuck.py").write_text(STUCK)
        seen, code = run(tutorial, ["20", "5", "--batch_size", "32"], h, 300)
        out["tutorial"] = {"alarms": int(seen["alarm_at"] is not None), "exit_code": code,
                           "max_gang_still_s": seen["max_gang_still_s"], "ran_s": seen["ran_s"]}
        seen, code = run(folder / "eval.py", [str(args.eval_s)], h, args.eval_s + 60)
        out["eval"] = {"alarms": int(seen["alarm_at"] is not None), "exit_code": code,
                       "max_gang_still_s": seen["max_gang_still_s"], "ran_s": seen["ran_s"]}
        marker = folder / "still-at"
        seen, code = run(folder / "stuck.py", [str(marker), "600"], h, 3 * h + 30)
        still = float(marker.read_text()) if marker.exists() else None
        out["stuck"] = {"alarms": int(seen["alarm_at"] is not None),
                        "detect_s": round(seen["alarm_at"] - still, 1) if seen["alarm_at"] and still else None}
        # the competitor: the process group's own timeout at the same value
        began = time.time()
        code = unwatched(folder / "eval.py", [str(args.eval_s)], args.eval_s + 60, {"PG_TIMEOUT_S": str(h)})
        out["pg_timeout_eval"] = {"false_alarm": code not in (0, None), "exit_code": code,
                                  "ran_s": round(time.time() - began, 1)}
        marker.unlink(missing_ok=True)
        code = unwatched(folder / "stuck.py", [str(marker), "600"], 3 * h + 60, {"PG_TIMEOUT_S": str(h)})
        ended = time.time()
        still = float(marker.read_text()) if marker.exists() else None
        out["pg_timeout_stuck"] = {"detected": code not in (0, None), "exit_code": code,
                                   "detect_s": round(ended - still, 1) if still and code not in (0, None) else None}
    out["false_alarms"] = out["tutorial"]["alarms"] + out["eval"]["alarms"]  # type: ignore[index]
    out["pg_timeout_false_alarms"] = int(out["pg_timeout_eval"]["false_alarm"])  # type: ignore[index]
    out["cpu_count"], out["load_1m"] = os.cpu_count(), round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
