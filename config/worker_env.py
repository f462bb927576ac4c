"""The environment contract between the launcher and the training processes (DESIGN §7).

One model, used on both sides: the launcher builds it and calls `to_env()`; the worker
runtime calls `WorkerEnv.from_env()`. torchrun adds the torch.distributed variables itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

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
