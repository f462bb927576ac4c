"""A training run's id: one trigger of a job (the UI, `trainyard submit`, a schedule, an Asset).

All attempts of a run share its id, and so do its reservation, its checkpoints
(`jobs/<job>/runs/<run>/checkpoints`), its run folders and its MLflow run. It is a path segment
and a Kubernetes label value, so its form is strict. Lives in `config/` because every layer
(engines, worker, operators, CLI) names runs and none of them may own the others.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime

_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")


def new_run_id(now: datetime | None = None) -> str:
    """`20261130t235959-3fa2c1`: sortable by start time, unique, and a safe path segment and
    Kubernetes label value (lower case, digits, `-`)."""
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dt%H%M%S}-{secrets.token_hex(3)}"


def check_run_id(run: str) -> str:
    """A run id is a path segment of the job's area; refuse anything that could escape it."""
    if not _RUN_ID.match(run):
        shown = run if len(run) <= 80 else run[:77] + "..."
        raise ValueError(f"run id {shown!r} must be 3-63 lower-case letters, digits or '-', "
                         "starting with a letter or digit (e.g. 20261130t235959-3fa2c1)")
    return run
