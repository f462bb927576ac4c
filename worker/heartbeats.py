"""This rank's heartbeat file, written off the training thread, at most once per
`write_interval_s` (a second at the default hang timeouts) whatever the step rate.

An atomic replace (`trainyard.plugins.run.heartbeat.write_heartbeat`: temp file + rename) costs ~0.3 ms
of CPU and ~1 ms of wall time on ext4 here (a rename over an existing file makes ext4 allocate and
flush the new file's blocks), and far more on a struggling network filesystem; validating the
beat (pydantic) another ~10 µs. Done every step, that was 1–4 % of the demo model's 27 ms step
on a 2-core machine, where a "background" thread takes its CPU from a rank. So:

- the training thread only hands over the newest beat — a `Heartbeat`, or a function that builds
  one, which the writer calls (validation off the training thread too) — and never wakes the
  writer for it: `submit` is a lock and an assignment;
- the writer takes the newest beat every `write_interval_s` and writes it; beats handed over in
  between are skipped (only the newest matters to the readers). A beat therefore reaches the
  file at most one interval after its step — 1 s at a timeout of 20 s or more, a twentieth of
  the timeout below that — which the hang rule's timeout absorbs;
- `flush()` writes the newest beat at once and waits for it (phase changes, exit, a benchmark's
  block end).

The beat's `time` is taken when it is handed over, so a training thread that hangs still leaves
a stale file, and a writer that hangs does too — both read as a hang, as they should.

Between steps the thread rewrites the last beat every `pulse_interval_s` (its `time`, the
step's, unchanged; `alive_at`, the write's, new): a rank blocked in a collective waiting for a
stopped peer still shows life, the stopped peer does not — which is how a hang names the rank
that stopped rather than the whole gang (`trainyard.plugins.run.rules.hang_culprits`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainyard.plugins.run.heartbeat import (
    Heartbeat,
    pulse_interval_s,
    write_heartbeat,
    write_interval_s,
)

log = logging.getLogger(__name__)

Beat = Heartbeat | Callable[[], Heartbeat]
"""What `submit` takes: a beat, or a function the writer thread calls to build it."""


class HeartbeatWriter:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._cond = threading.Condition()
        self._pending: Beat | None = None
        self._submitted = 0
        """Beats handed over so far."""
        self._written = 0
        """The count of the newest beat written (or given up on)."""
        self._wanted = 0
        """The count a `flush()` waits for: written at once, not at the next tick."""
        self._ticking = False
        """The writer wakes on its own (after its first beat): `submit` need not wake it."""
        self._closed = False
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="trainyard-heartbeat", daemon=True)
        self._thread.start()

    def submit(self, beat: Beat) -> None:
        """Hand over the newest beat (never blocks on the disk, never wakes the writer once it
        ticks: the beat is written at its next tick)."""
        with self._cond:
            self._pending = beat
            self._submitted += 1
            if not self._ticking:
                self._cond.notify()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Write the newest submitted beat now and wait for it (or its failure); False on timeout."""
        with self._cond:
            target = self._submitted
            if self._written >= target:
                return True
            self._wanted = max(self._wanted, target)
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._written >= target or not self._thread.is_alive(),
                                       timeout=timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s)

    def _next(self, last: Heartbeat | None, last_write: float) -> tuple[Beat, int] | None:
        """Under the lock: wait for what to write next — (beat, its count) — or None to stop."""
        while True:
            now = time.monotonic()
            if self._pending is not None and (last is None or self._closed or self._wanted > self._written
                                              or now >= last_write + write_interval_s(last.hang_timeout_s)):
                beat, self._pending = self._pending, None
                return beat, self._submitted
            if self._closed:
                return None
            if last is None:
                self._cond.wait()
                continue
            pulse_at = last_write + pulse_interval_s(last.hang_timeout_s)
            if now >= pulse_at:  # no new step for a pulse: the same beat again, as a sign of life
                return last, self._written
            interval = write_interval_s(last.hang_timeout_s)
            # Wake when the pending beat is due, or at least every interval: a beat handed over
            # meanwhile (submit does not wake the writer) waits at most one interval.
            due = last_write + interval if self._pending is not None else now + interval
            self._cond.wait(timeout=max(0.0, min(due, pulse_at) - now))

    def _run(self) -> None:
        last: Heartbeat | None = None
        last_write = 0.0
        while True:
            with self._cond:
                item = self._next(last, last_write)
            if item is None:
                return
            beat, count = item
            try:
                last = beat if isinstance(beat, Heartbeat) else beat()
                write_heartbeat(self.directory, last)
            except Exception as e:  # noqa: BLE001 - a full or read-only disk, a bad figure: never stop training
                if not self._warned:
                    log.warning("could not write heartbeat to %s: %s", self.directory, e)
                    self._warned = True
            last_write = time.monotonic()
            with self._cond:
                self._written = max(self._written, count)
                self._ticking = last is not None
                self._cond.notify_all()
