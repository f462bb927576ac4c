"""Spec and plan as MLflow params, with stable dotted names so runs compare column by column.

`spec.hardware.gpuCount`, `spec.parallelism.hints.hiddenSize`, `plan.tp`, `plan.micro_batch_size`:
the spec keeps its YAML (camelCase) spelling — the one users write and grep — and the plan its
Python spelling (it has no other). Lists are recorded as compact JSON, so `spec.source.args`
is one column rather than one per element.

Values of `spec.training.env` whose names look like credentials (`*TOKEN*`, `*SECRET*`,
`*KEY*`, `*PASSWORD*`, `*CREDENTIAL*`) are recorded as `<redacted>`: params are readable by
everyone who can open the experiment.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan

MAX_PARAM_VALUE_CHARS = 6000
"""`mlflow.utils.validation.MAX_PARAM_VAL_LENGTH`."""
MAX_KEY_CHARS = 250
"""`mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH`."""

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE", re.I)
_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /:]")
"""MLflow names may hold alphanumerics, `_ - . / :` and spaces; anything else becomes `_`."""


def spec_params(job: TrainingJob) -> dict[str, str]:
    """The whole spec, flattened: `metadata.team`, `spec.hardware.gpuCount`, …"""
    doc = redacted_spec(job)
    doc.pop("apiVersion", None)
    doc.pop("kind", None)
    return flatten(doc)


def redacted_spec(job: TrainingJob) -> dict[str, Any]:
    """The spec as its YAML document, credential-like env values replaced by `<redacted>`:
    what params and the run's `spec/` artifact show to everyone who can open the experiment."""
    doc = job.to_yaml_dict()
    env = doc.get("spec", {}).get("training", {}).get("env")
    if env:
        doc["spec"]["training"]["env"] = {
            k: (REDACTED if _SECRET_NAME.search(k) else v) for k, v in env.items()
        }
    return doc


def plan_params(plan: Plan) -> dict[str, str]:
    """The plan, flattened under `plan.`: degrees, micro-batching and the advisor's estimates.

    The degrees keep their flat names (`plan.tp`, not `plan.layout.tp`) although the plan nests
    them in its `layout`: MLflow compares runs column by column, and the runs logged before the
    degrees had one carrier (#59) have `plan.tp`. A plan's layout has one rank per node, so
    `ranks_per_node` says nothing and is left out."""
    doc = plan.model_dump(mode="json", exclude_none=True)
    layout = doc.pop("layout")
    doc.update({k: layout[k] for k in ("tp", "pp", "dp", "cp")})
    return flatten(doc, prefix="plan")


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings to `a.b.c` keys; lists and scalars to strings; None and {} left out."""
    out: dict[str, str] = {}
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, Mapping):
            out.update(flatten(item, name))
        elif item is not None:
            out[safe_key(name)] = param_value(item)
    return out


def param_value(value: Any) -> str:
    """A string MLflow accepts: JSON for non-strings, truncated to MLflow's limit."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)
    return truncate(text, MAX_PARAM_VALUE_CHARS)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def safe_key(name: str) -> str:
    """A valid MLflow param/tag/metric name; over-long names keep a hash so they stay unique."""
    name = _BAD_KEY_CHARS.sub("_", name)
    if len(name) > MAX_KEY_CHARS:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        name = f"{name[: MAX_KEY_CHARS - 13]}~{digest}"
    return name
