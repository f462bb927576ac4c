"""The product launching what Kueue admits (issue 55), on the real control plane of
`tests/support/kube/real_harness.py`: kube-apiserver, kube-controller-manager, kube-scheduler
and Kueue v0.17.0, two simulated nodes whose kubelets run the pods as real processes — as the
pods' securityContext user (uid 1000), in the team's namespace under Pod Security `restricted`.

An administrator applies the team's objects, the control plane's RBAC and the queues
(`ensure_queues`); then `KubernetesLauncher` with `queueing="kueue"`, on the control plane's own
ServiceAccount token, submits the attempt as a suspended Indexed Job and its headless Service;
Kueue admits the whole gang, kube-scheduler binds one pod per node, torchrun's c10d rendezvous
crosses the nodes' network, and the launcher reads the ranks' exits and the nodes they ran on.
A gang over the team's quota waits with Kueue's own reason, and `stop` deletes what was made.
A gang runs under its own NetworkPolicy, enforced on the nodes by the test plugin
(`tests/support/kube/netpol_enforcer.py`), its connections between the nodes judged and allowed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube import tenant
from tests.support.kube.jobs import placed, tiny_job
from tests.support.kube.real_harness import RealKubeHarness
from tests.support.kube.tenant import control_plane_launcher
from tests.support.require import missing
from trainyard.config.teams import Team, Teams
from trainyard.plugins.launch.volcano import KubernetesLauncher
from trainyard.plugins.run.model import RunHandle, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.waits]
TEAMS = Teams(teams={"demo": Team(share=1.0, quota_gpus=2)})
"""One team whose quota is the two nodes' two CPU slots."""
NAMESPACE = "team-demo"
TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def kube() -> Iterator[RealKubeHarness]:
    with tenant.traversable_harness("kueue-launch-") as harness:
        yield harness


@pytest.fixture(scope="module")
def launcher(kube: RealKubeHarness) -> KubernetesLauncher:
    """The administrator's part first, then the launcher as the control plane itself, with its
    ServiceAccount's own token (`tenant.control_plane_launcher`)."""
    return control_plane_launcher(kube, TEAMS)


def submit(kube: RealKubeHarness, launcher: KubernetesLauncher, name: str, args: list[str], **kwargs: Any
           ) -> RunHandle:
    parts = placed(tiny_job(name, args, **kwargs), kube.root / "home", run=f"r-{name}")
    return launcher.submit(*parts.submit_args(), attempt=0)


def wait(kube: RealKubeHarness, launcher: KubernetesLauncher, handle: RunHandle, predicate: Any, what: str,
         timeout_s: float = 180) -> RunStatus:
    return tenant.wait_for_status(kube, launcher, handle, predicate, what, timeout_s)


def trainer_log(kube: RealKubeHarness, pod: str, container: str = "trainer") -> str:
    return tenant.trainer_log(kube, pod, NAMESPACE, container)


def test_a_gang_kueue_admits_runs_across_the_nodes_and_completes(kube: RealKubeHarness,
                                                                 launcher: KubernetesLauncher) -> None:
    handle = submit(kube, launcher, "tiny-kueue", ["--steps", "3"])
    assert handle.api_version == "batch/v1" and handle.namespace == NAMESPACE
    done = wait(kube, launcher, handle, lambda s: s.finished, "the Indexed Job to complete")
    if done.state != "succeeded":
        print(done, *(trainer_log(kube, a.pod) for a in done.agents), sep="\n")
    assert done.state == "succeeded", done.message
    assert [r.exit_code for r in done.ranks] == [0, 0] and sorted(done.nodes) == sorted(kube.node_names), done
    assert [a.pod.rsplit("-", 1)[0] for a in done.agents] == [f"{handle.name}-0", f"{handle.name}-1"]
    assert "step 3" in trainer_log(kube, done.agents[1].pod)


def test_a_gang_over_its_teams_quota_waits_with_kueues_reason(kube: RealKubeHarness,
                                                               launcher: KubernetesLauncher) -> None:
    from tests.support.kube.jobs import wide_cluster

    job = tiny_job("tiny-over", ["--steps", "3"], gpus=4)
    parts = placed(job, kube.root / "home", run="r-over", cluster=wide_cluster(2))
    handle = launcher.submit(*parts.submit_args(), attempt=0)
    # Kueue makes the Workload first, then tries it against the quota and says why it waits
    waiting = wait(kube, launcher, handle, lambda s: "Kueue: pending: couldn't assign" in s.message,
                   "Kueue to say why the gang waits", 60)
    assert waiting.state == "pending" and "insufficient quota for cpu" in waiting.message, waiting
    stopped = launcher.stop(handle, grace_s=1)
    assert stopped.state == "stopped" and not stopped.processes_alive, stopped


def test_a_pinned_commit_is_fetched_by_the_init_container_and_the_gang_runs_it(
        kube: RealKubeHarness, launcher: KubernetesLauncher) -> None:
    """`spec.source.git`: the pods' init container (git, as uid 1000) fetches the pinned commit
    into the source volume; the trainer runs the entrypoint from there."""
    import subprocess

    work, bare = kube.root / "src-work", kube.root / "src.git"
    work.mkdir()
    script = (Path(__file__).parent / "tiny_job.py").read_text()
    (work / "fetched_job.py").write_text(script.replace('print(f"hello', 'print(f"fetched hello'))
    git = ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    subprocess.run([*git, "-C", str(work), "add", "."], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "tiny job"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    pinned = subprocess.run(["git", "-C", str(work), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    # a repository git reads over the local transport must be its user's own ("dubious
    # ownership" otherwise): the pods' user, as a git server's files are its own
    subprocess.run(["chown", "-R", "1000:1000", str(bare)], check=True)
    job = tiny_job("tiny-git", ["--steps", "2"])
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"source": type(job.spec.source).model_validate(
        {"git": {"repo": str(bare), "commit": pinned}, "entrypoint": "fetched_job.py", "args": ["--steps", "2"]})})})
    source_root = kube.root / "mnt" / "source"
    source_root.mkdir(parents=True, exist_ok=True)
    fetching = KubernetesLauncher(launcher.api, core_api=launcher.core_api,
                                  options=launcher.options.model_copy(update={"source_root": str(source_root)}))
    parts = placed(job, kube.root / "home", run="r-git")
    handle = fetching.submit(*parts.submit_args(), attempt=0)
    done = wait(kube, fetching, handle, lambda s: s.finished, "the fetched job to complete", TIMEOUT_S)
    logs = [trainer_log(kube, a.pod) for a in done.agents]
    assert done.state == "succeeded", (done.message, [trainer_log(kube, a.pod, "source") for a in done.agents])
    assert all("fetched hello" in log and "step 2" in log for log in logs), logs



def test_a_gang_runs_under_its_rendered_network_policy_enforced(kube: RealKubeHarness,
                                                                launcher: KubernetesLauncher) -> None:
    """The job's NetworkPolicy as `trainyard render k8s` prints it, applied by the administrator
    before the launch and enforced on the nodes (`tests/support/kube/netpol_enforcer.py`):
    torchrun's c10d rendezvous and gloo's connections (ephemeral ports) between the two nodes
    are the run's own traffic. The enforcer's counters show that connections between the gang's
    nodes were judged by the pods' rules (not only made before the rules were loaded, which
    conntrack would let pass) and allowed, and that nothing of the gang was dropped."""
    from tests.support.kube.netpol_enforcer import NETPOL, enforcing
    from trainyard.plugins.launch.manifests import render_all

    if shutil.which("nft") is None:
        missing("nft", "the policy enforcer programs the simulated network with nftables' `nft`")
    parts = placed(tiny_job("tiny-netpol", ["--steps", "3"]), kube.root / "home", run="r-netpol")
    docs = render_all(*parts.submit_args(), TEAMS, attempt=0, total_gpus=2, options=launcher.options)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    rest = kube.rest()
    with enforcing(kube.rest, kube.network) as enforcer:
        rest.create(NETPOL, "networkpolicies", NAMESPACE, policy)
        try:
            handle = launcher.submit(*parts.submit_args(), attempt=0)
            done = wait(kube, launcher, handle, lambda s: s.finished, "the gang to complete under its policy",
                        TIMEOUT_S)
            verdicts = enforcer.verdicts()
        finally:
            rest.delete(NETPOL, "networkpolicies", NAMESPACE, policy["metadata"]["name"])
    assert done.state == "succeeded", (done.message, [trainer_log(kube, a.pod) for a in done.agents])
    gang = [f"{NAMESPACE}/{a.pod}" for a in done.agents]
    assert set(gang) <= enforcer.isolated and enforcer.errors == [], (enforcer.isolated, enforcer.errors)
    judged = {key: dict(counts) for key, counts in verdicts.items() if key.split()[0] in gang}
    for direction in ("egress", "ingress"):
        assert sum(c.get("allowed", 0) for k, c in judged.items() if k.endswith(direction)) > 0, judged
    assert all(c.get("dropped", 0) == 0 for c in judged.values()), judged
