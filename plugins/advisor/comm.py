"""Collective and point-to-point times on the cluster's topology.

A process group is described by the mesh dimensions it spans — (size, stride) pairs in the
rank order tp, cp, dp, pp (`plugins/advisor/layout.py`). From the strides we know how many of
its members share a node (NVLink), how many more share a rack (InfiniBand under one leaf) and
how many racks it crosses (InfiniBand through the spine, divided by its oversubscription).

Collectives are modelled as hierarchical rings (NCCL's behaviour on a DGX-style fabric with
one HCA per GPU): an all-reduce of B bytes over levels of k₁ (node), k₂ (rack), k₃ (racks)
members costs Σᵢ 2·(kᵢ−1)/kᵢ · Bᵢ / bwᵢ with B₁ = B and Bᵢ₊₁ = Bᵢ/kᵢ — each level reduces
what the level below left. All-gather and reduce-scatter move half the bytes of an all-reduce.
Latency: NCCL all-reduces switch to trees at scale (2·⌈log₂ kᵢ⌉ hops per level), but its
all-gathers and reduce-scatters are rings: n − 1 hops per collective, which is what makes
per-layer ZeRO-3 collectives over thousands of ranks slow. Bandwidths are the links' bus
bandwidth (data sheet × `link_efficiency`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from plugins.advisor.hardware import Hardware


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


def _ring_hops_latency(levels: tuple[Level, ...]) -> float:
    """Latency of one pass around a flat ring through every member: NCCL's all-gather and
    reduce-scatter are rings (no tree), so their latency grows with the group's size."""
    total, inner = 0.0, 1
    for level in levels:
        outer = inner * level.size
        total += (outer - inner) * level.latency  # hops that cross this level's links
        inner = outer
    return total


def all_reduce_s(levels: tuple[Level, ...], nbytes: float, *, count: int = 1) -> float:
    """`count` all-reduces that together move `nbytes` (NCCL picks trees at scale: log latency)."""
    total, chunk = 0.0, nbytes
    for level in levels:
        k = level.size
        total += 2 * (k - 1) / k * chunk / level.bandwidth + count * 2 * math.ceil(math.log2(k)) * level.latency
        chunk /= k
    return total


def all_gather_s(levels: tuple[Level, ...], nbytes: float, *, count: int = 1) -> float:
    """`count` all-gathers (or reduce-scatters) whose unsharded results total `nbytes`."""
    if not levels:
        return 0.0
    bandwidth, chunk = 0.0, nbytes
    for level in levels:
        k = level.size
        bandwidth += (k - 1) / k * chunk / level.bandwidth
        chunk /= k
    return bandwidth + count * _ring_hops_latency(levels)


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
