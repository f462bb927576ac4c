"""Trainyard: run parallel PyTorch training jobs from one YAML `TrainingJob` spec.

The one import root of the distribution (DESIGN §1). The repository keeps its layout —
`config/`, `plugins/`, `worker/`, `node_agent/`, `operators/`, `sensors/`, `dags/`, `cli/` at the
top — and the build maps each folder under this package (`setup.py`), so a module is always
`trainyard.<folder>…` and no bare name (`config`, `operators`, …) is installed beside a user's
own Airflow deployment or training code.

The public API for training scripts is this module (DESIGN §7, the managed mode):

    import trainyard
    session = trainyard.init()
    start = session.restore(model=model, optimizer=optimizer)
    ...  session.report(loss=loss.item())  ...  if session.should_stop: break
    session.finish()

(`trainyard.worker.managed` says what each does.) Nothing heavy is imported here: a training rank,
a DAG parse and the `trainyard` command each import only what they use; `init` imports torch.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from trainyard.worker.managed import Session

try:
    __version__ = metadata.version("trainyard")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"


def init(*, spec: str | Path | None = None) -> Session:
    """This rank's session: `trainyard.worker.managed.init`."""
    from trainyard.worker.managed import init as start

    return start(spec=spec)


__all__ = ["__version__", "init"]
