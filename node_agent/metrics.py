"""Prometheus exposition of a node's health, rendered from one `NodeHealth` at scrape time.

A custom collector on a private `CollectorRegistry` (no process-global metrics, so tests can
run several agents in one process): every scrape takes one report from the `Monitor` (which
reads the last NVML sample, never NVML itself) and turns it into metric families. Names follow
Prometheus conventions: base units in the name (`_celsius`, `_bytes`, `_watts`, `_seconds`),
ratios as `_ratio`, counters ending in `_total`. Every series carries the `node` label so a
federated or service-level scrape keeps them apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from trainyard.node_agent.models import NodeHealth, RankHeartbeat, VerdictKind
from trainyard.node_agent.monitor import Monitor

_GPU_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("trainyard_gpu_temperature_celsius", "temperature_celsius", "GPU core temperature."),
    ("trainyard_gpu_memory_used_bytes", "memory_used_bytes", "GPU memory in use."),
    ("trainyard_gpu_memory_total_bytes", "memory_total_bytes", "GPU memory installed."),
    ("trainyard_gpu_utilization_ratio", "utilization_ratio", "Fraction of the last sample period a kernel ran."),
    ("trainyard_gpu_power_watts", "power_watts", "GPU board power draw."),
)

_RANK_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("trainyard_rank_heartbeat_age_seconds", "age_s", "Seconds since the rank's last heartbeat."),
    ("trainyard_rank_step", "step", "Last training step the rank reported."),
    ("trainyard_rank_loss", "loss", "Loss the rank reported at its last step."),
    ("trainyard_rank_tokens_per_second", "tokens_per_s", "Throughput the rank reported at its last step."),
    ("trainyard_rank_hang_timeout_seconds", "hang_timeout_s", "The job's hang timeout."),
    ("trainyard_rank_nan", "nan", "1 when the rank's last loss was NaN or infinite."),
    ("trainyard_rank_stale", "stale", "1 when the heartbeat is older than the hang timeout."),
    ("trainyard_rank_data_stall_seconds", "data_stall_s", "Seconds the rank's last step waited for data."),
    ("trainyard_rank_data_prefetch_depth", "prefetch_depth", "Batches ready in the rank's data queue."),
    ("trainyard_rank_data_cache_hit_ratio", "cache_hit_rate", "Share of shard opens the node cache served."),
    ("trainyard_rank_data_cache_hits", "cache_hits", "Shard-cache hits of the rank's process so far."),
    ("trainyard_rank_data_cache_misses", "cache_misses", "Shard-cache misses of the rank's process so far."),
    ("trainyard_rank_data_cache_fetched_bytes", "cache_bytes_fetched", "Bytes the rank's process fetched into the cache."),
    ("trainyard_rank_data_cache_evictions", "cache_evictions", "Shards the rank's process evicted from the cache."),
)

_RANK_LABELS = ("node", "job", "run", "attempt", "rank")


class NodeHealthCollector(Collector):
    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor

    def collect(self) -> Iterator[Metric]:
        health = self._monitor.health()
        yield from _node_metrics(health)
        yield from _gpu_metrics(health)
        yield from _xid_metrics(health.node, self._monitor.xid_counts())
        yield from _rank_metrics(health)


def build_registry(monitor: Monitor) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeHealthCollector(monitor))
    return registry


def _node_metrics(health: NodeHealth) -> Iterator[Metric]:
    node = health.node
    healthy = GaugeMetricFamily("trainyard_node_healthy", "1 when no verdict makes the node unfit for training.",
                                labels=["node"])
    healthy.add_metric([node], 1.0 if health.healthy else 0.0)
    yield healthy
    verdicts = GaugeMetricFamily("trainyard_node_verdicts", "Verdicts holding now, by kind.", labels=["node", "kind"])
    for kind in get_args(VerdictKind):
        verdicts.add_metric([node, kind], float(sum(1 for v in health.verdicts if v.kind == kind)))
    yield verdicts
    devices = GaugeMetricFamily("trainyard_node_devices", "Training devices the node offers.",
                                labels=["node", "type"])
    devices.add_metric([node, "gpu"], float(len(health.gpus)))
    devices.add_metric([node, "cpu_slot"], float(health.slots))
    yield devices
    invalid = GaugeMetricFamily("trainyard_heartbeat_invalid_files", "Heartbeat files skipped because they did not parse.",
                                labels=["node"])
    invalid.add_metric([node], float(health.invalid_heartbeat_files))
    yield invalid
    start = GaugeMetricFamily("trainyard_agent_start_time_seconds", "Unix time the node agent started.", labels=["node"])
    start.add_metric([node], health.time - health.uptime_s)
    yield start


def _gpu_metrics(health: NodeHealth) -> Iterator[Metric]:
    labels = ["node", "gpu", "uuid", "model"]
    for name, field, doc in _GPU_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=labels)
        for gpu in health.gpus:
            value = getattr(gpu, field)
            if value is not None:
                family.add_metric([health.node, str(gpu.index), gpu.uuid, gpu.name], float(value))
        yield family
    ecc = CounterMetricFamily("trainyard_gpu_ecc_uncorrectable_errors",
                              "Uncorrectable ECC errors: volatile (since driver load) and aggregate (lifetime).",
                              labels=[*labels, "counter"])
    failed = GaugeMetricFamily("trainyard_gpu_failed", "1 when a gpu_failed verdict holds for the GPU.",
                               labels=["node", "gpu"])
    for gpu in health.gpus:
        key = [health.node, str(gpu.index), gpu.uuid, gpu.name]
        for counter, value in (("volatile", gpu.ecc_volatile_uncorrectable),
                               ("aggregate", gpu.ecc_aggregate_uncorrectable)):
            if value is not None:
                ecc.add_metric([*key, counter], float(value))
    failed_indexes = set(health.failed_gpus)
    for index in sorted(failed_indexes | {g.index for g in health.gpus}):
        failed.add_metric([health.node, str(index)], 1.0 if index in failed_indexes else 0.0)
    yield ecc
    yield failed


def _xid_metrics(node: str, counts: dict[int | None, dict[int, int]]) -> Iterator[Metric]:
    family = CounterMetricFamily("trainyard_gpu_xid_events", "Xid events seen since the agent started.",
                                 labels=["node", "gpu", "xid"])
    for gpu, by_xid in sorted(counts.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        for xid, count in sorted(by_xid.items()):
            family.add_metric([node, "unknown" if gpu is None else str(gpu), str(xid)], float(count))
    yield family


def _rank_metrics(health: NodeHealth) -> Iterator[Metric]:
    for name, field, doc in _RANK_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=list(_RANK_LABELS))
        for rank in health.ranks:
            value = _sample(getattr(rank, field))
            if value is not None:
                family.add_metric(_rank_key(health.node, rank), value)
        yield family


def _sample(value: object) -> float | None:
    """A float for Prometheus, or None: one rank's odd value must never fail the scrape of the
    whole node (the heartbeat model bounds values already; this is the last guard)."""
    if value is None:
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return None


def _rank_key(node: str, rank: RankHeartbeat) -> list[str]:
    return [node, rank.job, rank.run, str(rank.attempt), str(rank.rank)]
