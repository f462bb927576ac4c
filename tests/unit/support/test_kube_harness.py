"""The harness itself: it leaves nothing behind (namespaces, /etc/netns entries, processes),
even when the test inside it fails; it removes what a killed harness left; its nodes are what
the placement inventory reads; and where namespaces cannot be made it skips — or fails, saying
how to provide them, when TRAINYARD_REQUIRE names netns."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.kube import netns
from tests.support.kube.harness import harness_or_skip


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_without_namespaces_it_skips_or_fails_as_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> None:
        raise netns.NetnsUnavailable("network namespaces need root (running as uid 1000)")

    monkeypatch.setattr(netns, "check_available", unavailable)
    monkeypatch.setenv("TRAINYARD_REQUIRE", "postgres")
    with pytest.raises(pytest.skip.Exception, match="needs network namespaces: network namespaces need root"):
        harness_or_skip(tmp_path)
    monkeypatch.setenv("TRAINYARD_REQUIRE", "postgres,netns")
    with pytest.raises(pytest.fail.Exception, match=r"required part 'netns' is missing.*run as root on Linux"):
        harness_or_skip(tmp_path)


@pytest.mark.slow
def test_it_cleans_up_after_a_failing_test_and_after_a_killed_harness(tmp_path: Path) -> None:
    stale = "tyk999999x0000-fab"  # a harness of a process that is gone
    try:
        netns.check_available()
    except netns.NetnsUnavailable as e:
        from tests.support.require import missing

        missing("netns", str(e))
    subprocess.run(["ip", "netns", "add", stale], check=True)
    before = namespaces() - {stale}
    made: list[str] = []
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="the test failed"), harness_or_skip(tmp_path / "kube") as kube:
        assert stale not in namespaces()  # swept when the harness started
        made = [kube.network.fabric, *(n.netns for n in kube.nodes.values())]
        pids = [p.pid for n in kube.nodes.values() for p in (n.kubelet, n.agent) if p is not None]
        assert set(made) <= namespaces() and all((netns.NETNS_ETC / m / "hosts").exists() for m in made[1:])
        nodes = kube.rest().list("v1", "nodes")
        from trainyard.plugins.placement.inventory import cluster_from_k8s_nodes

        cluster = cluster_from_k8s_nodes(nodes, name="kube-sim")
        assert [(n.name, n.rack, n.gpu_type, n.gpus, n.address) for n in cluster.nodes] == [
            ("kube-sim-0", "sim-rack", "cpu", 1, "10.213.0.10"), ("kube-sim-1", "sim-rack", "cpu", 1, "10.213.0.11")]
        raise RuntimeError("the test failed")
    assert made and not set(made) & namespaces() and namespaces() >= before
    assert not any((netns.NETNS_ETC / m).exists() for m in made)
    assert pids and not any(alive(p) for p in pids)
