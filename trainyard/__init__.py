"""Trainyard: run parallel PyTorch training jobs from one YAML `TrainingJob` spec.

The one import root of the distribution (DESIGN §1). The repository keeps its layout —
`config/`, `plugins/`, `worker/`, `node_agent/`, `operators/`, `sensors/`, `dags/`, `cli/` at the
top — and the build maps each folder under this package (`setup.py`), so a module is always
`trainyard.<folder>…` and no bare name (`config`, `operators`, …) is installed beside a user's
own Airflow deployment or training code.

Nothing is imported here: a training rank, a DAG parse and the `trainyard` command each import
only what they use.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("trainyard")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
