"""What rank 0 does with each checkpoint it committed, without waiting for the control plane
(DESIGN §6): record it in the run's MLflow run (the `trainyard.checkpoint.<step>` tags that
`register_model` chooses from) and apply the job's retention policy — never to the checkpoint
just committed, the newest valid one (rank 0 wrote its manifest from every rank's hashes).

The control plane's checkpoint watcher verifies and reports the same commits; both sides'
writes are idempotent (`log_checkpoint` skips a record it already has, retention deletes only
what its rules let go), so neither depends on the other: a triggerer that is down no longer
lets checkpoints pile up past `maxKeep`, nor leaves the run's MLflow record behind.

On a thread of its own, in commit order: the save's background thread only hands the result
over (`CheckpointManager.on_commit`), so a slow or unreachable tracking server never holds the
next save. `close()` waits, bounded, for what is queued, so a run's last checkpoint is recorded
before the process exits. Errors are logged, never raised: the commit stands either way.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.plugins.checkpoint.manager import SaveResult
    from trainyard.plugins.checkpoint.retention import RetentionPolicy

log = logging.getLogger(__name__)


class CommitRecorder:
    def __init__(self, *, checkpoint_uri: str, policy: RetentionPolicy, endpoint_url: str | None = None,
                 tracking_uri: str = "", mlflow_run_id: str = "") -> None:
        self.checkpoint_uri = checkpoint_uri
        self.policy = policy
        self.endpoint_url = endpoint_url
        self.tracking_uri = tracking_uri
        self.mlflow_run_id = mlflow_run_id
        self.recorded: list[int] = []
        """Steps recorded in MLflow, in commit order."""
        self.deleted: list[int] = []
        """Steps retention deleted after a commit."""
        self._queue: queue.Queue[tuple[int, str] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="trainyard-commit-records", daemon=True)
        self._thread.start()

    def __call__(self, result: SaveResult) -> None:
        """`CheckpointManager.on_commit`: queue the commit's bookkeeping (never blocks)."""
        self._queue.put((result.step, result.manifest_uri))

    def close(self, timeout_s: float = 60.0) -> bool:
        """Finish what is queued (at most `timeout_s`); False when it did not finish in time."""
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            log.warning("checkpoint bookkeeping did not finish within %.0f s; the control plane's "
                        "watcher records and verifies what is left", timeout_s)
            return False
        return True

    def _run(self) -> None:
        done = False
        while not done:
            batch = [self._queue.get()]
            while True:  # what queued up meanwhile (a slow server): recorded together
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            commits = [item for item in batch if item is not None]
            if commits:
                self.record(commits)

    def record(self, commits: list[tuple[int, str]]) -> None:
        """Each commit in MLflow first — what was committed is on record before anything is
        deleted — then retention once, the newest of them protected as the newest valid one."""
        if self.tracking_uri and self.mlflow_run_id:
            from trainyard.plugins.tracking.runs import log_committed_checkpoint

            for step, manifest_uri in commits:
                try:
                    log_committed_checkpoint(self.mlflow_run_id, manifest_uri, tracking_uri=self.tracking_uri,
                                             endpoint_url=self.endpoint_url)
                    self.recorded.append(step)
                except Exception as e:  # noqa: BLE001 - the watcher records it later; training goes on
                    log.warning("checkpoint step %d: not recorded in MLflow run %s (%s: %s)", step,
                                self.mlflow_run_id, type(e).__name__, e)
        from trainyard.plugins.checkpoint.catalog import list_checkpoints
        from trainyard.plugins.checkpoint.retention import apply_retention

        newest = max(step for step, _ in commits)
        try:
            # Commits that landed while these were recorded are still queued: not on record yet,
            # so not deleted yet — the next batch records them first.
            queued = {r.step: "committed since: recorded first" for r in
                      list_checkpoints(self.checkpoint_uri, endpoint_url=self.endpoint_url) if r.step > newest}
            report = apply_retention(self.checkpoint_uri, self.policy, known_valid=newest, protected=queued,
                                     endpoint_url=self.endpoint_url)
        except Exception as e:  # noqa: BLE001 - the next commit, or the sweep, tries again
            log.warning("after checkpoint step %d: retention not applied (%s: %s)", newest, type(e).__name__, e)
            return
        self.deleted += report.deleted
        if report.deleted:
            log.info("after checkpoint step %d: retention deleted steps %s", newest, sorted(report.deleted))
