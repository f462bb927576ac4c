"""Per-run storage credentials against an S3 endpoint that enforces IAM (moto's server, auth on):
the keys a launch issues read the job's dataset and write its own run's checkpoints, and S3
itself refuses them everywhere else — another team's checkpoints above all, read or write."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.exceptions import ClientError

from tests.integration.storage.conftest import IamS3
from tests.support.procs import REPO_ROOT
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.config.worker_env import AWS_CREDENTIAL_ENV, StorageCredentials
from trainyard.plugins.attempt.conf import AttemptConf, InvalidConf, check_conf_points, resume_point
from trainyard.plugins.attempt.storage_access import issue_for_attempt, revoke_for_run
from trainyard.plugins.storage.credentials import MAX_SESSION_S, MIN_SESSION_S
from trainyard.plugins.storage.s3 import S3Store

JOB, RUN, RIVAL = "team-a-lm", "r-0001", "rival-lm"
DATA = b'{"text": "the dataset of team a"}\n'
RIVAL_CKPT = f"jobs/{RIVAL}/runs/r-9/checkpoints/step-00000010"
OLD_CKPT = f"jobs/{JOB}/runs/r-0000/checkpoints/step-00000005"


@pytest.fixture
def world(iam_s3: IamS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TrainingJob, Settings]]:
    """The deployment's own keys in the environment (what issues), a job of team A, and the store
    holding team A's dataset, an earlier run of the job and another team's checkpoint."""
    for name in AWS_CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in iam_s3.admin.items():
        monkeypatch.setenv(name, value)
    doc = yaml.safe_load((REPO_ROOT / "config/jobs/demo-tiny-lm.yaml").read_text())
    doc["metadata"].update(name=JOB, team="team-a")
    doc["spec"]["dataset"]["source"] = "datasets/team-a/"
    doc["spec"]["training"]["maxRuntime"] = "2h"
    job = TrainingJob.model_validate(doc)
    settings = Settings(home=tmp_path, object_store=f"s3://{iam_s3.bucket}/root", s3_endpoint_url=iam_s3.endpoint_url,
                        storage_credentials="per-run")
    admin = _store(iam_s3)
    admin.put_bytes("datasets/team-a/part-0.jsonl", DATA)
    for folder in (RIVAL_CKPT, OLD_CKPT, f"jobs/{JOB}/runs/r-0000/checkpoints/step-00000006"):
        admin.put_bytes(f"{folder}/MANIFEST.json", b'{"step": 10}')
        admin.put_bytes(f"{folder}/__0_0.distcp", b"weights")
    yield job, settings
    revoke_for_run(job, settings, run=RUN)


def _store(iam_s3: IamS3, creds: StorageCredentials | None = None) -> S3Store:
    keys = None if creds is None else creds.to_env()
    return S3Store(iam_s3.bucket, "root", client=iam_s3.client("s3", keys))


def _refused(call: Any, *args: Any, **kwargs: Any) -> str:
    """The S3 error code `call` fails with."""
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return str(caught.value.response["Error"]["Code"])


def test_a_runs_keys_read_its_dataset_and_write_its_own_checkpoints(iam_s3: IamS3, world: Any) -> None:
    job, settings = world
    creds = issue_for_attempt(job, settings, run=RUN, attempt=0)
    assert creds is not None and creds.access_key_id != os.environ["AWS_ACCESS_KEY_ID"]
    assert creds.session_token.get_secret_value()
    lifetime = (creds.expiration - datetime.now(UTC)).total_seconds()
    assert MIN_SESSION_S <= lifetime <= MAX_SESSION_S and abs(lifetime - (2 * 3600 + 600)) < 120
    store = _store(iam_s3, creds)

    assert store.get_bytes("datasets/team-a/part-0.jsonl") == DATA
    own = f"jobs/{JOB}/runs/{RUN}/checkpoints/step-00000001"
    store.put_bytes(f"{own}/MANIFEST.json", b'{"step": 1}')
    big = Path(settings.home) / "shard.bin"
    big.parent.mkdir(parents=True, exist_ok=True)
    big.write_bytes(os.urandom(6 << 20))
    multipart = S3Store(iam_s3.bucket, "root", client=store.client, multipart_threshold=5 << 20,
                        multipart_chunksize=5 << 20)
    multipart.put_file(f"{own}/__0_0.distcp", big)  # a multipart upload: create, parts, complete
    assert [o.key for o in store.list(f"jobs/{JOB}/runs/{RUN}/checkpoints/")] == [
        f"{own}/MANIFEST.json", f"{own}/__0_0.distcp"]
    assert store.get_bytes(f"{own}/MANIFEST.json") == b'{"step": 1}'
    store.delete(f"{own}/MANIFEST.json")  # retention, by rank 0
    assert not _store(iam_s3).exists(f"{own}/MANIFEST.json")


def test_another_teams_checkpoints_are_refused_read_and_write(iam_s3: IamS3, world: Any) -> None:
    job, settings = world
    store = _store(iam_s3, issue_for_attempt(job, settings, run=RUN, attempt=0))
    manifest = f"{RIVAL_CKPT}/MANIFEST.json"
    assert _refused(store.get_bytes, manifest) == "AccessDenied"
    assert _refused(store.get_bytes, f"{RIVAL_CKPT}/__0_0.distcp") == "AccessDenied"
    assert _refused(store.put_bytes, manifest, b'{"step": 99}') == "AccessDenied"
    assert _refused(store.put_bytes, f"{RIVAL_CKPT}/__0_0.distcp", b"poison") == "AccessDenied"
    assert _refused(store.client.delete_object, Bucket=iam_s3.bucket, Key=f"root/{manifest}") == "AccessDenied"
    # nor the job's own earlier runs (no resume point named them), nor a write beside its run
    assert _refused(store.get_bytes, f"{OLD_CKPT}/MANIFEST.json") == "AccessDenied"
    assert _refused(store.put_bytes, f"jobs/{JOB}/runs/r-0000/checkpoints/step-00000007/MANIFEST.json",
                    b"{}") == "AccessDenied"
    assert _refused(store.put_bytes, "datasets/team-a/part-0.jsonl", b"rewritten") == "AccessDenied"
    assert _store(iam_s3).get_bytes(manifest) == b'{"step": 10}'  # untouched


def test_a_crafted_resume_from_is_refused_before_launch(iam_s3: IamS3, world: Any) -> None:
    job, settings = world
    store_uri = settings.object_store
    crafted = [f"{store_uri}/{RIVAL_CKPT}/MANIFEST.json",
               f"{store_uri}/jobs/{JOB}/../{RIVAL}/runs/r-9/checkpoints/step-00000010/MANIFEST.json",
               f"{store_uri}/jobs/{RIVAL}/checkpoints/{JOB}/runs/r-9/checkpoints/step-00000010/MANIFEST.json"]
    for uri in crafted:
        conf = AttemptConf(run=RUN, start_from=uri)
        with pytest.raises(InvalidConf, match=r"outside the job's area|'\.\.'|\.\."):
            check_conf_points(conf, job, object_store=store_uri)  # validate_spec
        with pytest.raises(InvalidConf):
            resume_point(conf, job, tracking_uri="", object_store=store_uri)  # launch, before any key is issued
        later = AttemptConf(run=RUN, attempt=1, resume_from=uri)  # a forged next-attempt conf
        with pytest.raises(InvalidConf):
            resume_point(later, job, tracking_uri="", object_store=store_uri)
        with pytest.raises(InvalidConf):  # and the grants refuse it themselves
            issue_for_attempt(job, settings, run=RUN, attempt=1, resume_from=uri)
    iam = iam_s3.client("iam")
    assert not iam.list_roles(PathPrefix="/trainyard/")["Roles"]  # nothing was issued


def test_a_resume_point_of_the_same_job_is_readable_and_nothing_beside_it(iam_s3: IamS3, world: Any) -> None:
    job, settings = world
    point = resume_point(AttemptConf(run=RUN, start_from=f"{settings.object_store}/{OLD_CKPT}/MANIFEST.json"), job,
                         tracking_uri="", object_store=settings.object_store)
    store = _store(iam_s3, issue_for_attempt(job, settings, run=RUN, attempt=0, resume_from=point))
    assert store.get_bytes(f"{OLD_CKPT}/__0_0.distcp") == b"weights"
    assert _refused(store.put_bytes, f"{OLD_CKPT}/__0_0.distcp", b"poison") == "AccessDenied"
    assert _refused(store.get_bytes, f"jobs/{JOB}/runs/r-0000/checkpoints/step-00000006/MANIFEST.json") \
        == "AccessDenied"


def test_each_attempt_gets_new_keys_and_closing_the_run_revokes_them(iam_s3: IamS3, world: Any) -> None:
    job, settings = world
    first = issue_for_attempt(job, settings, run=RUN, attempt=0)
    second = issue_for_attempt(job, settings, run=RUN, attempt=1)
    assert first is not None and second is not None and first.access_key_id != second.access_key_id
    assert first.role_arn == second.role_arn  # one role per run
    for creds in (first, second):
        assert _store(iam_s3, creds).get_bytes("datasets/team-a/part-0.jsonl") == DATA
    assert revoke_for_run(job, settings, run=RUN)
    assert _refused(iam_s3.client("iam").get_role, RoleName=first.role_arn.rsplit("/", 1)[1]) == "NoSuchEntity"
    for creds in (first, second):  # unexpired, and refused: moto answers 500 for a deleted role (AWS: AccessDenied)
        s3 = iam_s3.client("s3", creds.to_env(), retries=1)
        assert _refused(s3.get_object, Bucket=iam_s3.bucket, Key="root/datasets/team-a/part-0.jsonl") in (
            "AccessDenied", "500")
    assert not revoke_for_run(job, settings, run=RUN)  # a second close finds nothing


def test_a_deployment_whose_keys_may_not_issue_is_told_what_they_need(
        iam_s3: IamS3, world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-run keys are the default on S3: a deployment whose own credentials may use S3 but not
    IAM (what worked before) gets a fatal launch error naming the permissions and the way back
    to shared keys, not boto's AccessDenied alone."""
    import json

    from trainyard.plugins.errors import FatalError

    job, settings = world
    iam = iam_s3.client("iam")
    iam.create_user(UserName="s3-only")
    iam.put_user_policy(UserName="s3-only", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="s3-only")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    try:
        with pytest.raises(FatalError, match="TRAINYARD_STORAGE_CREDENTIALS=shared") as refused:
            issue_for_attempt(job, settings, run=RUN, attempt=0)
    finally:  # the fixture's clean-up revokes with the deployment's keys
        for name, value in iam_s3.admin.items():
            monkeypatch.setenv(name, value)
    assert "iam:CreateRole" in str(refused.value) and "AccessDenied" in str(refused.value), refused.value
