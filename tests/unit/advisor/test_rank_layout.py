from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import MESH_DIMS, RankLayout
from trainyard.plugins.placement.model import GangRequest, Placement


def test_rank_order_is_the_meshs_pp_dp_cp_tp() -> None:
    layout = RankLayout(tp=2, pp=3, dp=2, ranks_per_node=2)
    assert MESH_DIMS == ("pp", "dp", "cp", "tp")
    assert layout.shape == (3, 2, 1, 2)
    for pp in range(3):
        for dp in range(2):
            for tp in range(2):
                rank = (pp * 2 + dp) * 2 + tp
                assert layout.rank(pp=pp, dp=dp, tp=tp) == rank
                assert layout.coords(rank) == (pp, dp, 0, tp)
                assert layout.coords(rank).dp == dp


def test_groups_cover_every_rank_once_per_kind() -> None:
    layout = RankLayout(tp=2, pp=2, dp=3, cp=2, ranks_per_node=4)
    for kind, size in (("tp", 2), ("cp", 2), ("pp", 2), ("dp", 3)):
        groups = layout.groups(kind)
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(layout.world_size))
        for group in groups:  # members differ only in their `kind` coordinate
            others = {tuple(v for d, v in zip(MESH_DIMS, layout.coords(r), strict=True) if d != kind) for r in group}
            assert len(others) == 1


def test_strides_follow_the_order() -> None:
    layout = RankLayout(tp=2, pp=4, dp=3, cp=2)
    assert [layout.stride(d) for d in ("tp", "cp", "dp", "pp")] == [1, 2, 4, 12]


def test_tp_groups_stay_on_one_node_when_ranks_per_node_is_a_multiple_of_tp() -> None:
    layout = RankLayout(tp=4, pp=2, dp=2, ranks_per_node=8)
    assert all(len(nodes) == 1 for nodes in layout.group_nodes("tp"))


def test_a_replica_spans_pp_nodes_spaced_by_the_pp_stride() -> None:
    # TP=8, PP=4, DP=8 on 8-GPU nodes: PP group 0 = ranks 0, 64, 128, 192 on nodes 0, 8, 16, 24.
    layout = RankLayout(tp=8, pp=4, dp=8, ranks_per_node=8)
    assert layout.groups("pp")[0] == [0, 64, 128, 192]
    assert layout.group_nodes("pp")[0] == [0, 8, 16, 24]
    assert layout.groups("dp")[0] == [0, 8, 16, 24, 32, 40, 48, 56]
    assert layout.replica_nodes()[1] == [1, 9, 17, 25]
    assert layout.nodes_per_pipeline() == 4 and layout.replicas_tile_nodes()
    # Several replicas' stages share a node: still pp nodes per set.
    assert RankLayout(tp=2, pp=2, dp=4, ranks_per_node=4).replica_nodes() == [[0, 2], [1, 3]]
    # Everything inside one node.
    assert RankLayout(tp=2, pp=2, dp=2, ranks_per_node=8).replica_nodes() == [[0]]


def test_node_cuts_across_stage_blocks_join_the_replicas() -> None:
    # pp 2, dp 3, tp 2 at 4 ranks per node: stage blocks of 6 ranks straddle nodes, so every
    # node shares a PP group with every other: one set, placed as one unit.
    layout = RankLayout(tp=2, pp=2, dp=3, ranks_per_node=4)
    assert layout.replica_nodes() == [[0, 1, 2]] and layout.replicas_tile_nodes()


def test_bad_layouts_name_the_values() -> None:
    with pytest.raises(ValueError, match=r"world size 12 .* not divisible by ranks per node 8"):
        RankLayout(tp=2, pp=3, dp=2, ranks_per_node=8)
    with pytest.raises(ValueError, match="tp must be an integer of at least 1, got 0"):
        RankLayout(tp=0, pp=1, dp=1)
    with pytest.raises(ValueError, match="unknown group kind"):
        RankLayout(tp=1, pp=1, dp=1).groups("ep")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside"):
        RankLayout(tp=2).coords(2)


def test_contracts_carry_the_degrees_as_a_rank_layout_and_read_the_flat_form_written_before() -> None:
    # A plan in XCom of a job started before #59 has flat degrees; it loads as the nested form.
    old = '{"tp": 2, "pp": 1, "dp": 4, "cp": 1, "micro_batch_size": 2, "num_micro_batches": 3}'
    plan = Plan.model_validate_json(old)
    assert plan == Plan(layout=RankLayout(tp=2, dp=4), micro_batch_size=2, num_micro_batches=3)
    dumped = json.loads(plan.model_dump_json())
    assert dumped["layout"] == {"tp": 2, "pp": 1, "dp": 4, "cp": 1, "ranks_per_node": 1}
    assert not {"tp", "pp", "dp", "cp"} & set(dumped)
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
    # A reservation row's placement: the ranks per node travel into the layout too.
    node = {"name": "n0", "rack": "r0", "address": "10.0.0.1", "gpu_type": "H100", "node_gpus": 8,
            "node_rank": 0, "first_rank": 0, "slots": 8}
    placement = Placement.model_validate({"job": "j", "gpu_type": "H100", "tp": 8, "pp": 1, "dp": 1,
                                          "ranks_per_node": 8, "nodes": [node]})
    assert placement.layout == RankLayout(tp=8, ranks_per_node=8)
    request = GangRequest.model_validate({"job": "j", "gpu_type": "H100", "tp": 8, "dp": 2})
    assert request.layout == RankLayout(tp=8, dp=2) and request.layout.world_size == 16


def test_a_contract_with_both_forms_or_a_plan_with_ranks_per_node_is_refused() -> None:
    with pytest.raises(ValidationError, match="tp"):
        Plan.model_validate({"layout": {"tp": 2}, "tp": 2})
    with pytest.raises(ValidationError, match="one rank per node"):
        Plan(layout=RankLayout(tp=2, ranks_per_node=2))
    with pytest.raises(ValidationError, match="is not divisible by ranks per node 8"):
        Placement.model_validate({"job": "j", "gpu_type": "H100", "layout": {"tp": 3, "ranks_per_node": 8},
                                  "nodes": []})
