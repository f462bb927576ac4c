"""An independent check of a placement's hard constraints.

The search never builds a candidate that breaks one; this checker does not trust it. Tests
(and the benchmark's `violations` count) run every placement through it.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest, Placement


def hard_violations(
    placement: Placement,
    request: GangRequest,
    inventory: Inventory,
    free: Mapping[str, int],
) -> list[str]:
    """Every hard constraint `placement` breaks, as sentences (empty when it holds)."""
    out: list[str] = []
    if placement.layout.world_size != request.layout.world_size:
        out.append(f"world size {placement.layout.world_size} != requested {request.layout.world_size}")
    names = placement.node_names
    if len(names) != len(set(names)):
        out.append("a node appears twice")
    for index, placed in enumerate(placement.nodes):
        node = inventory.by_name.get(placed.name)
        if node is None:
            out.append(f"{placed.name}: not in the inventory")
            continue
        if node.gpu_type != request.gpu_type:
            out.append(f"{placed.name}: GPU type {node.gpu_type} != {request.gpu_type}")
        if not node.healthy:
            out.append(f"{placed.name}: unhealthy")
        if placed.name in request.exclude:
            out.append(f"{placed.name}: excluded")
        if placed.slots > int(free.get(placed.name, 0)):
            out.append(f"{placed.name}: uses {placed.slots} devices, {free.get(placed.name, 0)} free")
        if placed.slots != placement.layout.ranks_per_node:
            out.append(f"{placed.name}: {placed.slots} ranks, placement says {placement.layout.ranks_per_node}")
        if placed.node_rank != index or placed.first_rank != index * placement.layout.ranks_per_node:
            out.append(f"{placed.name}: node rank {placed.node_rank} / first rank {placed.first_rank} "
                       f"out of order at position {index}")
    layout = placement.layout
    for group, nodes in enumerate(layout.group_nodes("tp")):
        if len(nodes) != 1:
            out.append(f"TP group {group} spans {len(nodes)} nodes")
    return out
