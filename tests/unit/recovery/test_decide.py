"""`decide` on each class, the budget, the repeat guards, and the checkpoint choices against a
real local checkpoint catalog (manifests fabricated by `tests/unit/checkpoint/fabricate.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT
from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.config.cluster import load_cluster
from trainyard.config.loader import load_spec_file
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor import plan_job
from trainyard.plugins.attempt.bookkeeping import (
    DecisionInputs,
    apply_quarantine,
    decide_from_catalog,
)
from trainyard.plugins.checkpoint.catalog import latest_valid, list_checkpoints, scan, verify
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, step_dir
from trainyard.plugins.recovery.model import (
    NOT_REGISTERED,
    REGISTRATION_OFF,
    AttemptConf,
    FailureReport,
)
from trainyard.plugins.storage.store import ObjectStore, open_store

SPEC = load_spec_file(REPO_ROOT / "config/jobs/demo-tiny-lm.yaml")


def job(max_restarts: int = 3) -> TrainingJob:
    ft = SPEC.spec.fault_tolerance.model_copy(update={"max_restarts": max_restarts})
    return SPEC.model_copy(update={"spec": SPEC.spec.model_copy(update={"fault_tolerance": ft})})


def report(outcome: str, **kw: object) -> FailureReport:
    fields = {"job": "demo-tiny-lm", "run": "r-0001", "attempt": 0, "reason": f"{outcome} for the test", **kw}
    return FailureReport(outcome=outcome, **fields)


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store((tmp_path / "objects" / "jobs" / "demo-tiny-lm" / "runs" / "r-0001" / "checkpoints").as_uri())


@pytest.fixture
def ctx(store: ObjectStore) -> DecisionInputs:
    return DecisionInputs(checkpoint_uri=store.uri)


def uri(store: ObjectStore, step: int) -> str:
    return store.key_uri(f"{step_dir(step)}/{MANIFEST_NAME}")


def corrupt(store: ObjectStore, step: int) -> None:
    store.put_bytes(f"{step_dir(step)}/__0_0.distcp", b"bit rot" * 200)


def test_completed_and_cancelled(ctx: DecisionInputs, store: ObjectStore) -> None:
    finished = decide_from_catalog(report("completed"), job(), AttemptConf(), ctx)  # no checkpoint of ours: a plain script
    assert (finished.kind, finished.retries) == ("finish", False)
    assert finished.reason == f"completed — {NOT_REGISTERED}"
    make_checkpoint(store, 10)
    assert decide_from_catalog(report("completed"), job(), AttemptConf(), ctx).kind == "register"
    action = decide_from_catalog(report("cancelled", reason="stopped on request (user: x)"), job(), AttemptConf(), ctx)
    assert (action.kind, action.retries, action.reason) == ("cancel", False, "stopped on request (user: x)")


def registration(enabled: bool) -> TrainingJob:
    body = SPEC.spec.model_copy(update={"registration": SPEC.spec.registration.model_copy(update={"enabled": enabled})})
    return SPEC.model_copy(update={"spec": body})


@pytest.mark.parametrize(("spec_on", "param", "kind", "why"), [
    (True, None, "register", ""),
    (True, False, "finish", "(the trigger's register_model Param)"),
    (False, None, "finish", "(spec.registration.enabled: false)"),
    (False, True, "register", ""),
    (False, False, "finish", "(spec.registration.enabled: false)"),  # the form's switch as the spec set it
])
def test_registration_off_finishes_without_registering_and_says_who_turned_it_off(
        spec_on: bool, param: bool | None, kind: str, why: str, ctx: DecisionInputs, store: ObjectStore) -> None:
    make_checkpoint(store, 10)  # something to register: only the setting decides
    action = decide_from_catalog(report("completed"), registration(spec_on), AttemptConf(register_model=param), ctx)
    assert (action.kind, action.retries) == (kind, False)
    if kind == "finish":
        assert action.reason == f"completed — {REGISTRATION_OFF} {why}"


@pytest.mark.parametrize("outcome", ["worker_crash", "hang"])
def test_crash_and_hang_restart_from_the_newest_valid(outcome: str, store: ObjectStore, ctx: DecisionInputs) -> None:
    for step in (50, 100):
        make_checkpoint(store, step)
    action = decide_from_catalog(report(outcome), job(), AttemptConf(), ctx)
    assert (action.kind, action.resume_from, action.counts_against_budget) == ("restart", "", True)
    assert action.reason.endswith("restart the same gang from step 100")


def test_node_lost_replaces_the_node(store: ObjectStore, ctx: DecisionInputs) -> None:
    action = decide_from_catalog(report("node_lost", failed_nodes=["local-1"]), job(), AttemptConf(), ctx)
    assert (action.kind, action.exclude_nodes) == ("replace_node", ["local-1"])
    assert "re-place without local-1, resume from scratch" in action.reason
    nxt = AttemptConf(exclude_nodes=["local-3"]).next_attempt(report("node_lost"), action)
    assert nxt.exclude_nodes == ["local-1", "local-3"] and nxt.restarts_used == 1


def test_diverged_rolls_back_before_the_onset_and_quarantines_what_follows(
        store: ObjectStore, ctx: DecisionInputs) -> None:
    for step in (50, 100, 150):
        make_checkpoint(store, step)
    corrupt(store, 50)  # not a candidate anyway; the newest valid before 120 is 100
    action = decide_from_catalog(report("diverged", onset_step=120, step=170), job(), AttemptConf(), ctx)
    assert (action.kind, action.resume_from, action.quarantine) == ("rollback", uri(store, 100), [uri(store, 150)])
    assert "roll back to step 100" in action.reason
    apply_quarantine(action)
    # A later crash resumes from the newest valid checkpoint, which is no longer step 150.
    assert latest_valid(store).step == 100
    assert store.exists(f"{step_dir(150)}/{MANIFEST_NAME}") and verify(store, 150).ok  # kept


def test_diverged_skips_an_invalid_checkpoint_before_the_onset(store: ObjectStore, ctx: DecisionInputs) -> None:
    for step in (50, 100):
        make_checkpoint(store, step)
    corrupt(store, 100)
    action = decide_from_catalog(report("diverged", onset_step=101), job(), AttemptConf(), ctx)
    assert action.resume_from == uri(store, 50)


def test_diverged_without_a_checkpoint_before_the_onset_gives_up(store: ObjectStore, ctx: DecisionInputs) -> None:
    make_checkpoint(store, 100)
    action = decide_from_catalog(report("diverged", onset_step=80), job(), AttemptConf(), ctx)
    assert action.kind == "give_up" and "would diverge again" in action.reason
    assert decide_from_catalog(report("diverged"), job(), AttemptConf(), ctx).kind == "give_up"  # onset unknown


def test_checkpoint_corrupt_falls_back_and_quarantines_the_bad_one(store: ObjectStore, ctx: DecisionInputs) -> None:
    for step in (50, 100):
        make_checkpoint(store, step)
    corrupt(store, 100)
    action = decide_from_catalog(report("checkpoint_corrupt", corrupt_checkpoint=uri(store, 100)), job(), AttemptConf(), ctx)
    assert (action.kind, action.resume_from, action.quarantine) == ("fall_back", uri(store, 50), [uri(store, 100)])
    assert action.reason == "checkpoint step 100 does not verify: quarantine it, fall back to step 50"
    apply_quarantine(action, by="test")
    assert [r.step for r in list_checkpoints(store)] == [50]
    assert set(scan(store).quarantined) == {"step-00000100"}


def test_checkpoint_corrupt_without_a_named_uri_finds_the_bad_ones(store: ObjectStore, ctx: DecisionInputs) -> None:
    for step in (50, 100, 150):
        make_checkpoint(store, step)
    corrupt(store, 100)
    corrupt(store, 150)
    action = decide_from_catalog(report("checkpoint_corrupt"), job(), AttemptConf(), ctx)
    assert action.resume_from == uri(store, 50)
    assert action.quarantine == [uri(store, 150), uri(store, 100)]


def test_checkpoint_corrupt_with_nothing_to_fall_back_to_gives_up(store: ObjectStore, ctx: DecisionInputs) -> None:
    make_checkpoint(store, 50)
    corrupt(store, 50)
    action = decide_from_catalog(report("checkpoint_corrupt", corrupt_checkpoint=uri(store, 50)), job(), AttemptConf(), ctx)
    assert action.kind == "give_up" and "no valid checkpoint to fall back to" in action.reason


def test_oom_replans_with_less_memory(store: ObjectStore) -> None:
    cluster = load_cluster("local")
    plan = plan_job(SPEC, cluster).best
    assert plan is not None
    ctx = DecisionInputs(checkpoint_uri=store.uri, cluster=cluster, plan=plan)
    action = decide_from_catalog(report("oom"), job(), AttemptConf(), ctx)
    assert action.kind == "replan", action.reason
    from trainyard.plugins.advisor.plan import Plan

    new = Plan.model_validate_json(action.plan)
    assert new.memory_per_gpu_bytes < 0.9 * plan.memory_per_gpu_bytes  # what replan_after_oom demands
    assert f"re-planned to {new.describe()}" in action.reason
    assert AttemptConf().next_attempt(report("oom"), action).plan == action.plan


def test_oom_with_a_plan_that_already_fills_the_device_gives_up(store: ObjectStore) -> None:
    cluster = load_cluster("local")
    plan = plan_job(SPEC, cluster).best
    huge = plan.model_copy(update={"memory_per_gpu_bytes": 1024})  # "OOMed at 1 KiB": nothing fits in less
    action = decide_from_catalog(report("oom"), job(), AttemptConf(), DecisionInputs(store.uri, cluster=cluster, plan=huge))
    assert action.kind == "give_up" and "no plan fits in less memory" in action.reason
    with pytest.raises(ValueError, match="cluster"):
        decide_from_catalog(report("oom"), job(), AttemptConf(), DecisionInputs(store.uri))


def test_preempted_requeues_without_spending_the_budget(store: ObjectStore, ctx: DecisionInputs) -> None:
    make_checkpoint(store, 77)
    spent = AttemptConf(restarts_used=3)
    action = decide_from_catalog(report("preempted"), job(3), spent, ctx)
    assert (action.kind, action.counts_against_budget) == ("requeue", False)
    assert "resume from step 77" in action.reason
    assert spent.next_attempt(report("preempted"), action).restarts_used == 3


def test_budget_exhausted_lists_every_attempt(ctx: DecisionInputs) -> None:
    conf = AttemptConf()
    causes = [report("worker_crash", attempt=0, reason="rank 1 was killed by SIGKILL", step=10, rank=1, exit_code=-9),
              report("hang", attempt=1, reason="hang: rank 0 stuck"),
              report("node_lost", attempt=2, reason="node lost: local-1 GPU 1")]
    for r in causes:
        action = decide_from_catalog(r, job(3), conf, ctx)
        assert action.retries, action
        conf = conf.next_attempt(r, action)
    assert (conf.attempt, conf.restarts_used) == (3, 3)
    last = report("worker_crash", attempt=3, reason="rank 0 exited with code 1", rank=0, exit_code=1)
    action = decide_from_catalog(last, job(3), conf, ctx)
    assert action.kind == "give_up" and not action.retries
    assert action.reason.startswith("restart budget spent: 3 of 3 restarts used")
    for line in ("attempt 0: worker_crash — rank 1 was killed by SIGKILL", "attempt 1: hang — hang: rank 0 stuck",
                 "attempt 2: node_lost — node lost: local-1 GPU 1", "attempt 3: worker_crash — rank 0 exited"):
        assert line in action.reason


def test_in_place_restarts_count_against_the_budget(ctx: DecisionInputs) -> None:
    r = report("worker_crash", restarts_in_place=2, rank=1, exit_code=-9)
    assert decide_from_catalog(r, job(3), AttemptConf(restarts_used=0), ctx).kind == "restart"
    action = decide_from_catalog(r, job(3), AttemptConf(restarts_used=1), ctx)
    assert action.kind == "give_up" and "2 of them in place by torchrun" in action.reason
    assert AttemptConf().next_attempt(r, decide_from_catalog(r, job(3), AttemptConf(), ctx)).restarts_used == 3


def test_the_same_crash_twice_without_progress_gives_up(ctx: DecisionInputs) -> None:
    first = report("worker_crash", attempt=0, rank=1, exit_code=1, step=40, log_line="KeyError: 'label'")
    conf = AttemptConf().next_attempt(first, decide_from_catalog(first, job(), AttemptConf(), ctx))
    again = report("worker_crash", attempt=1, rank=1, exit_code=1, step=40, log_line="KeyError: 'label'")
    action = decide_from_catalog(again, job(), conf, ctx)
    assert action.kind == "give_up"
    assert action.reason.startswith("the script fails the same way every time: KeyError: 'label'")


@pytest.mark.parametrize("change", [{"step": 60}, {"rank": 0}, {"exit_code": 2}])
def test_a_crash_that_differs_or_progresses_is_restarted(change: dict, ctx: DecisionInputs) -> None:
    first = report("worker_crash", attempt=0, rank=1, exit_code=1, step=40)
    conf = AttemptConf().next_attempt(first, decide_from_catalog(first, job(), AttemptConf(), ctx))
    again = report("worker_crash", attempt=1, **{"rank": 1, "exit_code": 1, "step": 40, **change})
    assert decide_from_catalog(again, job(), conf, ctx).kind == "restart"


def test_signals_are_never_the_script_failing_the_same_way(ctx: DecisionInputs) -> None:
    first = report("worker_crash", attempt=0, rank=1, exit_code=-9, step=40)
    conf = AttemptConf().next_attempt(first, decide_from_catalog(first, job(), AttemptConf(), ctx))
    again = report("worker_crash", attempt=1, rank=1, exit_code=-9, step=40)
    assert decide_from_catalog(again, job(), conf, ctx).kind == "restart"


def test_the_same_divergence_after_a_rollback_gives_up(store: ObjectStore, ctx: DecisionInputs) -> None:
    make_checkpoint(store, 50)
    first = report("diverged", onset_step=61)
    action = decide_from_catalog(first, job(), AttemptConf(), ctx)
    assert action.kind == "rollback"
    again = decide_from_catalog(report("diverged", attempt=1, onset_step=61), job(), AttemptConf().next_attempt(first, action), ctx)
    assert again.kind == "give_up" and "diverges at step 61 again" in again.reason


def test_after_attempt_quarantines_cordons_and_records(tmp_path: Path, store: ObjectStore, ctx: DecisionInputs) -> None:
    from tests.unit.recovery.runs import Rank, evidence
    from trainyard.plugins.attempt.bookkeeping import after_attempt, begin_attempt
    from trainyard.plugins.recovery.evidence import NodeObservation
    from trainyard.plugins.state.jobs import JobStateStore

    state = JobStateStore(f"sqlite:///{tmp_path / 'state.db'}")
    run = state.open_run("tiny", trigger_key="t").run
    begin_attempt(state, "tiny", run, 0)
    state.transition("tiny", run, "running")
    for step in (50, 100, 150):
        make_checkpoint(store, step)
    ev, _ = evidence(tmp_path / "a0", [Rank(42, step=160)] * 2, run=run,
                     diverged={"step": 160, "onset_step": 120, "message": "loss 30 above 2"})
    result = after_attempt(ev, job(), AttemptConf(run=run), ctx, state=state)
    assert (result.report.outcome, result.action.kind, result.run.state) == ("diverged", "rollback", "recovering")
    assert result.quarantined and set(scan(store).quarantined) == {"step-00000150"}
    assert result.next_conf.resume_from == uri(store, 100) and result.next_conf.attempt == 1

    begin_attempt(state, "tiny", run, 1)
    state.transition("tiny", run, "running")
    lost = NodeObservation(node="local-1", missed_heartbeats=3, error="refused")
    ev, _ = evidence(tmp_path / "a1", [Rank(0), Rank(-9)], attempt=1, run=run, nodes=[lost])
    result = after_attempt(ev, job(), result.next_conf, ctx, state=state)
    assert (result.action.kind, result.cordoned, list(state.cordoned())) == ("replace_node", ("local-1",), ["local-1"])
    assert result.next_conf.exclude_nodes == ["local-1"] and result.next_conf.restarts_used == 2
    assert [a.outcome for a in state.attempts("tiny", run)] == ["diverged", "node_lost"]
    state.close()


def test_a_restart_quarantines_a_newer_checkpoint_that_does_not_verify(store: ObjectStore, ctx: DecisionInputs) -> None:
    for step in (50, 100):
        make_checkpoint(store, step)
    corrupt(store, 100)
    action = decide_from_catalog(report("worker_crash", step=120), job(), AttemptConf(), ctx)
    assert (action.kind, action.resume_step, action.quarantine) == ("restart", 50, [uri(store, 100)])
    assert "restart the same gang from step 50 (checkpoint step 100 does not verify" in action.reason
    apply_quarantine(action, by="test")
    assert [r.step for r in list_checkpoints(store)] == [50]
    assert set(scan(store).quarantined) == {"step-00000100"}  # kept, not deleted


def test_steps_lost_and_timings_land_in_the_report(tmp_path: Path, store: ObjectStore, ctx: DecisionInputs) -> None:
    from datetime import timedelta

    from tests.unit.recovery.runs import Rank, evidence
    from trainyard.plugins.attempt.bookkeeping import after_attempt, begin_attempt
    from trainyard.plugins.state.jobs import JobStateStore

    state = JobStateStore(f"sqlite:///{tmp_path / 'state.db'}")
    run = state.open_run("tiny", trigger_key="t").run
    begin_attempt(state, "tiny", run, 0)
    state.transition("tiny", run, "running")
    make_checkpoint(store, 50)
    ev, _ = evidence(tmp_path / "a0", [Rank(0, step=63, ended_at=9), Rank(-9, step=63, ended_at=5)], run=run)
    result = after_attempt(ev, job(), AttemptConf(run=run), ctx, state=state)
    report = result.report
    assert (report.outcome, report.step, report.resume_step, report.steps_lost) == ("worker_crash", 63, 50, 13)
    first_exit = min(e.ended_at for e in ev.exits)
    assert report.failed_at.timestamp() == pytest.approx(first_exit)  # rank 1's SIGKILL dates it
    assert report.time_to_detect_s == pytest.approx(4.0)  # the last rank seen down 4 s later
    stored = state.attempts("tiny", run)[0].failure_report
    assert stored.steps_lost == 13 and stored.resumed_at is None
    seconds = state.set_resumed("tiny", run, 0, report.detected_at + timedelta(seconds=7))
    assert seconds == pytest.approx(7.0)
    assert state.attempts("tiny", run)[0].failure_report.time_to_resume_s == pytest.approx(7.0)
    state.close()


def test_a_users_error_gives_up_at_once_and_leaves_the_budget_alone(ctx: DecisionInputs) -> None:
    action = decide_from_catalog(report("user_error", reason="rank 0 failed before training: ModuleNotFoundError: x"),
                    job(), AttemptConf(), ctx)
    assert (action.kind, action.retries, action.counts_against_budget) == ("give_up", False, False)
    assert action.reason.startswith("rank 0 failed before training: ModuleNotFoundError: x — not retried")
