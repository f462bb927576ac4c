"""A recovery's costs recorded in MLflow (`trainyard.plugins.tracking.recoveries`), on a real store: the
event knows its detection, the restart is written in when the next gang starts, and the time to
train again and the device-hours come from the run's own points at its end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.tracking.factories import make_job, make_plan
from trainyard.plugins.tracking import runs
from trainyard.plugins.tracking.artifacts import TIMELINE_TEXT, log_end_artifacts

T = datetime(2026, 5, 1, 12, tzinfo=UTC)


def _points(client: object, rid: str, key: str, steps: range, start: datetime) -> None:
    from mlflow.entities import Metric

    client.log_batch(rid, metrics=[Metric(key, 5.0 - 0.1 * s, int((start + timedelta(seconds=0.5 * i)).timestamp() * 1000), s)  # type: ignore[attr-defined]
                                   for i, s in enumerate(steps)]
                     + [Metric("step_time_s", 0.5, 0, s) for s in steps], synchronous=True)


def test_the_costs_of_a_crash_are_measured_when_the_run_ends(sqlite_tracking_uri: str,
                                                             request: pytest.FixtureRequest) -> None:
    uri = sqlite_tracking_uri
    rid = runs.start_or_resume_run(make_job(request.node.name.replace("_", "-")[:40]), make_plan(),
                                   tracking_uri=uri, attempt=0)
    client = runs.client_for(uri)
    _points(client, rid, "loss", range(1, 20), T - timedelta(seconds=10))
    runs.log_recovery_event(rid, "worker_crash", 0, 19, "rank 1 killed", tracking_uri=uri, duration_s=0.26,
                            resume_step=10, at=T, key="r/0/worker_crash")
    runs.log_recovery_timings(rid, step=0, tracking_uri=uri, time_to_resume_s=8.0, attempt=0)  # gang 1 started
    _points(client, rid, "loss.replay", range(11, 20), T + timedelta(seconds=20))  # first step after the restore

    log_end_artifacts(rid, tracking_uri=uri)
    (event,) = runs.recovery_events(rid, tracking_uri=uri)
    assert (event.detect_s, event.restart_s, event.steps_lost) == (0.26, 8.0, 9)
    assert event.time_to_train_again_s == pytest.approx(20.26)  # from the failure, 0.26 s before its detection
    assert event.device_hours_lost == pytest.approx(2 * (20.26 + 9 * 0.5) / 3600)
    run = client.get_run(rid)
    assert float(run.data.tags["trainyard.recovery_s"]) == pytest.approx(20.26)
    assert [(m.step, round(m.value, 2)) for m in client.get_metric_history(rid, "system/recovery.time_to_train_again_s")] \
        == [(19, 20.26)]
    assert [m.step for m in client.get_metric_history(rid, "system/recovery.time_to_resume_s")] == [19]  # at the failure
    text = client.download_artifacts(rid, TIMELINE_TEXT)
    with open(text) as f:
        assert "detected in 0.26 s · restarted in 8 s · trained again after 20.3 s · 9 step(s) lost" in f.read()
