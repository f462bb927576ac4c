"""One torchrun agent, run in-process, with its outcome written to a file.

The launcher starts `python -m trainyard.plugins.launch.agent --exit-file F -- <torchrun args>` in a new
session. Running torchrun in this very process (not as a child) keeps one process per agent and
makes the agent's pid the one the launcher recorded; the `finally` writes an `AgentExit`
(`plugins/run/records.py`) to F whatever happens short of SIGKILL — including the
per-rank exit codes torchrun collected (`ChildFailedError.failures`). A process that is gone
without that file was killed hard.

One correction to torchrun, applied here before it runs (`name_rendezvous_events_cheaply`): its
c10d rendezvous names every event it records with `inspect.stack()`, called twice per event, and
a restart records a few dozen. `inspect.stack()` reads the source of every frame and walks
`sys.modules` for each (`inspect.getmodule`, slower the more modules are loaded: CPython issue
92041), and an agent forked from the rank starter has torch, DCP and MLflow loaded: its in-place
restart spent 5-9 s (loaded machine) in those lookups, for event names that torchrun then drops
(no handler is configured by default). A frame walk gives the same name.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from trainyard.plugins.launch import loopback
from trainyard.plugins.run.records import AgentExit


def _method_name(depth: int = 2) -> str:
    """`dynamic_rendezvous.get_method_name` without `inspect.stack()`: the name of the function
    `depth` frames above this one (0 is this one), as `inspect.stack()[depth].function` was."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return "no_method_name"


def name_rendezvous_events_cheaply() -> None:
    """Make torchrun's c10d rendezvous name its events by walking frames (see the module docstring)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.get_method_name = _method_name


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--exit-file" or argv[2] != "--":
        raise SystemExit("usage: agent --exit-file FILE -- TORCHRUN_ARGS…")
    exit_file, torchrun_args = Path(argv[1]), argv[3:]
    code, failures, error = 1, {}, ""
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun

        name_rendezvous_events_cheaply()
        loopback.apply()  # the c10d rendezvous store on 127.0.0.1 only, not on every interface
        try:
            torchrun(torchrun_args)
            code = 0
        except ChildFailedError as e:
            failures = {str(rank): f.exitcode for rank, f in e.failures.items()}
            error = f"ChildFailedError: {e.name}"
        except SignalException as e:
            code, error = 128 + int(e.sigval), f"agent received {e.sigval.name}"
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        error = f"SystemExit({e.code!r})"
    except BaseException as e:  # noqa: BLE001 - whatever it was, it is recorded below
        traceback.print_exc()
        error = f"{type(e).__name__}: {e}"
    finally:
        AgentExit(exit_code=code, failures=failures, error=error, ended_at=time.time(),
                  pid=os.getpid()).write(exit_file)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)  # torchrun may leave non-daemon threads (store clients) behind


if __name__ == "__main__":
    main()
