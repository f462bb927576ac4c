"""This rank's heartbeat file, written off the training thread.

An atomic replace (`trainyard.plugins.run.heartbeat.write_heartbeat`: temp file + rename) costs ~0.1 ms
on tmpfs but ~3 ms on ext4 here (a rename over an existing file makes ext4 allocate and flush
the new file's blocks), and far more on a struggling network filesystem — 2 % of a 150 ms step,
or a stalled step. So the training thread only hands the newest beat to a writer thread and
carries on; when writes are slower than steps, intermediate beats are skipped (only the newest
matters to the readers). The beat's `time` is taken when it is handed over, so a training
thread that hangs still leaves a stale file, and a writer that hangs does too — both read as
a hang, as they should. `flush()` waits until the newest beat is on disk (phase changes, exit).

Between steps the thread rewrites the last beat every `pulse_interval_s` (its `time`, the
step's, unchanged; `alive_at`, the write's, new): a rank blocked in a collective waiting for a
stopped peer still shows life, the stopped peer does not — which is how a hang names the rank
that stopped rather than the whole gang (`trainyard.plugins.run.rules.hang_culprits`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from trainyard.plugins.run.heartbeat import Heartbeat, pulse_interval_s, write_heartbeat

log = logging.getLogger(__name__)


class HeartbeatWriter:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._cond = threading.Condition()
        self._pending: Heartbeat | None = None
        self._submitted = 0
        self._written = 0
        self._closed = False
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="trainyard-heartbeat", daemon=True)
        self._thread.start()

    def submit(self, beat: Heartbeat) -> None:
        """Hand over the newest beat (never blocks on the disk)."""
        with self._cond:
            self._pending = beat
            self._submitted += 1
            self._cond.notify()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the newest submitted beat is written (or given up on); False on timeout."""
        with self._cond:
            target = self._submitted
            return self._cond.wait_for(lambda: self._written >= target or not self._thread.is_alive(),
                                       timeout=timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        last: Heartbeat | None = None
        while True:
            with self._cond:
                pulse = pulse_interval_s(last.hang_timeout_s) if last is not None else None
                self._cond.wait_for(lambda: self._pending is not None or self._closed, timeout=pulse)
                if self._pending is not None:
                    beat, self._pending, count = self._pending, None, self._submitted
                elif self._closed or last is None:
                    return
                else:  # no new step for a pulse: the same beat again, as a sign of life
                    beat, count = last, self._written
            last = beat
            try:
                write_heartbeat(self.directory, beat)
            except OSError as e:  # a full or read-only disk must not stop training
                if not self._warned:
                    log.warning("could not write heartbeat to %s: %s", self.directory, e)
                    self._warned = True
            with self._cond:
                self._written = count
                self._cond.notify_all()
