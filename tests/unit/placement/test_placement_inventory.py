"""The inventory from Kubernetes node objects (real `V1Node` models, as `list_node` returns them)."""

from __future__ import annotations

from unittest.mock import create_autospec

import pytest
from kubernetes.client import (
    CoreV1Api,
    CustomObjectsApi,
    V1Node,
    V1NodeAddress,
    V1NodeCondition,
    V1NodeList,
    V1NodeSpec,
    V1NodeStatus,
    V1ObjectMeta,
    V1Taint,
)

from tests.unit.placement.placement_fixtures import inventory
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.launch.volcano import KubernetesLauncher
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import (
    Inventory,
    cluster_from_k8s_nodes,
    gpu_type_from_product,
)
from trainyard.plugins.placement.model import GangRequest


def node(name: str, rack: str | None, *, product: str = "NVIDIA-H100-80GB-HBM3", gpus: int | None = 8,
         ready: bool = True, cordoned: bool = False, taint: str | None = None, xid: str | None = None) -> V1Node:
    labels = {"kubernetes.io/hostname": name}
    if rack:
        labels["topology.kubernetes.io/rack"] = rack
    if gpus is not None:
        labels |= {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus)}
    return V1Node(
        metadata=V1ObjectMeta(name=name, labels=labels,
                              annotations={"trainyard.io/xid-errors-7d": xid} if xid else None),
        spec=V1NodeSpec(unschedulable=cordoned or None,
                        taints=[V1Taint(key="node.kubernetes.io/unreachable", effect=taint)] if taint else None),
        status=V1NodeStatus(conditions=[V1NodeCondition(type="Ready", status="True" if ready else "False")],
                            addresses=[V1NodeAddress(type="InternalIP", address=f"10.0.0.{len(name)}")]))


NODES = [
    node("a1", "rack-a"), node("a2", "rack-a", xid="4"), node("a3", "rack-a", ready=False),
    node("b1", "rack-b"), node("b2", "rack-b", cordoned=True), node("b3", "rack-b", taint="NoExecute"),
    node("c1", "rack-c", product="NVIDIA-A100-SXM4-80GB"), node("cpu-only", "rack-c", gpus=None),
    node("loose", None),
]


def test_nodes_become_a_cluster_with_racks_types_and_health() -> None:
    cluster = cluster_from_k8s_nodes(NODES, name="prod")
    assert cluster.spec.mode == "kubernetes"
    by_name = {n.name: n for n in cluster.nodes}
    assert "cpu-only" not in by_name
    assert by_name["loose"].rack == "rack-unknown"
    assert {n: by_name[n].rack for n in ("a1", "b1", "c1")} == {"a1": "rack-a", "b1": "rack-b", "c1": "rack-c"}
    assert by_name["c1"].gpu_type == "A100_80GB" and by_name["a1"].gpu_type == "H100"
    assert [n for n, v in by_name.items() if not v.healthy] == ["a3", "b2", "b3"]
    assert by_name["a2"].xid_errors_7d == 4 and by_name["a1"].address == "10.0.0.2"


def test_placement_on_the_label_inventory_avoids_unhealthy_and_xid_nodes() -> None:
    inv = Inventory.from_cluster(cluster_from_k8s_nodes(NODES))
    # Eligible H100 nodes: a1, a2 (4 Xid errors), b1, loose. Three are needed: a2 is left out.
    placement = place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8, dp=3)), inv)
    assert sorted(placement.node_names) == ["a1", "b1", "loose"]


def test_launcher_reads_the_inventory_through_core_v1() -> None:
    core = create_autospec(CoreV1Api, instance=True)
    core.list_node.return_value = V1NodeList(items=NODES)
    launcher = KubernetesLauncher(create_autospec(CustomObjectsApi, instance=True), core_api=core)
    assert len(launcher.cluster().nodes) == 8
    core.list_node.assert_called_once_with()


def test_no_gpu_nodes_is_an_error_and_products_map_to_spec_names() -> None:
    with pytest.raises(ValueError, match=r"no node carries the 'nvidia\.com/gpu\.count' label"):
        cluster_from_k8s_nodes([node("x", "r", gpus=None)])
    assert gpu_type_from_product("NVIDIA-H200") == "H200"
    assert gpu_type_from_product("NVIDIA-A100-SXM4-40GB") == "A100_40GB"
    assert gpu_type_from_product("Tesla-T4") == "Tesla-T4"


def test_the_type_index_keeps_racks_contiguous_and_positions_among_all_members() -> None:
    """`Inventory.of_type`: one GPU type's nodes grouped by rack; a node's position counts every
    member of its rack (the search's last tie-break), and a node the free map leaves out has no
    free device."""
    from trainyard.config.cluster import Cluster

    cluster = Cluster.model_validate({
        "apiVersion": "training.platform/v1", "kind": "Cluster", "metadata": {"name": "mixed"},
        "spec": {"racks": [{"name": f"r{i}", "nodes": [
            {"name": "{rack}-a{index}", "count": 2, "gpuType": "A100_80GB", "gpusPerNode": 4},
            {"name": "{rack}-h{index}", "count": 3, "gpuType": "H100", "gpusPerNode": 8}]} for i in range(2)],
            "health": {"r1-h0": {"healthy": False}}},
    })
    inv = Inventory.from_cluster(cluster)
    h100 = inv.of_type("H100")
    assert h100.names == ("r0-h0", "r0-h1", "r0-h2", "r1-h0", "r1-h1", "r1-h2")
    assert h100.position.tolist() == [2, 3, 4, 2, 3, 4]
    assert h100.rack.tolist() == [0, 0, 0, 1, 1, 1] and h100.rack_start.tolist() == [0, 3, 6]
    assert h100.healthy.tolist() == [True, True, True, False, True, True]
    assert (inv.gpus_per_node("H100"), inv.total_gpus("H100"), inv.total_gpus()) == (8, 48, 64)
    assert h100.free_counts({"r0-h1": 3, "r0-a0": 4}).tolist() == [0, 3, 0, 0, 0, 0]
    assert inv.of_type("L40S").names == () and inv.gpus_per_node("L40S") == 0


def test_nodes_the_free_map_leaves_out_are_not_placed_on() -> None:
    inv = inventory([(4, 8, "H100", 2)])
    free = {"r1-n2": 8, "r0-n3": 8}
    placement = place_gang(GangRequest(job="j", team="t", gpu_type="H100", layout=RankLayout(tp=8, dp=2)), inv, free)
    assert sorted(placement.node_names) == ["r0-n3", "r1-n2"]
