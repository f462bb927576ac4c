"""Collectives on the topology: which links a group crosses and what that costs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainyard.plugins.advisor.comm import (
    COLLECTIVE_BASE_LATENCY_S,
    all_gather_s,
    all_reduce_s,
    exposed_s,
    group_levels,
    p2p_s,
    ring_latency_s,
)
from trainyard.plugins.advisor.hardware import CATALOG, hardware_from_spec
from trainyard.plugins.advisor.layout import PYTORCH
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.timing import layer_cost

H100 = hardware_from_spec(CATALOG["H100"], nodes_per_rack=4, oversubscription=2.0)


def test_tp_group_stays_on_nvlink() -> None:
    levels = group_levels(H100, ((8, 1),))
    assert [lv.size for lv in levels] == [8]
    assert levels[0].bandwidth == H100.intra_node_bandwidth


def test_dp_group_over_racks_crosses_the_spine() -> None:
    # 256 ranks of stride 8 (one per node): 4 nodes per rack, 64 racks
    levels = group_levels(H100, ((256, 8),))
    assert [lv.size for lv in levels] == [4, 64]
    assert levels[1].bandwidth == pytest.approx(H100.intra_rack_bandwidth / 2)


def test_hierarchical_all_reduce_divides_inter_node_traffic_by_gpus_per_node() -> None:
    nbytes = 1e9
    flat = all_reduce_s(group_levels(H100, ((32, 8),)), nbytes)  # one rank per node, 32 nodes
    packed = all_reduce_s(group_levels(H100, ((32, 1),)), nbytes)  # 8 ranks per node, 4 nodes
    assert packed < flat
    one_level = group_levels(H100, ((4, 8),))
    k = 4
    assert all_reduce_s(one_level, nbytes) == pytest.approx(
        2 * (k - 1) / k * nbytes / one_level[0].bandwidth + COLLECTIVE_BASE_LATENCY_S
        + 2 * 2 * one_level[0].latency)


def test_ring_latency_is_alpha_times_hops_by_level_as_nccl_counts_them() -> None:
    """NCCL's ring all-gather latency (src/graph/tuning.cc): baseLat + (nRanks − nNodes)·intra
    + (nNodes − 1)·inter. 512 ranks packed 8 per node in one rack of 64 nodes."""
    hw = hardware_from_spec(CATALOG["H100"], nodes_per_rack=64)
    levels = group_levels(hw, ((512, 1),))
    assert [lv.size for lv in levels] == [8, 64]
    nccl = (COLLECTIVE_BASE_LATENCY_S + (512 - 64) * hw.gpu.intra_node_latency_s
            + (64 - 1) * hw.gpu.inter_node_latency_s)
    assert ring_latency_s(levels) == pytest.approx(nccl)
    # α·(p − 1) grows linearly with the group: twice the ranks, about twice the latency.
    double = group_levels(replace(hw, nodes_per_rack=128), ((1024, 1),))
    assert ring_latency_s(double) == pytest.approx(2 * ring_latency_s(levels), rel=0.01)


def test_ring_bandwidth_is_the_slowest_level() -> None:
    """A pipelined ring runs at its bottleneck: with 8 GPUs (and 8 HCAs) per node, each HCA
    carries 1/8 of the bytes, so the network level costs (B/8)/bw_IB, NVLink (7/8)·B/bw_NVL,
    and the ring takes the larger, not their sum."""
    levels = group_levels(H100, ((32, 1),))  # 4 nodes of 8
    nbytes = 8e9
    nvlink = 7 / 8 * nbytes / H100.intra_node_bandwidth
    network = 3 / 4 * (nbytes / 8) / H100.intra_rack_bandwidth
    assert all_gather_s(levels, nbytes) == pytest.approx(max(nvlink, network) + ring_latency_s(levels))


def test_a_flat_ring_runs_at_one_link_per_gpu() -> None:
    """Without the node's HCAs sharing the traffic, each GPU's own network link carries
    (p−1)/p of the bytes: 8× the hierarchical ring's network term on 8-GPU nodes."""
    levels = group_levels(H100, ((32, 1),))
    nbytes = 8e9
    flat = all_gather_s(levels, nbytes, hierarchical=False) - ring_latency_s(levels)
    assert flat == pytest.approx(31 / 32 * nbytes / H100.intra_rack_bandwidth)
    assert flat > 7 * (all_gather_s(levels, nbytes) - ring_latency_s(levels))
    assert all_gather_s((), nbytes, hierarchical=False) == 0.0


def test_all_gather_is_half_an_all_reduce_in_bytes_but_a_ring_in_latency() -> None:
    levels = group_levels(H100, ((64, 8),))
    big = 1e10
    assert all_gather_s(levels, big) == pytest.approx(all_reduce_s(levels, big) / 2, rel=0.01)
    tiny = 1.0
    assert all_gather_s(levels, tiny, count=100) > all_reduce_s(levels, tiny, count=100)


def test_pipeline_hop_uses_the_slowest_link_of_the_chain() -> None:
    assert p2p_s(H100, stride=1, size=8, nbytes=1e9) == pytest.approx(
        1e9 / H100.intra_node_bandwidth + H100.gpu.intra_node_latency_s)
    assert p2p_s(H100, stride=8, size=4, nbytes=1e9) == pytest.approx(
        1e9 / H100.intra_rack_bandwidth + H100.gpu.inter_node_latency_s)
    assert p2p_s(H100, stride=8, size=8, nbytes=1e9) > p2p_s(H100, stride=8, size=4, nbytes=1e9)


def test_overlap_hides_comm_up_to_the_window() -> None:
    assert exposed_s(1.0, 10.0) == pytest.approx(0.1)
    assert exposed_s(1.0, 0.5) == pytest.approx(0.5)
    assert exposed_s(1.0, 10.0, overlap=0.0) == 1.0


def test_tp_collectives_cost_nothing_without_tp_and_grow_across_nodes() -> None:
    model = ModelProfile(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                         ffn_hidden_size=14336, vocab_size=128256, sequence_length=8192,
                         global_batch_size=64)
    assert layer_cost(model, H100, PYTORCH, 1, 1, 1, False, 1).tp_collective == 0
    in_node = layer_cost(model, H100, PYTORCH, 1, 8, 1, False, 1).tp_collective
    small_nodes = replace(H100, gpus_per_node=4)
    across = layer_cost(model, small_nodes, PYTORCH, 1, 8, 1, False, 1).tp_collective
    # A ring over 2 nodes of 4: each of the 4 HCAs carries half of a GPU's bytes at 1/9 of
    # NVLink's bandwidth — the network level is the ring's bottleneck.
    assert across > 1.25 * in_node
