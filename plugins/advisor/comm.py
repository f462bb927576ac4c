"""Collective and point-to-point times on the cluster's topology.

A process group is described by the mesh dimensions it spans — (size, stride) pairs in the
rank order tp, cp, dp, pp (`plugins/advisor/layout.py`). From the strides we know how many of
its members share a node (NVLink), how many more share a rack (InfiniBand under one leaf) and
how many racks it crosses (InfiniBand through the spine, divided by its oversubscription):
levels of k₁ (node), k₂ (nodes in a rack), k₃ (racks) members, p = k₁·k₂·k₃.

Every collective costs a latency term plus a bandwidth term, α·(p − 1) + bytes/bandwidth,
with both split over the levels (NCCL's own cost model, `src/graph/tuning.cc`):

- **Ring** (NCCL's all-gather and reduce-scatter at every size, and its all-reduce for large
  messages): a pipelined ring through all p members. Latency: the sum of its p − 1 hops, each
  at the latency of the link it crosses — k₃·k₂·(k₁−1) NVLink hops, k₃·(k₂−1) leaf hops,
  k₃ − 1 spine hops (NCCL: (nRanks − nNodes)·intraLat + (nNodes − 1)·interLat) — plus NCCL's
  fixed `baseLat`. Bandwidth: the slowest level's links. Each node has one HCA per GPU, so a
  level's links carry what the level below left: (kᵢ−1)/kᵢ · Bᵢ with B₁ = B, Bᵢ₊₁ = Bᵢ/kᵢ; the
  pipelined ring runs at the slowest of those, max over i of (kᵢ−1)/kᵢ·Bᵢ/bwᵢ.
- **Tree / hierarchical** (NCCL's all-reduce at scale): 2·⌈log₂ kᵢ⌉ hops per level, and the
  levels one after the other (reduce inside the node, across nodes, broadcast back): the
  per-level bandwidth terms add up.

All-gather and reduce-scatter move half the bytes of an all-reduce. Bandwidths are the links'
bus bandwidth (data sheet × `link_efficiency`); the per-hop latencies are NCCL's tuning
constants for the Simple protocol (`GpuSpec.intra_node_latency_s`, `inter_node_latency_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from trainyard.plugins.advisor.hardware import Hardware


@dataclass(frozen=True, slots=True)
class Level:
    size: int
    bandwidth: float
    latency: float


def _members_within(span: int, dims: tuple[tuple[int, int], ...]) -> int:
    """Members of the group inside one block of `span` consecutive ranks."""
    count = 1
    for size, stride in dims:
        if size > 1 and stride < span:
            count *= min(size, max(1, span // stride))
    return count


@lru_cache(maxsize=4096)
def group_levels(hw: Hardware, dims: tuple[tuple[int, int], ...]) -> tuple[Level, ...]:
    """The hierarchy a group spanning mesh dimensions `dims` ((size, stride) pairs) crosses."""
    size = math.prod(s for s, _ in dims)
    if size <= 1:
        return ()
    in_node = min(_members_within(hw.gpus_per_node, dims), size)
    in_rack = max(min(_members_within(hw.gpus_per_rack, dims), size), in_node)
    gpu = hw.gpu
    levels = []
    if in_node > 1:
        levels.append(Level(in_node, hw.intra_node_bandwidth, gpu.intra_node_latency_s))
    if in_rack // in_node > 1:
        levels.append(Level(in_rack // in_node, hw.intra_rack_bandwidth, gpu.inter_node_latency_s))
    if size // in_rack > 1:
        levels.append(Level(size // in_rack, hw.cross_rack_bandwidth, 1.5 * gpu.inter_node_latency_s))
    return tuple(levels)


COLLECTIVE_BASE_LATENCY_S = 8.4e-6
"""NCCL's `baseLat` for the Simple protocol (ring and tree, `src/graph/tuning.cc`): the fixed
cost of launching one collective, whatever its size or group."""


def ring_latency_s(levels: tuple[Level, ...]) -> float:
    """α·(p − 1) of one pass around a pipelined ring through every member, by level: the ring
    crosses level i's links (kᵢ − 1)·kᵢ₊₁·…·k_top times (NCCL: (nRanks − nNodes) NVLink hops and
    nNodes − 1 network hops), plus the collective's base latency."""
    if not levels:
        return 0.0
    total, outer = COLLECTIVE_BASE_LATENCY_S, 1
    for level in reversed(levels):
        total += outer * (level.size - 1) * level.latency
        outer *= level.size
    return total


def ring_bandwidth_s(levels: tuple[Level, ...], nbytes: float, *, hierarchical: bool = True) -> float:
    """Bandwidth term of a ring all-gather (or reduce-scatter) of `nbytes` (the unsharded size):
    the slowest level, max over i of (kᵢ−1)/kᵢ · Bᵢ / bwᵢ with Bᵢ₊₁ = Bᵢ/kᵢ (one HCA per GPU: the
    k₁ GPUs of a node share the inter-node traffic).

    `hierarchical=False`: a flat ring whose every link carries (p−1)/p · B, so each GPU's own
    link bounds it — what a collective gets when its traffic is not spread over the node's HCAs
    (`Implementation.hierarchical_collectives`)."""
    if not hierarchical:
        size = math.prod(level.size for level in levels)
        return (size - 1) / size * nbytes / min(level.bandwidth for level in levels) if levels else 0.0
    worst, chunk = 0.0, nbytes
    for level in levels:
        k = level.size
        worst = max(worst, (k - 1) / k * chunk / level.bandwidth)
        chunk /= k
    return worst


def all_reduce_s(levels: tuple[Level, ...], nbytes: float, *, count: int = 1,
                 hierarchical: bool = True) -> float:
    """`count` all-reduces that together move `nbytes`: a reduce-scatter and an all-gather's
    bytes over the ring's bottleneck (2·(k−1)/k·B/bw), and NCCL's tree latency, 2·⌈log₂ kᵢ⌉ hops
    per level, which it picks over the ring's 2·(p − 1) hops once groups grow."""
    if not levels:
        return 0.0
    latency = COLLECTIVE_BASE_LATENCY_S + sum(2 * math.ceil(math.log2(lv.size)) * lv.latency
                                              for lv in levels)
    return 2 * ring_bandwidth_s(levels, nbytes, hierarchical=hierarchical) + count * latency


def all_gather_s(levels: tuple[Level, ...], nbytes: float, *, count: int = 1,
                 hierarchical: bool = True) -> float:
    """`count` all-gathers (or reduce-scatters) whose unsharded results total `nbytes`: NCCL runs
    them as rings at every size, so each pays the ring's α·(p − 1)."""
    if not levels:
        return 0.0
    return (ring_bandwidth_s(levels, nbytes, hierarchical=hierarchical)
            + count * ring_latency_s(levels))


def all_to_all_s(levels: tuple[Level, ...], nbytes: float) -> float:
    """Each member exchanges `nbytes` with the others; the slowest level carries its share."""
    if not levels:
        return 0.0
    size = math.prod(level.size for level in levels)
    worst, inner = 0.0, 1
    for level in levels:
        inner_next = inner * level.size
        share = nbytes * (inner_next - inner) / size
        worst = max(worst, share / level.bandwidth)
        inner = inner_next
    return worst + sum(level.latency for level in levels)


def p2p_s(hw: Hardware, *, stride: int, size: int, nbytes: float) -> float:
    """One pipeline hop of `nbytes` between neighbouring stages (the slowest hop of the chain)."""
    if size <= 1:
        return 0.0
    span = stride * size
    if span <= hw.gpus_per_node:
        bandwidth, latency = hw.intra_node_bandwidth, hw.gpu.intra_node_latency_s
    elif span <= hw.gpus_per_rack:
        bandwidth, latency = hw.intra_rack_bandwidth, hw.gpu.inter_node_latency_s
    else:
        bandwidth, latency = hw.cross_rack_bandwidth, 1.5 * hw.gpu.inter_node_latency_s
    return nbytes / bandwidth + latency


def exposed_s(comm: float, window: float, *, overlap: float = 0.9) -> float:
    """Communication left on the critical path when it can overlap `window` seconds of compute:
    what does not fit in the window, and never less than (1 − overlap) of it (the last bucket,
    launch gaps)."""
    return max(comm - window, comm * (1 - overlap))
