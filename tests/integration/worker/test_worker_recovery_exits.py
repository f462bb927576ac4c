"""The worker's own failure exits, with the real train.py under torchrun (2 processes), read
back by the recovery engine: an OOM exits `OOM` and classifies as `oom`; a corrupt resume
point exits `CHECKPOINT_CORRUPT`, classifies as `checkpoint_corrupt`, and the decided fall-back
(quarantine it, resume from the previous checkpoint) finishes the run.

The resumed run saves the quarantined step again, which overwrites the corrupt files in that
step's folder: quarantine keeps a bad checkpoint out of every restore, but its bytes survive
only until the same step is committed again (see plugins/checkpoint/catalog.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.worker.conftest import (
    RUN,
    WorkerRun,
    committed_steps,
    fsdp_plan,
    launch,
    tiny_job,
)
from trainyard.plugins.attempt.bookkeeping import (
    DecisionInputs,
    apply_quarantine,
    decide_from_catalog,
)
from trainyard.plugins.attempt.evidence import gather
from trainyard.plugins.checkpoint.catalog import scan, verify
from trainyard.plugins.checkpoint.uris import checkpoint_root
from trainyard.plugins.launch.local import LocalLauncher
from trainyard.plugins.recovery.classify import classify
from trainyard.plugins.recovery.model import AttemptConf, FailureReport
from trainyard.plugins.run import exit_codes
from trainyard.plugins.run.model import RunHandle
from trainyard.plugins.storage.store import open_store

pytestmark = pytest.mark.slow


def report_of(run: WorkerRun, job: str, attempt: int, resume_from: str = "") -> FailureReport:
    """What the control plane concludes from the run folder train.py left behind."""
    handle = RunHandle(kind="local", job=job, attempt=attempt, world_size=run.world_size,
                       run_dir=str(run.run_dir), heartbeat_dir=str(run.run_dir / "heartbeats"))
    launcher = LocalLauncher(run.run_dir.parent)
    status = launcher.poll(handle)
    return classify(gather(handle, status, launcher=launcher, run=RUN, resume_from=resume_from))


def test_out_of_memory_exits_oom(object_store: str, tmp_path: Path) -> None:
    job = tiny_job("oom-run", max_steps=6, interval_steps=100)
    run = launch(job, fsdp_plan(), object_store=object_store, run_dir=tmp_path / "a0", faults="oom@3")
    assert run.exit_codes() == [exit_codes.OOM] * 2, run.logs()
    report = report_of(run, "oom-run", 0)
    assert report.outcome == "oom", report
    assert "CUDA out of memory (injected" in report.log_line and "torch.OutOfMemoryError" in report.log_line


def test_a_corrupt_resume_point_is_quarantined_and_the_run_falls_back(object_store: str, tmp_path: Path) -> None:
    job = tiny_job("corrupt-run", max_steps=4, interval_steps=2)
    first = launch(job, fsdp_plan(), object_store=object_store, run_dir=tmp_path / "a0")
    assert first.exit_codes() == [0, 0], first.logs()
    root = checkpoint_root(object_store, "corrupt-run", RUN)
    store = open_store(root)
    shard = next(o.key for o in store.list("step-00000004/") if o.key.endswith(".distcp"))
    data = bytearray(store.get_bytes(shard))
    data[len(data) // 2] ^= 0xFF
    store.put_bytes(shard, bytes(data))
    bad = f"{root}/step-00000004/MANIFEST.json"

    second = launch(job, fsdp_plan(), object_store=object_store, run_dir=tmp_path / "a1", attempt=1,
                    resume_from=bad)
    assert second.exit_codes() == [exit_codes.CHECKPOINT_CORRUPT] * 2, second.logs()
    report = report_of(second, "corrupt-run", 1, resume_from=bad)
    assert (report.outcome, report.corrupt_checkpoint) == ("checkpoint_corrupt", bad), report
    action = decide_from_catalog(report, job, AttemptConf(run=RUN, attempt=1), DecisionInputs(checkpoint_uri=root))
    assert (action.kind, action.quarantine) == ("fall_back", [bad])
    assert action.resume_from.endswith("step-00000002/MANIFEST.json")
    apply_quarantine(action)
    assert committed_steps(object_store, "corrupt-run") == [2] and "step-00000004" in scan(store).quarantined

    third = launch(job, fsdp_plan(), object_store=object_store, run_dir=tmp_path / "a2", attempt=2,
                   resume_from=action.resume_from)
    assert third.exit_codes() == [0, 0], third.logs()
    assert "resumed from step 2" in third.rank_log(0)
    # The resumed run saved step 4 anew: the marker condemned the old manifest, not the new one.
    assert committed_steps(object_store, "corrupt-run") == [2, 4] and scan(store).quarantined == {}
    assert verify(store, 4).ok
