"""Trainyard installed as users install it: the built wheel (not this checkout's editable install)
in a fresh virtual environment, with only the extras asked for.

uv builds the wheel once per test session and installs from its cache (files linked, not copied:
a venv with torch in it takes seconds), pinned by the lock like `make venv`. Every process of
such a venv runs outside the checkout, with no PYTHONPATH: what it imports is what the venv holds.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.procs import REPO_ROOT

UV = Path(sys.executable).with_name("uv")
"""The uv `make venv` installed beside the suite's Python."""


@functools.cache
def built_wheel() -> Path:
    """`trainyard-<version>-py3-none-any.whl`, built from this checkout into a session folder as a
    package index gets it: the source distribution first, the wheel from that (which also leaves
    no `build/` folder in the checkout)."""
    out = Path(tempfile.mkdtemp(prefix="trainyard-wheel-"))
    subprocess.run([str(UV), "build", "--quiet", "--out-dir", str(out), str(REPO_ROOT)],
                   check=True, capture_output=True, text=True, timeout=600, env=clean_env())
    (wheel,) = out.glob("trainyard-*.whl")
    return wheel


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what would point a child at the checkout or at the
    suite's venv (PYTHONPATH, VIRTUAL_ENV, the venv's bin on PATH) — and with bytecode written:
    uv installs no .pyc files, and a fresh venv's processes would compile torch on every import."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME",
                                                          "PYTHONDONTWRITEBYTECODE")
           and not k.startswith(("PYTEST_", "_AIRFLOW_"))}
    suite_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != suite_bin)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env | dict(extra or {})


class Venv:
    """A fresh virtual environment at `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        subprocess.run([str(UV), "venv", "--quiet", "--python", sys.executable, str(path)], check=True,
                       capture_output=True, text=True, timeout=120, env=clean_env())

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def install(self, *requirements: str) -> None:
        """`uv pip install` with the lock as constraints (the versions `make venv` installs)."""
        subprocess.run([str(UV), "pip", "install", "--quiet", "--python", str(self.python), "-c",
                        str(REPO_ROOT / "constraints.txt"), *requirements], check=True, capture_output=True,
                       text=True, timeout=900, env=clean_env())

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process of this venv: its bin first on PATH, nothing else of ours."""
        env = clean_env(extra)
        env["PATH"] = os.pathsep.join([str(self.path / "bin"), env.get("PATH", "")])
        env["VIRTUAL_ENV"] = str(self.path)
        return env

    def run(self, args: Sequence[str | Path], *, cwd: Path, env: Mapping[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A command of this venv (`args[0]` a name in its bin, e.g. `python`, `torchrun`)."""
        cmd = [str(self.bin(str(args[0]))), *map(str, args[1:])]
        return subprocess.run(cmd, cwd=cwd, env=self.env(env), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def can_import(self, module: str, *, cwd: Path) -> bool:
        return self.run(["python", "-c", f"import {module}"], cwd=cwd).returncode == 0
