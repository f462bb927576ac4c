"""A DAG run a person marks failed stops its gang even when no triggerer is up to do it.

The watcher's trigger stops the gang when a person marks the DAG run (or the watcher) failed
(`TrainingTrigger.on_kill`, `sensors/triggers.py`), but only a running triggerer calls
`on_kill`: with the triggerer down at that moment, the trigger is simply gone when it comes
back, and the gang trained on with nothing watching it. Airflow's API server, though, tells its
listeners of every DAG run a person marks failed (`on_dag_run_failed`, with the message "Dag
Run's state was manually set to `failed`."), wherever the triggerer is.

So this listener (`MarkedFailedPlugin`, an Airflow plugin of its own through the package's
`airflow.plugins` entry point: every Airflow part loads it, only the API server hears a person's
mark) gives the triggerer `TAKE_OVER_AFTER_S` to begin its stop, which writes
the attempt's stop reason first, and then stops the attempt's gang itself when nobody has —
in a thread of its own, so the "Mark as failed" request answers at once. A DAG run the
scheduler fails (an attempt that failed as it should) is not a person's mark and is left alone.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

log = logging.getLogger(__name__)

MARKED_BY_A_PERSON = "manually set to `failed`"
"""What Airflow's API server says of a DAG run a person marked failed (`patch_dag_run_state`)."""

TAKE_OVER_AFTER_S = 20.0
"""How long the triggerer has to begin its own stop: it reacts within a loop (a second or two),
and two stops at once would send the ranks two SIGTERMs."""


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    if MARKED_BY_A_PERSON not in (msg or ""):
        return
    threading.Thread(target=take_over, args=(dag_run.dag_id, dag_run.run_id), daemon=True,
                     name=f"trainyard-marked-failed-{dag_run.run_id}").start()


def take_over(dag_id: str, dag_run_id: str, *, after_s: float = TAKE_OVER_AFTER_S, poll_s: float = 1.0) -> str:
    """Stop the gang of the attempt that DAG run `dag_run_id` of `dag_id` is, unless it ends or
    someone begins to stop it within `after_s`; returns what it did, in words (also logged)."""
    try:
        done = _take_over(dag_id, dag_run_id, after_s=after_s, poll_s=poll_s)
    except Exception:  # a listener's thread must never take the API server down
        log.exception("DAG run %s of %s was marked failed; its gang could not be stopped: `trainyard stop %s` "
                      "stops it", dag_run_id, dag_id, dag_id)
        return "failed"
    log.info("DAG run %s of %s was marked failed: %s", dag_run_id, dag_id, done)
    return done


def _take_over(dag_id: str, dag_run_id: str, *, after_s: float, poll_s: float) -> str:
    from trainyard.operators.common import runtime as engine_runtime
    from trainyard.plugins.control_room.locate import run_of_dag_run
    from trainyard.plugins.run.records import STOP_REASON_FILE
    from trainyard.plugins.state.jobs import RunNotFound, open_job_state
    from trainyard.sensors.triggers import keep_marked_failed, stop_marked_failed

    runtime = engine_runtime()
    store = open_job_state(runtime.settings.state_db)
    try:
        info = run_of_dag_run(store, dag_id, dag_run_id)
    except RunNotFound:
        return "not a training run's DAG run"
    recorded = f"{dag_id}/{dag_run_id}"
    mine = [a for a in store.attempts(dag_id, info.run) if a.dag_run_id == recorded]
    if not mine or mine[-1].state != "running" or mine[-1].run_handle is None:
        return "its attempt was not live"
    attempt, handle = mine[-1].attempt, mine[-1].run_handle
    reason_file = Path(handle.run_dir) / STOP_REASON_FILE if handle.run_dir else None
    deadline = time.monotonic() + after_s
    while time.monotonic() < deadline:
        live = store.live_attempt(dag_id, info.run)
        if live is None or live.attempt != attempt:
            return "its attempt had already ended"
        if reason_file is not None and reason_file.exists():
            return "the triggerer is stopping its gang"
        time.sleep(poll_s)
    why = f"its DAG run {dag_run_id} was marked failed in Airflow (no triggerer was up to stop it)"
    note = stop_marked_failed(handle, why, runtime)
    if not note:
        return "its attempt had already ended"
    from trainyard.operators.common import write_note

    write_note(dag_id, dag_run_id, note)
    keep_marked_failed(dag_id, dag_run_id)
    return note


class MarkedFailedPlugin(AirflowPlugin):
    """This module's listener, as Airflow loads listeners: from a plugin."""

    name = "trainyard-marked-failed"
    listeners = [sys.modules[__name__]]  # noqa: RUF012 - AirflowPlugin's own class attribute
