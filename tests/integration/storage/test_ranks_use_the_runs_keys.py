"""End to end through the local launcher: a rank started with the deployment's keys in the
launcher's environment sees only its run's, so S3 (moto, IAM enforcement on) lets it write its
checkpoint prefix and refuses it another team's checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.storage.conftest import IamS3
from tests.support import procs
from tests.support.procs import REPO_ROOT
from trainyard.config.cluster import load_cluster
from trainyard.config.loader import load_spec_file
from trainyard.config.settings import Settings
from trainyard.config.worker_env import AWS_CREDENTIAL_ENV
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.attempt.storage_access import issue_for_attempt, revoke_for_run
from trainyard.plugins.launch.environment import build_worker_env
from trainyard.plugins.launch.local import LocalLauncher
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest

pytestmark = [pytest.mark.slow]
RIVAL_MANIFEST = "root/jobs/rival-lm/runs/r-9/checkpoints/step-00000010/MANIFEST.json"


def test_a_rank_writes_its_checkpoints_and_cannot_read_another_teams(iam_s3: IamS3, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AWS_CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in iam_s3.admin.items():
        monkeypatch.setenv(name, value)
    admin = iam_s3.client("s3")
    admin.put_object(Bucket=iam_s3.bucket, Key=RIVAL_MANIFEST, Body=b'{"step": 10}')
    spec = tmp_path / "probe.yaml"
    spec.write_text(yaml.safe_dump({
        "apiVersion": "training.platform/v1", "kind": "TrainingJob",
        "metadata": {"name": "probe-lm", "team": "team-a"},
        "spec": {"source": {"entrypoint": "tests/integration/storage/s3_probe_job.py", "args": [RIVAL_MANIFEST]},
                 "hardware": {"gpuType": "cpu", "gpuCount": 1}, "parallelism": {"strategy": "manual"},
                 "dataset": {"source": "datasets/none/"}, "training": {"maxSteps": 1}}}))
    job = load_spec_file(spec)
    settings = Settings(home=tmp_path / "home", object_store=f"s3://{iam_s3.bucket}/root",
                        s3_endpoint_url=iam_s3.endpoint_url, storage_credentials="per-run")
    plan = Plan(layout=RankLayout(dp=1))
    placement = place_gang(GangRequest.for_job(job, plan, run="r-1"), Inventory.from_cluster(load_cluster("local")))
    keys = issue_for_attempt(job, settings, run="r-1", attempt=0)
    env = build_worker_env(job, plan, settings, run="r-1", attempt=0).model_copy(update={"storage_credentials": keys})
    base = procs.test_env({"TRAINYARD_S3_ENDPOINT_URL": iam_s3.endpoint_url, "TRAINYARD_WARM_RANKS": "0"})
    launcher = LocalLauncher(settings.runs_dir, source_dir=REPO_ROOT, base_env=base)
    handle = launcher.submit(job, plan, placement, env, attempt=0)
    try:
        status = launcher.wait(handle, timeout_s=120)
        log = launcher.logs(handle, rank=0)
        assert status.state == "succeeded", f"{status}\n{log}"
        assert "other team's checkpoint: AccessDenied" in log
        body: Any = admin.get_object(Bucket=iam_s3.bucket, Key="root/jobs/probe-lm/runs/r-1/checkpoints/probe.txt")
        assert body["Body"].read() == b"written by the rank"
    finally:
        if not launcher.poll(handle).finished:
            launcher.stop(handle, grace_s=0)
        revoke_for_run(job, settings, run="r-1")
