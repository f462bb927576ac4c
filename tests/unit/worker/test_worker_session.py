"""The session's configuration (launcher contract or standalone defaults), exit codes, fault
injection parsing and the MFU terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT
from trainyard.config.loader import load_spec_file
from trainyard.config.worker_env import WorkerEnv
from trainyard.plugins.advisor.flops import flops_per_token, mfu, peak_flops_per_device
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.run import exit_codes
from trainyard.plugins.run.exit_codes import describe
from trainyard.worker.faults import Faults
from trainyard.worker.session import SessionConfig

SPEC = load_spec_file(REPO_ROOT / "config/jobs/demo-tiny-lm.yaml")


def test_contract_environment_is_used_as_given(tmp_path: Path) -> None:
    plan = Plan(layout=RankLayout(dp=2), zero_stage=3, micro_batch_size=8, global_batch_size=16)
    env = WorkerEnv(job="demo-tiny-lm", run="r-test", attempt=3, plan=plan.model_dump_json(),
                    spec=SPEC.model_dump_json(by_alias=True), resume_from="file:///x/step-00000050/MANIFEST.json",
                    object_store="file:///store", checkpoint_uri="file:///store/jobs/demo-tiny-lm/checkpoints",
                    heartbeat_dir=str(tmp_path / "hb"), hang_timeout_s=120, run_dir=str(tmp_path),
                    mlflow_tracking_uri="sqlite:///m.db", mlflow_run_id="abc").to_env()
    config = SessionConfig.from_env({**env, "TRAINYARD_FAULTS": "nan_loss@3"})
    assert (config.job, config.attempt, config.plan, config.resume_from) == (
        "demo-tiny-lm", 3, plan, "file:///x/step-00000050/MANIFEST.json")
    assert (config.heartbeat_dir, config.run_dir, config.hang_timeout_s) == (tmp_path / "hb", tmp_path, 120)
    assert (config.mlflow_tracking_uri, config.mlflow_run_id) == ("sqlite:///m.db", "abc")
    assert (config.checkpoint_interval_steps, config.checkpoint_interval_s) == (50, 600)
    assert config.spec == SPEC and config.faults.due("nan_loss", 3)


def test_standalone_fills_defaults_from_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    config = SessionConfig.from_env({}, spec=SPEC, world_size=2)
    assert config.plan.layout.dp == 2 and config.plan.zero_stage == 0 and config.plan.micro_batch_size == 8
    assert config.object_store == (tmp_path / "objects").as_uri()
    assert config.checkpoint_uri == f"{config.object_store}/jobs/demo-tiny-lm/runs/standalone/checkpoints"
    assert config.heartbeat_dir == tmp_path / "runs" / "demo-tiny-lm" / "standalone" / "heartbeats"
    assert config.mlflow_run_id == "" and config.hang_timeout_s == 120
    with pytest.raises(ValueError, match="--spec"):
        SessionConfig.from_env({})


def test_exit_codes_are_distinct_and_named_for_the_launcher() -> None:
    codes = [exit_codes.COMPLETED, exit_codes.DIVERGED, exit_codes.PREEMPTED, exit_codes.PREEMPTED_NO_CHECKPOINT,
             exit_codes.CHECKPOINT_CORRUPT, exit_codes.OOM]
    assert len(set(codes)) == 6 and all(0 <= c < 128 for c in codes) and 1 not in codes
    assert (describe(42), describe(43), describe(0)) == ("diverged", "preempted", "completed")
    assert (describe(45), describe(46)) == ("checkpoint_corrupt", "oom")


def test_faults_parse_and_refuse_typos() -> None:
    faults = Faults.from_env({"TRAINYARD_FAULTS": "nan_loss@3, sigterm@7,nan_loss@9"})
    assert faults.due("nan_loss", 9) and faults.due("sigterm", 7) and not faults.due("nan_loss", 4)
    assert faults.loss(3, 1.5) != faults.loss(3, 1.5)  # NaN
    assert faults.loss(4, 1.5) == 1.5
    assert Faults.from_env({}).at == {}
    ranked = Faults.from_env({"TRAINYARD_FAULTS": "sigkill@120:1,hang@7:0"})
    assert ranked.ranks == {"sigkill": 1, "hang": 0} and ranked.due("sigkill", 120)
    for bad in ("sigkill@3", "nan_loss@3:1", "hang@3:x"):
        with pytest.raises(ValueError, match="kind@step"):
            Faults.from_env({"TRAINYARD_FAULTS": bad})
    with pytest.raises(ValueError, match="kind@step"):
        Faults.from_env({"TRAINYARD_FAULTS": "nan@3"})


def test_mfu_terms() -> None:
    hints = SPEC.spec.parallelism.hints
    assert flops_per_token(hints) == 6 * 770_048 + 12 * 4 * 128 * 128
    assert peak_flops_per_device("H100") == 989e12
    assert peak_flops_per_device("H100", "fp32") == 494.5e12
    assert mfu(100_000, 1.2e12, 256, 989e12) == pytest.approx(0.474, abs=1e-3)  # seed §7
    with pytest.raises(ValueError, match="num_devices"):
        mfu(1.0, 1.0, 0, 1.0)


def test_faults_fire_in_torchruns_first_incarnation_only() -> None:
    raw = {"TRAINYARD_FAULTS": "sigkill@5:1,nan_loss@3"}
    assert Faults.from_env(raw).due("nan_loss", 3)
    assert Faults.from_env({**raw, "TORCHELASTIC_RESTART_COUNT": "0"}).due("nan_loss", 3)
    restarted = Faults.from_env({**raw, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert restarted.at == {} and restarted.ranks == {}
