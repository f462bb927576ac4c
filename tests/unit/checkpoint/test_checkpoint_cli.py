"""`trainyard checkpoints list|verify|prune|export` against a real local store."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.s3_server import S3Server
from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.cli import checkpoints as cli_checkpoints
from trainyard.config.settings import get_settings
from trainyard.plugins.checkpoint.catalog import list_checkpoints
from trainyard.plugins.checkpoint.manifest import step_dir
from trainyard.plugins.storage.store import LocalStore, open_store

JOB = "demo"
OLDER_RUN, RUN = "20261129t100000-aaaaaa", "20261130t100000-bbbbbb"
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def run_cli(*argv: str) -> int:
    """The subcommand exactly as `trainyard` registers it (only this module is loaded, so the
    test does not depend on other teams' subcommands)."""
    parser = argparse.ArgumentParser(prog="trainyard")
    cli_checkpoints.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.func(args) or 0)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStore]:
    """Settings rooted in tmp_path (empty jobs folder); the checkpoint root of the job's latest
    run (an older run beside it holds one checkpoint the commands must not see)."""
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRAINYARD_OBJECT_STORE", raising=False)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    monkeypatch.setenv("TRAINYARD_JOBS_DIR", str(jobs))
    get_settings.cache_clear()
    runs = tmp_path / "home" / "objects" / "jobs" / JOB / "runs"
    make_checkpoint(LocalStore(runs / OLDER_RUN / "checkpoints"), 900)
    yield LocalStore(runs / RUN / "checkpoints")
    get_settings.cache_clear()


def _fill(store: LocalStore) -> None:
    old = datetime.now(UTC) - timedelta(days=2)
    for step, loss in [(100, 3.0), (200, 1.0), (300, 2.0), (400, 2.5)]:
        make_checkpoint(store, step, metrics={"eval_loss": loss}, created_at=old)
    make_checkpoint(store, 500, commit=False)


def test_list_json(store: LocalStore, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(store)
    assert run_cli("checkpoints", "list", JOB, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["root"] == store.uri
    assert [c["step"] for c in out["checkpoints"]] == [100, 200, 300, 400]
    assert out["checkpoints"][1]["metrics"] == {"eval_loss": 1.0}
    assert list(out["uncommitted"]) == ["step-00000500"]


def test_list_human_mentions_uncommitted_folders(store: LocalStore,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _fill(store)
    assert run_cli("checkpoints", "list", JOB) == 0
    out = capsys.readouterr().out
    assert "eval_loss=2.5" in out and "step-00000500: no manifest" in out


def test_verify_exit_code_follows_integrity(store: LocalStore,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _fill(store)
    assert run_cli("checkpoints", "verify", JOB) == 0
    path = store.path_of(f"{step_dir(300)}/__0_0.distcp")
    path.write_bytes(b"X" + path.read_bytes()[1:])
    capsys.readouterr()
    assert run_cli("checkpoints", "verify", JOB, "--json") == 1
    reports = {r["step"]: r for r in json.loads(capsys.readouterr().out)}
    assert not reports[300]["ok"] and "corrupt" in reports[300]["problems"][0]
    assert reports[400]["ok"]
    assert run_cli("checkpoints", "verify", JOB, "--step", "100") == 0
    assert run_cli("checkpoints", "verify", JOB, "--step", "300", "--no-hashes") == 0
    assert run_cli("checkpoints", "verify", JOB, "--step", "999") == 1


def test_prune_dry_run_says_what_and_why_then_prune(store: LocalStore,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _fill(store)
    argv = ["checkpoints", "prune", JOB, "--keep-last", "1", "--best-metric", "eval_loss",
            "--keep-best", "1", "--protect", "100"]
    assert run_cli(*argv, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "would delete step 300: no rule keeps it: not among the last 1" in out
    assert "step 200: among the best 1 by eval_loss (1)" in out
    assert "step 100: protected on the command line" in out
    assert [r.step for r in list_checkpoints(store)] == [100, 200, 300, 400]

    assert run_cli(*argv, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deleted"] == [300]
    assert [r.step for r in list_checkpoints(store)] == [100, 200, 400]


def test_prune_takes_the_policy_from_the_job_spec(store: LocalStore, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _fill(store)
    spec = tmp_path / "jobs" / "demo.yaml"
    spec.write_text(Path(__file__).parents[3].joinpath("config/jobs/demo-tiny-lm.yaml").read_text()
                    .replace("name: demo-tiny-lm", f"name: {JOB}"))
    from trainyard.config.loader import load_spec_file

    job = load_spec_file(spec)
    assert run_cli("checkpoints", "prune", JOB, "--dry-run", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"]["keep_last"] == job.spec.checkpoint.max_keep == 3
    assert report["policy"]["best_metric"] == job.spec.checkpoint.keep_best_metric == "loss"


def test_export_writes_safetensors(store: LocalStore, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    from safetensors.torch import load_file

    from trainyard.plugins.checkpoint.manager import CheckpointManager

    model = torch.nn.Linear(4, 3)
    with CheckpointManager(checkpoint_uri=store.uri, job=JOB, rank=0, world_size=1,
                           staging_dir=tmp_path / "stage") as mgr:
        mgr.save_sync(7, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    out = tmp_path / "export" / "model.safetensors"
    assert run_cli("checkpoints", "export", JOB, "--out", str(out), "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 7 and info["tensors"] == 2
    loaded = load_file(str(out))
    assert torch.equal(loaded["weight"], model.weight.detach())
    assert run_cli("checkpoints", "export", JOB, "--step", "8", "--out", str(out)) == 1


def test_uri_outside_the_job_is_a_usage_error(store: LocalStore) -> None:
    assert run_cli("checkpoints", "list", JOB, "--uri", "file:///tmp/jobs/other/checkpoints") == 2


def test_list_and_verify_against_s3(store: LocalStore, s3_server: S3Server,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The endpoint comes from TRAINYARD_S3_ENDPOINT_URL, as in the docker-compose stack."""
    bucket = s3_server.new_bucket()
    root = f"s3://{bucket}/trainyard/jobs/{JOB}/checkpoints"
    make_checkpoint(open_store(root, endpoint_url=s3_server.endpoint_url), 9)
    monkeypatch.setenv("TRAINYARD_S3_ENDPOINT_URL", s3_server.endpoint_url)
    get_settings.cache_clear()
    assert run_cli("checkpoints", "list", JOB, "--uri", root, "--json") == 0
    assert [c["step"] for c in json.loads(capsys.readouterr().out)["checkpoints"]] == [9]
    assert run_cli("checkpoints", "verify", JOB, "--uri", root) == 0
