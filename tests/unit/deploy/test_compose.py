"""docker-compose.yaml cannot run here (no Docker engine): validate it against the Compose
Specification's JSON schema, and check it agrees with the code it starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from config.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = ROOT.parent / "shared" / "schemas" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def test_compose_file_matches_the_compose_spec(compose: dict[str, Any]) -> None:
    if not SCHEMA.exists():
        pytest.skip(f"the Compose schema is not beside the checkout ({SCHEMA})")
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(compose, schema, cls=jsonschema.Draft7Validator)


def test_a_broken_compose_file_is_caught(compose: dict[str, Any]) -> None:
    if not SCHEMA.exists():
        pytest.skip(f"the Compose schema is not beside the checkout ({SCHEMA})")
    import jsonschema

    broken = json.loads(json.dumps(compose))
    broken["services"]["mlflow"]["ports"] = {"5000": 5000}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft7Validator)


def test_trainyard_variables_are_real_settings(compose: dict[str, Any]) -> None:
    fields = {f"TRAINYARD_{name.upper()}" for name in Settings.model_fields}
    for service in compose["services"].values():
        env = service.get("environment") or {}
        for key in env:
            if key.startswith("TRAINYARD_"):
                assert key in fields, f"{key} is not a Settings field"


def test_dependencies_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert dep != name
    assert (ROOT / "deploy" / "postgres-init.sql").exists()
