"""Shared material of the hostile-input suite: the inputs, the time bound and a two-job store.

Every case must end in a clear error within a second. The bound is enforced by pytest-timeout
(`TIMEOUT_S` per test, a few cases each, with headroom for a loaded CI machine), not by a
wall-clock assertion: what it catches is a case that never ends — an alias bomb expanded, a
billion template nodes generated — not a slow one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, step_dir
from trainyard.plugins.storage.store import LocalStore

TIMEOUT_S = 10

ALIAS_BOMB = b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
    f"b{i}: &b{i} [{', '.join(['*a' if i == 0 else f'*b{i - 1}'] * 9)}]\n".encode() for i in range(9))
"""Nine levels of nine aliases: 9^10 ≈ 3.5 billion strings once expanded, 700 bytes written."""

MERGE_BOMB = b"a: &a {k0: v, k1: v, k2: v}\n" + b"".join(
    f"m{i}: &m{i} {{<<: [{', '.join(['*a' if i == 0 else f'*m{i - 1}'] * 3)}], x{i}: [{', '.join(['*a' if i == 0 else f'*m{i - 1}'] * 9)}]}}\n".encode()
    for i in range(9))
"""The same growth through merge keys and nested mappings."""


def spec_doc(name: str, **checkpoint: str) -> dict:
    """A minimal valid TrainingJob for the local CPU cluster."""
    doc = {
        "apiVersion": "training.platform/v1", "kind": "TrainingJob",
        "metadata": {"name": name, "team": "demo"},
        "spec": {
            "source": {"entrypoint": "worker/train.py"},
            "hardware": {"gpuType": "cpu", "gpuCount": 2, "nodesPreferred": 2},
            "parallelism": {"strategy": "manual"},
            "dataset": {"source": "datasets/none/"},
            "training": {"maxSteps": 3},
        },
    }
    if checkpoint:
        doc["spec"]["checkpoint"] = checkpoint
    return doc


def write_spec(path: Path, name: str, **checkpoint: str) -> Path:
    path.write_text(yaml.safe_dump(spec_doc(name, **checkpoint)))
    return path


VICTIM, MALLORY = "victim", "mallory"
RUN, OTHER_RUN = "20261130t100000-aaaaaa", "20261130t110000-bbbbbb"


@dataclass(frozen=True)
class World:
    """A local object store holding two jobs: `victim` (someone else's, never to be touched)
    and `mallory` (the job whose inputs are hostile)."""

    home: Path
    jobs_dir: Path
    objects: Path

    @property
    def object_store(self) -> str:
        return self.objects.as_uri()

    def area(self, job: str) -> Path:
        return self.objects / "jobs" / job

    def root(self, job: str, run: str = RUN) -> Path:
        return self.area(job) / "runs" / run / "checkpoints"

    def manifest_uri(self, job: str, step: int, run: str = RUN) -> str:
        return (self.root(job, run) / step_dir(step) / MANIFEST_NAME).as_uri()

    def store(self, job: str, run: str = RUN) -> LocalStore:
        return LocalStore(self.root(job, run))


def build_world(tmp: Path) -> World:
    world = World(home=tmp / "home", jobs_dir=tmp / "jobs", objects=tmp / "home" / "objects")
    world.jobs_dir.mkdir(parents=True)
    make_checkpoint(world.store(VICTIM), 5, metrics={"loss": 0.5})
    make_checkpoint(world.store(MALLORY), 1, metrics={"loss": 2.0})
    write_spec(world.jobs_dir / f"{MALLORY}.yaml", MALLORY)
    return world
