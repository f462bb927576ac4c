"""The one retry policy: transient errors are tried again, anything else fails at once as itself,
the server's own wait is honoured, and attempts and deadlines both bound it."""

from __future__ import annotations

import pytest

from trainyard.plugins.errors import FatalError, TransientError
from trainyard.plugins.retry import any_of, policy


class Flaky:
    def __init__(self, errors: list[BaseException]) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_transient_errors_are_tried_again_and_the_waits_grow() -> None:
    slept: list[float] = []
    call = Flaky([TransientError("busy"), TransientError("busy"), TransientError("busy")])
    assert policy(attempts=5, first_wait_s=0.1, max_wait_s=1, jitter=False, sleep=slept.append)(call) == "ok"
    assert call.calls == 4 and slept == [0.1, 0.2, 0.4]


def test_a_fatal_error_fails_at_once_as_itself() -> None:
    call = Flaky([FatalError("bad input")])
    with pytest.raises(FatalError, match="bad input"):
        policy(attempts=5, sleep=lambda s: None)(call)
    assert call.calls == 1


def test_attempts_bound_it_and_the_last_error_is_raised_not_a_retry_error() -> None:
    call = Flaky([TransientError(f"busy {i}") for i in range(10)])
    with pytest.raises(TransientError, match="busy 2"):
        policy(attempts=3, sleep=lambda s: None)(call)


def test_what_the_server_asks_wins_capped() -> None:
    class Throttled(TransientError):
        def __init__(self, after: float) -> None:
            super().__init__("429")
            self.after = after

    slept: list[float] = []
    call = Flaky([Throttled(3.0), Throttled(100.0)])
    retrying = policy(attempts=3, max_wait_s=10, sleep=slept.append,
                      retry_after=lambda e: getattr(e, "after", None))
    assert retrying(call) == "ok" and slept == [3.0, 10.0]


def test_a_clients_own_transient_answers_join_the_engines() -> None:
    call = Flaky([ConnectionResetError("reset"), TransientError("busy")])
    retryable = any_of(lambda e: isinstance(e, ConnectionResetError))
    assert policy(any_of(retryable, lambda e: isinstance(e, TransientError)), attempts=3,
                  sleep=lambda s: None)(call) == "ok"
