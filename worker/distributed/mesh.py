"""The device mesh of a plan, and the plan a standalone run uses when none is given.

The mesh always has the four named dimensions `pp`, `dp`, `cp`, `tp` (size 1 when a technique
is off), outermost first: tensor parallelism talks most and gets the innermost (fastest,
intra-node) dimension, pipeline parallelism the outermost — the same order as torchtitan's
`ParallelDims`. The order is `RankLayout`'s (`plugins/advisor/rank_layout.py`), which the
placer uses too, so the ranks it keeps in a node or a rack are the ranks this mesh groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import MESH_DIMS, RankLayout

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["MESH_DIMS", "build_mesh", "default_plan", "mesh_shape"]


def mesh_shape(plan: Plan) -> tuple[int, ...]:
    return plan.layout.shape


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """`init_device_mesh` over the plan's degrees; the process group must be initialised."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    plan.layout.check_world_size(dist.get_world_size())
    return init_device_mesh(device_type, mesh_shape(plan), mesh_dim_names=MESH_DIMS)


def default_plan(world_size: int, *, global_batch_size: int, sequence_length: int | None = None,
                 zero_stage: int = 0) -> Plan:
    """Plain data parallelism over every process (DDP, or FSDP2 with `zero_stage` 3): what a
    standalone debugging run uses when no advisor plan is given."""
    if global_batch_size % world_size:
        raise ValueError(f"global batch size ({global_batch_size}) is not divisible by the "
                         f"world size ({world_size})")
    return Plan(layout=RankLayout(dp=world_size), zero_stage=zero_stage,  # type: ignore[arg-type]
                micro_batch_size=global_batch_size // world_size, num_micro_batches=1,
                global_batch_size=global_batch_size, sequence_length=sequence_length)
