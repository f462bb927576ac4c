"""Build small clusters and requests for placement tests (real `Cluster` models, via YAML-shaped dicts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainyard.config.cluster import Cluster
from trainyard.plugins.placement.inventory import Inventory


def make_cluster(racks: Sequence[tuple[int, int, str]] | Sequence[tuple[int, int, str, int]],
                 health: Mapping[str, Mapping[str, Any]] | None = None, name: str = "test") -> Cluster:
    """`racks`: (nodes, gpus per node, gpu type[, how many such racks]); racks are named
    `r<i>` and nodes `r<i>-n<j>`."""
    templates = []
    index = 0
    for spec in racks:
        nodes, gpus, gpu_type, *count = spec
        for _ in range(count[0] if count else 1):
            templates.append({"name": f"r{index}", "nodes": [
                {"name": "{rack}-n{index}", "count": nodes, "gpuType": gpu_type, "gpusPerNode": gpus}]})
            index += 1
    return Cluster.model_validate({
        "apiVersion": "training.platform/v1", "kind": "Cluster", "metadata": {"name": name},
        "spec": {"racks": templates, "health": dict(health or {})},
    })


def inventory(racks: Sequence[tuple], health: Mapping[str, Mapping[str, Any]] | None = None) -> Inventory:
    return Inventory.from_cluster(make_cluster(racks, health))


def busy(inv: Inventory, used: Mapping[str, int]) -> dict[str, int]:
    """Free map with `used` devices taken per node."""
    return inv.free_map(used)
