"""Exit codes of a training process: the worker exits with them, the launcher reports them
(`describe`: `diverged` rather than `exit 42`) and the control plane's outcome classifier reads
them. One table, on the run's floor, so none of the three imports another for it.

A crash is any other non-zero exit (a Python exception exits 1; a signal shows as
128 + signal number, or as a negative code from `subprocess`). The codes are above the range
Python, torchrun and shells use for themselves, and below 128 (signals).
"""

from __future__ import annotations

import functools
import signal

COMPLETED = 0
"""Training reached `training.maxSteps` (the final checkpoint is committed)."""

DIVERGED = 42
"""Loss became NaN/inf, or stayed above `divergenceFactor` × its running baseline for
`divergenceSteps` steps. No checkpoint is written: the control plane rolls back to the last
checkpoint before the onset (`<run_dir>/diverged.json` names it)."""

PREEMPTED = 43
"""SIGTERM (preemption, spot notice, `trainyard stop`): an emergency checkpoint of the last
finished step was committed, then the process exited. Requeue and resume from it."""

PREEMPTED_NO_CHECKPOINT = 44
"""SIGTERM, but the emergency checkpoint failed: resume from the previous committed one."""

CHECKPOINT_CORRUPT = 45
"""The checkpoint to restore does not verify (SHA-256 mismatch, missing shard, unreadable
manifest): the named resume point (`TRAINYARD_RESUME_FROM`) fails, or no committed checkpoint
verifies at all. Rank 0 writes `<run_dir>/checkpoint_corrupt.json` with the reason; the
control plane quarantines the bad manifest and falls back to the previous valid one. A
newer checkpoint that fails while an older one verifies is not this: the worker falls back
by itself and trains on."""

OOM = 46
"""`torch.OutOfMemoryError` in the training loop: the plan needs more device memory than
there is. The log holds the allocator's message; the control plane re-plans with less."""

MEANINGS: dict[int, str] = {
    COMPLETED: "the job completed",
    DIVERGED: "the loss diverged",
    PREEMPTED: "emergency checkpoint after SIGTERM (preemption, a stop, a timeout)",
    PREEMPTED_NO_CHECKPOINT: "stopped by SIGTERM without a checkpoint",
    CHECKPOINT_CORRUPT: "the checkpoint to restore does not verify",
    OOM: "out of device memory",
}
"""Each code in a few words, for people (`trainyard launch --help`, the launcher's status): the
one table of what the codes mean."""


@functools.cache
def known_codes() -> dict[int, str]:
    """Exit code → lower-case constant name (`DIVERGED = 42` → `diverged`)."""
    names: dict[int, str] = {}
    for name, value in dict(globals()).items():
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool):
            names.setdefault(value, name.lower())
    return names


def describe(code: int | None) -> str:
    """`completed`, `diverged`, `killed by SIGKILL`, `exit 1`, or '' while running."""
    if code is None:
        return ""
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    known = known_codes().get(code)
    if known:
        return known
    if 128 < code <= 128 + 64:
        return f"exit {code} (killed by {_signal_name(code - 128)})"
    return f"exit {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
