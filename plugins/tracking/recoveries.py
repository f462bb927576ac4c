"""What each recovery of a run cost, measured from the run itself once it has ended.

A recovery event (`runs.log_recovery_event`) knows its detection; the restart is written into
it when the next gang starts (`runs.log_recovery_timings(attempt=…)`). The time to train again
needs the next attempt's first step after its restore, which only the run's own points show:
the first `loss.replay` (or `loss`) point above the resume step, logged after the detection.
`record_recovery_costs` reads those at the run's end and writes, per event, the figures of
`trainyard.plugins.tracking.recovery_timing` — into the event's record, as metrics at the failure's step
(`recovery/time_to_train_again_s`, `recovery/device_hours_lost`), and their sum as the tag
`trainyard.recovery_s` (what the job stood still; the chargeback's fallback reads it).
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from trainyard.plugins.tracking.runs import RecoveryEvent

RECOVERY_SECONDS_TAG = "trainyard.recovery_s"
"""Seconds the job stood still across its recoveries (each one's time to train again, or its
detection where nothing later was measured)."""


def record_recovery_costs(run_id: str, *, tracking_uri: str) -> list[RecoveryEvent]:
    """Measure and record each event's costs (see the module docstring); returns the events."""
    from trainyard.plugins.tracking.metrics import replay_key
    from trainyard.plugins.tracking.recovery_timing import recovery_timing
    from trainyard.plugins.tracking.runs import (
        client_for,
        log_metrics,
        recovery_events,
        set_recovery_event,
    )

    client = client_for(tracking_uri)
    events = recovery_events(run_id, tracking_uri=tracking_uri)
    if not events:
        return []
    run = client.get_run(run_id)
    devices = int(run.data.params.get("spec.hardware.gpuCount", "1") or 1)
    points = {key: _points(client, run_id, key) for key in (replay_key("loss"), "loss")}
    step_times = [m.value for m in client.get_metric_history(run_id, "step_time_s")]
    step_time = statistics.median(step_times) if step_times else None
    out = []
    for i, event in enumerate(events):
        detected = datetime.fromisoformat(event.at)
        if detected.tzinfo is None:
            detected = detected.replace(tzinfo=UTC)
        failed = detected - timedelta(seconds=event.detect_s) if event.detect_s is not None else None
        timing = recovery_timing(
            failed_at=failed, detected_at=detected,
            resumed_at=detected + timedelta(seconds=event.restart_s) if event.restart_s is not None else None,
            trained_again_at=_first_step_after(points, event.resume_step, detected),
            step=event.step, resume_step=event.resume_step, devices=max(devices, 1), step_time_s=step_time)
        figures = {k: v for k, v in timing.model_dump().items() if v is not None and k != "detect_s"}
        event = event.model_copy(update=figures)
        set_recovery_event(run_id, i, event, tracking_uri=tracking_uri)
        costs = {k: v for k, v in timing.metrics().items() if k.endswith(("train_again_s", "device_hours_lost"))}
        if costs:
            log_metrics(client, run_id, costs, step=event.step or 0)
        out.append(event)
    still = sum(e.time_to_train_again_s if e.time_to_train_again_s is not None else (e.detect_s or 0.0) for e in out)
    client.set_tag(run_id, RECOVERY_SECONDS_TAG, f"{still:.6g}")
    return out


def _points(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, int]]:
    """(step, timestamp ms) of every point of `key`."""
    return sorted((m.step, m.timestamp) for m in client.get_metric_history(run_id, key))


def _first_step_after(points: dict[str, list[tuple[int, int]]], resume_step: int | None,
                      detected: datetime) -> datetime | None:
    """When the next attempt finished its first step after restoring `resume_step`: the first
    point above it, logged after the detection (the replayed steps come first when steps were lost)."""
    if resume_step is None:
        return None
    after = detected.timestamp() * 1000
    for series in points.values():
        stamps = [t for step, t in series if step > resume_step and t >= after]
        if stamps:
            return datetime.fromtimestamp(min(stamps) / 1000, UTC)
    return None
