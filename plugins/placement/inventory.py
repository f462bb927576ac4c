"""The placer's view of a cluster: nodes grouped by rack, indexed for fast search.

Two sources: the cluster files (`config/clusters/*.yaml`, via `trainyard.config.cluster.load_cluster`) and,
in Kubernetes mode, the API server's node objects (labels `topology.kubernetes.io/rack`,
`nvidia.com/gpu.product`, `nvidia.com/gpu.count` from GPU Feature Discovery). Both end as the same
`trainyard.config.cluster.Cluster`, so every consumer (advisor, rules, placer) sees one model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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

    def __post_init__(self) -> None:
        self.racks = {}
        for node in self.nodes:
            self.racks.setdefault(node.rack, []).append(node)
        self.by_name = {n.name: n for n in self.nodes}
        self.rack_order = {rack: i for i, rack in enumerate(self.racks)}

    @classmethod
    def from_cluster(cls, cluster: Cluster) -> Inventory:
        return cls(nodes=cluster.nodes)

    def gpus_per_node(self, gpu_type: str) -> int:
        return max((n.gpus for n in self.nodes if n.gpu_type == gpu_type), default=0)

    def total_gpus(self, gpu_type: str | None = None) -> int:
        return sum(n.gpus for n in self.nodes if gpu_type is None or n.gpu_type == gpu_type)

    def free_map(self, used: Mapping[str, int] | None = None) -> dict[str, int]:
        """Free devices per node, given devices in use per node (unknown nodes are ignored)."""
        used = used or {}
        return {n.name: max(n.gpus - int(used.get(n.name, 0)), 0) for n in self.nodes}


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
