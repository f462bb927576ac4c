"""Import a list of modules ahead of the forks that will need them, timing each: the Airflow
scheduler before it forks task processes (`cli/airflow_preloaded.py`) and an attempt's warm
rank starter before it forks ranks and agents (`plugins/launch/rank_zygote.py`). Stdlib only:
it runs first in those processes."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterable


def preload(modules: Iterable[str], *, who: str) -> dict[str, float]:
    """Import `modules`, returning module → seconds. A module that fails is reported on stderr
    (as `who`) and skipped: the process that needs it imports it again and fails in its own log."""
    took: dict[str, float] = {}
    for name in modules:
        started = time.perf_counter()
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - reported; the user of the module fails on it
            print(f"{who}: {name} failed to import ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
            continue
        took[name] = round(time.perf_counter() - started, 2)
    return took
