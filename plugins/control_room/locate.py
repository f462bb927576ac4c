"""Which training run an Airflow DAG run belongs to (DESIGN §4).

The DAG of a job is named after the job (`dags/factory.py`: `dag_id=job.name`). The first
attempt of a training run is the DAG run a person (or a schedule) triggered: the run's
`trigger_key` is `<dag_id>/<dag_run_id>`. Every later attempt is a DAG run the recovery
triggered, named `<run>__attempt-<n>` (`operators/outcome.py`), and records its DAG run as
`<dag_id>/<dag_run_id>` in the attempt's row. So a DAG run id names its training run either
by its shape or by one lookup of the trigger key.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.plugins.state.jobs import JobStateStore, RunInfo

LATER_ATTEMPT = re.compile(r"^(?P<run>[A-Za-z0-9][A-Za-z0-9._-]*)__attempt-(?P<attempt>\d+)$")


def run_of_dag_run(store: JobStateStore, dag_id: str, dag_run_id: str) -> RunInfo:
    """The training run (all attempts) that the DAG run `dag_run_id` of `dag_id` is an attempt
    of. Raises `RunNotFound` when the platform state has none (a DAG run that failed before
    `validate_spec` opened its run, or a DAG of another kind)."""
    from trainyard.plugins.state.jobs import RunNotFound

    later = LATER_ATTEMPT.match(dag_run_id)
    if later:
        return store.get_run(dag_id, later.group("run"))
    run = _run_by_trigger_key(store, dag_id, f"{dag_id}/{dag_run_id}")
    if run is None:
        raise RunNotFound(f"no training run of {dag_id!r} was opened by DAG run {dag_run_id!r} (its "
                          "validate_spec task opens the run; a DAG run that stopped before it has none)")
    return store.get_run(dag_id, run)


def _run_by_trigger_key(store: JobStateStore, job: str, key: str) -> str | None:
    """The run id opened by `key` (UNIQUE per job in `trainyard_runs`). A read of the store's
    own table: `JobStateStore` has no lookup by trigger key (its `open_run` creates one)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from trainyard.plugins.state.jobs import RunRow

    with Session(store.engine) as s:
        return s.scalars(select(RunRow.run).where(RunRow.job == job, RunRow.trigger_key == key)).first()
