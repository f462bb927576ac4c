"""Which prefixes a run's keys are scoped to (no network; S3's enforcement of them is
`tests/integration/storage/test_storage_credentials.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.procs import REPO_ROOT
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.plugins.attempt.conf import InvalidConf
from trainyard.plugins.attempt.storage_access import grants_for, issue_for_attempt, scoped
from trainyard.plugins.storage.credentials import Grant


def _job(**dataset: str) -> TrainingJob:
    doc = yaml.safe_load((REPO_ROOT / "config/jobs/demo-tiny-lm.yaml").read_text())
    doc["metadata"]["name"] = "lm"
    doc["spec"]["dataset"].update(dataset)
    return TrainingJob.model_validate(doc)


def test_a_run_is_granted_its_dataset_and_its_own_checkpoints(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, object_store="s3://store/root")
    assert scoped(settings)
    assert sorted(grants_for(_job(source="datasets/a/"), settings, run="r-1"), key=str) == sorted([
        Grant("store", "root/jobs/lm/runs/r-1/checkpoints/", write=True), Grant("store", "root/datasets/a/")], key=str)
    other_bucket = grants_for(_job(source="s3://corpora/web/v2"), settings, run="r-1")
    assert Grant("corpora", "web/v2/") in other_bucket


def test_a_resume_point_adds_its_checkpoint_folder_and_only_inside_the_job(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, object_store="s3://store/root")
    point = "s3://store/root/jobs/lm/runs/r-0/checkpoints/step-00000040/MANIFEST.json"
    assert Grant("store", "root/jobs/lm/runs/r-0/checkpoints/step-00000040/") in grants_for(
        _job(source="datasets/a/"), settings, run="r-1", resume_from=point)
    with pytest.raises(InvalidConf, match="outside the job's area"):
        grants_for(_job(source="datasets/a/"), settings, run="r-1",
                   resume_from="s3://store/root/jobs/rival/runs/r-0/checkpoints/step-00000040/MANIFEST.json")


def test_no_keys_for_a_file_store_or_a_shared_deployment(tmp_path: Path) -> None:
    job = _job(source="datasets/a/")
    for settings in (Settings(home=tmp_path, object_store=(tmp_path / "objects").as_uri()),
                     Settings(home=tmp_path, object_store="s3://store/root", storage_credentials="shared")):
        assert not scoped(settings)
        assert issue_for_attempt(job, settings, run="r-1", attempt=0) is None  # no network call either


def test_a_refusal_to_issue_is_fatal_and_a_throttle_or_an_outage_is_retried() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError

    from trainyard.plugins.attempt.storage_access import issuing_failed
    from trainyard.plugins.errors import FatalError, TransientError

    def error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                           "CreateRole")

    assert isinstance(issuing_failed(error("AccessDenied", 403)), FatalError)
    assert isinstance(issuing_failed(error("Throttling", 400)), TransientError)
    assert isinstance(issuing_failed(error("InternalFailure", 500)), TransientError)
    assert isinstance(issuing_failed(EndpointConnectionError(endpoint_url="http://iam.example")), TransientError)
