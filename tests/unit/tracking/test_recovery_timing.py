"""What a recovery cost, phase by phase (`trainyard.plugins.tracking.recovery_timing`): the issue's
worked example by hand, and the figures that stay unknown when a moment was not recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainyard.plugins.tracking.recovery_timing import recovery_timing

T = datetime(2026, 5, 1, 12, tzinfo=UTC)


def test_a_crash_that_lost_19_steps_and_took_36_5_s_to_train_again() -> None:
    # issue 30: detected 0.26 s after the kill, the next gang 20 s later, first step 16.24 s after
    t = recovery_timing(failed_at=T, detected_at=T + timedelta(seconds=0.26), resumed_at=T + timedelta(seconds=20.26),
                        trained_again_at=T + timedelta(seconds=36.5), step=119, resume_step=100, devices=2,
                        step_time_s=0.5)
    assert (t.detect_s, t.restart_s, t.time_to_train_again_s, t.steps_lost) == pytest.approx((0.26, 20.0, 36.5, 19))
    assert t.device_hours_lost == pytest.approx(2 * (36.5 + 19 * 0.5) / 3600)
    assert t.metrics() == pytest.approx({
        "recovery/time_to_detect_s": 0.26, "recovery/time_to_resume_s": 20.0, "recovery/time_to_train_again_s": 36.5,
        "recovery/steps_lost": 19.0, "recovery/device_hours_lost": t.device_hours_lost})


def test_an_undated_failure_counts_from_its_detection() -> None:
    t = recovery_timing(failed_at=None, detected_at=T, resumed_at=None, trained_again_at=T + timedelta(seconds=9),
                        step=50, resume_step=50, devices=8, step_time_s=None)
    assert (t.detect_s, t.restart_s, t.time_to_train_again_s, t.steps_lost) == (None, None, 9.0, 0)
    assert t.device_hours_lost == pytest.approx(8 * 9 / 3600)  # no step lost: the step time is not needed
    assert set(t.metrics()) == {"recovery/time_to_train_again_s", "recovery/steps_lost", "recovery/device_hours_lost"}


def test_a_recovery_still_going_has_no_cost_yet() -> None:
    t = recovery_timing(failed_at=T, detected_at=T + timedelta(seconds=1), resumed_at=None, trained_again_at=None,
                        step=10, resume_step=0, devices=4, step_time_s=1.0)
    assert (t.time_to_train_again_s, t.device_hours_lost, t.steps_lost) == (None, None, 10)
    with pytest.raises(ValueError, match="devices"):
        recovery_timing(failed_at=T, detected_at=T, resumed_at=None, trained_again_at=None, step=None,
                        resume_step=None, devices=0, step_time_s=None)
