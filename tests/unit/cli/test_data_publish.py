"""`trainyard data publish`: the version record in a real local store (idempotent per digest,
refused for changed bytes under the same tag) and a clear exit 3 when Airflow does not answer —
the asset event itself is exercised against a real Airflow in tests/e2e/test_airflow_retrain.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import free_port
from trainyard.cli.main import main
from trainyard.config.settings import get_settings
from trainyard.plugins.data.publish import PublishedVersion
from trainyard.plugins.storage.store import open_store


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINYARD_AIRFLOW_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
    get_settings.cache_clear()
    store = open_store(get_settings().object_store)
    store.put_bytes("datasets/news/shard-00000.jsonl", b'{"text": "first"}\n{"text": "second"}\n')
    yield tmp_path / "home"
    get_settings.cache_clear()


def test_publish_records_the_version_and_says_airflow_is_down(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "publish", "datasets/news/", "--version", "v1", "--json"]) == 3
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert (out["asset_uri"], out["version"], out["event"]) == ("trainyard://datasets/news", "v1", None)
    assert "does not answer" in captured.err and "version is recorded" in captured.err
    store = open_store(get_settings().object_store)
    record = PublishedVersion.model_validate_json(store.get_bytes("dataset-versions/datasets/news/v1.json"))
    assert record.dataset.digest == out["digest"] and record.dataset.num_shards == 1
    # the same bytes again: the first record stands
    assert main(["data", "publish", "datasets/news/", "--version", "v1", "--no-event", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["digest"] == out["digest"]
    assert PublishedVersion.model_validate_json(store.get_bytes("dataset-versions/datasets/news/v1.json")) == record


def test_changed_bytes_under_the_same_tag_and_missing_data_are_refused(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "publish", "datasets/news/", "--version", "v1", "--no-event"]) == 0
    open_store(get_settings().object_store).put_bytes("datasets/news/shard-00001.jsonl", b'{"text": "third"}\n')
    capsys.readouterr()
    assert main(["data", "publish", "datasets/news/", "--version", "v1", "--no-event"]) == 2
    assert "publish it under a new version tag" in capsys.readouterr().err
    assert main(["data", "publish", "datasets/news/", "--version", "v2", "--no-event"]) == 0
    assert main(["data", "publish", "datasets/none/", "--version", "v1", "--no-event"]) == 1
    assert "no jsonl shards" in capsys.readouterr().err
    assert main(["data", "publish", "datasets/news/", "--version", "a/b", "--no-event"]) == 2
