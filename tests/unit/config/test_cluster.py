from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from trainyard.config.cluster import Cluster, cluster_for, known_clusters, load_cluster


def test_the_seed_fleet_expands_from_a_few_lines() -> None:
    fleet = load_cluster("h100-fleet")
    assert len(fleet.nodes) == 1250
    assert len(fleet.racks) == 160
    assert fleet.total_gpus("H100") == 10_000
    assert fleet.gpus_per_node("H100") == 8
    assert fleet.total_gpus("H100", healthy_only=True) == 10_000 - 2 * 8
    assert {len(nodes) for nodes in fleet.racks.values()} == {7, 8}
    node = next(n for n in fleet.nodes if n.name == "rack-042-n0")
    assert node.rack == "rack-042" and node.xid_errors_7d == 3


def test_local_cluster_is_this_machine() -> None:
    local = load_cluster("local")
    assert [n.name for n in local.nodes] == ["local-0", "local-1"]
    assert {n.address for n in local.nodes} == {"127.0.0.1"}
    assert local.spec.mode == "local"


def test_duplicate_node_names_are_refused(tmp_path: Path) -> None:
    doc = {"metadata": {"name": "x"}, "spec": {"racks": [
        {"name": "r", "count": 2, "nodes": [{"name": "n{index}", "count": 2, "gpuType": "H100", "gpusPerNode": 8}]}]}}
    with pytest.raises(ValidationError, match="generated twice"):
        Cluster.model_validate(doc)


def test_health_for_unknown_nodes_is_refused() -> None:
    doc = {"metadata": {"name": "x"}, "spec": {
        "racks": [{"nodes": [{"gpuType": "H100", "gpusPerNode": 8}]}],
        "health": {"ghost": {"healthy": False}}}}
    with pytest.raises(ValidationError, match="unknown nodes"):
        Cluster.model_validate(doc)


def test_cluster_for_picks_the_one_with_the_gpu_type() -> None:
    assert cluster_for("H100", "local").name == "h100-fleet"
    assert cluster_for("cpu", "local").name == "local"
    assert cluster_for("TPU", "local").name == "local"
    assert set(known_clusters()) >= {"local", "h100-fleet"}


def test_unknown_cluster_lists_the_known_ones() -> None:
    with pytest.raises(FileNotFoundError, match=r"known clusters: .*h100-fleet"):
        load_cluster("nope")


def test_cluster_files_validate() -> None:
    for name in known_clusters():
        path = Path(__file__).resolve().parents[3] / "config" / "clusters" / f"{name}.yaml"
        Cluster.model_validate(yaml.safe_load(path.read_text()))


def test_bandwidths_are_read_with_their_unit_and_the_old_gbps_names_are_refused(tmp_path: Path) -> None:
    fleet = load_cluster("h100-fleet")
    assert fleet.spec.network.intra_node_bandwidth == 450e9  # 450GB/s
    assert fleet.spec.network.intra_rack_bandwidth == 50e9  # 400Gb/s: gigabits
    assert fleet.model_dump(mode="json", by_alias=True)["spec"]["network"]["intraRackBandwidth"] == "50GB/s"
    doc = yaml.safe_load(Path("config/clusters/h100-fleet.yaml").resolve().read_text())
    doc["spec"]["network"] = {"intraNodeGbps": 450}
    with pytest.raises(ValidationError, match=r"network.intraNodeGbps \(450\) is no longer read.*"
                                              r"Write `intraNodeBandwidth: 450GB/s`"):
        Cluster.model_validate(doc)
    doc["spec"]["network"] = {}
    doc["spec"]["accelerators"]["H100"]["memoryBandwidthGbps"] = 3350
    with pytest.raises(ValidationError, match=r"memoryBandwidthGbps.*`memoryBandwidth: 3350GB/s`"):
        Cluster.model_validate(doc)


def test_the_advisor_uses_the_clusters_bandwidths() -> None:
    from trainyard.plugins.advisor.hardware import hardware_for

    hw = hardware_for(load_cluster("h100-fleet"), "H100")
    assert (hw.gpu.intra_node_bandwidth, hw.gpu.inter_node_bandwidth) == (450e9, 50e9)
