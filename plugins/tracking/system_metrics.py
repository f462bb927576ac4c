"""System metrics (CPU, memory, disk, network, and GPUs through NVML where present) into a run.

MLflow's own `SystemMetricsMonitor` samples in a thread and logs `system/...` metrics. We
start it for an existing run id (the job's run, resumed across attempts) rather than through
`mlflow.start_run(log_system_metrics=True)`, which would tie it to a fluent run in this
process. With several nodes, each passes its `node_id` so the series stay apart
(`system/<node>/cpu_utilization_percentage`). `resume_logging=True` continues the step count
of an earlier attempt instead of writing over it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

log = logging.getLogger(__name__)


def start_system_metrics(
    run_id: str,
    *,
    tracking_uri: str,
    node_id: str | None = None,
    sampling_interval_s: float = 10.0,
    samples_before_logging: int = 1,
) -> SystemMetricsMonitor | None:
    """Start sampling; call `.finish()` on the result at the end. None if it cannot start
    (e.g. psutil missing): system metrics are a convenience, never a reason to fail a job."""
    if sampling_interval_s <= 0:
        raise ValueError(f"sampling_interval_s must be > 0, got {sampling_interval_s}")
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(
            run_id, sampling_interval=sampling_interval_s, samples_before_logging=samples_before_logging,
            resume_logging=True, node_id=node_id, tracking_uri=tracking_uri,
        )
        monitor.start()
    except Exception:
        log.warning("system metrics for run %s could not start", run_id, exc_info=True)
        return None
    return monitor
