from __future__ import annotations

import pytest

from plugins.placement.layout import RankLayout


def test_rank_convention_is_tp_innermost_dp_outermost() -> None:
    layout = RankLayout(tp=2, pp=3, dp=2, ranks_per_node=2)
    for dp in range(2):
        for pp in range(3):
            for tp in range(2):
                rank = (dp * 3 + pp) * 2 + tp  # the brief's convention (cp = 1)
                assert layout.rank(dp, pp, 0, tp) == rank
                assert layout.coords(rank) == (dp, pp, 0, tp)


def test_groups_cover_every_rank_once_per_kind() -> None:
    layout = RankLayout(tp=2, pp=2, dp=3, cp=2, ranks_per_node=4)
    for kind, size in (("tp", 2), ("cp", 2), ("pp", 2), ("dp", 3)):
        groups = layout.groups(kind)
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(layout.world_size))


def test_tp_groups_stay_on_one_node_when_ranks_per_node_is_a_multiple_of_tp() -> None:
    layout = RankLayout(tp=4, pp=2, dp=2, ranks_per_node=8)
    assert all(len(nodes) == 1 for nodes in layout.group_nodes("tp"))
    # One pipeline = pp·tp = 8 ranks = exactly one node here.
    assert layout.nodes_per_pipeline() == 1
    assert RankLayout(tp=8, pp=4, dp=8, ranks_per_node=8).nodes_per_pipeline() == 4


def test_pp_group_of_the_seed_example_spans_the_replicas_nodes() -> None:
    # Seed §8: TP=8, PP=4, DP=8 on 8-GPU nodes: PP group 0 = GPUs 0, 8, 16, 24 on nodes 0-3.
    layout = RankLayout(tp=8, pp=4, dp=8, ranks_per_node=8)
    assert layout.groups("pp")[0] == [0, 8, 16, 24]
    assert layout.group_nodes("pp")[0] == [0, 1, 2, 3]
    assert layout.groups("dp")[0] == [0, 32, 64, 96, 128, 160, 192, 224]


def test_bad_layouts_name_the_values() -> None:
    with pytest.raises(ValueError, match=r"world size 12 .* not divisible by ranks per node 8"):
        RankLayout(tp=2, pp=3, dp=2, ranks_per_node=8)
    with pytest.raises(ValueError, match="tp must be at least 1, got 0"):
        RankLayout(tp=0, pp=1, dp=1)
    with pytest.raises(ValueError, match="unknown group kind"):
        RankLayout(tp=1, pp=1, dp=1).groups("ep")  # type: ignore[arg-type]
