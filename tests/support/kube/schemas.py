"""What crosses the emulated API server's wire is checked against the real schemas.

Core kinds (Pod, Node, Event, Binding, Namespace, Service) against the Kubernetes OpenAPI
schemas shipped by `kubernetes-validate` (its strict variant: unknown fields are errors, as
with kubectl's default strict field validation); the Volcano kinds (Job, PodGroup, Queue)
against the CRDs' `openAPIV3Schema` read from the shared schemas folder
(`../shared/schemas/volcano/`, never copied into the project), made strict the same way.

A validator is built once per kind: `kubernetes_validate.validate` rebuilds its reference
registry on every call (~60 ms for a Pod); cached, a Pod validates in well under a millisecond,
which matters when every status write of every simulated node is checked.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
SCHEMAS = Path(os.environ.get("TRAINYARD_SHARED_SCHEMAS") or REPO_ROOT.parent / "shared" / "schemas")
"""`../shared/schemas` beside the checkout; a git worktree elsewhere names it with the variable."""
VOLCANO = SCHEMAS / "volcano"

CRDS = {
    ("batch.volcano.sh/v1alpha1", "Job"): "batch.volcano.sh_jobs.yaml",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "scheduling.volcano.sh_podgroups.yaml",
    ("scheduling.volcano.sh/v1beta1", "Queue"): "scheduling.volcano.sh_queues.yaml",
}


class SchemaMissing(RuntimeError):
    """The Volcano CRDs are not where the harness looks for them."""


class Invalid(ValueError):
    """An object the real API server would refuse (422): `field` is the JSON path, `reason`
    what is wrong there."""

    def __init__(self, kind: str, name: str, field: str, reason: str) -> None:
        super().__init__(f'{kind} "{name}" is invalid: {field}: {reason}')
        self.kind, self.name, self.field, self.reason = kind, name, field, reason


def _strict(schema: Any) -> Any:
    """The API server prunes unknown fields and, with strict field validation, refuses them;
    plain JSON Schema would accept them. Forbid them where the schema lists the properties."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def check_crds_present() -> None:
    missing = [f for f in CRDS.values() if not (VOLCANO / f).exists()]
    if missing:
        raise SchemaMissing(f"Volcano CRD schemas {missing} not found under {VOLCANO} (the shared "
                            "schemas folder is absent; set TRAINYARD_SHARED_SCHEMAS)")


@functools.cache
def _crd_validator(filename: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((VOLCANO / filename).read_text())
    return jsonschema.Draft7Validator(_strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))


@functools.cache
def _core_validator(api_version: str, kind: str) -> Any:
    import kubernetes_validate
    from kubernetes_validate.utils import schema_contents
    from referencing import Registry, Resource

    version = kubernetes_validate.latest_version()
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    short = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = schema_contents(f"{folder}/{kind.lower()}-{short}.json", version)
    definitions = schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validator_for(api_version: str, kind: str) -> Any:
    crd = CRDS.get((api_version, kind))
    if crd is not None:
        check_crds_present()
        return _crd_validator(crd)
    return _core_validator(api_version, kind)


def validate(obj: dict[str, Any]) -> None:
    """Raise `Invalid` (naming the first bad field) unless `obj` is valid for its kind."""
    kind, api_version = obj.get("kind", ""), obj.get("apiVersion", "")
    name = (obj.get("metadata") or {}).get("name", "")
    error = jsonschema.exceptions.best_match(validator_for(api_version, kind).iter_errors(obj))
    if error is not None:
        field = ".".join(str(p) for p in error.absolute_path) or "<root>"
        raise Invalid(kind, name, field, error.message)
