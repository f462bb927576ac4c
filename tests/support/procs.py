"""Run real processes from tests: torchrun jobs, servers, CLIs — with timeouts and logs.

A failing multi-process test is useless without the ranks' output, so `run_torchrun` returns
it and `check` puts it into the assertion message.
"""

from __future__ import annotations

import os
import random
import signal
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


def ephemeral_ports_start() -> int:
    """The first port the kernel lends outgoing connections (Linux's default where unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports free on the loopback address now, for a server
    that listens on port + i (the stack's node agents). Chosen below the kernel's ephemeral
    range: `free_port()`'s port + 1 is an ephemeral port that an outgoing connection of a test
    running beside may hold by then (seen in CI: the demo's second node agent, "Address already
    in use"); below that range only another listener can, and this checks there is none."""
    low = ephemeral_ports_start()
    pick = random.Random()
    for _ in range(200):
        base = pick.randrange(10_000, low - count)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports between 10000 and {low}")


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

    `fork_ranks=RUN_DIR`: run the script as the local launcher runs an entrypoint — the
    attempt's warm rank starter (forked from the host's template, torch imported) forks torchrun
    itself, as the launcher has it fork each node's agent, and every rank, which torchrun starts
    through `rank_exec` (its records under RUN_DIR): no process of the launch imports torch
    again (a fresh torchrun did: 1.2 CPU-s, 25 of them a suite). The ranks' output is torchrun's
    (returned here), or with `rank_logs` in RUN_DIR's `ranks/rank-NNNNN.log`, as the launcher
    keeps it. `TRAINYARD_WARM_RANKS=0` in `env` turns the zygote off: plain processes."""
    from trainyard.plugins.launch import rank_exec, rank_zygote

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    if fork_ranks is not None:
        cmd += rank_exec.rank_exec_args(fork_ranks, str(script), args, stdout=not rank_logs)
    else:
        cmd += [str(script), *args]
    full_env = test_env(env)
    if fork_ranks is not None and full_env.get(rank_zygote.SWITCH_ENV, "1") != "0":
        full_env[rank_zygote.ADDRESS_ENV] = rank_zygote.new_address()
        if rank_zygote.start(sys.executable, full_env[rank_zygote.ADDRESS_ENV], [], str(script), env=full_env,
                             cwd=REPO_ROOT, log=fork_ranks / "zygote.log") is not None:
            forked = _run_forked(cmd, full_env, timeout)
            if forked is not None:
                return forked
    with subprocess.Popen(cmd, cwd=REPO_ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _run_forked(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """`cmd` (`python -m torch.distributed.run …`) forked by the zygote `env` names, its output
    read from pipes and its exit code as the zygote reports it (`rank_exec.ForkedChild`); None
    when the zygote does not answer."""
    import threading

    from trainyard.plugins.launch import rank_exec

    pipes = [os.pipe(), os.pipe()]
    with open(os.devnull, "rb") as devnull:
        child = rank_exec.start_forked("torch.distributed.run", True, cmd[3:],
                                       [devnull.fileno(), *(w for _, w in pipes)], env=env, cwd=str(REPO_ROOT))
    for _, w in pipes:
        os.close(w)
    if child is None:
        for r, _ in pipes:
            os.close(r)
        return None
    outputs = ["", ""]

    def read(i: int) -> None:
        with os.fdopen(pipes[i][0], encoding="utf-8", errors="replace") as stream:
            outputs[i] = stream.read()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(2)]
    for reader in readers:
        reader.start()
    code: list[int] = []
    waiter = threading.Thread(target=lambda: code.append(child.wait()), daemon=True)
    waiter.start()
    waiter.join(timeout)
    if not code:
        os.kill(child.pid, signal.SIGKILL)
        raise subprocess.TimeoutExpired(cmd, timeout)
    for reader in readers:
        reader.join(30)  # the ranks' wrappers may hold the pipes a moment longer
    child.conn.close()
    return subprocess.CompletedProcess(cmd, code[0], outputs[0], outputs[1])


def check(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """Assert a process succeeded, showing its output when it did not."""
    assert result.returncode == 0, (
        f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-8000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
    )
    return result
