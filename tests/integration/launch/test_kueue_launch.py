"""The product launching what Kueue admits (issue 55), on the real control plane of
`tests/support/kube/real_harness.py`: kube-apiserver, kube-controller-manager, kube-scheduler
and Kueue v0.17.0, two simulated nodes whose kubelets run the pods as real processes — as the
pods' securityContext user (uid 1000), in the team's namespace under Pod Security `restricted`.

`KubernetesLauncher` with `queueing="kueue"` makes the team's queueing objects
(`ensure_queues`), submits the attempt as a suspended Indexed Job and its headless Service;
Kueue admits the whole gang, kube-scheduler binds one pod per node, torchrun's c10d rendezvous
crosses the nodes' network, and the launcher reads the ranks' exits and the nodes they ran on.
A gang over the team's quota waits with Kueue's own reason, and `stop` deletes what was made.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kube import netns
from tests.support.kube.jobs import placed, tiny_job
from tests.support.kube.real_cluster import binaries_missing
from tests.support.kube.real_harness import RealKubeHarness
from tests.support.require import missing
from trainyard.config.teams import Team, Teams
from trainyard.plugins.launch.kube_clients import clients_from_kubeconfig
from trainyard.plugins.launch.tenancy import render_teams
from trainyard.plugins.launch.volcano import KubernetesLauncher
from trainyard.plugins.run.model import RunHandle, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.waits]
TEAMS = Teams(teams={"demo": Team(share=1.0, quota_gpus=2)})
"""One team whose quota is the two nodes' two CPU slots."""


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeHarness]:
    if binaries_missing():
        missing("kube", f"the Kubernetes binaries are not built: {', '.join(binaries_missing())}")
    try:
        harness = RealKubeHarness(tmp_path_factory.mktemp("kube")).__enter__()
    except netns.NetnsUnavailable as e:
        missing("netns", f"the simulated nodes need network namespaces: {e}")
    with harness:
        for doc in render_teams(TEAMS, cpu_cluster=True):  # the administrator's part
            harness.rest().create(doc["apiVersion"], doc["kind"].lower() + "s", doc["metadata"].get("namespace"), doc)
        yield harness


@pytest.fixture(scope="module")
def launcher(kube: RealKubeHarness) -> KubernetesLauncher:
    options = kube.launcher_options(queueing="kueue", namespace=None, heartbeat_volume="emptyDir")
    launcher = KubernetesLauncher.from_clients(clients_from_kubeconfig(str(kube.kubeconfig)), options=options)
    launcher.ensure_queues(TEAMS, total_gpus=2, cpu_cluster=True)
    return launcher


def submit(kube: RealKubeHarness, launcher: KubernetesLauncher, name: str, args: list[str], **kwargs: Any
           ) -> RunHandle:
    parts = placed(tiny_job(name, args, **kwargs), kube.root / "home", run=f"r-{name}")
    return launcher.submit(*parts.submit_args(), attempt=0)


def wait(kube: RealKubeHarness, launcher: KubernetesLauncher, handle: RunHandle, predicate: Any, what: str,
         timeout_s: float = 180) -> RunStatus:
    seen: list[RunStatus] = []

    def check() -> RunStatus | None:
        seen.append(launcher.poll(handle))
        return seen[-1] if predicate(seen[-1]) else None

    try:
        return kube.wait_for(check, timeout_s, what)
    except AssertionError as e:
        raise AssertionError(f"{e}\nlast status: {seen[-1] if seen else None}\n{launcher.logs(handle)}\n"
                             f"{kube.diagnostics()}") from None


def test_a_gang_kueue_admits_runs_across_the_nodes_and_completes(kube: RealKubeHarness,
                                                                 launcher: KubernetesLauncher) -> None:
    handle = submit(kube, launcher, "tiny-kueue", ["--steps", "3"])
    assert handle.api_version == "batch/v1" and handle.namespace == "team-demo"
    done = wait(kube, launcher, handle, lambda s: s.finished, "the Indexed Job to complete")
    assert done.state == "succeeded", done
    assert [r.exit_code for r in done.ranks] == [0, 0] and sorted(done.nodes) == sorted(kube.node_names), done
    assert [a.pod.rsplit("-", 1)[0] for a in done.agents] == [f"{handle.name}-0", f"{handle.name}-1"]
    assert "step 3" in launcher.logs(handle, rank=1)


def test_a_gang_over_its_teams_quota_waits_with_kueues_reason(kube: RealKubeHarness,
                                                               launcher: KubernetesLauncher) -> None:
    from tests.support.kube.jobs import wide_cluster

    job = tiny_job("tiny-over", ["--steps", "3"], gpus=4)
    parts = placed(job, kube.root / "home", run="r-over", cluster=wide_cluster(2))
    handle = launcher.submit(*parts.submit_args(), attempt=0)
    waiting = wait(kube, launcher, handle, lambda s: "Kueue:" in s.message, "Kueue to say why the gang waits", 60)
    assert waiting.state == "pending" and "insufficient quota for cpu" in waiting.message, waiting
    stopped = launcher.stop(handle, grace_s=1)
    assert stopped.state == "stopped" and not stopped.processes_alive, stopped
