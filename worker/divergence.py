"""Divergence detection (DESIGN §5): a NaN/inf loss diverges at once; a loss above
`factor` × its running baseline for `patience` consecutive steps diverges at the first of them
(the *onset*, which the control plane rolls back before).

The baseline is an exponential moving average of the healthy losses (decay 0.99: about the
last 100 steps). Spikes do not feed it — a baseline that followed the spike up would never
call it a divergence — and the first step seeds it. Early training, where the loss falls fast,
only ever leaves the loss *below* its baseline, so it cannot trigger a false alarm.

The detector sees the global loss (the same on every rank, see `worker/step.py`), so every rank
reaches the same verdict at the same step without talking to the others. Its state is part
of a checkpoint (`state_dict`), so a resumed run keeps its baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Divergence:
    step: int
    """The step at which the verdict was reached."""
    onset_step: int
    """First step of the bad run (equals `step` for NaN/inf)."""
    reason: Literal["non_finite", "above_baseline"]
    loss: float
    baseline: float | None

    def describe(self) -> str:
        if self.reason == "non_finite":
            return f"loss is {self.loss} at step {self.step}"
        return (f"loss {self.loss:.4g} above its baseline {self.baseline:.4g} since step "
                f"{self.onset_step} (step {self.step})")


class DivergenceDetector:
    def __init__(self, *, factor: float = 10.0, patience: int = 100, decay: float = 0.99) -> None:
        if factor <= 1:
            raise ValueError(f"divergence factor must be > 1, got {factor}")
        if patience < 1:
            raise ValueError(f"divergence patience (steps) must be >= 1, got {patience}")
        if not 0 < decay < 1:
            raise ValueError(f"baseline decay must be in (0, 1), got {decay}")
        self.factor = factor
        self.patience = patience
        self.decay = decay
        self.baseline: float | None = None
        self.onset: int | None = None
        """First step of the current run of losses above the threshold, if any."""
        self.count = 0
        """Length of that run."""

    def update(self, step: int, loss: float) -> Divergence | None:
        """Feed the loss of `step`; a `Divergence` when the run has diverged, else None."""
        if not math.isfinite(loss):
            return Divergence(step, step, "non_finite", loss, self.baseline)
        if self.baseline is not None and loss > self.factor * self.baseline:
            if self.onset is None:
                self.onset = step
            self.count += 1
            if self.count >= self.patience:
                return Divergence(step, self.onset, "above_baseline", loss, self.baseline)
            return None
        self.onset, self.count = None, 0
        self.baseline = loss if self.baseline is None else (
            self.decay * self.baseline + (1 - self.decay) * loss)
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "onset": self.onset, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        baseline = state.get("baseline")
        self.baseline = None if baseline is None else float(baseline)
        onset = state.get("onset")
        self.onset = None if onset is None else int(onset)
        self.count = int(state.get("count", 0))
