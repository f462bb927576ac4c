"""Divergence: NaN/inf stops at once; a spike must last `patience` steps; the baseline ignores
spikes and survives a checkpoint."""

from __future__ import annotations

import math

import pytest

from trainyard.worker.divergence import DivergenceDetector


def feed(detector: DivergenceDetector, losses: list[float], start: int = 1):
    for step, loss in enumerate(losses, start=start):
        verdict = detector.update(step, loss)
        if verdict is not None:
            return verdict
    return None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_loss_diverges_at_once(bad: float) -> None:
    d = DivergenceDetector(factor=10, patience=100)
    verdict = feed(d, [3.0, 2.9, bad])
    assert verdict is not None and (verdict.step, verdict.onset_step, verdict.reason) == (3, 3, "non_finite")


def test_non_finite_first_loss_diverges() -> None:
    verdict = DivergenceDetector().update(1, math.nan)
    assert verdict is not None and verdict.baseline is None


def test_sustained_spike_diverges_at_patience_with_its_onset() -> None:
    d = DivergenceDetector(factor=10, patience=5)
    verdict = feed(d, [2.0] * 20 + [50.0] * 5)
    assert verdict is not None
    assert (verdict.step, verdict.onset_step, verdict.reason) == (25, 21, "above_baseline")
    assert verdict.baseline == pytest.approx(2.0)


def test_short_spike_is_forgiven_and_does_not_move_the_baseline() -> None:
    d = DivergenceDetector(factor=10, patience=5)
    assert feed(d, [2.0] * 20 + [50.0] * 4 + [2.0] + [50.0] * 4) is None
    assert d.baseline == pytest.approx(2.0)
    assert (d.onset, d.count) == (26, 4)


def test_falling_loss_never_alarms() -> None:
    d = DivergenceDetector(factor=2, patience=1)
    assert feed(d, [10.0 * 0.9**i for i in range(200)]) is None


def test_state_round_trip_keeps_the_baseline_and_the_run() -> None:
    d = DivergenceDetector(factor=10, patience=5)
    feed(d, [2.0] * 10 + [50.0] * 3)
    resumed = DivergenceDetector(factor=10, patience=5)
    resumed.load_state_dict(d.state_dict())
    verdict = feed(resumed, [50.0, 50.0], start=14)
    assert verdict is not None and (verdict.step, verdict.onset_step) == (15, 11)


@pytest.mark.parametrize(("kwargs", "match"), [({"factor": 1.0}, "factor"), ({"patience": 0}, "patience"),
                                               ({"decay": 1.0}, "decay")])
def test_bad_settings_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DivergenceDetector(**kwargs)
