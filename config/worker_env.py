"""The environment contract between the launcher and the training processes (DESIGN §7).

One model, used on both sides: the launcher builds it and calls `to_env()`; the worker
runtime calls `WorkerEnv.from_env()`. torchrun adds the torch.distributed variables itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, SecretStr

PREFIX = "TRAINYARD_"
NODE_VAR = "TRAINYARD_NODE"
"""Set per node by the launcher (not per job, so not a `WorkerEnv` field): the placement's node
name for the local launcher, `spec.nodeName` on Kubernetes. Heartbeats carry it."""

RESERVED_ENV = frozenset({
    "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI",
})
"""Names the platform or torchrun sets; a spec's `training.env` may not set them."""
RESERVED_PREFIXES = (PREFIX, "TORCHELASTIC_")


_UNPREFIXED = ("mlflow_tracking_uri", "mlflow_run_id")
"""MLflow's own variable names, so `mlflow` in the worker picks them up unaided."""


def is_reserved(name: str) -> bool:
    return name in RESERVED_ENV or name.startswith(RESERVED_PREFIXES)


def _variable(field: str) -> str:
    """The environment variable that carries a `WorkerEnv` field."""
    return field.upper() if field in _UNPREFIXED else PREFIX + field.upper()


AWS_CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)
"""Every variable through which botocore finds credentials: a launch that hands its ranks
`StorageCredentials` removes these from the environment it inherited, so the deployment's own
keys, profile or web identity never reach a rank."""


class StorageCredentials(BaseModel):
    """Temporary object-store credentials scoped to one run (`trainyard.plugins.storage.credentials`),
    the ranks' only ones. Never serialised with the `WorkerEnv` (`exclude`), never in a repr."""

    model_config = ConfigDict(frozen=True)

    access_key_id: str
    secret_access_key: SecretStr
    session_token: SecretStr
    expiration: datetime | None = None
    role_arn: str = ""
    """The run's role (one per run; deleted when the run closes)."""

    def to_env(self) -> dict[str, str]:
        """botocore's own variable names, and no instance-metadata fallback: a rank whose keys
        expire fails plainly instead of finding the node's role."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret_access_key.get_secret_value(),
                "AWS_SESSION_TOKEN": self.session_token.get_secret_value(),
                "AWS_EC2_METADATA_DISABLED": "true"}


def without_deployment_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less every credential variable (`AWS_CREDENTIAL_ENV`)."""
    return {k: v for k, v in env.items() if k not in AWS_CREDENTIAL_ENV}


class WorkerEnv(BaseModel):
    """What every training process receives besides torchrun's own variables."""

    model_config = ConfigDict(frozen=True)

    job: str
    run: str = Field(description="The training run (one trigger of the job); all attempts share it")
    attempt: int = 0
    plan: str = Field(description="Plan JSON (trainyard.plugins.advisor.plan.Plan)")
    spec: str = Field(description="The TrainingJob as JSON (camelCase)")
    resume_from: str = Field(default="", description="Manifest URI to restore, or empty for latest valid")
    object_store: str
    checkpoint_uri: str = Field(description="Root of this job's checkpoints (step-N folders)")
    heartbeat_dir: str
    hang_timeout_s: float = 600.0
    run_dir: str = Field(default="", description="Per-attempt folder for logs and scratch")
    mlflow_tracking_uri: str = ""
    mlflow_run_id: str = ""
    faults: str = Field(default="", description="Test-only fault injection (`worker/faults.py`, "
                                                "TRAINYARD_FAULTS); empty: none")
    learning_rate: float | None = Field(default=None, description="`training.learningRate` as this attempt "
                                        "trains it (the trigger form's override applied); unset: none given")
    max_steps: int | None = Field(default=None, description="`training.maxSteps` as this attempt trains it "
                                  "(the trigger form's `max_steps` applied)")
    storage_credentials: StorageCredentials | None = Field(
        default=None, exclude=True, repr=False,
        description="The run's scoped object-store credentials, set as AWS_* variables by "
                    "`job_environment` (the launcher's side only); None: the ranks inherit the "
                    "deployment's (a file:// store, or `TRAINYARD_STORAGE_CREDENTIALS=shared`)")

    def to_env(self) -> dict[str, str]:
        """Every field as its variable; no `TRAINYARD_FAULTS` at all when there are none (a
        base environment's own stays, as the fault tests set it), nothing for an unset value."""
        skip = set() if self.faults else {"faults"}
        return {_variable(name): str(value) for name, value in self.model_dump(exclude=skip).items()
                if value is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        environ = os.environ if environ is None else environ
        values = {name: environ[_variable(name)] for name in cls.model_fields if _variable(name) in environ}
        return cls.model_validate(values)
