"""Settings that cannot work in a cluster's pods are named with their fix before anything is applied."""

from __future__ import annotations

from typing import Any
from unittest.mock import create_autospec

import pytest
from kubernetes.client import CustomObjectsApi

from tests.unit.launch.launch_fixtures import gpu_job
from trainyard.plugins.errors import FatalError
from trainyard.plugins.launch.cluster_settings import (
    UnsafeForCluster,
    check_cluster_settings,
    cluster_setting_problems,
)
from trainyard.plugins.launch.volcano import KubernetesLauncher


def problems(env_update: dict[str, Any] | None = None, **spec: Any) -> dict[str, str]:
    job, _, _, env = gpu_job(**spec)
    update = dict(env_update or {})
    s3_endpoint = update.pop("_s3", None)
    found = cluster_setting_problems(job, env.model_copy(update=update), s3_endpoint_url=s3_endpoint)
    return {p.setting: p.severity for p in found}


def test_cluster_ready_settings_pass() -> None:
    assert problems() == {}


@pytest.mark.parametrize(("update", "expected"), [
    ({"object_store": "file:///home/me/.trainyard/objects",
      "checkpoint_uri": "file:///home/me/.trainyard/objects/jobs/gpt-200b/checkpoints"},
     {"TRAINYARD_OBJECT_STORE": "error"}),  # the checkpoint root below it is the same mistake, said once
    ({"checkpoint_uri": "file:///scratch/ckpt"}, {"spec.checkpoint.storage": "error"}),
    ({"resume_from": "file:///ckpt/step-00000100/MANIFEST.json"}, {"TRAINYARD_RESUME_FROM": "error"}),
    ({"mlflow_tracking_uri": "sqlite:////home/me/mlflow.db"}, {"MLFLOW_TRACKING_URI": "error"}),
    ({"mlflow_tracking_uri": "http://127.0.0.1:5000"}, {"MLFLOW_TRACKING_URI": "error"}),
    ({"mlflow_tracking_uri": ""}, {"MLFLOW_TRACKING_URI": "warning"}),
    ({"mlflow_run_id": ""}, {"MLFLOW_RUN_ID": "warning"}),
    ({"_s3": "http://localhost:9000"}, {"TRAINYARD_S3_ENDPOINT_URL": "error"}),
])
def test_each_setting_that_cannot_work(update: dict[str, Any], expected: dict[str, str]) -> None:
    assert problems(update) == expected


def test_a_local_dataset_and_an_unpinned_git_source() -> None:
    assert problems(dataset={"source": "file:///data/web/"}) == {"spec.dataset.source": "error"}
    assert problems(source={"entrypoint": "t.py", "git": {"repo": "https://x/y.git"}}) == {
        "spec.source.git.commit": "error"}


def test_the_launcher_refuses_before_any_api_call() -> None:
    job, plan, placement, env = gpu_job()
    bad = env.model_copy(update={"mlflow_tracking_uri": "sqlite:///mlflow.db"})
    with pytest.raises(UnsafeForCluster, match=r"MLFLOW_TRACKING_URI='sqlite:///mlflow\.db'") as refused:
        check_cluster_settings(job, bad)
    assert isinstance(refused.value, FatalError)  # an operator fails at once, no retry
    api = create_autospec(CustomObjectsApi, instance=True)
    with pytest.raises(UnsafeForCluster):
        KubernetesLauncher(api).submit(job, plan, placement, bad, attempt=2)
    assert api.method_calls == []
