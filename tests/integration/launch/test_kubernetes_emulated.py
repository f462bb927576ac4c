"""KubernetesLauncher end to end on the simulated cluster (`tests/support/kube/harness.py`):
two nodes, each a network namespace with one CPU "GPU", behind the emulated API server and
Volcano; the pods are real torchrun processes whose gloo rendezvous crosses the namespaces'
network. Needs root and `ip netns` (skips elsewhere; fails where TRAINYARD_REQUIRE has netns).

One harness serves the module (a harness starts in ~2 s, a torchrun pod in ~10 s on 2 cores).
"""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.kube import tenant
from tests.support.kube.harness import KubeHarness, harness_or_skip
from tests.support.kube.jobs import placed, tiny_job, wide_cluster
from trainyard.plugins.launch.volcano import KubernetesLauncher
from trainyard.plugins.run.model import RunHandle, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.waits]
JOBS = ("batch.volcano.sh/v1alpha1", "jobs")


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeHarness]:
    harness = harness_or_skip(tmp_path_factory.mktemp("kube"))
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(scope="module")
def launcher(kube: KubeHarness) -> KubernetesLauncher:
    from trainyard.config.teams import load_teams

    launcher = KubernetesLauncher.from_kubeconfig(str(kube.kubeconfig), options=kube.launcher_options())
    launcher.ensure_queues(load_teams(), total_gpus=2)
    return launcher


def submit(kube: KubeHarness, launcher: KubernetesLauncher, name: str, args: list[str], **kwargs: object
           ) -> RunHandle:
    parts = placed(tiny_job(name, args, **kwargs), kube.root / "home", run=f"r-{name}")  # type: ignore[arg-type]
    return launcher.submit(*parts.submit_args(), attempt=0)


def wait(kube: KubeHarness, launcher: KubernetesLauncher, handle: RunHandle, predicate, what: str,
         timeout_s: float = 120) -> RunStatus:
    return tenant.wait_for_status(kube, launcher, handle, predicate, what, timeout_s,
                                  explain=lambda _: launcher.logs(handle))  # the emulator serves pods' logs


def test_a_torchrun_job_completes_across_the_nodes_network(kube: KubeHarness, launcher: KubernetesLauncher) -> None:
    handle = submit(kube, launcher, "tiny-ok", ["--steps", "3"])
    retried = submit(kube, launcher, "tiny-ok", ["--steps", "3"])  # a retried launch task
    assert retried.uid == handle.uid
    assert [j["metadata"]["name"] for j in kube.rest().list(*JOBS, kube.namespace)].count(handle.name) == 1
    done = wait(kube, launcher, handle, lambda s: s.finished, "the job to finish")
    assert done.state == "succeeded", launcher.logs(handle)
    assert [(r.rank, r.node, r.exit_code) for r in done.ranks] == [(0, "kube-sim-0", 0), (1, "kube-sim-1", 0)]
    logs = launcher.logs(handle, rank=1)
    assert "hello rank=1 world=2 job=tiny-ok attempt=0 node=kube-sim-1" in logs and "step 3 sum=3" in logs
    # rank 1 lives in kube-sim-1's namespace: its heartbeats are that node's, its agent serves them
    beats = list(kube.nodes["kube-sim-1"].heartbeat_dir.rglob("*.json"))
    assert beats and not list(kube.nodes["kube-sim-0"].heartbeat_dir.rglob("rank-00001*"))
    with urllib.request.urlopen(kube.node_agents["kube-sim-1"] + "/health", timeout=5) as r:
        assert r.status == 200
    launcher.stop(handle, grace_s=0)


def test_a_rank_exiting_42_and_a_sigkilled_pod_are_failed_ranks_with_their_codes(
        kube: KubeHarness, launcher: KubernetesLauncher) -> None:
    diverged = submit(kube, launcher, "tiny-nan", ["--steps", "2", "--fail-rank", "1", "--exit-code", "42"])
    first = wait(kube, launcher, diverged, lambda s: s.finished, "the diverging job to fail")
    assert (first.state, first.failed_rank, first.exit_code) == ("failed", 1, 42)
    assert next(r for r in first.ranks if r.rank == 1).outcome == "diverged"
    killed = submit(kube, launcher, "tiny-kill", ["--steps", "200", "--sleep", "0.2"])
    wait(kube, launcher, killed, lambda s: "step 2" in launcher.logs(killed, rank=1), "the second job to train")
    kube.kill_pod(f"{killed.name}-worker-1", signal.SIGKILL)  # node rank 1 of two pods (c10d's order)
    status = wait(kube, launcher, killed, lambda s: s.state == "failed", "Volcano to abort the killed job")
    agent = next(a for a in status.agents if a.pod == f"{killed.name}-worker-1")
    assert (agent.node in killed.nodes, agent.exit_code, agent.reason) == (True, 137, "Error")
    rank = next(r for r in status.ranks if r.rank == 1)
    assert (rank.exit_code, rank.outcome) == (-9, "killed by SIGKILL")
    assert status.failed_rank == 1 and "pod " + agent.pod in status.message
    for handle in (diverged, killed):
        assert launcher.stop(handle, grace_s=0).state == "stopped"


def test_a_rank_killed_inside_its_pod_is_restarted_in_place_by_both_nodes_torchrun(kube: KubeHarness) -> None:
    """torchrun's fast path across pods: the c10d rendezvous starts a new round on both nodes,
    so the restarted rank and its peer on the other node meet again and the Job never fails."""
    from trainyard.plugins.launch.volcano import KubernetesLauncher

    launcher = KubernetesLauncher.from_kubeconfig(str(kube.kubeconfig),
                                                  options=kube.launcher_options(torchrun_max_restarts=1))
    handle = submit(kube, launcher, "tiny-restart", ["--steps", "30", "--sleep", "0.1"])
    wait(kube, launcher, handle, lambda s: "step 3 " in launcher.logs(handle, rank=1), "the job to train")
    kube.kill_rank(f"{handle.name}-worker-1")
    done = wait(kube, launcher, handle, lambda s: s.finished, "the restarted job to finish")
    assert done.state == "succeeded", launcher.logs(handle)
    # rank 1's torchrun counted the restart; rank 0's restarted its worker for the new round
    # (counted only when its worker's collective failed first: a race, either is right)
    assert [(r.rank, r.exit_code) for r in done.ranks] == [(0, 0), (1, 0)] and done.ranks[1].restart == 1
    for rank in (0, 1):  # the whole gang started again, together, and trained to the end
        starts = launcher.logs(handle, rank=rank).split(f"=== rank {rank} restart ")
        assert len(starts) == 3 and "step 30 sum=3" in starts[2], launcher.logs(handle, rank=rank)
    launcher.stop(handle, grace_s=0)


def test_stop_gives_the_workers_their_sigterm_grace_then_the_job_is_gone(
        kube: KubeHarness, launcher: KubernetesLauncher) -> None:
    import json

    handle = submit(kube, launcher, "tiny-stop", ["--steps", "400", "--sleep", "0.2"])
    wait(kube, launcher, handle, lambda s: "step 2" in launcher.logs(handle, rank=0), "the job to train")
    folders = [kube.pod_dir(f"{handle.name}-worker-{i}") for i in range(2)]
    stopped = launcher.stop(handle, grace_s=20)
    assert stopped.state == "stopped" and not stopped.processes_alive
    assert handle.name not in [j["metadata"]["name"] for j in kube.rest().list(*JOBS, kube.namespace)]
    for rank, folder in enumerate(folders):  # each rank answered SIGTERM within the grace (tiny_job: exit 43)
        exits = folder / "volumes" / "kubernetes.io~empty-dir" / "run" / "exits.jsonl"  # the kubelet's layout
        records = [json.loads(line) for line in exits.read_text().splitlines()]
        assert [(r["rank"], r["exit_code"]) for r in records] == [(rank, 43)]
        assert "SIGTERM, emergency checkpoint" in (folder / "trainer.log").read_text()


def test_more_gpus_than_the_nodes_have_is_unschedulable_with_the_numbers(
        kube: KubeHarness, launcher: KubernetesLauncher) -> None:
    job = tiny_job("tiny-wide", ["--steps", "1"], gpus=4)
    parts = placed(job, kube.root / "home", run="r-tiny-wide", cluster=wide_cluster(2))
    impatient = KubernetesLauncher.from_kubeconfig(str(kube.kubeconfig),
                                                   options=kube.launcher_options(start_timeout_s=2))
    handle = impatient.submit(*parts.submit_args(), attempt=0)
    pending = wait(kube, impatient, handle, lambda s: "not started" in s.message, "the scheduler's verdict", 30)
    assert pending.state == "pending"
    assert "0/2 nodes are available: 2 Insufficient cpu" in pending.message
    assert "requests cpu: 2; the most any node has free is cpu: 1" in pending.message
    failed = wait(kube, impatient, handle, lambda s: s.finished, "the start deadline", 30)
    assert failed.state == "failed" and failed.message.startswith("launch failed:")
    impatient.stop(handle, grace_s=0)


def test_a_node_whose_link_goes_down_becomes_not_ready_and_is_reported(
        kube: KubeHarness, launcher: KubernetesLauncher) -> None:
    handle = submit(kube, launcher, "tiny-lost", ["--steps", "400", "--sleep", "0.2"])
    wait(kube, launcher, handle, lambda s: "step 2" in launcher.logs(handle, rank=1), "the job to train")
    agent_url = kube.node_agents["kube-sim-1"]
    kube.lose_node("kube-sim-1")
    try:
        lost = wait(kube, launcher, handle, lambda s: any(a.node_ready is False for a in s.agents),
                    "the node lifecycle controller to mark kube-sim-1 NotReady", 30)
        assert "node(s) not Ready: kube-sim-1" in lost.message
        with pytest.raises(OSError):  # its node agent is cut off with it (still running behind the link)
            urllib.request.urlopen(agent_url + "/livez", timeout=2)
        evicted = wait(kube, launcher, handle, lambda s: s.state == "failed", "the eviction to abort the job", 30)
        pod = next(a for a in evicted.agents if a.node == "kube-sim-1")
        assert pod.reason == "Evicted:DeletionByTaintManager" and pod.node_ready is False
        assert "was evicted" in evicted.message
        stopped = launcher.stop(handle, grace_s=1)
        assert stopped.state == "stopped" and f"no grace: pods on lost nodes: {pod.pod}" in stopped.message
        assert not stopped.processes_alive
    finally:
        kube.restore_node("kube-sim-1")
    kube.wait_for(lambda: "kube-sim-1" in kube.ready_nodes(), 30, "kube-sim-1 to be Ready again")
