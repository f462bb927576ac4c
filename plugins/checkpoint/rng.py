"""Capture and restore every RNG a training step may draw from: Python's `random`, numpy's
global generator, torch's CPU generator and, when CUDA is in use, every CUDA device's.

A resumed run must draw the same dropout masks and data shuffles as an uninterrupted one
(DESIGN §5), so these go into each rank's extra-state JSON (see `state_json`).
"""

from __future__ import annotations

import random
from typing import Any


def capture_rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=True),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(_as_python_state(state["python"]))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = list(state["cuda"])
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:  # a different node shape: keep what we can, device by device
            for index, s in enumerate(cuda_states[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, index)


def _as_python_state(value: Any) -> tuple[Any, ...]:
    """`random.setstate` wants (version, tuple_of_ints, gauss_next) with a real inner tuple."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
