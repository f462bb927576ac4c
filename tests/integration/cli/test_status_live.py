"""`trainyard status` while a run trains: the step comes from the ranks' heartbeats (a real
torchrun gang of the launcher's tiny job), not from what the control plane last recorded —
which here is nothing at all past the launch. Every line fits 80 columns, the MLflow run id
included. Then the same run through a node agent only (its heartbeat files unreadable from
here), and a gang whose ranks all finished before the control plane noticed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.launch.test_local_launcher import ENTRYPOINT
from tests.integration.node_agent.test_run_evidence import spec, submit
from tests.support.node_agents import node_agents
from tests.support.waiting import wait_for
from trainyard.cli.main import main
from trainyard.config.settings import Settings, get_settings
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.attempt.launchers import Runtime
from trainyard.plugins.attempt.watching import stop_gang
from trainyard.plugins.run.heartbeat import read_heartbeats, write_heartbeat
from trainyard.plugins.run.records import StopReason
from trainyard.plugins.state.jobs import open_job_state

pytestmark = [pytest.mark.slow, pytest.mark.waits]
JOB = "tiny-status"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    get_settings.cache_clear()
    open_job_state.cache_clear()
    yield tmp_path / "home"
    open_job_state.cache_clear()
    get_settings.cache_clear()


def shown_step(out: str) -> int:
    (row,) = [line.split() for line in out.splitlines() if line.strip().startswith("0 ")]
    return int(row[3])


def test_status_shows_the_live_step_of_a_training_run(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(home=home)
    store = open_job_state(settings.state_db)
    run = store.open_run(JOB, trigger_key="manual__live", team="demo", project="tiny-lm").run
    store.set_mlflow_run(JOB, run, "0123456789abcdef0123456789abcdef")
    for state in ("scheduling", "starting"):
        store.transition(JOB, run, state)
    store.start_attempt(JOB, run, 0)
    _, handle = submit(settings, spec(JOB, entrypoint=ENTRYPOINT, args=["--steps", "500", "--sleep", "3"],
                                             hang_timeout="5m"), Plan(layout=RankLayout(dp=2)), run)
    try:
        store.set_handle(JOB, run, 0, handle)
        store.transition(JOB, run, "running")

        def steps() -> list[int]:
            beats = read_heartbeats(handle.heartbeat_dir, range(2))
            return sorted(b.step for b in beats.values()) if len(beats) == 2 else []

        wait_for(lambda: bool(steps()) and steps()[0] >= 2, "the live status to show step 2", 180, poll_s=0.2)
        before = steps()[0]
        assert main(["status", JOB]) == 0
        out = capsys.readouterr().out
        after = steps()[-1]
        assert before <= shown_step(out) <= after, out
        assert "attempt 0 live: step" in out and "(slowest of 2 ranks)" in out, out
        assert "MLflow run 0123456789abcdef0123456789abcdef" in out
        assert all(len(line) <= 80 for line in out.splitlines()), out

        # A node where the files are not at hand (another machine): the agents' report of the ranks.
        with node_agents(["local-0", "local-1"], settings.runs_dir, tmp_path / "agents") as urls:
            moved = tmp_path / "elsewhere"
            monkeypatch.setenv("TRAINYARD_NODE_AGENTS", json.dumps(urls))
            get_settings.cache_clear()
            store.set_handle(JOB, run, 0, handle.model_copy(update={"heartbeat_dir": str(moved)}))
            before = steps()[0]
            assert main(["status", JOB]) == 0
            out = capsys.readouterr().out
            assert before <= shown_step(out) <= steps()[-1] and "(node agents)" in out, out
    finally:
        stop_gang(handle, StopReason(reason="requested", detail="test over"), Runtime(settings), grace_s=5)

    # Every rank finished, the control plane has not recorded it: status says so.
    done = Path(handle.heartbeat_dir)
    for beat in read_heartbeats(done, range(2)).values():
        write_heartbeat(done, beat.model_copy(update={"phase": "done"}))
    store.set_handle(JOB, run, 0, handle)
    assert main(["status", JOB]) == 0
    out = capsys.readouterr().out
    said = " ".join(out.split())  # the line wraps at 80 columns
    assert "the workers finished at step" in said and "not recorded by the control plane yet" in said, out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    shutil.rmtree(done)
