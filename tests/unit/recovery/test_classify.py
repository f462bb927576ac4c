"""`classify` on run folders the launcher reads back (`runs.py`): one case per class, then the
precedence cases where one failure shows the symptoms of several."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.unit.recovery.runs import Rank, evidence
from trainyard.node_agent.models import NodeHealth, Verdict
from trainyard.plugins.recovery.classify import AttemptStillRunning, classify, stop_cause_of
from trainyard.plugins.recovery.evidence import NodeObservation
from trainyard.plugins.run import exit_codes

TRACEBACK = "Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: bad row 17\n"
OOM_LOG = ("step 9 loss 2.1\ntorch.OutOfMemoryError after step 9: CUDA out of memory. Tried to "
           "allocate 2.00 GiB\n")


def health(node: str, *verdicts: Verdict) -> NodeObservation:
    return NodeObservation(node=node, health=NodeHealth(
        node=node, time=time.time(), healthy=not verdicts, verdicts=list(verdicts), accelerator="cpu",
        uptime_s=10.0))


GPU_FAILED = Verdict(kind="gpu_failed", reason="Xid 79: GPU has fallen off the bus", since=0.0, gpu=1, xid=79)


def test_completed(tmp_path: Path) -> None:
    ev, status = evidence(tmp_path, [Rank(0), Rank(0)])
    report = classify(ev)
    assert status.state == "succeeded"
    assert (report.outcome, report.rank, report.exit_code, report.failed) == ("completed", None, 0, False)
    assert report.run == "r-0001" and report.step == 10


def test_worker_crash_names_the_first_failing_rank_and_its_log_line(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(-15, step=7, ended_at=20), Rank(1, step=7, log=TRACEBACK, ended_at=10)])
    report = classify(ev)
    assert (report.outcome, report.rank, report.node, report.exit_code) == ("worker_crash", 1, "local-1", 1)
    assert report.reason == "rank 1 on local-1 exited with code 1 at step 7: ValueError: bad row 17"
    assert report.log_line == "ValueError: bad row 17"
    assert any(line == "rank 1 on local-1: exit 1 at step 7" for line in report.evidence)


def test_a_signal_is_reported_as_such(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(0, step=12), Rank(-9, step=12, ended_at=5)])
    report = classify(ev)
    assert report.outcome == "worker_crash"
    assert report.reason == "rank 1 on local-1 was killed by SIGKILL at step 12"


def test_node_lost_from_a_fatal_verdict(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(0), Rank(-6, ended_at=3)],
                     nodes=[health("local-0"), health("local-1", GPU_FAILED)])
    report = classify(ev)
    assert (report.outcome, report.failed_nodes) == ("node_lost", ["local-1"])
    assert "local-1 GPU 1: gpu_failed (Xid 79)" in report.reason


def test_node_lost_from_missed_heartbeats_but_not_from_one(tmp_path: Path) -> None:
    gone = NodeObservation(node="local-1", missed_heartbeats=3, error="connection refused")
    ev, _ = evidence(tmp_path / "a", [Rank(0), Rank(-9)], nodes=[gone])
    report = classify(ev)
    assert (report.outcome, report.failed_nodes) == ("node_lost", ["local-1"])
    assert "missed 3 heartbeats: connection refused" in report.reason
    once = NodeObservation(node="local-1", missed_heartbeats=1, error="timeout")
    ev, _ = evidence(tmp_path / "b", [Rank(0), Rank(-9)], nodes=[once])
    assert classify(ev).outcome == "worker_crash"


def test_a_node_outside_the_gang_is_not_our_problem(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(0), Rank(1)], nodes=[health("other-7", GPU_FAILED)])
    assert classify(ev).outcome == "worker_crash"


def test_hang_when_the_watcher_stopped_the_gang(tmp_path: Path) -> None:
    ev, status = evidence(tmp_path, [Rank(-9, step=40, ended_at=101), Rank(-9, step=41, ended_at=101)],
                          stop_reason="hang: rank 0 made no step progress for 620 s")
    report = classify(ev)
    assert status.state == "stopped"
    assert report.outcome == "hang" and "rank 0 made no step progress for 620 s" in report.reason


def test_hang_while_running(tmp_path: Path) -> None:
    ev, status = evidence(tmp_path, [Rank(None, step=40), Rank(None, step=41)], alive_hung=True)
    assert status.state == "running" and all(r.hung for r in status.ranks)
    report = classify(ev)
    # every rank stalls once one does: the laggard (step 40; rank 1 finished 41 and waits) is blamed
    assert report.outcome == "hang" and report.rank == 0 and "(hung ranks [0])" in report.reason
    assert report.time_to_detect_s == pytest.approx(900, abs=30)  # dated by the last heartbeat


def test_a_lost_node_is_dated_by_its_verdict_and_detected_by_the_stop(tmp_path: Path) -> None:
    onset = time.time() - 1000
    verdict = GPU_FAILED.model_copy(update={"since": onset})
    ev, _ = evidence(tmp_path, [Rank(-15, ended_at=101)] * 2, stop_reason="node_lost: local-0 GPU 1",
                     stop_after=100, stop_nodes=("local-0",), nodes=[health("local-0", verdict)])
    report = classify(ev)
    assert report.outcome == "node_lost"
    assert report.failed_at.timestamp() == pytest.approx(onset)
    assert report.detected_at.timestamp() == pytest.approx(ev.stop_reason.at)


def test_a_node_lost_to_silence_is_dated_by_its_agents_last_answer(tmp_path: Path) -> None:
    """No verdict dates a node that went silent: the health watch's stop reason carries the
    time its agent last answered (`StopReason.since`)."""
    ev, _ = evidence(tmp_path, [Rank(-15, ended_at=101)] * 2, stop_reason="node_lost: local-1 missed 3 heartbeats",
                     stop_after=100, stop_nodes=("local-1",),
                     nodes=[NodeObservation(node="local-1", missed_heartbeats=3, error="connection refused")])
    assert classify(ev).time_to_detect_s is None  # nothing dates it
    answered = ev.stop_reason.at - 12.5
    ev = ev.model_copy(update={"stop_reason": ev.stop_reason.model_copy(update={"since": answered})})
    report = classify(ev)
    assert (report.outcome, report.failed_nodes) == ("node_lost", ["local-1"])
    assert report.failed_at.timestamp() == pytest.approx(answered)
    assert report.time_to_detect_s == pytest.approx(12.5)


def test_node_lost_when_kubernetes_evicted_the_pod_of_a_node_not_ready() -> None:
    """Kubernetes can see the node go before the health watch misses its agent three times: the
    Job aborts with the pod evicted from a node not Ready. That is the node's loss, not a crash."""
    from trainyard.plugins.recovery.evidence import Evidence
    from trainyard.plugins.run.model import AgentStatus, RankStatus, RunStatus

    aborted = RunStatus(state="failed", message="Volcano phase Aborted: pod w-1 on kube-sim-1 was evicted",
                        ranks=[RankStatus(rank=0, node="kube-sim-0", step=14), RankStatus(rank=1, node="kube-sim-1")],
                        agents=[AgentStatus(node="kube-sim-0", alive=False, node_ready=True),
                                AgentStatus(node="kube-sim-1", alive=False, reason="Evicted", node_ready=False)])
    report = classify(Evidence(job="tiny", status=aborted))
    assert (report.outcome, report.failed_nodes) == ("node_lost", ["kube-sim-1"])
    assert "node(s) not Ready: kube-sim-1" in report.reason
    ready = aborted.model_copy(update={"agents": [a.model_copy(update={"node_ready": True}) for a in aborted.agents]})
    assert classify(Evidence(job="tiny", status=ready)).outcome != "node_lost"


def test_a_running_attempt_without_symptoms_is_refused(tmp_path: Path) -> None:
    from trainyard.plugins.recovery.evidence import Evidence
    from trainyard.plugins.run.model import RankStatus, RunStatus

    running = RunStatus(state="running", ranks=[RankStatus(rank=0, step=3)])
    with pytest.raises(AttemptStillRunning, match="nothing to classify yet"):
        classify(Evidence(job="tiny", status=running))


def test_diverged_with_its_onset(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(42, step=160), Rank(42, step=160)], diverged={
        "step": 160, "onset_step": 61, "reason": "above_baseline", "loss": "31.0", "baseline": 2.0,
        "last_checkpoint_step": 150, "message": "loss 31 above its baseline 2 since step 61 (step 160)"})
    report = classify(ev)
    assert (report.outcome, report.onset_step, report.step) == ("diverged", 61, 160)
    assert "onset step 61" in report.reason


def test_checkpoint_corrupt_from_the_worker_record(tmp_path: Path) -> None:
    uri = "file:///objects/jobs/tiny/checkpoints/step-00000020/MANIFEST.json"
    ev, _ = evidence(tmp_path, [Rank(exit_codes.CHECKPOINT_CORRUPT, step=0)] * 2, corrupt={
        "resume_from": uri, "reason": f"requested checkpoint {uri} does not verify: step 20: corrupt"})
    report = classify(ev)
    assert (report.outcome, report.corrupt_checkpoint) == ("checkpoint_corrupt", uri)
    assert "does not verify" in report.reason


def test_checkpoint_corrupt_from_the_log_alone(tmp_path: Path) -> None:
    log = ("trainyard.plugins.checkpoint.errors.NoValidCheckpointError: no checkpoint under file:///x "
           "verifies: step 4: a.distcp: missing\n")
    ev, _ = evidence(tmp_path, [Rank(1, log=log, step=0), Rank(0, step=0)], resume_from="")
    report = classify(ev)
    assert report.outcome == "checkpoint_corrupt" and "NoValidCheckpointError" in report.reason


def test_oom_from_the_exit_code_or_the_log(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path / "code", [Rank(exit_codes.OOM, log=OOM_LOG, step=9), Rank(-15, step=9, ended_at=5)])
    report = classify(ev)
    assert (report.outcome, report.rank, report.exit_code) == ("oom", 0, exit_codes.OOM)
    assert "CUDA out of memory" in report.log_line and "at step 9" in report.reason
    # A user script that died of it with a plain traceback (exit 1):
    ev, _ = evidence(tmp_path / "log", [Rank(1, log="RuntimeError: CUDA out of memory. Tried to allocate")] * 2)
    assert classify(ev).outcome == "oom"


def test_preempted_by_an_outside_sigterm(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(exit_codes.PREEMPTED, step=30)] * 2)
    report = classify(ev)
    assert report.outcome == "preempted" and "emergency checkpoint committed" in report.reason
    ev, _ = evidence(tmp_path / "b", [Rank(exit_codes.PREEMPTED_NO_CHECKPOINT, step=30)] * 2)
    assert "no emergency checkpoint" in classify(ev).reason


def test_preempted_by_the_platform_when_the_lease_was_lost(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(43, ended_at=101)] * 2,
                     stop_reason="lease_lost: the reservation expired while the control plane was down")
    report = classify(ev)
    assert report.outcome == "preempted" and "reservation lost" in report.reason


def test_cancelled_by_a_user_stop(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(43, ended_at=101)] * 2, stop_reason="requested: trainyard stop")
    report = classify(ev)
    assert (report.outcome, report.failed) == ("cancelled", False)
    assert report.reason == "stopped on request (trainyard stop)"
    # A stop with no reason recorded (Ctrl-C in `trainyard launch`) is a stop on request too.
    ev, _ = evidence(tmp_path / "b", [Rank(43, ended_at=101)] * 2, stop_reason="")
    assert classify(ev).outcome == "cancelled"


def test_in_place_restarts_are_counted(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(0, restart=2), Rank(-9, restart=2, earlier_exits=[-9, -9])],
                     max_restarts=2)
    report = classify(ev)
    assert (report.outcome, report.restarts_in_place) == ("worker_crash", 2)
    assert any("restarted the workers in place 2 time(s) (of 2)" in line for line in report.evidence)


def test_in_place_restarts_are_counted_from_the_node_agents_heartbeats_when_no_exit_says(
        tmp_path: Path) -> None:
    """A stopped Kubernetes Job takes its pods' exit records with it: the healthy node's agent
    still serves its ranks' heartbeats, which carry the gang's restart count."""
    from trainyard.node_agent.models import RankHeartbeat

    gone = NodeObservation(node="local-1", missed_heartbeats=3, error="connection refused")
    alive = health("local-0")
    beat = RankHeartbeat(job="tiny", run="r-0001", attempt=0, rank=0, pid=7, phase="train", step=33,
                         time=time.time(), age_s=1.0, hang_timeout_s=60.0, stale=False, restart=1)
    alive = alive.model_copy(update={"health": alive.health.model_copy(update={"ranks": [beat]})})
    ev, _ = evidence(tmp_path / "a", [Rank(0), Rank(-9)], nodes=[gone, alive])
    gone_job = ev.status.model_copy(update={"ranks": [], "step": None})  # what polling a deleted Job gives
    ev = ev.model_copy(update={"status": gone_job, "exits": []})
    report = classify(ev)
    assert (report.outcome, report.restarts_in_place) == ("node_lost", 1)
    assert report.step == 33  # the lost node says nothing; its peer's heartbeat does
    # another attempt's heartbeat on that node says nothing about this one
    other = beat.model_copy(update={"attempt": 3})
    alive = alive.model_copy(update={"health": alive.health.model_copy(update={"ranks": [other]})})
    ev, _ = evidence(tmp_path / "b", [Rank(0), Rank(-9)], nodes=[gone, alive])
    assert classify(ev).restarts_in_place == 0


def test_a_replayed_control_plane_exit_is_not_an_in_place_restart(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(42, restart=1, earlier_exits=[42], replayed=True)] * 2, max_restarts=1,
                     diverged={"step": 7, "onset_step": 7})
    report = classify(ev)
    assert (report.outcome, report.onset_step, report.restarts_in_place) == ("diverged", 7, 0)


# --- precedence ---------------------------------------------------------------------------------


def test_node_lost_wins_over_the_crash_it_caused(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(1, log=TRACEBACK), Rank(-6)],
                     nodes=[health("local-1", Verdict(kind="node_unhealthy", reason="disk full", since=0.0))])
    report = classify(ev)
    assert report.outcome == "node_lost" and report.failed_nodes == ["local-1"]
    assert any("ValueError: bad row 17" in line for line in report.evidence)  # symptom kept


def test_node_lost_wins_over_a_hang_and_a_divergence(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(42), Rank(42)], diverged={"step": 5, "onset_step": 5},
                     nodes=[health("local-0", GPU_FAILED)])
    assert classify(ev).outcome == "node_lost"
    ev, _ = evidence(tmp_path / "b", [Rank(-9, ended_at=101)] * 2, stop_reason="hang: rank 1",
                     nodes=[health("local-1", GPU_FAILED)])
    assert classify(ev).outcome == "node_lost"


def test_a_user_stop_wins_over_everything(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(-9, ended_at=101)] * 2, stop_reason="requested: stop it",
                     nodes=[health("local-1", GPU_FAILED)])
    assert classify(ev).outcome == "cancelled"


def test_a_failure_before_the_hang_stop_is_the_cause(tmp_path: Path) -> None:
    """The watcher stopped a gang whose rank 1 had already crashed (the others waited in a
    collective): the crash is the cause, the stop only cleaned up."""
    ev, status = evidence(tmp_path, [Rank(-9, ended_at=150), Rank(3, log=TRACEBACK, ended_at=50)],
                          stop_reason="hang: rank 0 made no progress", stop_after=100)
    assert status.state == "failed"
    report = classify(ev)
    assert (report.outcome, report.rank) == ("worker_crash", 1)


def test_the_platform_stop_for_a_hang_is_not_a_preemption(tmp_path: Path) -> None:
    """The stop's SIGTERM makes healthy ranks exit 43 after an emergency checkpoint."""
    ev, _ = evidence(tmp_path, [Rank(43, ended_at=101), Rank(-9, ended_at=102)], stop_reason="hang: rank 1")
    assert classify(ev).outcome == "hang"


def test_checkpoint_corrupt_wins_over_the_crash_exit(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(exit_codes.CHECKPOINT_CORRUPT, step=0), Rank(-15, step=0, ended_at=9)],
                     corrupt={"resume_from": "", "reason": "no checkpoint verifies"})
    assert classify(ev).outcome == "checkpoint_corrupt"


def test_oom_wins_over_the_crash_of_the_other_rank(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(1, log=TRACEBACK, ended_at=5), Rank(1, log=OOM_LOG, ended_at=9)])
    report = classify(ev)
    assert report.outcome == "oom" and report.rank == 0  # rank 0 failed first; rank 1's log says why


def test_node_lost_named_by_the_health_watcher(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(-9, ended_at=101)] * 2, stop_reason="node_lost: gpu_failed on local-1",
                     stop_nodes=("local-1",))
    report = classify(ev)
    assert (report.outcome, report.failed_nodes) == ("node_lost", ["local-1"])
    assert report.reason == "node lost: gpu_failed on local-1"
    assert "stop-reason.json: node_lost: gpu_failed on local-1" in report.evidence


def test_the_launchers_clean_up_of_a_failed_gang_is_not_a_request(tmp_path: Path) -> None:
    """`settle` stops what a failed attempt left running (stopped.json, no reason) after the
    failure: the failure is the cause."""
    ev, status = evidence(tmp_path, [Rank(7, ended_at=50), Rank(-15, ended_at=150)], stop_reason="",
                          stop_after=100)
    assert status.state == "failed" and ev.stop is not None and stop_cause_of(ev) is None
    assert classify(ev).outcome == "worker_crash"


def test_a_hang_stop_without_detail_still_reads(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(-9, ended_at=101)] * 2, stop_reason="hang:")
    report = classify(ev)
    assert (report.outcome, report.reason) == ("hang", "hang: the hang watcher stopped the gang")


IMPORT_ERROR = ("Traceback (most recent call last):\n  File \"/team/train.py\", line 2, in <module>\n"
                "    import transformerz\nModuleNotFoundError: No module named 'transformerz'\n")


def test_the_same_start_up_error_on_every_rank_before_a_step_is_the_users_error(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(1, step=0, log=IMPORT_ERROR, ended_at=1),
                                Rank(1, step=0, log="[rank1]: " + IMPORT_ERROR.splitlines()[-1], ended_at=2)])
    report = classify(ev)
    assert (report.outcome, report.rank, report.exit_code) == ("user_error", 0, 1)
    assert report.reason == ("rank 0 on local-0 failed before training: "
                             "ModuleNotFoundError: No module named 'transformerz'")


def test_a_peer_the_agent_ended_before_it_reached_the_error_does_not_make_it_a_crash(tmp_path: Path) -> None:
    """Rank 0's import failed first; torchrun's SIGTERM ended rank 1 before its own import did."""
    ev, _ = evidence(tmp_path, [Rank(1, step=0, log=IMPORT_ERROR, ended_at=1),
                                Rank(-15, step=0, log="=== rank 1 restart 0 …\n", ended_at=2)])
    assert classify(ev).outcome == "user_error"


@pytest.mark.parametrize(("ranks", "why"), [
    ([Rank(1, step=5, log=IMPORT_ERROR, ended_at=1), Rank(-15, step=5, ended_at=2)], "it had trained"),
    ([Rank(-9, step=0, log=IMPORT_ERROR, ended_at=1), Rank(-15, step=0, ended_at=2)], "a signal"),
    ([Rank(1, step=0, log=IMPORT_ERROR, ended_at=1), Rank(1, step=0, log=TRACEBACK, ended_at=2)], "ranks differ"),
    ([Rank(1, step=0, log=TRACEBACK, ended_at=1), Rank(1, step=0, log=TRACEBACK, ended_at=2)], "not a start-up error"),
])
def test_anything_else_stays_a_worker_crash(tmp_path: Path, ranks: list[Rank], why: str) -> None:
    assert classify(evidence(tmp_path, ranks)[0]).outcome == "worker_crash", why
