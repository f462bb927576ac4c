"""`AgentConfig`: everything one node agent is told, validated once (the CLI builds it)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_PORT = 9420
"""Not 9400 (dcgm-exporter's) so both can run on a node with host networking."""


class AgentConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    node: str = Field(min_length=1)
    """The node's name as the cluster knows it (Kubernetes: `spec.nodeName`)."""
    heartbeat_dir: Path
    """Root under which workers write `rank-*.json` heartbeats (searched recursively)."""
    host: str = "0.0.0.0"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    """0 asks the OS for a free port (tests)."""
    poll_interval_s: float = Field(default=5.0, gt=0)
    """How often NVML is sampled; a scrape reads the last sample, never NVML itself."""
    thermal_threshold_c: float = 83.0
    thermal_window_s: float = Field(default=60.0, ge=0)
    cpu_slots: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=0)
    """Slots reported when the node has no usable NVIDIA GPU."""
    forget_after_s: float = Field(default=86400.0, ge=0)
    """Heartbeats older than this are left out of reports (0 keeps them forever): a job that
    died without cleaning up must not show as hung on this node for ever."""
    forget_finished_after_s: float = Field(default=600.0, ge=0)
    """An attempt whose ranks all finished (`done`, `diverged`) is left out of reports this
    long after its last heartbeat; an attempt followed by a newer one of the same job on this
    node is left out at once (it ended before the next could start)."""
    xid_wait_ms: int = Field(default=1000, ge=1)
    """How long one NVML event wait blocks; bounds how long `stop()` takes."""
    enable_fault_injection: bool = False
