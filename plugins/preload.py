"""Import a list of modules ahead of the forks that will need them, timing each: the Airflow
scheduler before it forks task processes (`cli/airflow_preloaded.py`) and an attempt's warm
rank starter before it forks ranks and agents (`plugins/launch/rank_zygote.py`). Stdlib only:
it runs first in those processes."""

from __future__ import annotations

import gc
import importlib
import sys
import time
from collections.abc import Iterable


def preload(modules: Iterable[str], *, who: str) -> dict[str, float]:
    """Import `modules`, returning module → seconds. A module that fails is reported on stderr
    (as `who`) and skipped: the process that needs it imports it again and fails in its own log.

    Then everything imported so far is frozen out of the garbage collector (`gc.freeze()`, as
    its documentation advises before forking): a forked child's collections would otherwise walk
    the half million objects it shares with this process (a rank template's, after torch and
    MLflow), writing to each one's header and so copying every page the imports filled. Measured
    on one 60-step attempt of the e2e tests' model (`trainyard launch --offline`, a warm template,
    the CPU of its starter and ranks from `/proc`): 7.1–7.4 CPU-s without the freeze, 5.7–5.8
    with it."""
    took: dict[str, float] = {}
    for name in modules:
        started = time.perf_counter()
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - reported; the user of the module fails on it
            print(f"{who}: {name} failed to import ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
            continue
        took[name] = round(time.perf_counter() - started, 2)
    gc.freeze()
    return took
