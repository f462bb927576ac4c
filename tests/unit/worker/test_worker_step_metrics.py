"""Rank 0's figures for MLflow (`trainyard.worker.step_metrics`): the loss of every step, the rest
once per window (averaged where they are rates), nothing handed to the streamer while a window
is open."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from trainyard.plugins.advisor.flops import mfu
from trainyard.worker.step_metrics import StepMetrics


class Recorder:
    """Stands in for `MetricsStreamer`: records what `log` is given, in order."""

    def __init__(self) -> None:
        self.points: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, metrics: Mapping[str, float], timestamp_ms: int | None = None) -> None:
        self.points.append((step, dict(metrics)))


def two_steps(window: StepMetrics) -> None:
    for step, (seconds, stall, grad_norm) in enumerate([(0.1, 0.01, 1.0), (0.3, 0.03, 2.0)], start=1):
        window.add(step, loss=3.0 - step, step_time_s=seconds, tokens=100, grad_norm=grad_norm,
                   lr=0.1 * step, data_stall_s=stall, data_metrics={"prefetch_depth": float(step)},
                   metrics={"accuracy": 0.25 * step, "loss": 99.0, "unset": None})


def test_the_loss_of_every_step_and_the_rest_once_per_window() -> None:
    streamer = Recorder()
    window = StepMetrics(streamer, world_size=2, every_s=3600)  # type: ignore[arg-type]
    two_steps(window)
    assert streamer.points == []  # nothing crosses to the streamer's thread while the window is open
    window.flush()
    assert streamer.points[:2] == [(1, {"loss": 2.0}), (2, {"loss": 1.0})]
    step, values = streamer.points[2]
    assert step == 2  # at the window's last step
    assert values == pytest.approx({
        "accuracy": 0.5, "grad_norm": 2.0, "lr": 0.2, "data/prefetch_depth": 2.0,  # as of that step
        "step_time_s": 0.2, "data_stall_s": 0.02,  # averages over the window
        "tokens_per_s": 200 / 0.4,  # the window's tokens over its time
    })
    window.flush()
    assert len(streamer.points) == 3  # a closed window is not sent twice


def test_a_zero_window_logs_every_step_as_before() -> None:
    streamer = Recorder()
    window = StepMetrics(streamer, world_size=2, every_s=0)  # type: ignore[arg-type]
    two_steps(window)
    assert [step for step, _ in streamer.points] == [1, 1, 2, 2]
    assert streamer.points[3][1]["step_time_s"] == pytest.approx(0.3)
    assert streamer.points[3][1]["tokens_per_s"] == pytest.approx(100 / 0.3)


def test_mfu_from_the_windows_tokens_per_second() -> None:
    streamer = Recorder()
    window = StepMetrics(streamer, world_size=2, flops_per_token=6e6, peak_flops=1e12, every_s=3600)  # type: ignore[arg-type]
    two_steps(window)
    window.flush()
    values = streamer.points[-1][1]
    assert values["mfu"] == pytest.approx(mfu(values["tokens_per_s"], 6e6, 2, 1e12))


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="every_s must be >= 0"):
        StepMetrics(Recorder(), world_size=1, every_s=-1)  # type: ignore[arg-type]
