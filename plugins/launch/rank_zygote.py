"""An attempt's warm rank starter: one process per attempt on this host that imports torch
and the entrypoint's libraries once, then forks a rank for each `rank_exec` wrapper that asks.

Why: a rank of `worker/train.py` spends ~8 s of CPU (quiet machine; 20 s and more on a loaded
one) importing torch, DTensor/FSDP and `torch._dynamo` (sympy underneath; DDP's constructor
imports dynamo) before its first step. Every rank of every incarnation paid it: the first
start, and again on each in-place restart, the fast path whose whole point is to be quick.
Forked from this process a rank starts with those imports done; the host pays them once per
attempt. What is imported: torch, DCP, and the `import`s at the top level of the entrypoint's
source (`entry_imports`), which every rank runs first thing anyway. The ranks wait for the
whole preload: it starts with the agents, while they import torch and rendezvous, so it is
mostly done when they ask; serving a rank half-way would have it import the rest itself, in
parallel with the zygote, and save nothing.

How a rank is started (`rank_exec` is the client):
- the wrapper connects to the abstract Unix socket named in `TRAINYARD_RANK_ZYGOTE` and sends
  one message: the entrypoint, its arguments, the wrapper's environment and working directory,
  with its stdin/stdout/stderr attached (SCM_RIGHTS);
- the zygote forks; the child becomes a session of its own, takes those descriptors, that
  environment and directory, and runs the entrypoint as `__main__` (`runpy`, as `python -u`
  would); the zygote answers `{"pid": …}`, then `{"exit": …}` when the child ends (negative:
  killed by that signal, as `Popen.returncode`).

Lifetimes, which replace what sharing the wrapper's process group gave for free:
- the wrapper forwards SIGTERM/SIGINT/SIGHUP to the child, once each (the child is not in the
  group torchrun signals);
- a wrapper that dies (torchrun's SIGKILL) closes its connection, and the zygote SIGKILLs the
  child at once: no rank outlives the process torchrun thinks is the rank;
- a child dies with the zygote (PR_SET_PDEATHSIG);
- the local launcher has the torchrun agents forked too (`detached`: they outlive the launcher's
  connection), so they skip their own import of torch; the zygote then exits once its last
  child has ended. Given agents to watch instead (a torchrun it did not start), it exits once
  they are gone and its last child has ended. It ignores SIGTERM, since it must outlive the
  ranks' emergency checkpoints to hand their exit codes back; it carries the run's
  `TRAINYARD_RUN_DIR`, so the launcher's `stop` sweeps it.

Only the owner's processes may ask: the peer's uid (SO_PEERCRED) must be this process's, since
an abstract socket has no file permissions. When no zygote answers, `rank_exec` starts the
entrypoint as a plain child, as before.

Forking after imports is safe here because nothing has run yet: no thread of ours, no OpenMP
pool (no parallel op ran), no CUDA context (importing torch does not initialise CUDA), no
process group, no logging handler. The child applies the per-rank settings that a fresh
interpreter would have read at start-up: `OMP_NUM_THREADS` (libgomp read the zygote's at
load time) and `sys.path[0]`. A module whose import reads per-rank state (`RANK`, the
device) would see the zygote's; `TRAINYARD_WARM_RANKS=0` is the way out for such a script.

Only the local launcher starts one. Kubernetes pods run torchrun directly, and their ranks
start as plain children.

The host's template: the starter itself is forked too. One long-lived process per user, Python,
source folder and start-up environment (`template_name`) has imported torch, DCP, torchrun,
torch's parallelism and MLflow (`TEMPLATE_MODULES`: third-party code only, so an edit to this
repository never reaches a rank through a template started before it) and forks each attempt's
starter, which then imports only the entrypoint's own modules: the host pays torch's import
(2–3 CPU-s) once, not once per attempt. A starter forked this way must still be found by the
sweeps that name a run's processes by their environment (`TRAINYARD_RUN_DIR`: the launcher's
stop, and `make down` for every run under the home), which read `/proc/PID/environ` — the block of memory the
kernel filled at `exec`, which a fork inherits unchanged. So the template is started with a block
of spare room (`ROOM_ENV`), and the forked starter writes its run's environment over it
(`show_environment`) before doing anything else; a run's environment that does not fit is
refused, and its attempt gets a starter of its own, as does any attempt when
`TEMPLATE_SWITCH_ENV` is `0`. The template carries no run's markers, so no sweep of a run stops
it; it exits after `TEMPLATE_IDLE_S` without a request, or when `make down` asks
(`stop_templates`). Only the environment is rewritten: `ps` shows a forked
starter and the ranks it forks with the template's command line (`… rank_zygote --template NAME`).
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import errno
import hashlib
import importlib
import importlib.util
import io
import json
import os
import secrets
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.plugins.launch import loopback
from trainyard.plugins.preload import preload
from trainyard.plugins.run.processes import (
    environ_entries,
    is_alive,
    signal_pids,
    started_as,
    stat_fields,
)

ADDRESS_ENV = "TRAINYARD_RANK_ZYGOTE"
"""The variable that names the zygote's socket to the ranks' wrappers: `@NAME`, for the abstract
name `\\0NAME` (an environment variable cannot hold a NUL)."""

SWITCH_ENV = "TRAINYARD_WARM_RANKS"
"""`0` turns the zygote off: every rank then imports its libraries itself."""

MAX_MESSAGE = 1 << 20
PR_SET_PDEATHSIG = 1

CONNECT_PATIENCE_S = 5.0
"""How long a zygote may take to bind its socket (it binds before importing anything heavy)."""

FORK_TIMEOUT_S = 300.0
"""How long to wait for the zygote's answer (its imports take 8–40 s) before starting the
process without it."""

FIRST_REQUEST_S = 60.0
"""A zygote that nobody asked within this long after start-up exits (its launcher failed)."""

ALWAYS = ("torch", "torch.distributed.checkpoint", "torch.distributed.run", "trainyard.plugins.run.records")
"""Imported whatever the entrypoint: torch itself; DCP, which the worker runtime imports when it
first saves or restores; and torchrun and what `trainyard.plugins.launch.agent` imports, for the agents
the local launcher has forked too (the agent module itself runs as `__main__`)."""


TEMPLATE_SWITCH_ENV = "TRAINYARD_RANK_TEMPLATE"
"""`0`: each attempt's starter imports torch itself instead of being forked from the host's
template."""

TEMPLATE_IDLE_ENV = "TRAINYARD_RANK_TEMPLATE_IDLE_S"
TEMPLATE_IDLE_S = 300.0
"""A template that nobody asked for this long exits; the next attempt starts another."""

TEMPLATE_MODULES = ("torch", "torch.distributed.checkpoint", "torch.distributed.run",
                    "torch.distributed.pipelining", "torch.distributed.fsdp", "torch.distributed.tensor.parallel",
                    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "torch.nn.parallel",
                    "mlflow", "mlflow.store.tracking.sqlalchemy_store")
"""torch itself and `ALWAYS`'s torch modules, and the parallelism `trainyard.worker.distributed` applies:
pipelining (which imports torch's compiler, dynamo), FSDP2, DTensor TP, the activation
checkpoint wrapper and DDP. Left to each attempt's starter they were 0.5 CPU-s of every one
(0.7–1.3 s of its start in CI, 76 starters a run); a template pays them once. And MLflow with
its database store, which rank 0 opens for the metrics streamer and the checkpoint records of
every tracked attempt: 1.5 CPU-s of each (`time.process_time()` around the imports, after
torch's); the import reads a few variables (`STARTUP_ENV` has them) and starts no thread."""

ROOM_ENV = "TRAINYARD_ENVIRON_ROOM"
ROOM_BYTES = 32768
"""The spare environment block a template starts with, which each starter it forks overwrites
with its run's environment (`show_environment`)."""

STARTUP_ENV = ("PYTHON", "LD_", "LC_", "LANG", "TZ", "TMPDIR", "OMP_", "MKL_", "KMP_", "TORCH", "PYTORCH",
               "CUDA", "NVIDIA", "NCCL", "GLOO", "MLFLOW_CONFIGURE_LOGGING", "MLFLOW_LOGGING_",
               "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PANDAS_", "PROTOCOL_BUFFERS_")
"""Prefixes of the variables an interpreter reads at start-up (its flags, `sys.path`, the locale,
the dynamic loader) or torch, MLflow and their libraries may read while being imported (MLflow
its logging and telemetry switches — not the run's `MLFLOW_RUN_ID`, read when used): a template
serves only starters whose environment has exactly its values of these (they are part of its
name)."""

STAT_ENV_START = 47
"""`/proc/PID/stat` field 50 (`env_start`; `env_end` follows) in `stat_fields`' numbering."""


def is_module(entry: str) -> bool:
    """An entrypoint run with `python -m` (`pkg.mod`) rather than as a script (`x.py`, `a/b`)."""
    return not (entry.endswith(".py") or os.sep in entry)


def entry_imports(entry: str, module: bool, cwd: Path) -> list[str]:
    """The absolute imports at the top level of the entrypoint's source: what it imports
    anyway, first thing, in every rank. Imports under `if`/`try` (TYPE_CHECKING, optional
    dependencies) and inside functions are left to the rank."""
    if module:
        try:
            spec = importlib.util.find_spec(entry)
        except (ImportError, ValueError):
            return []
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return []
        path = Path(spec.origin)
    else:
        path = cwd / entry
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
            names.append(node.module)
    return list(dict.fromkeys(names))


PLATFORM_WORKER = Path(__file__).resolve().parents[2] / "worker" / "train.py"
"""`config.settings.PACKAGE_ROOT`'s worker, found without importing pydantic into every rank's wrapper."""


def runs_platform_worker(entry: str) -> bool:
    """`entry` is Trainyard's own worker, the one script the host's template may start: the
    template preloads the worker's parallelism (`TEMPLATE_MODULES`: pipelining imports torch's
    compiler), which the worker imports anyway and any other script would run with unasked
    (see `warm_start_for`); a managed script's starter preloads only `ALWAYS` and its own imports."""
    return entry == "trainyard.worker.train" or (entry.endswith(".py") and Path(entry).resolve() == PLATFORM_WORKER)


def warm_start_for(entry: str, cwd: Path) -> bool:
    """Whether ranks of `entry` may be forked from a warm starter: only a script that imports
    Trainyard at its top level (a managed script, Trainyard's worker), whose imports the starter
    preloads anyway. A plain script runs as torchrun would run it, importing only what it imports:
    a preloaded module changes the program — with `torch.distributed.pipelining` (the template
    preloads it: it imports torch's compiler) imported first, pytorch/examples' DDP tutorial
    deadlocked at exit in 1 of 6 runs under plain torchrun (its Reducer's process group joining a
    gloo thread that waits for the GIL), and in none of 6 without."""
    names = entry_imports(entry, is_module(entry), cwd)
    return any(n == "trainyard" or n.startswith("trainyard.") for n in names)


@dataclass
class Request:
    """One rank to start: `python -u ENTRY ARGS…` (or `-m ENTRY`) as the wrapper would have."""

    entry: str
    module: bool
    args: list[str]
    env: dict[str, str]
    cwd: str
    detached: bool = False
    """The child outlives the asker's connection (an agent, whose launcher returns at once);
    otherwise the connection going away kills it (a rank whose wrapper died)."""
    stdio: list[int] = field(default_factory=list)
    shown: int | None = None
    """In a starter forked from a template: the pipe it writes to once it shows its run's
    environment. The template answers with its pid only then, so no sweep can miss it; a
    starter that could not show it exits, and the asker starts a fresh one."""

    def message(self) -> bytes:
        return json.dumps({"entry": self.entry, "module": self.module, "args": self.args,
                           "env": self.env, "cwd": self.cwd, "detached": self.detached}).encode()

    @classmethod
    def parse(cls, data: bytes, fds: list[int]) -> Request:
        d = json.loads(data)
        return cls(entry=str(d["entry"]), module=bool(d["module"]), args=[str(a) for a in d["args"]],
                   env={str(k): str(v) for k, v in d["env"].items()}, cwd=str(d["cwd"]),
                   detached=bool(d.get("detached", False)), stdio=fds)


def ask(name: str, request: Request, stdio: list[int], *,
        patience_s: float = CONNECT_PATIENCE_S) -> tuple[socket.socket, int] | None:
    """Have the zygote `name` fork `request` with `stdio` as its stdin/stdout/stderr; returns
    the open connection (which then reports the exit) and the child's pid, or None when no
    zygote answers — the caller then starts the process itself. What listens must be this
    user's: a template's name can be worked out, and another user who took it first would
    otherwise be handed the run's environment and log."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        _connect(conn, socket_address(name), patience_s)
        if _peer(conn)[1] != os.getuid():
            raise PermissionError(f"{name} is served by another user")
        socket.send_fds(conn, [request.message()], stdio)
        conn.settimeout(FORK_TIMEOUT_S)  # the zygote answers once its imports are done
        reply = json.loads(conn.recv(4096))
        conn.settimeout(None)
        return conn, int(reply["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        conn.close()
        return None


def _peer(conn: socket.socket) -> tuple[int, int]:
    """The other end's pid and uid (SO_PEERCRED: the kernel's, not what the peer says)."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _connect(conn: socket.socket, address: str, patience_s: float) -> None:
    """Connect, giving a zygote started a moment ago (it is a fresh interpreter too) the time to
    bind its socket; a zygote that is not there at all costs this much once per asker."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            conn.connect(address)
            return
        except (ConnectionRefusedError, FileNotFoundError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def new_address() -> str:
    """An abstract socket name (`@…`) nobody else can guess; the uid check is what guards it."""
    return f"@trainyard-rank-zygote-{os.getpid()}-{secrets.token_hex(8)}"


def socket_address(name: str) -> str:
    """`@NAME` → the abstract `\\0NAME`; anything else is a path."""
    return "\0" + name[1:] if name.startswith("@") else name


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: it outlives a killed parent
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Child:
    pid: int
    conn: socket.socket | None
    """Where its exit is reported; None once a detached child's asker has gone."""
    detached: bool


class Zygote:
    """The serving loop: accept, fork, reap, report; kill a rank whose wrapper is gone."""

    def __init__(self, listener: socket.socket, agents: list[tuple[int, int | None]], *,
                 template_room: int | None = None, idle_s: float = TEMPLATE_IDLE_S) -> None:
        self.listener, self.agents = listener, agents
        self.children: dict[int, Child] = {}  # by pidfd
        self.uid = os.getuid()
        self.started, self.served = time.monotonic(), False
        self.asked = self.started
        self.template_room, self.idle_s = template_room, idle_s
        """A template (`template_room` set: the bytes its environment block holds) forks starters
        that must fit their run's environment into that block, and lives until idle."""
        self.stopping = False
        """A template asked to stop (SIGTERM: `make down`) exits between requests, never in the
        middle of forking a starter."""

    def serve(self) -> Request:
        """Serve until there is nothing left to serve (`_done`); returns only in a forked child."""
        while True:
            request = self.step(1.0)
            if request is not None:
                return request

    def step(self, timeout_s: float) -> Request | None:
        """Handle what is ready within `timeout_s`: new requests, ended children, gone askers."""
        conns = [c.conn for c in self.children.values() if c.conn is not None]
        ready, _, _ = select.select([self.listener, *self.children, *conns], [], [], timeout_s)
        if (not ready or self.stopping) and self._done():
            sys.exit(0)
        for item in ready:
            if item is self.listener:
                request = self._accept()
                if request is not None:
                    return request
            elif isinstance(item, int):
                self._reap(item)
            else:
                self._asker_gone(item)
        return None

    def _done(self) -> bool:
        """No child left, and nobody left to ask: the watched agents are gone — or, when it
        forks the agents itself, it served them (or nobody came within `FIRST_REQUEST_S`)."""
        if self.template_room is not None:  # its children are starters with lives of their own
            return self.stopping or time.monotonic() - self.asked > self.idle_s
        if self.children:
            return False
        if self.agents:
            return not any(is_alive(pid, ticks) for pid, ticks in self.agents)
        return self.served or time.monotonic() - self.started > FIRST_REQUEST_S

    def _accept(self) -> Request | None:
        conn, _ = self.listener.accept()
        try:
            pid, uid = _peer(conn)
            if uid != self.uid:
                print(f"rank zygote: refused pid {pid} of uid {uid}", file=sys.stderr, flush=True)
                conn.close()
                return None
            conn.settimeout(10.0)
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
        except OSError as e:
            print(f"rank zygote: no request: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            conn.close()
            return None
        try:
            request = Request.parse(data, fds)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"rank zygote: bad request: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        unfit = self.template_room is not None and len(environ_block(request.env)) > self.template_room
        if unfit or _peer_closed(conn):  # the asker starts it itself: it gave up waiting, or it is told to
            for fd in request.stdio:
                os.close(fd)
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        shown, request.shown = os.pipe() if self.template_room is not None else (None, None)
        child = os.fork()
        if child == 0:
            self._close_all(conn)
            if shown is not None:
                os.close(shown)
            return request
        for fd in request.stdio:
            os.close(fd)
        ok = True
        if shown is not None and request.shown is not None:
            os.close(request.shown)
            ok = bool(select.select([shown], [], [], FORK_TIMEOUT_S)[0]) and os.read(shown, 1) == b"1"
            os.close(shown)
        if not ok:  # the starter could not show its run's environment: the asker starts its own
            _kill(child)
            conn.close()
        self.children[os.pidfd_open(child)] = Child(child, conn if ok else None, request.detached)
        self.served, self.asked = True, time.monotonic()
        if ok:
            _send(conn, {"pid": child})
        return None

    def _close_all(self, conn: socket.socket) -> None:
        self.listener.close()
        conn.close()
        for pidfd, child in self.children.items():
            os.close(pidfd)
            if child.conn is not None:
                child.conn.close()
        self.children.clear()

    def _reap(self, pidfd: int) -> None:
        child = self.children.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(child.pid, 0)
        if child.conn is not None:
            _send(child.conn, {"exit": os.waitstatus_to_exitcode(status)})
            child.conn.close()

    def _asker_gone(self, conn: socket.socket) -> None:
        try:
            if conn.recv(MAX_MESSAGE):
                return  # the protocol has no more client messages: dropped, so select does not spin
        except OSError:
            pass
        for child in self.children.values():
            if child.conn is conn:
                conn.close()
                child.conn = None
                if not child.detached:
                    _kill(child.pid)  # a rank whose wrapper died; the pidfd then reports it


def _peer_closed(conn: socket.socket) -> bool:
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return not conn.recv(1, socket.MSG_PEEK)
    except OSError:
        return True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _send(conn: socket.socket, message: dict[str, int]) -> None:
    with contextlib.suppress(OSError):  # the wrapper is gone
        conn.send(json.dumps(message).encode())


def environ_block(env: Mapping[str, str]) -> bytes:
    """The environment as `exec` lays it out in memory (and `/proc/PID/environ` shows it)."""
    return b"".join(f"{k}={v}".encode(errors="surrogateescape") + b"\0" for k, v in env.items())


def _environ_span() -> tuple[int, int]:
    """Where this process's environment block lies (`/proc/self/stat`'s env_start, env_end)."""
    fields = stat_fields(os.getpid()) or []
    return int(fields[STAT_ENV_START]), int(fields[STAT_ENV_START + 1])


def environ_room() -> int:
    """The size of this process's environment block."""
    start, end = _environ_span()
    return end - start


def show_environment(env: Mapping[str, str]) -> None:
    """Write `env` over this process's environment block, so that `/proc/self/environ` — what
    `ps e` and the sweeps of a run's processes read — shows it instead of the environment this
    process's ancestor was started with. Only after `os.environ` was replaced: the C library's
    `environ` then points at copies, and nothing reads the old block again (what `setproctitle`
    relies on for the argument block). The caller made sure it fits."""
    start, end = _environ_span()
    block = environ_block(env)
    if len(block) > end - start:
        raise ValueError(f"the environment ({len(block)} bytes) does not fit the block ({end - start})")
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        mem.write(block.ljust(end - start, b"\0"))


def become(request: Request, zygote_pid: int, *, from_template: bool = False) -> list[str]:
    """Turn a freshly forked child into the rank a fresh `python -u` would have been; returns
    `sys.argv`. Forked `from_template`, it is an attempt's starter: it does not die with the
    template (which idles out while attempts run), and it shows its run's environment."""
    os.setsid()
    if not from_template:
        _die_with_parent()
        if os.getppid() != zygote_pid:  # the zygote died between the fork and the prctl
            os._exit(128 + signal.SIGKILL)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(request.stdio):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115 - the process's stdin
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                                   errors="backslashreplace")
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    if from_template:
        try:
            show_environment(request.env)
        except (OSError, ValueError) as e:
            print(f"rank zygote: cannot show the run's environment ({e}); a fresh starter takes over",
                  file=sys.stderr, flush=True)
            os._exit(1)
        if request.shown is not None:
            os.write(request.shown, b"1")
            os.close(request.shown)
    torch = sys.modules.get("torch")
    threads = request.env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    if request.module:
        sys.path[0] = request.cwd
        return [request.entry, *request.args]
    script = str(Path(request.cwd, request.entry))
    sys.path[0] = str(Path(script).parent)
    return [script, *request.args]


def start(python: str, address: str, agents: list[tuple[int, int | None]], entry: str, *,
          env: dict[str, str], cwd: Path, log: Path) -> int | None:
    """Start an attempt's zygote on this host, in a session of its own, serving `address` for
    ranks of `entry` until nothing is left to serve (`Zygote._done`: its last child ended, and
    the watched `agents` (pid, start ticks) are gone, or it forked the agents itself). Returns
    its pid; None when it could not start (everything then starts as plain processes). It is
    forked from the host's template where one serves this environment (started here when none
    does), else started as a fresh interpreter."""
    watched = ",".join(f"{pid}:{ticks or 0}" for pid, ticks in agents)
    module = is_module(entry)
    args = ["--address", address, "--agents", watched, *(["-m"] if module else []), entry]
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"rank zygote: not started: {e}", file=sys.stderr, flush=True)
        return None
    if env.get(TEMPLATE_SWITCH_ENV, "1") != "0" and python == sys.executable and runs_platform_worker(entry):
        pid = _fork_from_template(args, env=env, cwd=cwd, log=log)
        if pid is not None:
            return pid
    command = [python, "-m", "trainyard.plugins.launch.rank_zygote", *args]
    try:
        with log.open("ab") as out:
            proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        print(f"rank zygote: not started: {e}", file=sys.stderr, flush=True)
        return None
    return proc.pid


def template_name(env: Mapping[str, str], cwd: Path, idle_s: float) -> str:
    """The abstract socket of the template that may fork a starter for `env` in `cwd`: one per
    user, interpreter, source folder, start-up environment (`STARTUP_ENV`) and version of the
    code a template runs (this module and what it imports, the installations of the packages it
    preloads), so a changed venv or an edited starter gets a template of its own and the old one
    idles out."""
    packages = [importlib.util.find_spec(name) for name in dict.fromkeys(m.split(".")[0] for m in TEMPLATE_MODULES)]
    files = [Path(__file__), Path(sys.modules["trainyard.plugins.preload"].__file__ or ""),
             Path(sys.modules["trainyard.plugins.run.processes"].__file__ or ""), Path(sys.executable),
             *(Path(spec.origin) if spec and spec.origin else Path(sys.executable) for spec in packages)]
    stats = [(str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files]
    startup = sorted((k, v) for k, v in env.items() if k.startswith(STARTUP_ENV))
    key = json.dumps([os.getuid(), str(cwd.resolve()), idle_s, stats, startup])
    return f"@trainyard-rank-template-{os.getuid()}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _fork_from_template(args: list[str], *, env: dict[str, str], cwd: Path, log: Path) -> int | None:
    """The starter's pid, forked by the template that serves this environment (started now when
    none does); None when none could (the caller starts a fresh one)."""
    if len(environ_block(env)) > ROOM_BYTES:
        return None
    try:
        idle_s = float(env.get(TEMPLATE_IDLE_ENV, TEMPLATE_IDLE_S))
        name = template_name(env, cwd, idle_s)
    except (OSError, ValueError):
        return None
    request = Request(entry="trainyard.plugins.launch.rank_zygote", module=True, args=args, env=env, cwd=str(cwd),
                      detached=True)
    try:
        with log.open("ab") as out, open(os.devnull, "rb") as devnull:
            stdio = [devnull.fileno(), out.fileno(), out.fileno()]
            answer = ask(name, request, stdio, patience_s=0.0)
            if answer is None and _start_template(name, env=env, cwd=cwd, idle_s=idle_s):
                answer = ask(name, request, stdio)
    except OSError as e:
        print(f"rank zygote: no template: {e}", file=sys.stderr, flush=True)
        return None
    if answer is None:
        return None
    conn, pid = answer
    conn.close()  # detached: the starter outlives this connection
    return pid


def _start_template(name: str, *, env: Mapping[str, str], cwd: Path, idle_s: float) -> bool:
    """Start the template `name`: the start-up environment it serves, `PATH` and `HOME`, and the
    spare room its starters' environments are written into; no run's markers. Its output goes
    to a log of its own in the temporary folder (never the caller's pipes, which it outlives)."""
    keep = {k: v for k, v in env.items() if k.startswith(STARTUP_ENV) or k in ("PATH", "HOME")}
    keep[ROOM_ENV] = "." * (ROOM_BYTES - len(environ_block(keep)) - len(ROOM_ENV) - 2)
    try:
        folder = _private_folder()
        with open(os.open(folder / "rank-template.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                          0o600), "ab") as out:
            subprocess.Popen([sys.executable, "-m", "trainyard.plugins.launch.rank_zygote", "--template", name,
                              "--idle-s", str(idle_s)], cwd=cwd, env=keep, stdin=subprocess.DEVNULL,
                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        print(f"rank zygote: no template started: {e}", file=sys.stderr, flush=True)
        return False
    return True


def _private_folder() -> Path:
    """`$TMPDIR/trainyard-<uid>`, this user's only (mode 0700, owned, not a link): where a
    template keeps its log, beside other users' in a shared temporary folder."""
    folder = Path(tempfile.gettempdir()) / f"trainyard-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{folder} is not this user's private folder")
    return folder


def serve_template(name: str, idle_s: float) -> None:
    """The host's template: import `TEMPLATE_MODULES`, then fork attempts' starters until idle.
    Another template already serving `name` (two attempts started one at once) wins: this one
    exits."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(socket_address(name))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            sys.exit(0)
        raise
    listener.listen(64)
    os.chdir("/")  # hold no folder of a home or a checkout; `sys.path` is absolute
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # as in `main`: no import may init CUDA
    took = preload(TEMPLATE_MODULES, who="rank template")
    print(f"rank template {name}: pid {os.getpid()}, preloaded {took}", file=sys.stderr, flush=True)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        print("rank template: an import initialised CUDA; no starter is forked from here", file=sys.stderr,
              flush=True)
        sys.exit(0)  # the askers read the closed socket as "no template" and start their own
    template_pid = os.getpid()
    zygote = Zygote(listener, [], template_room=environ_room(), idle_s=idle_s)
    signal.signal(signal.SIGTERM, lambda *_: setattr(zygote, "stopping", True))
    request = zygote.serve()
    sys.argv = become(request, template_pid, from_template=True)
    import runpy

    runpy.run_module(request.entry, run_name="__main__", alter_sys=True)


def stop_templates(python: str = sys.executable) -> int:
    """Ask this user's templates started with `python` (this checkout's venv) to exit; returns
    how many. For `make down`: a template holds no home, but nothing of the stack should stay
    behind it. Attempts it started run on; the next attempt starts another template."""
    room = ROOM_ENV.encode() + b"="
    # the starters and ranks it forked carry its command line too, but their run's environment
    found = [pid for pid in started_as([python, "-m", "trainyard.plugins.launch.rank_zygote", "--template"])
             if any(entry.startswith(room) for entry in environ_entries(pid) or [])]
    signal_pids(found, signal.SIGTERM)
    return len(found)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 4 and argv[0] == "--template" and argv[2] == "--idle-s":
        serve_template(argv[1], float(argv[3]))
        return
    if len(argv) not in (5, 6) or argv[0] != "--address" or argv[2] != "--agents" or (len(argv) == 6 and argv[4] != "-m"):
        raise SystemExit("usage: rank_zygote --address NAME --agents PID:TICKS,… [-m] ENTRYPOINT   "
                         "(NAME: '@…' for the abstract namespace)")
    address = socket_address(argv[1])
    agents = [(int(pid), int(ticks) or None) for pid, ticks in (a.split(":") for a in argv[3].split(",") if a)]
    entry, module = argv[-1], len(argv) == 6
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen(64)  # the wrappers wait in the backlog until the imports are done
    modules = list(dict.fromkeys([*ALWAYS, *entry_imports(entry, module, Path.cwd())]))
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # an import-time is_available() must not init CUDA
    took = preload(modules, who="rank zygote")
    print(f"rank zygote: preloaded {len(took)}/{len(modules)} modules in {sum(took.values()):.1f} s: {took}",
          file=sys.stderr, flush=True)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        print("rank zygote: an import initialised CUDA, which a forked process cannot use; the ranks start "
              "as plain children", file=sys.stderr, flush=True)
        sys.exit(0)  # the waiting wrappers read the closed socket as "no zygote"
    loopback.apply()  # what it forks (agents, ranks) hosts stores on loopback only
    zygote_pid = os.getpid()
    request = Zygote(listener, agents).serve()
    sys.argv = become(request, zygote_pid)
    import runpy

    if request.module:
        runpy.run_module(request.entry, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
