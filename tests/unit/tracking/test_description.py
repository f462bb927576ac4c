"""The MLflow run's description (`mlflow.note.content`): the outcome line, then the links back to
Airflow's DAG runs and the Trainyard view; and the colour each new run of an experiment gets."""

from __future__ import annotations

from pathlib import Path

from tests.unit.tracking.factories import make_job, make_plan
from trainyard.plugins.tracking import runs
from trainyard.plugins.tracking.description import (
    NOTE_TAG,
    RunLinks,
    live_line,
    run_description,
    set_run_description,
)
from trainyard.plugins.tracking.metrics import series_key


def test_a_live_runs_line_says_the_state_and_why() -> None:
    assert live_line("running") == "Running."
    assert live_line("recovering", "worker_crash: rank 1 exited 1.") == (
        "Recovering: an attempt failed and the next one is on its way: worker_crash: rank 1 exited 1.")


def test_the_description_links_each_dag_run_and_the_view_and_escapes_markup() -> None:
    text = run_description(job="tiny_lm", run="r1", outcome="Failed: rank [1] *crashed*", links=RunLinks(
        dag_runs=[("attempt 0: DAG run manual__x", "http://af/dags/tiny_lm/runs/manual__x")],
        view_url="http://af/trainyard/jobs/tiny_lm/runs/r1"))
    lines = text.splitlines()
    assert lines[0] == r"**Failed: rank \[1\] \*crashed\***"
    assert r"- Trainyard view: [tiny\_lm run r1](http://af/trainyard/jobs/tiny_lm/runs/r1)" in lines
    assert r"- Airflow: [attempt 0: DAG run manual\_\_x](http://af/dags/tiny_lm/runs/manual__x)" in lines


def test_the_description_is_the_runs_note_and_each_new_run_has_another_colour(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = runs.start_or_resume_run(make_job("colours"), make_plan(), tracking_uri=uri, attempt=0, trigger_id="a")
    second = runs.start_or_resume_run(make_job("colours"), make_plan(), tracking_uri=uri, attempt=0, trigger_id="b")
    client = runs.client_for(uri)
    colours = [client.get_run(r).data.tags[runs.RUN_COLOR_TAG] for r in (first, second)]
    assert colours == list(runs.RUN_COLORS[:2])
    again = runs.start_or_resume_run(make_job("colours"), make_plan(), tracking_uri=uri, attempt=1, run_id=first)
    assert client.get_run(again).data.tags[runs.RUN_COLOR_TAG] == colours[0]  # an attempt keeps its run's
    set_run_description(first, "**Completed.**", tracking_uri=uri)
    assert client.get_run(first).data.tags[NOTE_TAG] == "**Completed.**"


def test_the_platforms_series_fold_into_system_metrics_and_the_trainings_stay() -> None:
    for name in ("checkpoint/step", "data/cache_hit_rate", "recovery/worker_crash", "data_quality/rows_checked",
                 "data_stall_s", "checkpoint_blocking_s", "recovery_events", "trainyard.attempt",
                 "total_cost_usd", "idle_pct"):
        assert series_key(name) == "system/" + name.replace("/", ".")  # one level: no section of its own
    for name in ("loss", "loss.replay", "lr", "tokens_per_s", "mfu", "accuracy", "system/cpu_utilization_percentage"):
        assert series_key(name) == name
    assert series_key("grad_norm") == "total_grad_norm"  # sorts after loss on the run page
