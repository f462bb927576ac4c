"""`NodeHealth`: what a node agent says about its node (DESIGN §1 contract, §8).

The control plane's deferrable sensors parse this JSON every few seconds, so this module
imports only pydantic and the standard library: importing it from a sensor or a trigger must
stay cheap (no NVML, no prometheus_client, no HTTP server).

Times are Unix seconds (floats), like `Heartbeat.time`. Every model ignores unknown fields so
a control plane keeps parsing the reports of a newer agent during a rolling upgrade.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainyard.plugins.run.heartbeat import DataFigures

VerdictKind = Literal["gpu_failed", "thermal", "hang", "node_unhealthy", "no_gpu"]
"""
- `gpu_failed`: a fatal Xid, an uncorrectable ECC error, or the GPU is lost (seed §5).
- `thermal`: the GPU stayed above the thermal threshold (83 °C) for the whole window (60 s).
- `hang`: a rank's heartbeat is older than its job's hang timeout (no step progress).
- `node_unhealthy`: the node as a whole is unfit (today only by fault injection; a place for
  future checks such as a full disk or a lost NIC).
- `no_gpu`: informational; NVML is not usable here, so the node reports CPU slots.
"""

UNHEALTHY_KINDS: tuple[str, ...] = ("gpu_failed", "thermal", "node_unhealthy")
"""Verdicts that make the node unfit for training. `hang` concerns one job's ranks, not the
node (the node may be fine and the job's code stuck), and `no_gpu` is information."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Verdict(_Model):
    """One thing wrong (or notable) on the node, with the evidence in `reason`."""

    kind: VerdictKind
    reason: str
    since: float
    """When the underlying condition began: the Xid event, the first sample above the
    thermal threshold, the rank's last heartbeat, the fault injection."""
    gpu: int | None = None
    """GPU index (the NVML index; on a CPU node, the slot index) for GPU verdicts."""
    xid: int | None = None
    job: str | None = None
    run: str | None = None
    attempt: int | None = None
    rank: int | None = None
    step: int | None = None
    """A hang: the rank's last step (the lowest step of a gang is its laggard)."""
    frozen: bool | None = None
    """A hang: the rank's process gave no sign of life either (stopped, or stuck holding the
    interpreter) — False: alive, its step stuck (waiting for a peer?); None: cannot tell."""
    injected: bool = False
    """Made by `POST /faults` (tests, game days), not observed."""

    def about(self, job: str, run: str, attempt: int) -> bool:
        """Whether this verdict concerns that attempt: a node verdict (a GPU, the node: no job)
        concerns every attempt on the node; a rank verdict only its own job, run and attempt."""
        return self.job is None or (self.job == job and (self.run or "") == run and self.attempt == attempt)


class GpuStatus(_Model):
    """One GPU as NVML last saw it. A field is None where the GPU does not support it."""

    index: int
    name: str = ""
    uuid: str = ""
    utilization_ratio: float | None = None
    """Fraction of the last sample period in which a kernel ran (NVML's `gpu` utilisation / 100)."""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    ecc_volatile_uncorrectable: int | None = None
    """Uncorrectable ECC errors since the last driver load; > 0 fails the GPU."""
    ecc_aggregate_uncorrectable: int | None = None
    """Lifetime uncorrectable ECC errors (survives reboots): reported, not judged, because a
    GPU whose rows were remapped and reset is usable again yet keeps this count."""
    xid_events: dict[int, int] = Field(default_factory=dict)
    """Xid code → events seen since the agent started (real and injected)."""
    lost: bool = False
    """NVML answered `GPU is lost` for this GPU."""


class RankHeartbeat(_Model, DataFigures):
    """The latest heartbeat of one training rank on this node, judged against its job."""

    job: str
    run: str = ""
    """The training run (one trigger of the job); "" from a runtime that does not say."""
    attempt: int
    rank: int
    local_rank: int = 0
    pid: int
    phase: str
    step: int
    time: float
    """Unix time of the heartbeat."""
    signal: Literal["steps", "activity"] = "steps"
    """What dates `time` (`Heartbeat.signal`): the rank's steps, or its activity (a plain script)."""
    restart: int = 0
    """The gang's in-place restarts before this incarnation (`Heartbeat.restart`)."""
    age_s: float
    loss: float | None = None
    tokens_per_s: float | None = None
    nan: bool = False
    hang_timeout_s: float
    stale: bool
    """Older than `hang_timeout_s` while the rank has not finished and its process may live."""
    alive_at: float | None = None
    """The writer's last sign of life (`Heartbeat.alive_at`)."""
    frozen: bool | None = None
    """No sign of life for half the hang timeout (`Heartbeat.frozen`; None for a finished or
    gone rank, or a writer that does not say)."""
    gone: bool = False
    """The rank's process is gone (the agent shares its PID namespace and found no such live
    process): a cancelled, crashed or finished run, not a hang."""
    path: str = ""


class NodeHealth(_Model):
    """The report served at `GET /health`."""

    node: str
    time: float
    healthy: bool
    """False when a verdict in `UNHEALTHY_KINDS` holds."""
    verdicts: list[Verdict] = Field(default_factory=list)
    accelerator: Literal["nvidia", "cpu"]
    gpus: list[GpuStatus] = Field(default_factory=list)
    slots: int = 0
    """CPU slots offered for training when the node has no usable NVIDIA GPU (else 0)."""
    driver_version: str | None = None
    probe_error: str | None = None
    """Why NVML is not usable here (e.g. `NVMLError_LibraryNotFound: …`), else None."""
    ranks: list[RankHeartbeat] = Field(default_factory=list)
    invalid_heartbeat_files: int = 0
    """Files named like heartbeats that did not parse (skipped, warned about once each)."""
    invalid_heartbeats: dict[str, str] = Field(default_factory=dict)
    """Path → why it was skipped, for the first few of them: the file to look at."""
    uptime_s: float
    fault_injection: bool = False

    @property
    def failed_gpus(self) -> list[int]:
        """Indexes of GPUs with a `gpu_failed` verdict, sorted."""
        return sorted({v.gpu for v in self.verdicts if v.kind == "gpu_failed" and v.gpu is not None})

    def verdicts_for(self, job: str, attempt: int | None = None, *, run: str | None = None) -> list[Verdict]:
        """The rank verdicts (hangs) of one job (and run, and attempt, when given)."""
        return [v for v in self.verdicts if v.job == job and (attempt is None or v.attempt == attempt)
                and (run is None or v.run == run)]

    def about(self, job: str, run: str, attempt: int) -> NodeHealth:
        """This report as one attempt's evidence: the node's own verdicts and that attempt's
        rank verdicts and ranks; another run's (or attempt's) are not its evidence."""
        return self.model_copy(update={
            "verdicts": [v for v in self.verdicts if v.about(job, run, attempt)],
            "ranks": [r for r in self.ranks if (r.job, r.run, r.attempt) == (job, run, attempt)]})

    def unhealthy_verdicts(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.kind in UNHEALTHY_KINDS]


class FaultRequest(BaseModel):
    """Body of `POST /faults` (only with `--enable-fault-injection`): exactly one fault.

    `{"gpu": 3, "xid": 79}` feeds an Xid event for GPU 3 through the same path as a real one
    (a fatal Xid fails the GPU; a benign one is only counted). On a CPU node the index is a
    slot index, so the local stack can rehearse GPU failures. `{"node_unhealthy": true,
    "reason": "..."}` marks the whole node unhealthy. `DELETE /faults` clears both kinds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: int | None = Field(default=None, ge=0)
    xid: int = Field(default=79, ge=1)
    node_unhealthy: bool = False
    reason: str = ""

    @model_validator(mode="after")
    def _one_fault(self) -> FaultRequest:
        if (self.gpu is None) == (not self.node_unhealthy):
            raise ValueError(
                f"give exactly one fault: a GPU index (gpu={self.gpu}) or node_unhealthy=true "
                f"(node_unhealthy={self.node_unhealthy})"
            )
        return self
