"""What is known about one attempt once it ended (or while it runs): the `Evidence` that
`classify()` turns into a `FailureReport`, as plain values.

The attempt engine gathers it (`plugins/attempt/evidence.py`: the run folder, the launcher's
logs, the node agents) and hands it here; recovery reads no file, calls no agent and asks no
launcher, so the same evidence classifies the same way in any process, a test included. What
the observations *mean* (a stop that cancels, a fatal node verdict, a hang's culprits, the
first failure) is judged in one place, `classify.py`; these models only hold them.

- the launcher's `RunStatus` (state, each rank's exit code, restart count, heartbeat, `hung`);
- the run folder's records (`plugins/run/records.py`): every rank exit (torchrun's in-place
  restarts included), the launcher's stop, the control plane's stop reason, `diverged.json`,
  `checkpoint_corrupt.json`;
- the tail of each failed rank's log, read through the `Launcher` protocol (local or Kubernetes);
- the health of the gang's nodes as their agents reported it (`NodeObservation`), already
  narrowed to this attempt (another run's hang on the node is not this one's evidence).

Pure Python: no Airflow, no torch, no I/O.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from trainyard.node_agent.models import NodeHealth, RankHeartbeat
from trainyard.plugins.run.model import RunStatus
from trainyard.plugins.run.records import (
    CheckpointCorruptRecord,
    DivergenceRecord,
    RankRecord,
    StopReason,
    StopRequest,
)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class NodeObservation(_Record):
    """One node of the gang as the control plane last saw it (`classify.node_fatal_reasons`
    judges it)."""

    node: str
    health: NodeHealth | None = None
    missed_heartbeats: int = 0
    """Polls in a row that the agent did not answer (0 when `health` is fresh)."""
    error: str = ""
    """Why the last poll failed."""


class Evidence(_Record):
    """Everything `classify()` needs about one attempt."""

    job: str
    run: str = ""
    attempt: int = 0
    status: RunStatus
    gang_nodes: list[str] = Field(default_factory=list)
    """The gang's nodes in node-rank order: where its pods were bound (`RunHandle.bound`), the
    placement's before that."""
    max_restarts_in_place: int = 0
    """torchrun's `--max-restarts` for this attempt."""
    exits: list[RankRecord] = Field(default_factory=list)
    stop: StopRequest | None = None
    stop_reason: StopReason | None = None
    """Why the control plane stopped the gang (`plugins/attempt/watching.py`)."""
    diverged: DivergenceRecord | None = None
    checkpoint_corrupt: CheckpointCorruptRecord | None = None
    log_tails: dict[int, str] = Field(default_factory=dict)
    """Rank → the last lines of its log (failed ranks only)."""
    nodes: list[NodeObservation] = Field(default_factory=list)
    resume_from: str = ""
    """The checkpoint this attempt was told to restore (empty = the newest valid one)."""
    last_beats: dict[int, float] = Field(default_factory=dict)
    """Rank → the time of its last heartbeat (dates a hang: when progress stopped)."""
    last_alive: dict[int, float] = Field(default_factory=dict)
    """Rank → its writer's last sign of life (`Heartbeat.alive_at`): tells a frozen rank from
    the ranks waiting for it (`classify.hung_ranks`)."""
    hang_timeout_s: float | None = None
    """The job's hang timeout, as its heartbeats say."""
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def served_beats(self) -> list[RankHeartbeat]:
        """This attempt's rank heartbeats as the gang's node agents serve them (`nodes`, already
        narrowed to the attempt): what is left to read once a stopped Kubernetes Job took its
        pods' records."""
        return [b for n in self.nodes if n.health is not None for b in n.health.ranks]
