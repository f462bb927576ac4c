"""First-fit: the baseline the benchmark compares the topology-aware search against.

It honours the same hard constraints (type, health, exclusions, TP inside a node, all or
nothing) but takes the first eligible nodes in inventory order, blind to racks.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainyard.plugins.placement.gang import build_placement, slots_per_node_options
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest, PendingReason, Placement, Unschedulable
from trainyard.plugins.placement.scoring import ScoreWeights


def place_first_fit(request: GangRequest, inventory: Inventory, free: Mapping[str, int]) -> Placement:
    per_node = inventory.gpus_per_node(request.gpu_type)
    for k in slots_per_node_options(request, per_node) if request.layout.tp <= per_node else ():
        layout = request.layout.with_ranks_per_node(k)
        chosen = []
        for node in inventory.nodes:
            if (node.gpu_type == request.gpu_type and node.healthy and node.name not in request.exclude
                    and int(free.get(node.name, 0)) >= k):
                chosen.append(node)
                if len(chosen) == layout.num_nodes:
                    return build_placement(request, layout, chosen, inventory, free,
                                           weights=ScoreWeights(), strategy="first-fit")
    raise Unschedulable.of(PendingReason(code="not_enough_nodes", gpu_type=request.gpu_type,
                                      message="first-fit found too few free nodes"))
