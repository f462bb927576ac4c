"""The one retry policy (tenacity): what every client of a service — the state database, S3,
MLflow, the Kubernetes API, Airflow's REST API, the embedded PostgreSQL — retries, and how.

A caller says which errors are worth another try (default: `trainyard.plugins.errors.is_retryable`, a
`TransientError`; a client adds its service's own transient answers: a database deadlock, an
HTTP 503, S3's SlowDown), and how long it may keep trying: a number of attempts, a deadline, or
both. The wait is exponential with jitter, capped, and honours what the server asked
(`Retry-After`) when the caller can read it from the error. Whatever is not retryable fails at
once, and the last error is raised as itself (never tenacity's `RetryError`).

Standard library and tenacity only: the state database, the workers and the stack import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from trainyard.plugins.errors import is_retryable

Predicate = Callable[[BaseException], bool]


class _wait_asked(wait_base):
    """The server's own wait (a `Retry-After`) when it gave one, capped; else `fallback`."""

    def __init__(self, fallback: wait_base, asked: Callable[[BaseException | None], float | None],
                 max_s: float) -> None:
        self.fallback, self.asked, self.max_s = fallback, asked, max_s

    def __call__(self, retry_state: RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        seconds = self.asked(error)
        return min(seconds, self.max_s) if seconds is not None else self.fallback(retry_state)


def policy(retryable: Predicate = is_retryable, *, attempts: int | None = None, deadline_s: float | None = None,
           first_wait_s: float = 0.5, max_wait_s: float = 8.0, jitter: bool = True,
           retry_after: Callable[[BaseException | None], float | None] | None = None,
           extra_stop: stop_base | None = None, before_sleep: Callable[[RetryCallState], None] | None = None,
           sleep: Callable[[float], None] = time.sleep) -> Retrying:
    """A `Retrying` that tries again on `retryable` errors only, up to `attempts` tries and/or
    `deadline_s` seconds (neither: until it succeeds — give one), waiting exponentially from
    `first_wait_s` up to `max_wait_s` (what `retry_after` reads from the error wins, capped).
    Reusable and thread-safe: build it once per client (its per-call state is thread-local)."""
    stop: stop_base = stop_never
    if attempts is not None:
        stop = stop_after_attempt(attempts)
    if deadline_s is not None:
        stop = stop_after_delay(deadline_s) if attempts is None else stop | stop_after_delay(deadline_s)
    if extra_stop is not None:
        stop = stop | extra_stop
    wait: wait_base = wait_exponential_jitter(multiplier=first_wait_s, max=max_wait_s, jitter=first_wait_s if jitter else 0)
    if retry_after is not None:
        wait = _wait_asked(wait, retry_after, max_wait_s)
    kwargs: dict[str, Any] = {"before_sleep": before_sleep} if before_sleep is not None else {}
    return Retrying(retry=retry_if_exception(retryable), stop=stop, wait=wait, sleep=sleep, reraise=True, **kwargs)


def any_of(*predicates: Predicate) -> Predicate:
    """An error any of `predicates` calls transient (a client's own test beside the engines')."""
    return lambda error: any(p(error) for p in predicates)
