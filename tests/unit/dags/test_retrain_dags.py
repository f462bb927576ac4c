"""Retraining DAGs: a spec's `schedule:` is the DAG's cron, `retrain.onAsset:` its Asset (both:
either one starts a run), and `retrain.promote: manual` adds the evaluation and approval gate after
`register_model` — as Airflow's loader builds and the dag-processor serialises them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.dag_file import dagbag

REPO = Path(__file__).resolve().parents[3]
DEMO = yaml.safe_load((REPO / "config" / "jobs" / "demo-tiny-lm.yaml").read_text())


def write_spec(folder: Path, name: str, **spec: Any) -> None:
    doc = yaml.safe_load(yaml.safe_dump(DEMO))
    doc["metadata"]["name"] = name
    doc["spec"].update(spec)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))


@pytest.fixture
def bag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    folder = tmp_path / "jobs"
    folder.mkdir()
    write_spec(folder, "nightly", schedule="0 3 * * *", retrain={"promote": "manual"})
    write_spec(folder, "on-data", retrain={"onAsset": "datasets/pydoc-topics/", "startFromAlias": "production"})
    write_spec(folder, "both", schedule="@daily", retrain={"onAsset": "s3://lake/text/", "promote": "none"})
    write_spec(folder, "plain")
    monkeypatch.setenv("TRAINYARD_JOBS_DIR", str(folder))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)

    from trainyard.config.settings import get_settings

    get_settings.cache_clear()
    yield dagbag()
    get_settings.cache_clear()


def test_schedule_and_asset_become_the_dags_schedule(bag: Any) -> None:
    from airflow.sdk import Asset, AssetOrTimeSchedule

    assert bag.import_errors == {}
    assert bag.dags["nightly"].schedule == "0 3 * * *"
    assert bag.dags["plain"].schedule is None
    on_data = bag.dags["on-data"].schedule
    assert isinstance(on_data, Asset) and on_data.uri == "trainyard://datasets/pydoc-topics"
    both = bag.dags["both"].schedule
    assert isinstance(both, AssetOrTimeSchedule)
    assert both.asset_condition == Asset("s3://lake/text") and both.timetable.expression == "0 0 * * *"  # @daily


def test_manual_promotion_adds_evaluate_approval_and_promote_after_register(bag: Any) -> None:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    for name in ("nightly", "on-data"):  # promote defaults to manual once a retrain section exists
        tasks = bag.dags[name].task_dict
        assert tasks["register_model"].downstream_task_ids == {"evaluate"}
        assert tasks["evaluate"].downstream_task_ids == {"approve_promotion"}
        assert tasks["approve_promotion"].downstream_task_ids == {"promote_model"}
        gate = tasks["approve_promotion"]
        assert isinstance(gate, ApprovalOperator) and gate.options == ["Approve", "Reject"]
        assert gate.defaults == ["Reject"] and "approval_body" in gate.body and "subject" in gate.template_fields
    for name in ("both", "plain"):
        assert not {"evaluate", "approve_promotion", "promote_model"} & set(bag.dags[name].task_dict)
        assert bag.dags[name].task_dict["register_model"].downstream_task_ids == set()


def test_retraining_dags_serialise_with_their_schedule_and_gate(bag: Any) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    for name in ("nightly", "on-data", "both"):
        dag = bag.dags[name]
        restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
        assert set(restored.task_dict) == set(dag.task_dict)
        assert type(restored.timetable).__name__ == type(dag.timetable).__name__
    assert "approve_promotion" in DagSerialization.from_dict(
        DagSerialization.to_dict(bag.dags["nightly"])).task_dict


def test_asset_uri_of_a_dataset() -> None:
    from trainyard.plugins.data.assets import dataset_asset_uri

    assert dataset_asset_uri("datasets/pydoc-topics/") == "trainyard://datasets/pydoc-topics"
    assert dataset_asset_uri("s3://lake/text/") == "s3://lake/text"
    with pytest.raises(ValueError, match="names no dataset"):
        dataset_asset_uri("/")


def test_the_data_preparation_task_emits_the_datasets_asset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from trainyard.config.settings import Settings
    from trainyard.operators.datasets import prepare_demo_version
    from trainyard.plugins.data.publish import PublishedVersion
    from trainyard.plugins.storage.store import open_store

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    monkeypatch.delenv("TRAINYARD_DEMO_DAGS", raising=False)
    assert "trainyard_prepare_demo_data" not in dagbag().dags  # a deployment's Airflow: no demo DAG
    monkeypatch.setenv("TRAINYARD_DEMO_DAGS", "true")  # the embedded stack's
    dag = dagbag().dags["trainyard_prepare_demo_data"]
    (task,) = dag.tasks
    asset = Asset("trainyard://datasets/pydoc-topics")
    assert task.outlets == [asset] and dag.schedule is None
    settings = Settings(home=tmp_path / "home")
    events = OutletEventAccessors()
    out = prepare_demo_version("v7", outlet_events=events, settings=settings)
    assert out["asset_uri"] == asset.uri
    extra = events[asset].extra
    assert (extra["version"], extra["digest"]) == ("v7", out["digest"]) and extra["num_shards"] >= 1
    record = open_store(settings.object_store).get_bytes("dataset-versions/datasets/pydoc-topics/v7.json")
    assert PublishedVersion.model_validate_json(record).dataset.digest == out["digest"]
