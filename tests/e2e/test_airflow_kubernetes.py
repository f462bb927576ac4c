"""The DAG on Kubernetes (DESIGN §11): the demo job through a real Airflow whose cluster is the
simulated one — three nodes of one CPU "GPU" each behind the emulated API server and Volcano
(`tests/support/kube`), each node a network namespace whose kubelet runs the pods as real
processes. Nothing of the launch path is patched: `launch_training` submits a Volcano Job
through the cncf-kubernetes provider's `KubernetesHook` (the connection
`AIRFLOW_CONN_KUBERNETES_DEFAULT`), the training trigger polls it, the health watch polls the
nodes' agents, torchrun's gloo rendezvous crosses the namespaces' network, and the pods write
checkpoints and MLflow through the shared filesystem (the object store's folder, the embedded
PostgreSQL's Unix socket).

One stack and one harness serve the module: a happy run through a restart of the scheduler and
the triggerer (the trigger re-attaches; one Job), a gang larger than the cluster (refused with the
numbers before anything is allocated), a crashed rank (→ worker_crash → restart) and a node whose
link goes down mid-run (→ node_lost → cordon + re-place on the spare node → resume from the
newest checkpoint). Needs root and `ip netns` (skips elsewhere; fails in
CI, where TRAINYARD_REQUIRE names netns).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.airflow_stack import RunningStack, demo_spec, running_stack
from tests.support.kube.harness import NODES_WITH_SPARE, KubeHarness, harness_or_skip
from trainyard.plugins.airflow_api import AttemptRun, follow_training_run

pytestmark = pytest.mark.slow

NODES = NODES_WITH_SPARE
JOB = "kube-tiny"
INTERVAL = 10
JOBS = ("batch.volcano.sh/v1alpha1", "jobs")
IMAGE = "registry.example.com/trainyard/demo:1"
"""Pulled nowhere: the simulated nodes run every image as this checkout's venv."""


def _spec(steps: int) -> dict[str, Any]:
    spec = demo_spec(JOB)  # the smaller model: the subject is the launch path, not the model
    spec["spec"]["image"] = IMAGE
    spec["spec"]["checkpoint"] = {"intervalSteps": INTERVAL, "maxKeep": 100}
    spec["spec"]["training"]["maxSteps"] = steps
    # every failure goes through the control plane (a killed pod takes its torchrun with it)
    spec["spec"]["faultTolerance"] = {"maxRestarts": 3, "hangTimeout": "60s", "inPlaceRestarts": 0}
    return spec


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeHarness]:
    harness = harness_or_skip(tmp_path_factory.mktemp("kube"), nodes=NODES)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(scope="module")
def stack(kube: KubeHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    folder = tmp_path_factory.mktemp("airflow-kube")
    with running_stack(folder / "home", overrides=kube.airflow_overrides(folder), agents=kube.node_agents) as s:
        yield s


def _train(s: RunningStack, steps: int, conf: dict[str, Any] | None = None, *, during: Any = None) -> list[AttemptRun]:
    """Write the job with `steps`, trigger it and follow its training run to the end."""
    s.add_jobs({JOB: _spec(steps)})
    first = s.client.trigger(JOB, conf or {})["dag_run_id"]
    if during is not None:
        during(first)
    return follow_training_run(s.client, JOB, first, timeout_s=600)


def _volcano_jobs(kube: KubeHarness, run: str) -> list[dict[str, Any]]:
    return [j for j in kube.rest().list(*JOBS, namespace=kube.namespace)
            if j["metadata"].get("labels", {}).get("trainyard.io/run") == run]


def _pods(kube: KubeHarness, job_name: str) -> list[dict[str, Any]]:
    return [p for p in kube.rest().list("v1", "pods", namespace=kube.namespace)
            if p["metadata"].get("labels", {}).get("volcano.sh/job-name") == job_name]


def _handle(s: RunningStack, attempt: AttemptRun) -> Any:
    from trainyard.plugins.run.model import RunHandle

    return RunHandle.model_validate(s.client.xcom(JOB, attempt.dag_run_id, "launch_training"))


def _losses(s: RunningStack, run: str) -> list[Any]:
    from trainyard.plugins.tracking.runs import client_for

    client = client_for(s.settings.mlflow_tracking_uri)
    exp = client.get_experiment_by_name("demo/tiny-lm")
    (found,) = client.search_runs([exp.experiment_id], filter_string=f"tags.`trainyard.run` = '{run}'")
    return client.get_metric_history(found.info.run_id, "loss")


def test_the_demo_job_trains_as_a_volcano_job_on_the_simulated_nodes(stack: RunningStack, kube: KubeHarness) -> None:
    """…and the scheduler and the triggerer restart while the attempt is watched: the trigger
    re-attaches to the Job from the stored handle; nothing submits a second Job."""
    steps = 40

    def restart_airflow_while_watching(first_dag_run: str) -> None:
        stack.wait_for_task(JOB, first_dag_run, "watch_training", "deferred")
        stack.stack.stop_all(["triggerer", "scheduler"])
        stack.stack.start("scheduler")
        stack.stack.start("triggerer")

    attempts = _train(stack, steps, during=restart_airflow_while_watching)
    assert [(a.state, a.outcome, a.action) for a in attempts] == [("success", "completed", "register")], \
        f"{attempts}\n{stack.logs()}"
    (attempt,) = attempts
    handle = _handle(stack, attempt)
    assert handle.kind == "kubernetes", handle
    (job,) = _volcano_jobs(kube, attempt.run)  # one Job for the one attempt, no second submit
    assert job["metadata"]["name"] == handle.name and job["metadata"]["uid"] == handle.uid
    assert job["status"]["state"]["phase"] == "Completed", job["status"]
    pods = _pods(kube, handle.name)
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} <= set(NODES), pods
    assert len({p["spec"]["nodeName"] for p in pods}) == 2  # one slot a node: the gang spans two
    assert max(m.step for m in _losses(stack, attempt.run)) == steps  # the pods reached MLflow
    assert stack.client.task_instances(JOB, attempt.dag_run_id)["launch_training"]["try_number"] == 1
    from trainyard.plugins.state.jobs import JobStateStore

    info = JobStateStore(stack.settings.state_db).get_run(JOB, attempt.run)
    assert info.state == "completed", info
    # the attempt's handle names the nodes the pods ran on, in node-rank order (c10d's order of
    # the pods' names), as the watch found them bound: what a recovery would blame and cordon
    from trainyard.plugins.launch.gang_pods import node_order

    bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    (stored,) = JobStateStore(stack.settings.state_db).attempts(JOB, attempt.run)
    assert stored.run_handle is not None and stored.run_handle.nodes == [bound[p] for p in node_order(handle.name, bound)]


def test_a_gang_larger_than_the_cluster_is_refused_with_the_numbers_and_submits_nothing(
        stack: RunningStack, kube: KubeHarness) -> None:
    """Before anything is allocated: the job's DAG reports it (paused, tagged invalid, the report
    in its documentation) with what was asked and what the cluster has, and runs nothing; the
    other jobs' DAGs stay; no Volcano Job is made. (The launcher's own Unschedulable, past
    Volcano's gang check, is an integration test.)"""
    spec = _spec(5)
    spec["metadata"]["name"] = big = "kube-too-big"
    spec["spec"]["hardware"]["gpuCount"] = len(NODES) + 1
    stack.write_jobs({big: spec})
    try:
        stack.client.request_parse()
        details = stack.until(f"the DAG {big}", lambda: big in stack.client.dags() and stack.client.dag_details(big),
                              timeout_s=120)
        error = details["doc_md"]
        assert "trainyard:invalid-spec" in {t["name"] for t in details["tags"]} and details["is_paused"], details
        assert "CLUSTER_TOO_SMALL spec.hardware.gpuCount" in error, error
        assert f"{len(NODES) + 1} cpu requested; cluster 'kube-sim' has {len(NODES)} healthy" in error, error
        assert JOB in stack.client.dags() and stack.client.import_errors() == []
        assert not [j for j in kube.rest().list(*JOBS, namespace=kube.namespace)
                    if j["metadata"].get("labels", {}).get("trainyard.io/job") == big]
    finally:  # the next tests' DAG file parses without it
        (stack.jobs_dir / f"{big}.yaml").unlink()


def test_a_crashed_rank_fails_its_pod_and_the_run_restarts_from_the_checkpoint(
        stack: RunningStack, kube: KubeHarness) -> None:
    steps = 30
    attempts = _train(stack, steps, {"fault_kill_rank": 1, "fault_kill_at_step": 15})
    assert [(a.state, a.outcome, a.action) for a in attempts] == [
        ("failed", "worker_crash", "restart"), ("success", "completed", "register")], f"{attempts}\n{stack.logs()}"
    run = attempts[0].run
    first, second = (_handle(stack, a) for a in attempts)
    # one Job name per run; attempt 1's Job replaced attempt 0's failed one (another uid)
    assert (first.name, first.attempt, second.attempt) == (second.name, 0, 1) and first.uid != second.uid
    action = stack.client.xcom(JOB, attempts[0].dag_run_id, "classify_outcome", key="action")
    assert action["resume_step"] == INTERVAL, action  # the kill came at step 15: resume from 10
    (job,) = _volcano_jobs(kube, run)
    assert (job["metadata"]["uid"], job["status"]["state"]["phase"]) == (second.uid, "Completed"), job["status"]
    assert max(m.step for m in _losses(stack, run)) == steps


def test_a_node_whose_link_goes_down_is_lost_cordoned_and_replaced(stack: RunningStack, kube: KubeHarness) -> None:
    """The link of a gang node goes down once the first checkpoint is committed; the health
    watch misses its agent, the gang is stopped, the node cordoned, and the next attempt is
    placed on the spare node and resumes from the newest checkpoint."""
    # Attempt 0 holds before step 25 (rank 1 SIGSTOPs itself: the first attempt's fault only,
    # far inside the 60 s hang timeout), so the link goes down while the gang runs however slowly
    # this machine trains, and the gang cannot finish before the loss is seen; the step-10
    # checkpoint is committed by then (a rank's save at step 20 waits for its previous one).
    # Attempt 1 runs clean from that checkpoint: 30 steps, not the 190 a race would need.
    steps = 40
    lost: dict[str, str] = {}

    def take_a_node_down(first_dag_run: str) -> None:
        from trainyard.plugins.checkpoint.catalog import list_checkpoints
        from trainyard.plugins.launch.environment import checkpoint_uri

        deadline = time.monotonic() + 300
        handle = None
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                raw = stack.client.xcom(JOB, first_dag_run, "launch_training")
            except Exception:  # noqa: BLE001 - not launched yet
                continue
            if not raw:
                continue
            from trainyard.config.spec import TrainingJob
            from trainyard.plugins.run.model import RunHandle

            handle = RunHandle.model_validate(raw)
            root = checkpoint_uri(TrainingJob.model_validate(_spec(steps)), stack.settings.object_store, handle.run)
            if list_checkpoints(root):
                break
        assert handle is not None, "the first attempt never launched"
        node = sorted(p["spec"]["nodeName"] for p in _pods(kube, handle.name))[-1]
        lost["node"] = node
        kube.lose_node(node)

    attempts = _train(stack, steps, {"fault_hang_rank": 1, "fault_hang_at_step": 25}, during=take_a_node_down)
    assert [(a.outcome, a.action) for a in attempts][:1] == [("node_lost", "replace_node")], f"{attempts}\n{stack.logs()}"
    assert attempts[-1].outcome == "completed", f"{attempts}\n{stack.logs()}"
    assert attempts[0].state == "failed"
    from trainyard.plugins.state.jobs import JobStateStore

    # whichever saw it first — the health watch (3 missed agent polls, its stop reason kept) or
    # Kubernetes (the pod evicted from the node not Ready) — the lost node is the one named
    report = JobStateStore(stack.settings.state_db).attempts(JOB, attempts[0].run)[0].failure_report
    assert report.failed_nodes == [lost["node"]], report
    if "missed 3 heartbeats" in report.reason:  # the health watch's: dated by the agent's last answer
        assert report.time_to_detect_s is not None and report.time_to_detect_s > 0, report
    second = _handle(stack, attempts[1])
    assert lost["node"] not in second.nodes and len(second.nodes) == 2, second  # the spare took its place
    assert {p["spec"]["nodeName"] for p in _pods(kube, second.name)} == set(second.nodes)
    action = stack.client.xcom(JOB, attempts[0].dag_run_id, "classify_outcome", key="action")
    assert action["resume_step"] >= INTERVAL, action  # from a checkpoint, not from scratch
    assert max(m.step for m in _losses(stack, attempts[0].run)) == steps
    kube.restore_node(lost["node"])
