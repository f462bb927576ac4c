"""The warm rank starter's pure parts: what it preloads for an entrypoint, and how a wrapper
reads the exit of a process that is not its child."""

from __future__ import annotations

import importlib.util
import os
import signal
import sysconfig
import time
from pathlib import Path

from tests.support.waiting import wait_for
from trainyard.plugins.launch.rank_zygote import TEMPLATE_MODULES, entry_imports, socket_address
from trainyard.plugins.run import processes


def test_the_preload_is_the_entrypoints_top_level_absolute_imports(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(
        "from __future__ import annotations\n"
        "import os, torch.distributed as dist\n"
        "from trainyard.worker.session import TrainingSession\n"
        "from . import sibling\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import typing_only\n"
        "try:\n"
        "    import optional_dependency\n"
        "except ImportError:\n"
        "    optional_dependency = None\n"
        "def main():\n"
        "    import lazily_imported\n"
        "import os\n"
    )
    assert entry_imports("job.py", False, tmp_path) == ["os", "torch.distributed", "trainyard.worker.session", "typing"]


def test_a_module_entrypoint_is_found_on_the_path_and_a_missing_or_broken_one_preloads_nothing(tmp_path: Path) -> None:
    imports = entry_imports("trainyard.plugins.launch.rank_exec", True, tmp_path)
    assert "trainyard.plugins.files" in imports and "subprocess" in imports
    assert entry_imports("no_such_module_anywhere", True, tmp_path) == []
    assert entry_imports("missing.py", False, tmp_path) == []
    (tmp_path / "broken.py").write_text("def (:\n")
    assert entry_imports("broken.py", False, tmp_path) == []


def test_an_at_name_is_abstract_and_anything_else_a_path() -> None:
    assert socket_address("@trainyard-x") == "\0trainyard-x"
    assert socket_address("/run/zygote.sock") == "/run/zygote.sock"


def _unreaped_child(body: str) -> tuple[int, int | None]:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        if body == "exit 3":
            os._exit(3)
        time.sleep(60)
        os._exit(0)
    return pid, processes.start_ticks(pid)


def _until_zombie(pid: int) -> None:
    wait_for(lambda: (processes.stat_fields(pid) or ["?"])[0] == "Z", "the child to end", 30, poll_s=0.01)


def test_the_exit_of_an_ended_unreaped_process_is_read_from_proc() -> None:
    pid, ticks = _unreaped_child("exit 3")
    _until_zombie(pid)
    assert processes.zombie_exit_code(pid, ticks) == 3
    assert processes.zombie_exit_code(pid, (ticks or 0) + 1) is None  # another process with that pid
    os.waitpid(pid, 0)
    assert processes.zombie_exit_code(pid, ticks) is None  # reaped: gone


def test_a_killed_process_reads_as_minus_the_signal_and_a_running_one_as_none() -> None:
    pid, ticks = _unreaped_child("sleep")
    assert processes.zombie_exit_code(pid, ticks) is None
    os.kill(pid, signal.SIGKILL)
    _until_zombie(pid)
    assert processes.zombie_exit_code(pid, ticks) == -signal.SIGKILL
    os.waitpid(pid, 0)


def test_a_template_serves_one_start_up_environment_whatever_the_run() -> None:
    from trainyard.plugins.launch.rank_zygote import template_name

    base = {"PATH": "/usr/bin", "PYTHONPATH": "/src"}
    name = template_name(base, Path.cwd(), 300.0)
    assert name == template_name({**base, "TRAINYARD_RUN_DIR": "/runs/a", "RANK": "3"}, Path.cwd(), 300.0)
    for other in ({**base, "PYTHONHASHSEED": "5"}, {**base, "OMP_NUM_THREADS": "4"},
                  {**base, "LD_PRELOAD": "/x.so"}, {**base, "TORCH_LOGS": "+dynamo"}):
        assert template_name(other, Path.cwd(), 300.0) != name, other
    assert template_name(base, Path("/"), 300.0) != name != template_name(base, Path.cwd(), 1.0)


def test_the_templates_preload_is_third_party_only_and_every_module_exists() -> None:
    """Third-party code only (an edit to this checkout never reaches a rank through a template
    started before it), and no misspelt name, which would cost only the seconds it was meant to
    save (the template reports a failed import and goes on)."""
    specs = {name: importlib.util.find_spec(name) for name in TEMPLATE_MODULES}
    assert [name for name, spec in specs.items() if spec is None] == []
    installed = {Path(sysconfig.get_paths()[kind]).resolve() for kind in ("purelib", "platlib")}
    not_installed = [name for name, spec in specs.items()
                     if not installed & set(Path(str(spec.origin)).resolve().parents)]
    assert not_installed == [], not_installed  # e.g. a module of this checkout


def test_only_a_script_that_imports_trainyard_is_started_warm(tmp_path: Path) -> None:
    """A plain script runs with only its own imports, as under torchrun (a preloaded module
    changes the program: see `warm_start_for`)."""
    from trainyard.plugins.launch.rank_zygote import warm_start_for

    (tmp_path / "plain.py").write_text("import torch\nimport torch.distributed as dist\n")
    (tmp_path / "managed.py").write_text("import os\nimport trainyard\n")
    (tmp_path / "worker_like.py").write_text("from trainyard.worker.session import TrainingSession\n")
    assert not warm_start_for(str(tmp_path / "plain.py"), tmp_path)
    assert warm_start_for(str(tmp_path / "managed.py"), tmp_path)
    assert warm_start_for(str(tmp_path / "worker_like.py"), tmp_path)
    assert warm_start_for("trainyard.worker.train", tmp_path)
