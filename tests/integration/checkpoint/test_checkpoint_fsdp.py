"""Real torchrun jobs (FSDP2 on gloo) saving, restoring, resharding and surviving corruption
and a SIGKILL mid-save. The job script is `fsdp_job.py` beside this file."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import check, run_torchrun
from tests.support.s3_server import S3Server
from trainyard.plugins.checkpoint.catalog import latest_valid, list_checkpoints, scan
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME
from trainyard.plugins.storage.store import LocalStore

pytestmark = pytest.mark.slow

JOB_SCRIPT = Path(__file__).with_name("fsdp_job.py")
JOB = "fsdp-demo"
TIMEOUT = 240


@dataclass(frozen=True)
class TrainedJob:
    root: str
    ref_dir: Path
    staging: Path
    endpoint_url: str | None = None

    def args(self, mode: str, *extra: str, steps: int = 4) -> list[str]:
        args = [mode, "--root", self.root, "--job", JOB, "--steps", str(steps), "--ref-dir",
                str(self.ref_dir), "--staging", str(self.staging), *extra]
        if self.endpoint_url:
            args += ["--endpoint-url", self.endpoint_url]
        return args

    def run(self, mode: str, *extra: str, nproc: int = 2, steps: int = 4
            ) -> subprocess.CompletedProcess[str]:
        return run_torchrun(JOB_SCRIPT, self.args(mode, *extra, steps=steps), nproc=nproc,
                            timeout=TIMEOUT, fork_ranks=_run_dir(self.staging.parent))


def _run_dir(parent: Path) -> Path:
    """A fresh folder for one launch's rank records (`run_torchrun`'s `fork_ranks`)."""
    return Path(tempfile.mkdtemp(prefix="launch-", dir=parent))


def _train(tmp: Path, root: str, *extra: str, endpoint_url: str | None = None) -> TrainedJob:
    job = TrainedJob(root, tmp / "ref", tmp / "staging", endpoint_url)
    out = check(job.run("train", "--save-every", "2", *extra))
    assert "TRAINED steps=4 last_commit=4" in out.stdout
    return job


@pytest.fixture(scope="module")
def local_job(tmp_path_factory: pytest.TempPathFactory) -> TrainedJob:
    """One 2-rank FSDP2 run, 4 steps, checkpoints at steps 2 and 4 in a local store."""
    tmp = tmp_path_factory.mktemp("fsdp")
    return _train(tmp, (tmp / "objects" / "jobs" / JOB / "checkpoints").as_uri())


def test_two_ranks_commit_manifests_with_every_rank_file(local_job: TrainedJob) -> None:
    records = list_checkpoints(local_job.root)
    assert [r.step for r in records] == [2, 4]
    manifest = records[-1].manifest
    assert (manifest.job, manifest.world_size, manifest.plan) == (JOB, 2, {"dp": 2})
    assert manifest.metrics == {"loss": 0.25}
    paths = {f.path: f.rank for f in manifest.files}
    assert paths == {".metadata": 0, "__0_0.distcp": 0, "__1_0.distcp": 1,
                     "extra/rank-00000.json": 0, "extra/rank-00001.json": 1}
    assert latest_valid(local_job.root).step == 4
    assert not any(local_job.staging.rglob("*.distcp")), "staging copies must be cleaned up"


def test_restore_is_bit_identical_and_training_continues_identically(local_job: TrainedJob) -> None:
    """Restore step 2 on 2 ranks: parameters, AdamW state, scheduler and sampler equal the
    saved ones bit for bit; training on to step 4 ends exactly where the original run did."""
    manifest = local_job.root + "/step-00000002/" + MANIFEST_NAME
    out = check(local_job.run("resume", "--manifest", manifest, "--continue"))
    assert "RESTORED step=2 world=2 saved_by=2" in out.stdout
    assert "MATCH_RESTORE step=2" in out.stdout
    assert "MATCH_CONTINUE step=4" in out.stdout


def test_two_rank_checkpoint_restores_on_one_rank(local_job: TrainedJob) -> None:
    out = check(local_job.run("resume", nproc=1))
    assert "RESTORED step=4 world=1 saved_by=2" in out.stdout
    assert "MATCH_RESTORE step=4" in out.stdout


def test_flipped_byte_falls_back_to_previous_checkpoint(local_job: TrainedJob, tmp_path: Path
                                                        ) -> None:
    """One flipped byte in rank 1's shard of step 4: every rank rejects step 4, says why,
    restores step 2 — and continuing from there still reproduces step 4 exactly."""
    import shutil

    root = tmp_path / "objects" / "jobs" / JOB / "checkpoints"
    shutil.copytree(LocalStore(local_job.root.removeprefix("file://")).root, root)  # keep the
    # module's checkpoints intact for the other tests
    shard = root / "step-00000004" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    job = TrainedJob(root.as_uri(), local_job.ref_dir, tmp_path / "staging")

    out = check(job.run("resume", "--continue"))
    assert "RESTORED step=2 world=2 saved_by=2" in out.stdout
    assert "MATCH_CONTINUE step=4" in out.stdout
    assert "step-00000004/MANIFEST.json rejected" in out.stderr
    assert "__1_0.distcp: BLAKE3" in out.stderr and "(corrupt)" in out.stderr
    assert latest_valid(root.as_uri()).step == 2


def test_sigkill_during_save_leaves_no_manifest(tmp_path: Path) -> None:
    """Rank 1 is SIGKILLed in the middle of the step-4 save, after rank 0 uploaded its shard:
    the folder holds files but no manifest, so the catalog never lists it."""
    root = (tmp_path / "objects" / "jobs" / JOB / "checkpoints").as_uri()
    job = TrainedJob(root, tmp_path / "ref", tmp_path / "staging")
    out = job.run("train", "--save-every", "2", "--kill-rank", "1", "--kill-at-step", "4")
    assert out.returncode != 0, out.stdout
    assert "KILLING rank 1 during the save of step 4" in out.stdout
    found = scan(root)
    assert [r.step for r in found.committed] == [2]
    assert "step-00000004" in found.uncommitted  # rank 0's shard made it, the commit did not
    assert any(o.key.endswith("__0_0.distcp") for o in found.uncommitted["step-00000004"])
    assert [r.step for r in list_checkpoints(root)] == [2]
    assert latest_valid(root).step == 2


def test_s3_zstd_checkpoint_restores_on_four_ranks(s3_server: S3Server, tmp_path: Path) -> None:
    """The same job against a real S3 endpoint with zstd-compressed files, restored onto 4."""
    bucket = s3_server.new_bucket()
    root = f"s3://{bucket}/team/jobs/{JOB}/checkpoints"
    job = _train(tmp_path, root, "--compression", "zstd", endpoint_url=s3_server.endpoint_url)
    record = latest_valid(root, endpoint_url=s3_server.endpoint_url)
    assert record is not None and record.step == 4
    assert {f.compression for f in record.manifest.files} == {"zstd"}
    out = check(job.run("resume", nproc=4))
    assert "RESTORED step=4 world=4 saved_by=2" in out.stdout
    assert "MATCH_RESTORE step=4" in out.stdout


def test_ranks_with_different_parameters_keep_their_own_optimizer_state(tmp_path: Path) -> None:
    """Pipeline stages: each rank's parameters, AdamW state and param_groups (its own lr and
    betas) come back to that rank — nothing collides under a shared DCP key."""
    root = (tmp_path / "objects" / "jobs" / JOB / "checkpoints").as_uri()
    out = check(run_torchrun(Path(__file__).with_name("stages_job.py"),
                             [root, JOB, str(tmp_path / "staging")], timeout=TIMEOUT,
                             fork_ranks=_run_dir(tmp_path)))
    assert "STAGE_MATCH rank=0 lr=0.01" in out.stdout
    assert "STAGE_MATCH rank=1 lr=0.02" in out.stdout
