"""Trainyard as an Airflow provider: what Airflow's `apache_airflow_provider` entry point returns.

Airflow lists it on the Providers page (`airflow providers list`), validates it against its
provider schema, and reads from it the operators, sensors and triggers, the extra links a task
shows, and the plugin (the Trainyard view). The plugin loads from the installed package, never
from files copied into a plugins folder: by this list where Airflow discovers providers eagerly
(`[core] lazy_discover_providers = False`), and by the `airflow.plugins` entry point otherwise
(Airflow's default, under which providers' plugins are not loaded) — pyproject.toml declares
both. Pure data, no imports: Airflow calls it in every component.
"""

from __future__ import annotations

from typing import Any

INTEGRATION = "Trainyard"


def get_provider_info() -> dict[str, Any]:
    from trainyard import __version__

    return {
        "package-name": "trainyard",
        "name": "Trainyard",
        "description": "Parallel PyTorch training jobs from one YAML TrainingJob spec: validated, planned, "
                       "placed as a gang, launched with torchrun or as a Volcano Job, checkpointed, watched, "
                       "recovered and tracked in MLflow — one DAG per spec.\n",
        "versions": [__version__],
        "integrations": [{"integration-name": INTEGRATION, "tags": ["software"]}],
        "operators": [{"integration-name": INTEGRATION, "python-modules": [
            "trainyard.operators.validate",
            "trainyard.operators.placement",
            "trainyard.operators.launch",
            "trainyard.operators.outcome",
            "trainyard.operators.retrain",
        ]}],
        "sensors": [{"integration-name": INTEGRATION, "python-modules": ["trainyard.sensors.watch"]}],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": ["trainyard.sensors.triggers"]}],
        "extra-links": [
            "trainyard.operators.links.MlflowRunLink",
            "trainyard.operators.links.TrainyardViewLink",
            "trainyard.operators.links.ModelVersionLink",
        ],
        "plugins": [{"name": "trainyard", "plugin-class": "trainyard.plugins.trainyard_plugin.TrainyardPlugin"},
                    {"name": "trainyard-marked-failed",
                     "plugin-class": "trainyard.sensors.marked_failed.MarkedFailedPlugin"}],
    }
