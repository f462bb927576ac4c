"""Node-agent verdicts are evidence of their own run only, with real parts: node agents as real
processes (`tests/support/node_agents.py`) over the home's runs folder, gangs of real torchrun
processes (the launcher's tiny job, and `worker/train.py` for the hang of one stopped rank).

- a run that hangs while another run of the same job ends: the agent reports the hang, and the
  other run's evidence does not carry it; once the hung run is cancelled, its verdicts are gone
  from the agent too (its processes are gone: nothing hangs);
- one rank of a real training gang stopped with SIGSTOP: the agent's hang verdict, the
  control plane's hang stop and the classified report all name that rank, not the gang.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.launch.test_local_launcher import ENTRYPOINT
from tests.support import procs
from tests.support.node_agents import node_agents
from tests.support.procs import REPO_ROOT
from tests.support.waiting import wait_for
from trainyard.config.cluster import load_cluster
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.node_agent.client import fetch_health
from trainyard.node_agent.models import NodeHealth, Verdict
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.attempt.evidence import gather, observe_node
from trainyard.plugins.attempt.launchers import Runtime
from trainyard.plugins.attempt.watching import WatchState, stop_gang, watch_once
from trainyard.plugins.launch.environment import build_worker_env
from trainyard.plugins.launch.local import LocalLauncher
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest
from trainyard.plugins.recovery.classify import classify
from trainyard.plugins.run.model import RunHandle
from trainyard.plugins.run.records import StopReason

pytestmark = [pytest.mark.slow, pytest.mark.waits]
NODES = ("local-0", "local-1")
HUNG, NEXT = "20260101t000000-aaaaaa", "20260101t000001-bbbbbb"


def spec(name: str, *, entrypoint: str, args: list[str], hang_timeout: str, **extra: object) -> TrainingJob:
    doc = yaml.safe_load((REPO_ROOT / "config/jobs/demo-tiny-lm.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["source"] = {"entrypoint": entrypoint, "args": args}
    doc["spec"]["hardware"] = {"gpuType": "cpu", "gpuCount": 2, "nodesPreferred": 2}
    doc["spec"]["faultTolerance"] = {"hangTimeout": hang_timeout, "inPlaceRestarts": 0}
    doc["spec"].update(extra)
    return TrainingJob.model_validate(doc)


def submit(settings: Settings, job: TrainingJob, plan: Plan, run: str, *, faults: str = "") -> tuple[LocalLauncher, RunHandle]:
    """One attempt of `run`, 2 nodes × 1 rank, started detached the way `launch` starts it."""
    placement = place_gang(GangRequest.for_job(job, plan, run=run), Inventory.from_cluster(load_cluster("local")))
    launcher = LocalLauncher(settings.runs_dir, source_dir=REPO_ROOT, base_env=procs.test_env({"OMP_NUM_THREADS": "1"}))
    env = build_worker_env(job, plan, settings, run=run, attempt=0)
    if faults:
        env = env.model_copy(update={"faults": faults})
    return launcher, launcher.submit(job, plan, placement, env, attempt=0)


def hangs(urls: dict[str, str], job: str, run: str) -> list[Verdict]:
    reports: list[NodeHealth] = [fetch_health(url) for url in urls.values()]
    return [v for h in reports for v in h.verdicts if v.kind == "hang" and v.job == job and v.run == run]


def test_a_cancelled_runs_verdicts_never_appear_in_the_next_runs_evidence(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    runtime = Runtime(settings)
    name = "tiny-evidence"
    with node_agents(NODES, settings.runs_dir, tmp_path / "agents") as urls:
        stuck = spec(name, entrypoint=ENTRYPOINT, args=["--steps", "50", "--sleep", "300"], hang_timeout="2s")
        hung_launcher, hung = submit(settings, stuck, Plan(layout=RankLayout(dp=2)), HUNG)  # sleeps after step 1: hangs
        wait_for(lambda: hangs(urls, name, HUNG), "the agents to report the hang of the first run", 180, poll_s=0.3)

        quick = spec(name, entrypoint=ENTRYPOINT, args=["--steps", "2"], hang_timeout="5m")
        launcher, handle = submit(settings, quick, Plan(layout=RankLayout(dp=2)), NEXT)
        status = launcher.wait(handle, timeout_s=180)
        assert status.state == "succeeded", launcher.logs(handle)
        seen = [observe_node(node, url) for node, url in sorted(urls.items())]
        assert any(v.run == HUNG for o in seen if o.health for v in o.health.verdicts)  # the agents still say it
        evidence = gather(handle, status, launcher=launcher, run=NEXT, nodes=seen)
        report = classify(evidence)
        assert report.outcome == "completed"
        assert not [v for o in evidence.nodes if o.health for v in o.health.verdicts if v.job is not None]
        assert not [fact for fact in report.evidence if HUNG in fact or "hang" in fact], report.evidence

        stop_gang(hung, StopReason(reason="requested", detail="cancelled by the test"), runtime, grace_s=5)
        wait_for(lambda: not hangs(urls, name, HUNG), "the cancelled run's verdicts to expire", 60, poll_s=0.3)
        gone = [r for url in urls.values() for r in fetch_health(url).ranks if r.run == HUNG]
        assert gone and all(r.gone and not r.stale for r in gone)
        cancelled = classify(gather(hung, hung_launcher.poll(hung), launcher=hung_launcher, run=HUNG,
                                    nodes=[observe_node(n, u) for n, u in sorted(urls.items())]))
        assert cancelled.outcome == "cancelled" and not [f for f in cancelled.evidence if ": hang:" in f]


def test_a_hang_of_one_stopped_rank_names_that_rank_only(tmp_path: Path) -> None:
    """Rank 1 of a real training gang stops itself with SIGSTOP before step 6 (`hang@6:1`);
    rank 0 blocks in its next collective, its step as stale as rank 1's."""
    from trainyard.cli.main import main

    settings = Settings(home=tmp_path / "home")
    assert main(["data", "prepare-demo", "--object-store", settings.object_store, "--shards", "2"]) == 0
    hints = {"hiddenSize": 64, "numLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 2, "ffnHiddenSize": 128,
             "vocabSize": 256, "sequenceLength": 32, "globalBatchSize": 8, "mixedPrecision": "fp32",
             "activation": "swiglu"}
    job = spec("tiny-sigstop", entrypoint="worker/train.py", args=[], hang_timeout="10s",
               checkpoint={"intervalSteps": 1000, "maxKeep": 2},
               training={"maxSteps": 400, "seed": 7, "learningRate": 0.003},
               parallelism={"strategy": "manual", "hints": hints})
    plan = Plan(layout=RankLayout(dp=2), micro_batch_size=4, global_batch_size=8, sequence_length=32)
    runtime = Runtime(settings)
    with node_agents(NODES, settings.runs_dir, tmp_path / "agents") as urls:
        launcher, handle = submit(settings, job, plan, HUNG, faults="hang@6:1")
        try:
            verdicts = wait_for(lambda: hangs(urls, job.name, HUNG), "a hang verdict", 300, poll_s=0.3)
            assert {(v.rank, v.frozen) for v in verdicts} == {(1, True)}, verdicts  # each agent sees both ranks
            step = watch_once(handle, WatchState(renew_lease=False), runtime, grace_s=3)
        finally:
            launcher.stop(handle, grace_s=3)
        assert step.finished and step.stop is not None and step.stop.reason == "hang", step
        assert step.stop.ranks == [1], step.stop
        report = classify(gather(handle, step.status, launcher=launcher, run=HUNG))
        assert report.outcome == "hang" and report.rank == 1 and "(hung ranks [1])" in report.reason, report
