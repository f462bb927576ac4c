"""`trainyard jobs | status | stop | nodes` against a real SQLite state DB; `stop` stops a real
detached process through the handle stored in the job state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from trainyard.cli.main import main
from trainyard.config.settings import get_settings
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.placement.model import PlacedNode, Placement
from trainyard.plugins.recovery.model import FailureReport, RecoveryAction
from trainyard.plugins.run import processes
from trainyard.plugins.run.model import AgentRecord, RunHandle
from trainyard.plugins.state.jobs import JobStateStore, open_job_state
from trainyard.plugins.state.reservations import open_state

T0 = datetime.now(UTC) - timedelta(minutes=5)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobStateStore]:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    get_settings.cache_clear()
    open_job_state.cache_clear()
    yield open_job_state(get_settings().state_db)
    open_job_state(get_settings().state_db).close()
    open_job_state.cache_clear()
    get_settings.cache_clear()


def recovered_run(store: JobStateStore) -> str:
    run = store.open_run("demo-tiny-lm", trigger_key="manual__1", team="demo", project="tiny-lm", now=T0).run
    for state in ("scheduling", "starting", "running"):
        store.transition("demo-tiny-lm", run, state)
    store.start_attempt("demo-tiny-lm", run, 0, now=T0)
    crash = FailureReport(job="demo-tiny-lm", run=run, attempt=0, outcome="worker_crash",
                          reason="rank 1 on local-1 was killed by SIGKILL at step 120", step=120,
                          ended_at=T0 + timedelta(seconds=95), evidence=["launcher: failed"])
    store.finish_attempt(crash, RecoveryAction(kind="restart", reason="worker_crash: restart the same gang "
                                                                      "from step 100 " + "(padding) " * 8))
    store.transition("demo-tiny-lm", run, "starting")
    store.start_attempt("demo-tiny-lm", run, 1, now=T0 + timedelta(seconds=100))
    store.transition("demo-tiny-lm", run, "running")
    return run


def test_jobs_lists_runs_newest_first(store: JobStateStore, capsys: pytest.CaptureFixture[str]) -> None:
    first = recovered_run(store)
    second = store.open_run("other-job", trigger_key="t").run
    assert main(["jobs"]) == 0
    out = capsys.readouterr().out
    assert out.index(second) < out.index(first)
    row = next(line for line in out.splitlines() if first in line)
    assert "running" in row and "worker_crash" in row and " 2 " in row
    assert all(len(line) <= 80 for line in out.splitlines())
    assert main(["jobs", "--json", "--job", "demo-tiny-lm"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["attempts"], r["last_cause"]) for r in runs] == [(first, 2, "worker_crash")]


def test_a_long_job_name_wraps_in_its_cell_and_is_never_cut(store: JobStateStore,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    name = "a-team-s-very-long-job-name-of-the-longest-kind-x52"
    store.open_run(name, trigger_key="t")
    assert main(["jobs"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "…" not in out
    assert "".join(line.split()[0] for line in out.splitlines()[1:] if line.strip()).startswith(name), out


def test_status_shows_every_attempt_in_80_columns(store: JobStateStore, capsys: pytest.CaptureFixture[str]) -> None:
    run = recovered_run(store)
    assert main(["status", "demo-tiny-lm"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert f"demo-tiny-lm run {run}  running" in out
    assert "attempt 0 rank 1 on local-1 was killed by SIGKILL at step 120" in out
    assert "→ restart: worker_crash: restart the same gang from step 100" in out
    assert "\n  (padding)" in out  # the long action reason wraps, indented
    table = [line.split() for line in out.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert table[0][:4] == ["0", "worker_crash", "restart", "120"] and table[0][5] == "95s"
    assert table[1][:2] == ["1", "running"]
    assert main(["status", "demo-tiny-lm", "--evidence"]) == 0
    assert "    · launcher: failed" in capsys.readouterr().out
    assert main(["status", "demo-tiny-lm", "--run", run, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["attempts"][0]["evidence"] == ["launcher: failed"]
    assert main(["status", "no-such-job"]) == 1
    assert "has no run" in capsys.readouterr().err


def test_status_says_the_runs_one_outcome_line(store: JobStateStore, capsys: pytest.CaptureFixture[str]) -> None:
    run = store.open_run("reg-fails", trigger_key="t").run
    store.transition("reg-fails", run, "failed", reason="registration failed: LookupError: no checkpoint")
    assert main(["status", "reg-fails"]) == 0
    assert "outcome: failed — registration failed: LookupError: no checkpoint" in capsys.readouterr().out
    assert main(["status", "reg-fails", "--json"]) == 0
    outcome = json.loads(capsys.readouterr().out)["outcome"]
    assert (outcome["kind"], outcome["reason"]) == ("failed", "registration failed: LookupError: no checkpoint")


def test_stop_stops_the_live_gang_and_cancels_the_run(store: JobStateStore, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = recovered_run(store)
    run_dir = tmp_path / "runs" / "demo-tiny-lm" / run / "1"
    run_dir.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                            env={**os.environ, "TRAINYARD_RUN_DIR": str(run_dir)})
    try:
        handle = RunHandle(kind="local", job="demo-tiny-lm", attempt=1, world_size=1, run_dir=str(run_dir),
                           agents=[AgentRecord(node="local-0", node_rank=0, pid=proc.pid, pgid=proc.pid,
                                               start_ticks=processes.start_ticks(proc.pid), nproc=1)])
        store.set_handle("demo-tiny-lm", run, 1, handle)
        devices = open_state(store.url)
        node = PlacedNode(name="local-0", rack="r", address="127.0.0.1", gpu_type="cpu", node_gpus=2, node_rank=0,
                          first_rank=0, slots=1)
        devices.reserve(Placement(job="demo-tiny-lm", run=run, attempt=1, team="demo", gpu_type="cpu", layout=RankLayout(tp=1, pp=1, dp=1, ranks_per_node=1), nodes=[node]))
        assert devices.used_by_node() == {"local-0": 1}
        assert main(["stop", "demo-tiny-lm", "--grace-s", "5"]) == 0
        assert devices.used_by_node() == {}  # the reservation went with the gang
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = capsys.readouterr().out
    assert f"run {run} of demo-tiny-lm cancelled (attempt 1: stopped)" in out
    assert (run_dir / "stopped.json").exists()
    assert json.loads((run_dir / "stop-reason.json").read_text())["reason"] == "requested"
    info = store.get_run("demo-tiny-lm", run)
    assert (info.state, info.final_reason) == ("cancelled", "stopped on request (trainyard stop)")
    assert store.attempts("demo-tiny-lm", run)[1].outcome == "cancelled"
    assert main(["stop", "demo-tiny-lm"]) == 0
    assert "already cancelled" in capsys.readouterr().out


def test_status_says_which_signal_watches_a_live_attempt_for_a_hang(store: JobStateStore, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from trainyard.plugins.run.heartbeat import Heartbeat, write_heartbeat

    run = recovered_run(store)
    beats = tmp_path / "beats"
    store.set_handle("demo-tiny-lm", run, 1, RunHandle(kind="local", job="demo-tiny-lm", run=run, attempt=1,
                                                       world_size=2, heartbeat_dir=str(beats)))
    for rank in (0, 1):  # a plain script: its wrappers write activity beats (step 0 means nothing)
        write_heartbeat(beats, Heartbeat(job="demo-tiny-lm", run=run, attempt=1, rank=rank, pid=1, step=0,
                                         time=time.time(), signal="activity"))
    assert main(["status", "demo-tiny-lm"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a plain script: hang watch on its ranks' CPU time and I/O, last active" in out, out
    for rank in (0, 1):  # the script writes its own beats (managed): the steps watch it
        write_heartbeat(beats, Heartbeat(job="demo-tiny-lm", run=run, attempt=1, rank=rank, pid=1, step=130 + rank,
                                         time=time.time()))
    assert main(["status", "demo-tiny-lm"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "step 130 (slowest of 2 ranks)" in out and "hang watch on its steps" in out, out


def test_nodes_cordon_list_uncordon(store: JobStateStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nodes", "cordon", "local-1", "--reason", "gpu_failed: Xid 79"]) == 0
    assert main(["nodes", "list"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("local-1"))
    assert "cordoned" in row and "gpu_failed: Xid 79" in row
    assert "ready" in next(line for line in out.splitlines() if line.startswith("local-0"))
    assert main(["nodes", "list", "--json"]) == 0
    nodes = {n["node"]: n for n in json.loads(capsys.readouterr().out)}
    assert nodes["local-1"]["cordoned"] and not nodes["local-0"]["cordoned"]
    assert list(store.cordoned()) == ["local-1"]
    assert main(["nodes", "uncordon", "local-1"]) == 0
    assert main(["nodes", "uncordon", "local-1"]) == 1
    assert store.cordoned() == {}


def test_a_stopped_embedded_database_is_one_line_naming_its_socket_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """After `make down` the home's embedded PostgreSQL is gone: `trainyard jobs` and `models`
    say so and how to start it, instead of the driver's traceback."""
    from trainyard.config.databases import postgres_root, socket_dir

    home = tmp_path / "home"
    (postgres_root(home) / "data").mkdir(parents=True)
    (postgres_root(home) / "data" / "PG_VERSION").write_text("16\n")  # a cluster, not running
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    for name in ("TRAINYARD_STATE_DB", "TRAINYARD_MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    open_job_state.cache_clear()
    try:
        for argv, setting in ((["jobs"], "TRAINYARD_STATE_DB"),
                              (["models", "--dataset", "d"], "TRAINYARD_MLFLOW_TRACKING_URI")):
            assert main(argv) == 1
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0, err
            assert f"nothing listens at {socket_dir(home) / '.s.PGSQL.5432'}" in err
            assert "`make up`" in err and setting in err
    finally:
        get_settings.cache_clear()
        open_job_state.cache_clear()
