"""`steps.register` ends the run: completed and registered, or failed when the registration
fails — never "completed" with no model (issue 57). Real spec, home and job state; the MLflow
side (`MlflowListener.registered`) is replaced by what it returns or raises."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.unit.tracking.factories import make_job
from trainyard.config.settings import Settings
from trainyard.plugins.attempt.launchers import Runtime
from trainyard.plugins.attempt.listener import MlflowListener
from trainyard.plugins.attempt.steps import (
    Concluded,
    RegistrationFailed,
    open_attempt,
    register,
    run_outcome,
)
from trainyard.plugins.errors import TransientError
from trainyard.plugins.recovery.model import (
    NOT_REGISTERED,
    REGISTRATION_OFF,
    AttemptConf,
    FailureReport,
    RecoveryAction,
)
from trainyard.plugins.state.jobs import JobStateStore
from trainyard.plugins.tracking.registry import ModelVersionInfo

RUN = "20261201t000000-57e957"


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[SimpleNamespace]:
    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    settings = Settings(home=tmp_path / "home")
    prepare_demo_dataset(open_store(settings.object_store).child(DEMO_PREFIX.rstrip("/")))
    spec = tmp_path / "reg-job.yaml"
    spec.write_text(yaml.safe_dump(make_job("reg-job").model_dump(mode="json", by_alias=True, exclude_none=True)))
    runtime = Runtime(settings)
    opened = open_attempt(spec, AttemptConf(run=RUN, max_steps=20), trigger_key="t/1", runtime=runtime)
    state = JobStateStore(settings.state_db)
    state.transition("reg-job", RUN, "running")
    yield SimpleNamespace(opened=opened, runtime=runtime, state=state)


def test_the_spec_s_own_max_steps_is_kept_beside_the_trigger_s_override(opened: SimpleNamespace) -> None:
    assert opened.opened.job.spec.training.max_steps == 20
    assert opened.opened.spec_max_steps == make_job("reg-job").spec.training.max_steps != 20


def test_a_failed_registration_fails_the_run_and_says_why(opened: SimpleNamespace,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: MlflowListener, *_: object) -> ModelVersionInfo:
        raise ValueError("weights_path must be an existing .safetensors file")

    monkeypatch.setattr(MlflowListener, "registered", broken)
    with pytest.raises(RegistrationFailed) as failed:
        register(opened.opened, "mlflow-run", opened.runtime)
    line = "failed — registration failed: ValueError: weights_path must be an existing .safetensors file"
    assert str(failed.value) == line
    outcome = run_outcome(opened.opened, opened.runtime)
    assert (outcome.line, outcome.exit_code, outcome.mlflow_status) == (line, 1, "FAILED")
    assert opened.state.get_run("reg-job", RUN).state == "failed"


def test_a_transient_error_leaves_the_run_for_the_task_s_retry(opened: SimpleNamespace,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def down(self: MlflowListener, *_: object) -> ModelVersionInfo:
        raise TransientError("the tracking server did not answer")

    monkeypatch.setattr(MlflowListener, "registered", down)
    with pytest.raises(TransientError):
        register(opened.opened, "mlflow-run", opened.runtime)
    assert opened.state.get_run("reg-job", RUN).state == "running"


def test_a_registered_version_completes_the_run_with_the_alias_decision(opened: SimpleNamespace,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    note = "candidate not moved (it stays on version 1): the run reached step 20 of the spec's maxSteps 200"
    version = ModelVersionInfo(name="reg-job", version="2", checkpoint_step=20, candidate_note=note)
    monkeypatch.setattr(MlflowListener, "registered", lambda self, *_: version)
    registered = register(opened.opened, "mlflow-run", opened.runtime)
    assert registered.outcome.line == f"completed and registered — registered reg-job version 2 from step 20; {note}"
    assert registered.outcome == run_outcome(opened.opened, opened.runtime)
    assert (registered.outcome.exit_code, registered.outcome.dag_run_state) == (0, "success")


@pytest.mark.parametrize(("action", "note"), [
    (RecoveryAction(kind="register", reason="the attempt completed: export and register the model"),
     "attempt 0: completed at step 4 → registering"),
    (RecoveryAction(kind="finish", reason=f"completed — {REGISTRATION_OFF} (spec.registration.enabled: false)"),
     f"attempt 0: completed at step 4 → {REGISTRATION_OFF} (spec.registration.enabled: false)"),
    (RecoveryAction(kind="finish", reason=f"completed — {NOT_REGISTERED}"),
     f"attempt 0: completed at step 4 → {NOT_REGISTERED}"),
])
def test_the_note_after_classify_says_registering_or_why_nothing_is(action: RecoveryAction, note: str) -> None:
    report = FailureReport(job="j", run=RUN, attempt=0, outcome="completed", reason="every rank completed", step=4)
    assert Concluded(report=report, action=action).summary == note


def test_the_note_of_a_preempted_attempt_names_the_preemption_in_its_preemptors_words() -> None:
    cause = ("preempted by Kueue: Preempted (InCohortReclamation): Preempted to accommodate a workload (UID: u) "
             "due to reclamation within the cohort (emergency checkpoint committed)")
    report = FailureReport(job="j", run=RUN, attempt=0, outcome="preempted", reason=cause, step=12, rank=0,
                           exit_code=43)
    action = RecoveryAction(kind="requeue", reason="preempted: requeue", resume_step=12, counts_against_budget=False)
    note = Concluded(report=report, action=action).summary
    assert note.startswith("attempt 0: preempted at step 12") and "→ requeue from step 12" in note
    assert note.endswith(f" — {cause}")
