"""Kueue preempts a running gang, on the real control plane of `tests/support/kube/real_harness.py`
(issue 56, Build 4 at the launcher level): kube-apiserver, kube-controller-manager,
kube-scheduler and Kueue v0.17.0, two simulated nodes of one CPU slot each.

Two teams share the two slots in one cohort (a nominal quota of one slot each, borrowing up to
two). Team A's low-priority gang of two ranks borrows B's idle slot and runs; team B's
high-priority gang of one rank arrives; Kueue reclaims B's nominal quota by evicting A (its
Workload `Evicted`/`Preempted`, the Job suspended, its pods deleted with their grace). A's ranks
get SIGTERM and commit their emergency checkpoint before their pods go (exit 43), the launcher
reports the attempt ended with Kueue's cause in Kueue's words, and — as the attempt engine does
with any finished attempt — `settle` removes the evicted Job, so Kueue cannot run it again on its
own beside the next attempt. That next attempt waits in Kueue's queue with Kueue's reason while
B runs, is admitted once B completes, and resumes from the emergency checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kube import tenant
from tests.support.kube.jobs import placed, tiny_job
from tests.support.kube.real_harness import RealKubeHarness
from trainyard.config.spec import TrainingJob
from trainyard.config.teams import Team, Teams
from trainyard.plugins.launch.volcano import KubernetesLauncher
from trainyard.plugins.recovery.classify import classify
from trainyard.plugins.recovery.evidence import Evidence
from trainyard.plugins.run import exit_codes
from trainyard.plugins.run.model import RunHandle, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.waits]
TEAMS = Teams(teams={"alpha": Team(share=0.5, quota_gpus=2), "beta": Team(share=0.5, quota_gpus=2)})
"""Two teams, a slot each by right, either may borrow the other's while it is idle."""
TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def kube() -> Iterator[RealKubeHarness]:
    with tenant.traversable_harness("kueue-preempt-") as harness:
        yield harness


@pytest.fixture(scope="module")
def launcher(kube: RealKubeHarness) -> KubernetesLauncher:
    """The administrator's objects for both teams, then the launcher on the control plane's own
    ServiceAccount token."""
    return tenant.control_plane_launcher(kube, TEAMS)


def job_of(name: str, team: str, priority: str, gpus: int, args: list[str]) -> TrainingJob:
    job = tiny_job(name, args, gpus=gpus, team=team)
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"priority": priority})})


def submit(kube: RealKubeHarness, launcher: KubernetesLauncher, job: TrainingJob, *, run: str,
           attempt: int = 0) -> RunHandle:
    parts = placed(job, kube.root / "home", run=run, attempt=attempt)
    return launcher.submit(*parts.submit_args(), attempt=attempt)


def wait(kube: RealKubeHarness, launcher: KubernetesLauncher, handle: RunHandle, predicate: Any, what: str,
         timeout_s: float = TIMEOUT_S) -> RunStatus:
    return tenant.wait_for_status(kube, launcher, handle, predicate, what, timeout_s)


def trainer_logs(kube: RealKubeHarness, handle: RunHandle) -> dict[str, str]:
    """The whole trainer logs of the Job's pods, as their nodes keep them — the pods of an evicted
    Job included, which the API server no longer lists, and so the pods of every attempt (they
    share the Job's name): a log's `hello … attempt=N` line says whose it is. Whole, not a tail:
    a rank's log can outgrow any tail under load (torch's socket warnings), and the line that
    names the attempt is its first."""
    found = sorted(kube.root.glob(f"nodes/*/pods/{handle.namespace}_{handle.name}-*/trainer.log"))
    return {path.parent.name: path.read_text(errors="replace") for path in found}


def attempt_logs(kube: RealKubeHarness, handle: RunHandle, attempt: int) -> list[str]:
    return [log for log in trainer_logs(kube, handle).values() if f" attempt={attempt} " in log]


def trained(kube: RealKubeHarness, handle: RunHandle, step: int) -> list[str]:
    """The pods of the Job whose ranks have logged `step` (both ranks of a pod share its log)."""
    return [pod for pod, log in trainer_logs(kube, handle).items() if f"step {step} " in log]


def test_kueue_preempts_the_borrowing_gang_which_checkpoints_and_resumes_when_capacity_returns(
        kube: RealKubeHarness, launcher: KubernetesLauncher) -> None:
    folder = kube.root / "alpha-checkpoints"
    folder.mkdir()
    folder.chmod(0o777)  # the pods' user (uid 1000) writes the emergency checkpoint there
    low = job_of("alpha-low", "alpha", "low", 2,
                 ["--steps", "30", "--sleep", "0.5", "--checkpoint-dir", str(folder)])
    hold = kube.root / "beta-holds"  # beta's gang holds its slot until the test has seen alpha's wait
    hold.touch()
    high = job_of("beta-high", "beta", "high", 1, ["--steps", "4", "--sleep", "0.5", "--hold-while", str(hold)])

    # team alpha's gang borrows beta's idle slot and trains
    first = submit(kube, launcher, low, run="r-low")
    wait(kube, launcher, first, lambda s: s.state == "running" and len(trained(kube, first, 2)) == 2,
         "alpha's gang to train on both slots")

    # team beta's gang arrives: Kueue reclaims beta's slot by evicting alpha's gang
    beta = submit(kube, launcher, high, run="r-high")
    ended = wait(kube, launcher, first, lambda s: s.finished, "Kueue to evict alpha's gang")
    assert ended.state == "failed" and ended.evicted, ended
    assert ended.evicted.startswith("Preempted"), ended.evicted  # Kueue's own reason, word for word
    assert "InCohortReclamation" in ended.evicted or "reclamation" in ended.evicted.lower(), ended.evicted
    assert f"Kueue evicted the gang: {ended.evicted}" in ended.message, ended.message
    assert (folder / "emergency.json").exists(), (ended, trainer_logs(kube, first))
    checkpoint = json.loads((folder / "emergency.json").read_text())
    assert checkpoint["attempt"] == 0 and checkpoint["step"] >= 2, checkpoint
    assert not ended.ranks or {r.exit_code for r in ended.ranks} <= {exit_codes.PREEMPTED, None}, ended.ranks

    report = classify(Evidence(job=first.job, run=first.run, attempt=0, status=ended))
    assert report.outcome == "preempted" and ended.evicted in report.reason, report

    # the attempt engine settles a finished attempt: the evicted Job goes, or Kueue would admit it
    # again by itself beside the DAG's next attempt
    launcher.settle(first, ended)
    second = submit(kube, launcher, low, run="r-low", attempt=1)
    waiting = wait(kube, launcher, second, lambda s: "Kueue: pending: couldn't assign" in s.message,
                   "alpha's next attempt to wait in Kueue's queue, saying why", 60)
    assert waiting.state == "pending" and "insufficient unused quota for cpu" in waiting.message, waiting

    hold.unlink()
    done = wait(kube, launcher, beta, lambda s: s.finished, "beta's gang to complete")
    assert done.state == "succeeded", done

    resumed = wait(kube, launcher, second, lambda s: s.finished, "alpha's gang to be admitted again and complete")
    assert resumed.state == "succeeded", (resumed, trainer_logs(kube, second))
    logs = attempt_logs(kube, second, 1)
    assert len(logs) == 2, trainer_logs(kube, second)
    assert all(f"resumed from the emergency checkpoint of step {checkpoint['step']}" in log for log in logs), logs
    assert all("step 30" in log for log in logs), logs
