"""DATASET_NOT_FOUND against real stores: a local folder and an S3 endpoint (moto server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.s3_server import CREDENTIALS, S3Server, running_s3_server
from trainyard.config.loader import load_spec_file
from trainyard.config.problems import Code
from trainyard.config.settings import Settings
from trainyard.plugins.data.shards import list_shards, open_dataset
from trainyard.plugins.storage.store import open_store
from trainyard.plugins.validation.dataset import check_dataset

DEMO = load_spec_file(Path(__file__).resolve().parents[3] / "config" / "jobs" / "demo-tiny-lm.yaml")


def _with_source(source: str, fmt: str = "jsonl"):
    dataset = DEMO.spec.dataset.model_copy(update={"source": source, "format": fmt})
    return DEMO.model_copy(update={"spec": DEMO.spec.model_copy(update={"dataset": dataset})})


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server


def test_relative_source_lives_in_the_object_store(settings: Settings) -> None:
    (p,) = check_dataset(DEMO, settings)
    assert p.code == Code.DATASET_NOT_FOUND and p.severity == "error"
    assert p.message == "no jsonl shards at 'datasets/pydoc-topics/'"
    store = open_dataset("datasets/pydoc-topics/", object_store=settings.object_store)
    store.put_bytes("README.md", b"not a shard")
    assert [x.code for x in check_dataset(DEMO, settings)] == [Code.DATASET_NOT_FOUND]
    store.put_bytes("b.jsonl", b'{"text": "x"}\n')
    store.put_bytes("a.jsonl", b'{"text": "y"}\n')
    assert check_dataset(DEMO, settings) == []
    assert [o.key for o in list_shards(store, "jsonl")] == ["a.jsonl", "b.jsonl"]
    assert [x.code for x in check_dataset(_with_source("datasets/pydoc-topics/", "parquet"), settings)] == [
        Code.DATASET_NOT_FOUND]


def test_more_stripes_than_shards_is_a_warning_naming_both(settings: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(3):
        (folder / f"s{i}.jsonl").write_text('{"text": "x"}\n')
    job = _with_source(folder.as_uri() + "/")
    for stripes in (None, 3):
        dataset = job.spec.dataset.model_copy(update={"stripes": stripes})
        assert check_dataset(job.model_copy(update={"spec": job.spec.model_copy(update={"dataset": dataset})}),
                             settings) == []
    dataset = job.spec.dataset.model_copy(update={"stripes": 8})
    (p,) = check_dataset(job.model_copy(update={"spec": job.spec.model_copy(update={"dataset": dataset})}), settings)
    assert (p.code, p.severity, p.path) == (Code.DATA_STRIPES, "warning", "spec.dataset.stripes")
    assert p.message == "8 stripes asked for, but the dataset has 3 shards: the run will use 3"


def test_file_uri_source(settings: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "s.txt").write_text("hello")
    assert check_dataset(_with_source(folder.as_uri() + "/", "text"), settings) == []


def test_s3_source(settings: Settings, s3: S3Server) -> None:
    bucket = s3.new_bucket("data")
    settings = settings.model_copy(update={"s3_endpoint_url": s3.endpoint_url})
    job = _with_source(f"s3://{bucket}/corpus/v1/")
    assert [p.code for p in check_dataset(job, settings)] == [Code.DATASET_NOT_FOUND]
    open_store(f"s3://{bucket}/corpus/v1", endpoint_url=s3.endpoint_url).put_bytes("s-0.jsonl", b'{"text":"a"}\n')
    assert check_dataset(job, settings) == []
    (missing,) = check_dataset(_with_source("s3://no-such-bucket/x/"), settings)
    assert missing.severity == "error" and "NoSuchBucket" in missing.message


def test_an_unreachable_store_is_a_warning_not_a_verdict(settings: Settings,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CREDENTIALS.items():  # not the module's S3 server's: it may not be running
        monkeypatch.setenv(name, value)
    settings = settings.model_copy(update={"s3_endpoint_url": "http://127.0.0.1:9"})
    (p,) = check_dataset(_with_source("s3://bucket/x/"), settings)
    assert p.code == Code.STORE_UNREACHABLE and p.severity == "warning"
    assert "could not check" in p.message


def test_missing_s3_credentials_are_said_as_such(settings: Settings, s3: S3Server, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = s3.new_bucket("data")
    open_store(f"s3://{bucket}/corpus", endpoint_url=s3.endpoint_url).put_bytes("s-0.jsonl", b'{"text":"a"}\n')
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    settings = settings.model_copy(update={"s3_endpoint_url": s3.endpoint_url})
    (p,) = check_dataset(_with_source(f"s3://{bucket}/corpus/"), settings)  # the shard is there
    assert (p.code, p.severity) == (Code.STORE_CREDENTIALS, "error")
    assert p.message == f"cannot read 's3://{bucket}/corpus/': Unable to locate credentials"
    assert "AWS_ACCESS_KEY_ID" in p.hint and "--offline" in p.hint
