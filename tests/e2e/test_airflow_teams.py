"""Two teams through Airflow on the real control plane (issue 56, Build 4): the DAG of each job
on `tests/e2e/kube_stack.py` — kube-apiserver, kube-controller-manager, kube-scheduler, Kueue
v0.17.0, two simulated nodes of one CPU slot each — with the store on S3 and MLflow over HTTP.

Team `demo` holds one slot by right and may borrow the other; team `vision` holds the other.
`demo`'s low-priority gang of two ranks borrows `vision`'s idle slot and trains; `vision`'s
high-priority gang of one rank arrives. Nothing of ours preempts on a Kueue cluster: our placer
hands `vision`'s gang to Kueue unreserved, and Kueue reclaims its slot by evicting `demo`'s gang.
Its ranks commit their emergency checkpoint (a real DCP checkpoint in S3) before their pods go;
the attempt ends `preempted` with Kueue's cause in the DAG run's note and in the run's timeline;
the DAG requeues it, and its next attempt waits in `demo`'s queue with Kueue's quota reason on its
DAG run's note and in the Trainyard view. Capacity returns when `vision`'s run is marked failed in
Airflow (its gang stops, checkpointing first: what a person does; waiting for it to end by itself
would make the test a race between its training and the DAG's hand-over on a busy machine): `demo`'s
gang is admitted again, resumes from the emergency checkpoint and completes. Needs root and the Kubernetes binaries (skips elsewhere;
fails in CI, where TRAINYARD_REQUIRE names them).
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.airflow_stack import RunningStack, demo_spec
from tests.e2e.kube_stack import kube_stack
from tests.support.kube.harness import DEFAULT_NODES
from tests.support.kube.real_harness import RealKubeHarness
from trainyard.config.teams import Team, Teams
from trainyard.plugins.airflow_api import (
    AttemptRun,
    attempt_dag_run_id,
    first_attempt,
    follow_training_run,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
"""Two trainings, an eviction, two DAG hand-overs and a resume on two busy cores: longer than the
suite's 600 s default (the stack's start-up included)."""

LOW, HIGH = "demo-low", "vision-high"
TEAMS = Teams(teams={"demo": Team(share=0.5, quota_gpus=2), "vision": Team(share=0.5, quota_gpus=2)})
"""Kueue's queues for the two teams (names from config/teams.yaml, which validation reads): a
slot each by right, either may borrow the other's while it is idle."""
IMAGE = "registry.example.com/trainyard/demo:1"
INTERVAL = 20
LOW_STEPS, HIGH_STEPS = 160, 5000
"""The demo's own model (~0.5-3 s a step on two busy cores): demo's gang must still train when
vision's has gone through its DAG to Kueue; vision's trains until the test stops it."""


def _spec(name: str, team: str, priority: str, gpus: int, steps: int) -> dict[str, Any]:
    spec = demo_spec(name, smaller=False)
    spec["metadata"].update({"team": team, "priority": priority})
    spec["spec"]["image"] = IMAGE
    spec["spec"]["hardware"]["gpuCount"] = gpus
    spec["spec"]["checkpoint"] = {"intervalSteps": INTERVAL, "maxKeep": 100}
    spec["spec"]["training"]["maxSteps"] = steps
    spec["spec"]["faultTolerance"] = {"maxRestarts": 1, "hangTimeout": "90s", "inPlaceRestarts": 0}
    return spec


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[RealKubeHarness, RunningStack]]:
    with kube_stack(nodes=DEFAULT_NODES, cpus_per_node=1, teams=TEAMS) as both:
        yield both


def _emergency_steps(kube: RealKubeHarness, handle_name: str) -> set[int]:
    """The steps the pods of an attempt's Job logged an emergency checkpoint of (the worker's
    line), from their nodes' folders: the pods themselves are gone once Kueue evicted them."""
    found = set()
    for log in kube.root.glob(f"nodes/*/pods/*_{handle_name}-*/trainer.log"):
        found |= {int(m) for m in re.findall(r"SIGTERM: emergency checkpoint of step (\d+)", log.read_text(errors="replace"))}
    return found


def _trigger(stack: RunningStack, job: str) -> tuple[str, str]:
    """Attempt 0 of a new training run of `job`: (run, its first DAG run id)."""
    conf, dag_run_id = first_attempt({})
    stack.client.trigger(job, conf, run_id=dag_run_id)
    return conf["run"], dag_run_id


def _note(stack: RunningStack, job: str, dag_run_id: str) -> str:
    try:
        return stack.client.dag_run(job, dag_run_id).get("note") or ""
    except Exception:  # noqa: BLE001 - the next attempt's DAG run may not exist yet
        return ""


def _view(stack: RunningStack, job: str, run: str, what: str) -> dict[str, Any]:
    """The Trainyard view's JSON (`view.json` or `live.json`), as its page fetches it."""
    with urllib.request.urlopen(f"{stack.client.url}/trainyard/jobs/{job}/runs/{run}/{what}", timeout=30) as answer:
        return json.loads(answer.read())


def _losses(stack: RunningStack, run: str) -> list[Any]:
    from trainyard.plugins.tracking.runs import client_for

    client = client_for(stack.settings.mlflow_tracking_uri)
    exp = client.get_experiment_by_name("demo/tiny-lm")
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`trainyard.run` = '{run}'")
    return client.get_metric_history(found[0].info.run_id, "loss") if found else []


def test_kueue_preempts_the_borrowing_team_which_checkpoints_waits_with_the_quotas_reason_and_resumes(
        cluster: tuple[RealKubeHarness, RunningStack]) -> None:
    kube, stack = cluster
    stack.add_jobs({LOW: _spec(LOW, "demo", "low", 2, LOW_STEPS), HIGH: _spec(HIGH, "vision", "high", 1, HIGH_STEPS)})

    # demo's gang borrows vision's idle slot and trains
    low_run, low_first = _trigger(stack, LOW)
    stack.wait_for_task(LOW, low_first, "watch_training", "deferred", timeout_s=300)
    stack.until("demo's gang to train a few steps", lambda: max((m.step for m in _losses(stack, low_run)), default=0)
                >= 3, timeout_s=300)

    # vision's gang arrives: Kueue evicts demo's, which checkpoints and is requeued
    _, high_first = _trigger(stack, HIGH)
    followed: dict[str, list[AttemptRun]] = {}
    vision = threading.Thread(target=lambda: followed.setdefault(
        HIGH, follow_training_run(stack.client, HIGH, high_first, timeout_s=600)), daemon=True)
    vision.start()
    evicted = stack.until("demo's attempt 0 to end preempted, its note saying by whom",
                          lambda: (n := _note(stack, LOW, low_first)).startswith("attempt 0: preempted") and n,
                          timeout_s=300)
    assert "preempted by Kueue: Preempted (InCohortReclamation)" in evicted, evicted
    handle = stack.client.xcom(LOW, low_first, "launch_training")
    (saved,) = _emergency_steps(kube, handle["name"])  # every rank saved the same step, before its pod went
    assert f"→ requeue from step {saved} " in evicted, (saved, evicted)  # and the requeue resumes from it

    # its next attempt waits in demo's queue, saying why on its DAG run and in the view
    second = attempt_dag_run_id(low_run, 1)
    waiting = stack.until("demo's attempt 1 to say why it waits",
                          lambda: "waiting to start" in (n := _note(stack, LOW, second)) and n, timeout_s=300)
    assert "Kueue: pending: couldn't assign flavors" in waiting and "insufficient unused quota for cpu" in waiting, \
        waiting
    live = _view(stack, LOW, low_run, "live.json")
    assert live["attempt"] == 1 and "insufficient unused quota for cpu" in live["waiting"], live

    # capacity returns: a person marks vision's run failed, its gang stops (checkpointing first);
    # demo's is admitted again and completes from its emergency checkpoint
    stack.client.set_state(HIGH, high_first, "failed")
    vision.join(timeout=600)
    from trainyard.plugins.attempt.closing import run_timeline
    from trainyard.plugins.state.jobs import JobStateStore

    # a DAG run marked failed ends without classifying (the person's decision is the outcome):
    # the run's state says what happened, as for any run marked failed
    (high_attempt,) = followed[HIGH]
    high = stack.until("vision's run to be cancelled", lambda: (
        i := JobStateStore(stack.settings.state_db).get_run(HIGH, high_attempt.run)).final and i, timeout_s=120)
    assert high.state == "cancelled" and "marked failed" in high.final_reason, high
    attempts = follow_training_run(stack.client, LOW, low_first, timeout_s=600)
    assert [(a.state, a.outcome, a.action) for a in attempts] == [
        ("failed", "preempted", "requeue"), ("success", "completed", "register")], f"{attempts}\n{stack.logs()}"

    first, resumed = JobStateStore(stack.settings.state_db).attempts(LOW, low_run)
    assert first.outcome == "preempted" and first.reason.startswith("preempted by Kueue: Preempted"), first
    assert resumed.outcome == "completed", resumed
    timeline = [what for _, what in run_timeline(LOW, low_run, stack.settings)]
    assert any(line.startswith("attempt 0 preempted") and "preempted by Kueue: Preempted (InCohortReclamation)" in line
               for line in timeline), timeline
    view = _view(stack, LOW, low_run, "view.json")
    assert view["attempts"][0]["reason"] == first.reason, view["attempts"]
    assert view["attempts"][0]["resume_step"] == saved, view["attempts"]
    # resumed from that checkpoint, not an older one: no step trained (and logged) twice
    steps = [m.step for m in _losses(stack, low_run)]
    assert max(steps) == LOW_STEPS and len(steps) == len(set(steps)), steps
