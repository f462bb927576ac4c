"""The placer groups ranks exactly as the worker's device mesh does, for every plan shape the
advisor can return — so "TP in a node, a pipeline in a rack" holds for the groups that run.

The mesh's groups are computed the way `torch.distributed.device_mesh.DeviceMesh` forms its
process groups (`mesh.swapdims(-1, dim).reshape(-1, mesh.size(dim))` over
`arange(world).reshape(mesh_shape(plan))`), from the worker's own `mesh_shape` and `MESH_DIMS`.
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.placement.placement_fixtures import inventory
from trainyard.plugins.advisor.hardware import CATALOG, hardware_from_spec
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.planner import plan_auto
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.placement.constraints import hard_violations
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.model import GangRequest
from trainyard.worker.distributed.mesh import MESH_DIMS, mesh_shape

H100 = hardware_from_spec(CATALOG["H100"])
SMALL = ModelProfile(hidden_size=2048, num_layers=8, num_heads=16, num_kv_heads=4,
                     ffn_hidden_size=5632, vocab_size=32000, sequence_length=2048,
                     global_batch_size=32)
LLAMA7B = ModelProfile(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                       ffn_hidden_size=11008, vocab_size=32000, sequence_length=4096,
                       global_batch_size=256)
LONG = ModelProfile(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                    ffn_hidden_size=14336, vocab_size=128256, sequence_length=32768,
                    global_batch_size=64)


def mesh_groups(plan: Plan) -> dict[str, set[frozenset[int]]]:
    mesh = torch.arange(plan.layout.world_size).reshape(mesh_shape(plan))
    out = {}
    for dim, name in enumerate(MESH_DIMS):
        rows = mesh.swapdims(-1, dim).reshape(-1, mesh.size(dim)).tolist()
        out[name] = {frozenset(r) for r in rows}
    return out


def searched_shapes() -> list[tuple[int, int, int, int]]:
    shapes = set()
    for model, gpus in ((SMALL, 8), (SMALL, 16), (SMALL, 32), (LLAMA7B, 16), (LLAMA7B, 64),
                        (LONG, 64)):
        result = plan_auto(model, H100, gpus, top_k=40)
        for plan in [result.best, *result.alternatives]:
            assert plan is not None
            shapes.add((plan.layout.tp, plan.layout.pp, plan.layout.dp, plan.layout.cp))
    return sorted(shapes)


SHAPES = searched_shapes()


def test_the_search_returns_varied_shapes() -> None:
    assert any(tp > 1 and pp > 1 for tp, pp, _, _ in SHAPES)
    assert len(SHAPES) >= 8


@pytest.mark.parametrize(("shape", "gpus_per_node"), [
    (shape, per_node) for per_node in (8, 4) for shape in [*SHAPES, (2, 2, 2, 1)]
    if shape[0] <= per_node],  # TP larger than a node is refused before placement
    ids=lambda v: "tp{}pp{}dp{}cp{}".format(*v) if isinstance(v, tuple) else f"{v}gpn")
def test_placer_groups_equal_mesh_groups(shape: tuple[int, int, int, int], gpus_per_node: int) -> None:
    tp, pp, dp, cp = shape
    plan = Plan(layout=RankLayout(tp=tp, pp=pp, dp=dp, cp=cp))
    inv = inventory([(4, gpus_per_node, "H100", 8)])
    request = GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=tp, pp=pp, dp=dp, cp=cp))
    placement = place_gang(request, inv)
    assert hard_violations(placement, request, inv, inv.free_map()) == []
    expected = mesh_groups(plan)
    for kind in MESH_DIMS:
        placed = {frozenset(g.ranks) for g in placement.groups_of(kind)}
        if getattr(plan.layout, kind) == 1:
            assert placed == set()  # the placer lists only groups of more than one rank
        else:
            assert placed == expected[kind], kind
    # Each node holds the ranks torchrun gives it, and the coordinates it reports are the mesh's.
    coords = torch.arange(plan.layout.world_size).reshape(mesh_shape(plan))
    for node in placement.nodes:
        ranks = range(node.first_rank, node.first_rank + node.slots)
        stages = sorted({int((coords == r).nonzero()[0][0]) for r in ranks})
        replicas = sorted({int((coords == r).nonzero()[0][1]) for r in ranks})
        assert (node.pp_stages, node.dp_replicas) == (stages, replicas)


def test_tp2_pp2_dp2_pipelines_stay_in_a_rack() -> None:
    # The bug case: with DP outermost in the placer, ranks 2-5 had other (dp, pp) coordinates
    # than in the worker, so the rack rule kept the wrong ranks together.
    inv = inventory([(2, 2, "H100", 4)])
    request = GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=2, pp=2, dp=2), require_pp_in_rack=True)
    placement = place_gang(request, inv)
    pp_groups = placement.groups_of("pp")
    assert {frozenset(g.ranks) for g in pp_groups} == mesh_groups(Plan(layout=RankLayout(tp=2, pp=2, dp=2)))["pp"]
    assert placement.pp_groups_in_one_rack() == (len(pp_groups), len(pp_groups))
