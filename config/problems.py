"""What validation says about a spec: one `Problem` per mistake, never just the first.

Every check in Trainyard — schema, cross-field rules, the dry run — reports `Problem`s with a
stable `code` so that scripts, the Airflow UI and tests can match on it, a `path` in the
spec's own (camelCase) spelling, and a `hint` that says how to fix it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from trainyard.plugins.errors import FatalError  # a leaf module with no imports, not an engine


class Code(StrEnum):
    """Stable problem codes. Never rename one: users grep for them."""

    # file and schema
    FILE_UNREADABLE = "FILE_UNREADABLE"
    FILE_TOO_LARGE = "FILE_TOO_LARGE"
    NOT_YAML = "NOT_YAML"
    NOT_A_MAPPING = "NOT_A_MAPPING"
    DUPLICATE_KEY = "DUPLICATE_KEY"
    UNKNOWN_FIELD = "UNKNOWN_FIELD"
    MISSING_FIELD = "MISSING_FIELD"
    INVALID_VALUE = "INVALID_VALUE"
    # spec-only rules (config/rules.py)
    INVALID_JOB_NAME = "INVALID_JOB_NAME"
    PARALLELISM_MISMATCH = "PARALLELISM_MISMATCH"
    PP_LAYER_MISMATCH = "PP_LAYER_MISMATCH"
    TP_HEAD_MISMATCH = "TP_HEAD_MISMATCH"
    MIN_GPU_COUNT = "MIN_GPU_COUNT"
    CHECKPOINT_PREFIX = "CHECKPOINT_PREFIX"
    RESERVED_ENV = "RESERVED_ENV"
    HINTS_REQUIRED = "HINTS_REQUIRED"
    INVALID_SCHEDULE = "INVALID_SCHEDULE"
    TOKENIZER = "TOKENIZER"
    # rules against the cluster (config/rules.py)
    UNKNOWN_GPU_TYPE = "UNKNOWN_GPU_TYPE"
    TP_EXCEEDS_NODE = "TP_EXCEEDS_NODE"
    GPU_MEMORY_TOO_SMALL = "GPU_MEMORY_TOO_SMALL"
    CLUSTER_TOO_SMALL = "CLUSTER_TOO_SMALL"
    # the dry run (plugins/validation)
    INSUFFICIENT_GPU_MEMORY = "INSUFFICIENT_GPU_MEMORY"
    DATASET_NOT_FOUND = "DATASET_NOT_FOUND"
    STORE_CREDENTIALS = "STORE_CREDENTIALS"
    """The object store cannot be read with the credentials at hand (none found, or refused)."""
    STORE_UNREACHABLE = "STORE_UNREACHABLE"
    """The object store did not answer: nothing is known about the dataset (a warning)."""
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    UNKNOWN_TEAM = "UNKNOWN_TEAM"
    DATA_QUALITY = "DATA_QUALITY"
    DATA_STRIPES = "DATA_STRIPES"
    """More data stripes asked for than the dataset has shards (a warning: one per shard)."""
    MODEL_SIZE_MISMATCH = "MODEL_SIZE_MISMATCH"
    UNSUPPORTED_BY_RUNTIME = "UNSUPPORTED_BY_RUNTIME"
    LAUNCHER_UNAVAILABLE = "LAUNCHER_UNAVAILABLE"
    """This deployment's launcher cannot provide the spec's devices (another cluster has them), or
    no launcher is wired for the cluster's mode."""


class Problem(BaseModel):
    """One thing wrong (or worth a warning) in a spec."""

    model_config = ConfigDict(frozen=True)

    code: Code
    path: str
    """Where, in the spec's own spelling: `spec.hardware.gpuCount`; the file for file problems."""
    message: str
    """What is wrong, naming the value that is wrong."""
    hint: str = ""
    """How to fix it."""
    severity: Literal["error", "warning"] = "error"

    def render(self) -> str:
        """`path: message (hint)` — the one-line human form."""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{self.path}: {self.message}{hint}"


class SpecError(FatalError, ValueError):
    """Raised when a spec has errors; carries every problem found, not just the first. Fatal:
    the same spec fails the same way until someone edits it."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {p.code}: {p.render()}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) in the spec:\n{lines}")


def preview(text: str, limit: int = 300) -> str:
    """A message cut to `limit` characters: values in messages come from untrusted input."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def errors_only(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]
