"""`follow_training_run`: through every attempt of a training run, reading what it needs."""

from __future__ import annotations

from typing import Any

from trainyard.plugins.airflow_api import (
    FINAL_DAG_RUN_STATES,
    AirflowRequestFailed,
    attempt_dag_run_id,
    follow_training_run,
)

RUN = "20261205t000000-abcdef"


class ScriptedAirflow:
    """The REST calls `follow_training_run` makes, answered from a script of DAG run states:
    attempt 0 fails (worker crash → restart), attempt 1 appears late and completes."""

    def __init__(self) -> None:
        self.states = {"first": ["queued", "running", "running", "running", "failed"],
                       attempt_dag_run_id(RUN, 1): [None, "running", "running", "success"]}
        self.calls: list[tuple[str, str]] = []
        self.actions = {"first": "restart", attempt_dag_run_id(RUN, 1): "register"}
        self.current = ""  # the state the last `dag_run` answered

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        self.calls.append(("dag_run", run_id))
        states = self.states[run_id]
        state = states.pop(0) if len(states) > 1 else states[0]
        if state is None:
            raise AirflowRequestFailed("GET", f"dagRuns/{run_id}", 404, "not found")
        self.current = state
        return {"state": state}

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        self.calls.append(("task_instances", run_id))
        final = self.current in FINAL_DAG_RUN_STATES
        return {"validate_spec": {"state": "success"},
                "classify_outcome": {"state": "success" if final else "none"}}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        self.calls.append(("xcom", f"{task_id}:{key}"))
        if task_id == "validate_spec":
            return {"run": RUN}
        if key == "report":
            return {"outcome": "completed" if self.actions[run_id] == "register" else "worker_crash", "reason": "r"}
        return {"kind": self.actions[run_id]}


def test_every_attempt_is_followed_to_its_outcome() -> None:
    airflow = ScriptedAirflow()
    attempts = follow_training_run(airflow, "job", "first", timeout_s=30, poll_s=0)  # type: ignore[arg-type]
    assert [(a.attempt, a.state, a.outcome, a.action, a.run) for a in attempts] == [
        (0, "failed", "worker_crash", "restart", RUN), (1, "success", "completed", "register", RUN)]
    assert attempts[-1].tasks == {"validate_spec": "success", "classify_outcome": "success"}


def test_once_the_run_is_known_only_the_dag_runs_state_is_polled_until_it_ends() -> None:
    airflow = ScriptedAirflow()
    follow_training_run(airflow, "job", "first", timeout_s=30, poll_s=0)  # type: ignore[arg-type]
    listed = [run for call, run in airflow.calls if call == "task_instances"]
    # attempt 0: its first running poll (to learn the run's id) and its end; attempt 1: its end
    assert listed == ["first", "first", attempt_dag_run_id(RUN, 1)], airflow.calls
    assert sum(call == "dag_run" for call, _ in airflow.calls) == 9


def test_a_progress_display_gets_the_tasks_of_every_poll() -> None:
    airflow = ScriptedAirflow()
    seen: list[dict[str, Any]] = []
    follow_training_run(airflow, "job", "first", timeout_s=30, poll_s=0,  # type: ignore[arg-type]
                        on_poll=lambda attempts, tasks: seen.append(tasks))
    # every running poll of both attempts; none while queued or before the hand-over's DAG run exists
    assert [bool(tasks) for tasks in seen] == [False, True, True, True, False, True, True]
