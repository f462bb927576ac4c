"""What one recovery cost, phase by phase: the one home of that arithmetic (issue 30).

`recovery_seconds` used to be the detection time alone (0.26 s for a crash that lost 19 steps
and took 36.5 s to train again). A recovery has four figures, and a person needs each:

    failed_at ──detect──▶ detected_at ──restart──▶ resumed_at ──restore, first step──▶ trains again
    └──────────────────────── time to train again ───────────────────────────────┘

- `detect_s`: the failure (the first failing rank's exit, the hung rank's last heartbeat)
  until the control plane knew (`FailureReport.time_to_detect_s`);
- `restart_s`: detection until the next attempt's gang was started (the hand-over between DAG
  runs, the re-placement, the launch: `FailureReport.time_to_resume_s`);
- `time_to_train_again_s`: the failure (its detection when the failure is not dated) until the
  next attempt finished its first step after the restore — what the job stood still;
- `steps_lost`: steps trained and thrown away (the last step reached minus the resume step).

`device_hours_lost` is what the devices paid for it: every device of the gang for the time to
train again plus the steps lost trained a second time (`steps_lost × step_time_s`), in hours.
The first step after the restore is counted in both terms; at one step in hundreds that is
within the noise of the step time and keeps the formula one a reader can check by hand.

Pure Python: the Trainyard view and the MLflow run compute it from the same inputs.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class RecoveryTiming(BaseModel):
    """The figures of one recovery; None where not measured (yet)."""

    model_config = ConfigDict(frozen=True)

    detect_s: float | None = None
    restart_s: float | None = None
    time_to_train_again_s: float | None = None
    steps_lost: int | None = None
    device_hours_lost: float | None = None

    def metrics(self) -> dict[str, float]:
        """The measured figures as MLflow metrics (`recovery/<figure>`), the ones known."""
        names = {"detect_s": "time_to_detect_s", "restart_s": "time_to_resume_s",
                 "time_to_train_again_s": "time_to_train_again_s", "steps_lost": "steps_lost",
                 "device_hours_lost": "device_hours_lost"}
        return {f"recovery/{names[k]}": float(v) for k, v in self.model_dump().items() if v is not None}


def recovery_timing(*, failed_at: datetime | None, detected_at: datetime, resumed_at: datetime | None,
                    trained_again_at: datetime | None, step: int | None, resume_step: int | None,
                    devices: int, step_time_s: float | None) -> RecoveryTiming:
    """The figures of one recovery from its moments (see the module docstring).

    `trained_again_at`: when the next attempt finished its first step after the restore (its
    first metric point above the resume step); `devices`: the gang's size; `step_time_s`: a
    typical step of the run (the median of its `step_time_s` metric), for the steps redone."""
    if devices < 1:
        raise ValueError(f"devices must be at least 1, got {devices}")
    start = failed_at or detected_at
    detect = max(0.0, (detected_at - failed_at).total_seconds()) if failed_at is not None else None
    restart = max(0.0, (resumed_at - detected_at).total_seconds()) if resumed_at is not None else None
    again = max(0.0, (trained_again_at - start).total_seconds()) if trained_again_at is not None else None
    lost = max(0, step - resume_step) if step is not None and resume_step is not None else None
    hours = None
    if again is not None and lost is not None and (lost == 0 or step_time_s is not None):
        hours = devices * (again + lost * (step_time_s or 0.0)) / 3600.0
    return RecoveryTiming(detect_s=detect, restart_s=restart, time_to_train_again_s=again, steps_lost=lost,
                          device_hours_lost=hours)
