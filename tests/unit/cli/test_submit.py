"""`trainyard submit`: what it sends, where it puts the spec, and what it says when Airflow is
not there (the end-to-end tests drive the same REST client against a real Airflow)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainyard.cli.main import main
from trainyard.cli.submit import _into_jobs_folder, parse_params

DEMO = Path(__file__).resolve().parents[3] / "config" / "jobs" / "demo-tiny-lm.yaml"


def test_params_are_json_when_they_parse_and_text_otherwise() -> None:
    assert parse_params(["max_steps=100", "learning_rate=3e-4", "dry_run=true", "start_from=models:/m@prod",
                         "fault_kill_rank=1"]) == {
        "max_steps": 100, "learning_rate": 3e-4, "dry_run": True, "start_from": "models:/m@prod",
        "fault_kill_rank": 1}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_params(["max_steps"])


def test_the_spec_goes_where_the_dag_factory_reads_it_once_and_an_edit_updates_it(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    mine = tmp_path / "mine.yaml"
    shutil.copy(DEMO, mine)
    placed, changed = _into_jobs_folder(mine, "demo-tiny-lm", jobs)
    assert changed and placed == jobs / "demo-tiny-lm.yaml" and placed.read_bytes() == mine.read_bytes()
    assert _into_jobs_folder(mine, "demo-tiny-lm", jobs) == (placed, False)  # the same spec again: nothing new
    mine.write_text(mine.read_text().replace("maxSteps: 200", "maxSteps: 300"))
    assert _into_jobs_folder(mine, "demo-tiny-lm", jobs) == (placed, True)  # the edit updates the job's copy
    assert placed.read_bytes() == mine.read_bytes() and [p.name for p in jobs.iterdir()] == ["demo-tiny-lm.yaml"]


def test_airflow_down_is_exit_3_with_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.procs import free_port
    from trainyard.config.settings import get_settings

    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINYARD_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("TRAINYARD_AIRFLOW_URL", f"http://127.0.0.1:{free_port()}")
    get_settings.cache_clear()
    try:
        assert main(["submit", str(DEMO)]) == 3
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert "Airflow does not answer at http://127.0.0.1:" in err and "make airflow" in err
    assert (tmp_path / "jobs" / "demo-tiny-lm.yaml").exists()


def test_an_invalid_spec_is_refused_before_airflow_is_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEMO.read_text().replace("gpuCount: 2", "gpuCuont: 2"))
    assert main(["submit", str(bad)]) == 1
    assert "gpuCuont" in capsys.readouterr().err
