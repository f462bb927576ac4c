"""The one DAG file (`trainyard.config.airflow.DAG_FILE`) as Airflow's own loader sees it: one DAG per spec with DESIGN §4's graph,
an invalid spec reported as an import error carrying its validation report, one DAG built when
a task's parse names it, and every DAG serialisable (what the dag-processor stores)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dag_file import dagbag

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted([*(REPO / "config" / "jobs").glob("*.yaml"), *(REPO / "config" / "examples").glob("*.yaml")])


@pytest.fixture
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "jobs"
    folder.mkdir()
    for spec in EXAMPLES:
        shutil.copy(spec, folder / spec.name)
    monkeypatch.setenv("TRAINYARD_JOBS_DIR", str(folder))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINYARD_DEMO_DAGS", "true")
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    from trainyard.config.settings import get_settings

    get_settings.cache_clear()
    yield folder
    get_settings.cache_clear()


MAINTENANCE = {"trainyard_checkpoint_audit", "trainyard_retention_sweep", "trainyard_chargeback",
               "trainyard_prepare_demo_data"}
"""The platform's own DAGs: `dags/maintenance.py` (tested in `test_maintenance_dags.py`) and
`dags/datasets.py` (`test_retrain_dags.py`; built where `TRAINYARD_DEMO_DAGS` is set)."""


def training_dags(bag: object) -> dict[str, object]:
    return {k: v for k, v in bag.dags.items() if k not in MAINTENANCE}  # type: ignore[attr-defined]


def names(specs: list[Path]) -> set[str]:
    from trainyard.config.loader import load_spec_file

    return {load_spec_file(p).name for p in specs}


def test_every_example_spec_is_a_dag_with_the_designed_graph(jobs: Path) -> None:
    bag = dagbag()
    assert bag.import_errors == {}
    assert set(bag.dags) == names(EXAMPLES) | MAINTENANCE
    dag = bag.dags["demo-tiny-lm"]
    down = {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks}
    assert down["validate_spec"] == ["validate_data"]
    assert down["plan_parallelism"] == ["place_gang"]
    assert down["launch_training"] == ["watch_checkpoints", "watch_health", "watch_training"]
    for watcher in ("watch_training", "watch_checkpoints", "watch_health"):
        assert down[watcher] == ["classify_outcome"]
    assert down["release_gang"] == ["choose_action"]
    assert down["choose_action"] == sorted(["register_model", "finish_run", "give_up", "cancelled", "restart",
                                            "replace_node", "rollback", "fall_back", "replan", "requeue"])
    for action in ("restart", "replace_node", "rollback", "fall_back", "replan", "requeue"):
        assert down[action] == ["resume_next_attempt"]
    tasks = dag.task_dict
    assert tasks["place_gang"].is_setup and tasks["release_gang"].is_teardown
    assert tasks["classify_outcome"].trigger_rule == "all_done"
    assert tasks["resume_next_attempt"].trigger_rule == "none_failed_min_one_success"
    assert {"team:demo", "project:tiny-lm"} <= set(dag.tags)
    assert {"max_steps", "learning_rate", "start_from", "dry_run", "fault_kill_rank"} <= set(dag.params)


def test_every_dag_serialises_as_the_dag_processor_stores_it(jobs: Path) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    for dag in training_dags(dagbag()).values():
        data = DagSerialization.to_dict(dag)
        restored = DagSerialization.from_dict(data)
        assert set(restored.task_dict) == set(dag.task_dict)
        assert restored.task_dict["validate_spec"].has_retry_policy  # evaluated in the worker


def test_an_invalid_spec_is_a_paused_dag_with_its_report_and_the_others_stay(jobs: Path) -> None:
    """Not an import error: Airflow would mark every DAG of the one DAG file stale with it."""
    broken = (jobs / "demo-tiny-lm.yaml").read_text().replace("gpuCount: 2", "gpuCuont: 2")
    (jobs / "broken.yaml").write_text(broken.replace("name: demo-tiny-lm", "name: broken-job"))
    (jobs / "garbage.yaml").write_text("apiVersion: [nope\n")
    bag = dagbag()
    assert bag.import_errors == {}
    assert set(training_dags(bag)) == names(EXAMPLES) | {"broken-job", "invalid-spec-garbage"}
    dag = bag.dags["broken-job"]  # the job's own name, as the file declares it
    assert dag.is_paused_upon_creation and dag.schedule is None
    assert {"trainyard:invalid-spec", "team:demo"} <= set(dag.tags)
    assert "gpuCuont" in dag.doc_md and "did you mean 'gpuCount'" in dag.doc_md and "broken.yaml" in dag.description
    (task,) = dag.tasks
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="gpuCuont"):
        task.execute({})
    assert "NOT_YAML" in bag.dags["invalid-spec-garbage"].doc_md  # no name to read: the file's


def test_a_tasks_parse_builds_only_its_dag(jobs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "demo-tiny-lm")
    (jobs / "broken.yaml").write_text("apiVersion: nope\n")
    bag = dagbag()
    assert set(bag.dags) == {"demo-tiny-lm"} and bag.import_errors == {}


def test_a_tasks_parse_reads_only_the_specs_that_name_its_job(jobs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.config import loader
    from trainyard.dags.factory import read_specs

    read: list[str] = []
    real = loader.read_spec_file
    monkeypatch.setattr(loader, "read_spec_file", lambda path: read.append(Path(path).name) or real(path))
    found = [job.name for _, job, _ in read_specs(jobs, only="demo-tiny-lm") if job is not None]
    assert found == ["demo-tiny-lm"]
    assert len(read) < len(EXAMPLES)
    assert read == [p.name for p in sorted(jobs.glob("*.yaml")) if b"demo-tiny-lm" in p.read_bytes()]


def test_a_spec_that_escapes_its_name_is_still_found_by_a_tasks_parse(jobs: Path) -> None:
    from trainyard.dags.factory import read_specs

    demo = jobs / "demo-tiny-lm.yaml"
    text = demo.read_text()
    assert "name: demo-tiny-lm" in text
    escaped = text.replace("name: demo-tiny-lm", 'name: "escaped\\x2dname"', 1)
    assert "escaped-name" not in escaped
    (jobs / "zz-escaped.yaml").write_text(escaped)
    found = [job.name for _, job, _ in read_specs(jobs, only="escaped-name") if job is not None]
    assert found == ["escaped-name"]


def test_the_dag_files_import_nothing_heavy() -> None:
    from tests.support.imports import DAG_PARSE_HEAVY, assert_none_loaded

    assert_none_loaded("dag_files", DAG_PARSE_HEAVY)
