"""Run real processes from tests: torchrun jobs, servers, CLIs — with timeouts and logs.

A failing multi-process test is useless without the ranks' output, so `run_torchrun` returns
it and `check` puts it into the assertion message.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for child processes: the repo on the path, one thread per process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def run_torchrun(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    nproc: int = 2,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    fork_ranks: Path | None = None,
    rank_logs: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `torchrun --standalone --nproc-per-node N script args…` and return its output.

    `fork_ranks=RUN_DIR`: run the script as the local launcher runs an entrypoint — torchrun
    starts `rank_exec` (its records under RUN_DIR) and the attempt's warm rank starter, which
    imported the script's imports once, forks every rank: one import of torch and DCP (~5 CPU-s
    on the 2-core machine) per launch instead of one per rank. The ranks' output is torchrun's
    (returned here), or with `rank_logs` in RUN_DIR's `ranks/rank-NNNNN.log`, as the launcher
    keeps it. `TRAINYARD_WARM_RANKS=0` in `env` turns the zygote off."""
    from plugins.launch import processes, rank_exec, rank_zygote

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    if fork_ranks is not None:
        cmd += rank_exec.rank_exec_args(fork_ranks, str(script), args, stdout=not rank_logs)
    else:
        cmd += [str(script), *args]
    full_env = test_env(env)
    zygote_log = fork_ranks / "zygote.log" \
        if fork_ranks is not None and full_env.get(rank_zygote.SWITCH_ENV, "1") != "0" else None
    if zygote_log is not None:
        full_env[rank_zygote.ADDRESS_ENV] = rank_zygote.new_address()
    with subprocess.Popen(cmd, cwd=REPO_ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        if zygote_log is not None:
            rank_zygote.start(sys.executable, full_env[rank_zygote.ADDRESS_ENV],
                              [(proc.pid, processes.start_ticks(proc.pid))], str(script), env=full_env,
                              cwd=REPO_ROOT, log=zygote_log)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def check(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """Assert a process succeeded, showing its output when it did not."""
    assert result.returncode == 0, (
        f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-8000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
    )
    return result
