"""MetricsStreamer against a real SQLite-backed MLflow store (and a socket that never answers)."""

from __future__ import annotations

import math
import socket
import threading

import pytest

from trainyard.plugins.tracking.metrics import MetricsStreamer, is_transient


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_every_point_arrives_in_batches_of_at_most_max_batch(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    # 1000 steps x 3 keys = 3000 points with max_batch=700: at least 5 log_batch calls.
    with MetricsStreamer(sqlite_tracking_uri, mlflow_run, flush_every_s=0.2, max_batch=700) as s:
        for step in range(1000):
            s.log(step, {"loss": 1.0 / (step + 1), "lr": 3e-4, "tokens_per_s": float(step)})
    stats = s.stats
    assert (stats.logged, stats.sent, stats.dropped, stats.failed, stats.pending) == (3000, 3000, 0, 0, 0)
    loss = history(sqlite_tracking_uri, mlflow_run, "loss")
    assert [step for step, _ in loss] == list(range(1000))
    assert loss[9] == (9, pytest.approx(0.1))
    assert len(history(sqlite_tracking_uri, mlflow_run, "tokens_per_s")) == 1000


def test_one_log_call_larger_than_a_batch_is_split(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    many = {f"layer.{i}.grad_norm": float(i) for i in range(2500)}
    with MetricsStreamer(sqlite_tracking_uri, mlflow_run, flush_every_s=60, max_batch=1000) as s:
        s.log(7, many)
    assert s.stats.sent == 2500
    assert history(sqlite_tracking_uri, mlflow_run, "layer.2499.grad_norm") == [(7, 2499.0)]


def test_flush_sends_without_closing(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    s = MetricsStreamer(sqlite_tracking_uri, mlflow_run, flush_every_s=3600)
    try:
        s.log(1, {"loss": 2.5}, timestamp_ms=1_700_000_000_000)
        assert s.flush(timeout_s=60)
        from mlflow import MlflowClient

        (point,) = MlflowClient(sqlite_tracking_uri).get_metric_history(mlflow_run, "loss")
        assert (point.step, point.value, point.timestamp) == (1, 2.5, 1_700_000_000_000)
        s.log(2, {"loss": 2.0})
    finally:
        stats = s.close(timeout_s=60)
    assert stats.sent == 2
    assert history(sqlite_tracking_uri, mlflow_run, "loss") == [(1, 2.5), (2, 2.0)]


def test_send_soon_sends_without_waiting_for_the_next_round(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    """What a checkpoint asks: its steps' points go now, not `flush_every_s` (an hour here) later."""
    import time

    s = MetricsStreamer(sqlite_tracking_uri, mlflow_run, flush_every_s=3600)
    try:
        s.log(1, {"loss": 2.5})
        s.send_soon()
        give_up = time.monotonic() + 120
        while s.stats.sent < 1 and time.monotonic() < give_up:
            time.sleep(0.05)
        assert s.stats.sent == 1
        assert history(sqlite_tracking_uri, mlflow_run, "loss") == [(1, 2.5)]
    finally:
        s.close(timeout_s=60)


def test_bad_names_and_values_are_dropped_one_by_one(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    with MetricsStreamer(sqlite_tracking_uri, mlflow_run, flush_every_s=60) as s:
        s.log(0, {"loss": 1.5, "bad\nname": 1.0, "note": "not a number", "nan_loss": math.nan})
        s.log(1, {"loss": 1.25, "bad\nname": 2.0})
    stats = s.stats
    assert (stats.logged, stats.sent, stats.dropped, stats.failed, stats.pending) == (6, 3, 3, 0, 0)
    assert history(sqlite_tracking_uri, mlflow_run, "loss") == [(0, 1.5), (1, 1.25)]
    (nan_point,) = history(sqlite_tracking_uri, mlflow_run, "nan_loss")
    assert math.isnan(nan_point[1])  # a diverged loss must be visible, not swallowed


def test_a_refused_batch_is_counted_and_never_raised(sqlite_tracking_uri: str) -> None:
    missing_run = "0123456789abcdef0123456789abcdef"
    s = MetricsStreamer(sqlite_tracking_uri, missing_run, flush_every_s=60, retry_attempts=2)
    s.log(0, {"loss": 1.0, "lr": 0.1})
    stats = s.close(timeout_s=60)
    assert (stats.sent, stats.failed, stats.pending) == (0, 2, 0)


def test_log_after_close_is_dropped_and_counted(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    s = MetricsStreamer(sqlite_tracking_uri, mlflow_run)
    s.close(timeout_s=60)
    s.log(0, {"loss": 1.0, "lr": 0.1})
    assert s.stats.dropped == 2
    assert s.close(timeout_s=1).sent == 0  # a second close is harmless


def test_a_hung_server_fills_the_queue_and_log_drops_instead_of_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    # A socket that accepts connections and never answers: the thread blocks inside log_batch.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted = threading.Event()
    conns: list[socket.socket] = []

    def accept() -> None:
        conn, _ = server.accept()
        conns.append(conn)
        accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    uri = f"http://127.0.0.1:{server.getsockname()[1]}"
    # mark_replay=False: the first call is then the stuck log_batch (not the get_run before it).
    s = MetricsStreamer(uri, "0123456789abcdef0123456789abcdef", max_batch=1, max_queue=3, retry_attempts=1,
                        mark_replay=False)
    try:
        s.log(0, {"loss": 1.0})
        assert accepted.wait(120), "the streamer never reached the server"
        for step in range(1, 11):
            s.log(step, {"loss": 1.0})  # returns at once although the thread is stuck
        stats = s.stats
        assert (stats.logged, stats.dropped) == (4, 7)
        stats = s.close(timeout_s=0.5)
        assert stats.pending == 4 and stats.sent == 0
    finally:
        for conn in conns:
            conn.close()
        server.close()


def test_transient_errors_are_the_retryable_ones() -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import (
        INVALID_PARAMETER_VALUE,
        RESOURCE_DOES_NOT_EXIST,
        TEMPORARILY_UNAVAILABLE,
    )

    assert is_transient(MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE))
    assert is_transient(ConnectionRefusedError())
    assert not is_transient(MlflowException("no such run", error_code=RESOURCE_DOES_NOT_EXIST))
    assert not is_transient(MlflowException("bad value", error_code=INVALID_PARAMETER_VALUE))
    assert not is_transient(ValueError("x"))


def test_from_env_needs_both_variables(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    assert MetricsStreamer.from_env({"MLFLOW_TRACKING_URI": sqlite_tracking_uri}) is None
    s = MetricsStreamer.from_env({"MLFLOW_TRACKING_URI": sqlite_tracking_uri, "MLFLOW_RUN_ID": mlflow_run})
    assert s is not None and s.run_id == mlflow_run
    s.close(timeout_s=60)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch": 1001}, "max_batch must be between 1 and 1000"),
        ({"max_batch": 0}, "got 0"),
        ({"flush_every_s": 0}, "flush_every_s must be > 0"),
        ({"max_queue": 0}, "max_queue must be >= 1"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricsStreamer("sqlite:///x.db", "abc", **kwargs)


def test_importing_the_module_does_not_import_mlflow() -> None:
    from tests.support.imports import assert_none_loaded

    assert_none_loaded("metrics_streamer", {"mlflow"})


def test_a_resumed_attempt_logs_its_replayed_steps_apart(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    # Attempt 0 logged steps 1..12 and crashed; attempt 1 restored step 8 and trains 9..15.
    with MetricsStreamer(sqlite_tracking_uri, mlflow_run, flush_every_s=60) as s:
        for step in range(1, 13):
            s.log(step, {"loss": 10.0 - step})
    with MetricsStreamer(sqlite_tracking_uri, mlflow_run, flush_every_s=60) as s:
        for step in range(9, 16):
            s.log(step, {"loss": 10.0 - step + 0.5, "lr": 0.1})
    stats = s.stats
    loss = history(sqlite_tracking_uri, mlflow_run, "loss")
    assert [step for step, _ in loss] == list(range(1, 16))  # one value per step
    assert dict(loss)[12] == -2.0 and dict(loss)[13] == -2.5  # attempt 0's up to 12, then attempt 1's
    assert [step for step, _ in history(sqlite_tracking_uri, mlflow_run, "loss.replay")] == [9, 10, 11, 12]
    assert len(history(sqlite_tracking_uri, mlflow_run, "lr")) == 7  # a key new in this attempt: no replay
    assert (stats.sent, stats.replayed) == (14, 4)


def test_replay_marking_can_be_turned_off(sqlite_tracking_uri: str, mlflow_run: str) -> None:
    for _ in range(2):
        with MetricsStreamer(sqlite_tracking_uri, mlflow_run, flush_every_s=60, mark_replay=False) as s:
            s.log(3, {"loss": 1.0})
    assert len(history(sqlite_tracking_uri, mlflow_run, "loss")) == 2
