"""The placer's view of a cluster: nodes grouped by rack, indexed for fast search.

Two sources: the cluster files (`config/clusters/*.yaml`, via `trainyard.config.cluster.load_cluster`) and,
in Kubernetes mode, the API server's node objects (labels `topology.kubernetes.io/rack`,
`nvidia.com/gpu.product`, `nvidia.com/gpu.count` from GPU Feature Discovery). Both end as the same
`trainyard.config.cluster.Cluster`, so every consumer (advisor, rules, placer) sees one model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from trainyard.config.cluster import Cluster, Node

RACK_LABEL = "topology.kubernetes.io/rack"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
XID_ANNOTATION = "trainyard.io/xid-errors-7d"
"""Written by the node agent: Xid errors seen on the node's GPUs in the last 7 days."""
UNKNOWN_RACK = "rack-unknown"

_PRODUCTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"H200", re.I), "H200"),
    (re.compile(r"H100", re.I), "H100"),
    (re.compile(r"A100.*80", re.I), "A100_80GB"),
    (re.compile(r"A100", re.I), "A100_40GB"),
    (re.compile(r"L40S", re.I), "L40S"),
)


def gpu_type_from_product(product: str) -> str:
    """`NVIDIA-H100-80GB-HBM3` → `H100`: GPU Feature Discovery's product label to the type
    names specs use; unknown products keep their label value."""
    for pattern, name in _PRODUCTS:
        if pattern.search(product):
            return name
    return product


@dataclass
class Inventory:
    """Nodes by rack, with lookups the search needs; built once per cluster."""

    nodes: tuple[Node, ...]
    racks: dict[str, list[Node]] = field(init=False)
    by_name: dict[str, Node] = field(init=False)
    rack_order: dict[str, int] = field(init=False)
    _types: dict[str, TypeIndex] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.racks = {}
        for node in self.nodes:
            self.racks.setdefault(node.rack, []).append(node)
        self.by_name = {n.name: n for n in self.nodes}
        self.rack_order = {rack: i for i, rack in enumerate(self.racks)}
        self._types = {t: TypeIndex.build(self, t) for t in sorted({n.gpu_type for n in self.nodes})}

    @classmethod
    def from_cluster(cls, cluster: Cluster) -> Inventory:
        return cls(nodes=cluster.nodes)

    def of_type(self, gpu_type: str) -> TypeIndex:
        """The static arrays of one GPU type's nodes, built with the inventory (nodes never
        change inside an `Inventory`; only the free map a caller passes does)."""
        index = self._types.get(gpu_type)
        if index is None:
            index = self._types[gpu_type] = TypeIndex.build(self, gpu_type)
        return index

    def gpus_per_node(self, gpu_type: str) -> int:
        return self.of_type(gpu_type).largest_node

    def total_gpus(self, gpu_type: str | None = None) -> int:
        if gpu_type is None:
            return sum(n.gpus for n in self.nodes)
        return self.of_type(gpu_type).total_gpus

    def free_map(self, used: Mapping[str, int] | None = None) -> FreeDevices:
        """Free devices per node, given devices in use per node (unknown nodes are ignored);
        indexed by GPU type (`FreeDevices`), so a placer that keeps it needs no pass over the
        fleet per request."""
        used = used or {}
        return FreeDevices(self, {n.name: max(n.gpus - int(used.get(n.name, 0)), 0) for n in self.nodes})

    def free_rows(self, gpu_type: str, free: Mapping[str, int]) -> np.ndarray:
        """Free devices per row of `of_type(gpu_type)`: the column a `FreeDevices` of this
        inventory keeps (no copy: read it, do not write it), else one pass over the map."""
        if isinstance(free, FreeDevices) and free.inventory is self:
            return free.column(gpu_type)
        return self.of_type(gpu_type).free_counts(free)


@dataclass(frozen=True)
class TypeIndex:
    """One GPU type's nodes as columns, grouped by rack in `Inventory.racks` order.

    Why: a request on a 100,000-GPU fleet (12,500 nodes) cannot afford a Python loop over
    every `Node` object; with these columns the placer reads the caller's free map once
    (`free_counts`, one pass in C; none for a `FreeDevices`, which keeps the column) and
    counts eligible nodes per rack with numpy, and touches
    `Node` objects only in the racks it picks. Row `i` is `nodes[i]`; a rack's rows are
    contiguous (`rack_start[r]:rack_start[r + 1]`, `r` its `rack_order`).
    """

    nodes: tuple[Node, ...]
    names: tuple[str, ...]
    row_of: dict[str, int]
    rack: np.ndarray
    """`rack_order` of each row's rack."""
    position: np.ndarray
    """Each node's index among all members of its rack (any type): the search's last tie-break."""
    healthy: np.ndarray
    rack_start: np.ndarray
    """Length racks + 1: rack `r`'s rows are `rack_start[r]:rack_start[r + 1]`."""
    largest_node: int
    total_gpus: int

    @classmethod
    def build(cls, inventory: Inventory, gpu_type: str) -> TypeIndex:
        nodes: list[Node] = []
        racks: list[int] = []
        positions: list[int] = []
        starts = [0]
        for rack, members in inventory.racks.items():
            for position, node in enumerate(members):
                if node.gpu_type == gpu_type:
                    nodes.append(node)
                    racks.append(inventory.rack_order[rack])
                    positions.append(position)
            starts.append(len(nodes))
        return cls(
            nodes=tuple(nodes), names=tuple(n.name for n in nodes),
            row_of={n.name: i for i, n in enumerate(nodes)},
            rack=np.array(racks, dtype=np.int64), position=np.array(positions, dtype=np.int64),
            healthy=np.array([n.healthy for n in nodes], dtype=bool),
            rack_start=np.array(starts, dtype=np.int64),
            largest_node=max((n.gpus for n in nodes), default=0), total_gpus=sum(n.gpus for n in nodes))

    def free_counts(self, free: Mapping[str, int]) -> np.ndarray:
        """Free devices per row (a node the map leaves out has none)."""
        return np.fromiter(map(free.get, self.names, repeat(0)), dtype=np.int64, count=len(self.names))

    def rows(self, names: Iterable[str]) -> list[int]:
        """Rows of the named nodes of this type (other names are ignored)."""
        return [self.row_of[name] for name in names if name in self.row_of]


class FreeDevices(MutableMapping[str, int]):
    """Free devices per node: a mapping node name → count, and the same counts as one column
    per GPU type in `TypeIndex` row order, kept in step on every write.

    Why: on a 12,500-node fleet, turning a plain dict into the search's column is a pass over
    every node per request — about 1 ms, half of a request's CPU time in
    `benchmarks/placement.py`. A caller that keeps the map between requests (the benchmark, a
    long-lived placer) and writes each allocation into it pays O(1) per changed node instead;
    `Inventory.free_rows` hands the column to the search. Any other mapping still works (read
    once per request).
    """

    def __init__(self, inventory: Inventory, counts: Mapping[str, int]) -> None:
        self.inventory = inventory
        self._counts = dict(counts)
        self._columns: dict[str, np.ndarray] = {}

    def column(self, gpu_type: str) -> np.ndarray:
        """Free devices per row of `inventory.of_type(gpu_type)` (built on first use)."""
        column = self._columns.get(gpu_type)
        if column is None:
            column = self._columns[gpu_type] = self.inventory.of_type(gpu_type).free_counts(self._counts)
        return column

    def _write_row(self, name: str, value: int) -> None:
        node = self.inventory.by_name.get(name)
        column = self._columns.get(node.gpu_type) if node is not None else None
        if node is not None and column is not None:
            column[self.inventory.of_type(node.gpu_type).row_of[name]] = value

    def __getitem__(self, name: str) -> int:
        return self._counts[name]

    def get(self, name: str, default: int | None = None) -> int | None:  # type: ignore[override]
        return self._counts.get(name, default)  # the dict's own, in C: scoring reads it per node

    def __setitem__(self, name: str, value: int) -> None:
        self._counts[name] = value
        self._write_row(name, int(value))

    def __delitem__(self, name: str) -> None:
        del self._counts[name]
        self._write_row(name, 0)  # a node the map leaves out has no free device

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def __repr__(self) -> str:
        return f"FreeDevices({self._counts!r})"


def cluster_from_k8s_nodes(nodes: Iterable[Any], *, name: str = "kubernetes") -> Cluster:
    """Build a `Cluster` from Kubernetes node objects (`V1Node` or their dict form).

    A node is healthy when its `Ready` condition is `True`, it is not cordoned, and it has no
    `NoExecute` taint; nodes without the GPU count label are skipped (not GPU nodes).
    """
    racks: dict[str, list[dict[str, Any]]] = {}
    health: dict[str, dict[str, Any]] = {}
    for raw in nodes:
        node = raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        if GPU_COUNT_LABEL not in labels:
            continue
        node_name = meta["name"]
        gpus = int(labels[GPU_COUNT_LABEL])
        if gpus < 1:
            continue
        rack = labels.get(RACK_LABEL, UNKNOWN_RACK)
        racks.setdefault(rack, []).append({
            "name": node_name, "gpuType": gpu_type_from_product(labels.get(GPU_PRODUCT_LABEL, "unknown")),
            "gpusPerNode": gpus, "address": internal_ip(node) or node_name,
        })
        entry: dict[str, Any] = {}
        if not _is_healthy(node):
            entry["healthy"] = False
        xid = (meta.get("annotations") or {}).get(XID_ANNOTATION)
        if xid is not None and str(xid).isdigit():
            entry["xidErrors7d"] = int(xid)
        if entry:
            health[node_name] = entry
    if not racks:
        raise ValueError(f"no GPU nodes: no node carries the '{GPU_COUNT_LABEL}' label")
    # Node and rack names are literal (no `{…}` placeholders: Kubernetes names cannot hold braces).
    return Cluster.model_validate({
        "apiVersion": "training.platform/v1", "kind": "Cluster", "metadata": {"name": name},
        "spec": {"mode": "kubernetes", "health": health, "racks": [
            {"name": rack, "nodes": [dict(n, count=1) for n in members]}
            for rack, members in sorted(racks.items())
        ]},
    })


def internal_ip(node: Mapping[str, Any]) -> str | None:
    """The node's `InternalIP` (the dict form of a `V1Node`), None before the kubelet reports one."""
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return None


def _is_healthy(node: Mapping[str, Any]) -> bool:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    if any(t.get("effect") == "NoExecute" for t in spec.get("taints") or []):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    return ready is not None and ready.get("status") == "True"
