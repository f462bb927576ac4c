"""The two kinds of engine error: retrying helps, or it does not.

Every error an engine raises on purpose derives from one of these, so a caller decides what to
do from the class alone — the way Airflow's providers split `AirflowFailException` from a
retryable `AirflowException`. An operator fails its task at once on a `FatalError` (a bad spec,
a plan the runtime cannot run, a checkpoint of another job) and lets Airflow retry a
`TransientError` (a lost reservation race, an unreachable node agent, an object store that
timed out). The CLI maps them to exit codes the same way.

No Airflow import here: engines use this module, operators translate it.
"""

from __future__ import annotations


class TrainyardError(Exception):
    """Base of every error an engine raises on purpose."""

    retryable: bool = False


class FatalError(TrainyardError):
    """Retrying the same call with the same input cannot succeed: fix the input first."""

    retryable = False


class TransientError(TrainyardError):
    """The world was not ready (a race lost, a service down, a timeout): retrying may succeed."""

    retryable = True


class DatabaseDown(TransientError):
    """A database's server is not running (the home's embedded PostgreSQL after `make down`):
    its message names the socket and the fix (`trainyard.config.databases.down_message`)."""


def is_retryable(error: BaseException) -> bool:
    """True for a `TransientError` (or anything that says it is retryable), False otherwise.

    Errors from outside the engines (a `KeyError` from a bug) are not retryable: a retry would
    only hide the bug behind a delay."""
    return bool(getattr(error, "retryable", False))
