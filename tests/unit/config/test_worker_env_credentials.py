"""A run's storage keys ride on the `WorkerEnv` for the launcher only: never in its JSON, its
repr or its `TRAINYARD_*` variables."""

from __future__ import annotations

from trainyard.config.worker_env import StorageCredentials, WorkerEnv


def test_the_keys_never_leave_the_launcher_in_the_worker_env() -> None:
    keys = StorageCredentials(access_key_id="ASIARUN", secret_access_key="run-secret", session_token="run-token")
    env = WorkerEnv(job="j", run="r", plan="{}", spec="{}", object_store="s3://b/p", checkpoint_uri="s3://b/p/c",
                    heartbeat_dir="/tmp/h", storage_credentials=keys)
    assert env.storage_credentials == keys
    for text in (env.model_dump_json(), repr(env), str(env.to_env()), repr(keys)):
        assert "run-secret" not in text and "run-token" not in text
    assert keys.to_env()["AWS_SECRET_ACCESS_KEY"] == "run-secret"
    assert WorkerEnv.from_env(env.to_env()).storage_credentials is None
