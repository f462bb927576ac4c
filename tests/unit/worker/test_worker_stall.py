"""`trainyard.worker.stall`: a warning per window of steps whose data stalls pass 5 % of step time."""

from __future__ import annotations

import logging

import pytest

from trainyard.worker.stall import StallMonitor


def test_warns_only_for_windows_above_the_threshold(caplog: pytest.LogCaptureFixture) -> None:
    monitor = StallMonitor(window_steps=4)
    caplog.set_level(logging.WARNING, logger="trainyard.worker.stall")
    shares = [monitor.update(s, 0.004, 0.1) for s in range(1, 5)]  # 4 % stalled
    assert shares[:3] == [None] * 3 and shares[3] == pytest.approx(0.04) and monitor.warnings == 0
    data = {"prefetch_depth": 0.0, "cache_hit_rate": 0.5, "cache_hits": 1.0}
    shares = [monitor.update(s, 0.02, 0.1, data) for s in range(5, 9)]  # 20 % stalled
    assert shares[3] == pytest.approx(0.2) and monitor.warnings == 1
    (record,) = caplog.records
    assert "20.0 %" in record.getMessage() and "prefetch_depth 0" in record.getMessage()
    assert "cache_hit_rate 0.5" in record.getMessage() and "cache_hits" not in record.getMessage()
    assert monitor.update(9, None, 0.1) is None  # a loop that does not measure stalls
