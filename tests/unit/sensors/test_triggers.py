"""The deferrable sensors' triggers: `serialize()` mirrors `__init__` exactly (the triggerer
re-creates them from it after a restart), and `run()` fires the right event on run folders the
real `LocalLauncher.poll` reads back (fabricated: no process runs, so nothing can be stopped by
mistake). The hang path, which stops real processes, is tested with torchrun in
tests/integration/sensors/."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from pathlib import Path

import pytest

from tests.unit.checkpoint.fabricate import make_checkpoint
from tests.unit.recovery.runs import Rank, fabricate
from trainyard.sensors.triggers import CheckpointTrigger, HealthTrigger, TrainingTrigger

NO_LEASE = {"renew_lease": False}
"""The fabricated runs reserved nothing."""


def _first_event(trigger) -> dict:
    async def first() -> dict:
        return (await trigger.run().asend(None)).payload

    return asyncio.run(asyncio.wait_for(first(), timeout=60))


@pytest.mark.parametrize("trigger", [
    TrainingTrigger({"kind": "local"}, watch={"deadline": 1.8e9, "renew_lease": True, "last_renew": 0.0,
                                              "deadline_reason": "the attempt outlived training.maxRuntime"},
                    poll_interval_s=0.5),
    CheckpointTrigger({"kind": "local"}, checkpoint_root="file:///c", after_step=50, interval_steps=10,
                      endpoint_url="http://s3", poll_interval_s=1.0),
    HealthTrigger({"kind": "local"}, agents={"n0": "http://a:9420"}, poll_interval_s=2.0, max_misses=4),
])
def test_serialize_mirrors_init(trigger) -> None:
    path, kwargs = trigger.serialize()
    module, name = path.rsplit(".", 1)
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (path, kwargs)
    assert set(kwargs) == set(inspect.signature(type(trigger).__init__).parameters) - {"self"}


def test_training_trigger_fires_finished_with_the_settled_status(tmp_path: Path) -> None:
    handle = fabricate(tmp_path, [Rank(exit_code=0, step=20), Rank(exit_code=0, step=20)])
    event = _first_event(TrainingTrigger(handle.model_dump(mode="json"), watch=NO_LEASE, poll_interval_s=0.1))
    assert event["status"] == "finished"
    assert event["run_status"]["state"] == "succeeded" and event["run_status"]["step"] == 20


def test_training_trigger_reports_a_failed_run_as_finished_too(tmp_path: Path) -> None:
    handle = fabricate(tmp_path, [Rank(exit_code=0, step=7), Rank(exit_code=-9, step=7)])
    event = _first_event(TrainingTrigger(handle.model_dump(mode="json"), watch=NO_LEASE, poll_interval_s=0.1))
    assert event["status"] == "finished"  # what the failure means is classify_outcome's to say
    assert event["run_status"]["state"] == "failed" and event["run_status"]["failed_rank"] == 1


def test_checkpoint_trigger_fires_per_new_checkpoint_then_finished(tmp_path: Path) -> None:
    from trainyard.plugins.storage.store import open_store

    handle = fabricate(tmp_path / "runs", [Rank(exit_code=0, step=30), Rank(exit_code=0, step=30)])
    root = (tmp_path / "objects" / "checkpoints").as_uri()
    for step in (10, 20):
        make_checkpoint(open_store(root), step)
    kwargs = {"checkpoint_root": root, "interval_steps": 10, "poll_interval_s": 0.1}
    event = _first_event(CheckpointTrigger(handle.model_dump(mode="json"), after_step=10, **kwargs))
    assert (event["status"], event["step"], event["after_step"]) == ("checkpoint", 20, 10)
    assert event["manifest_uri"].endswith("step-00000020/MANIFEST.json")
    event = _first_event(CheckpointTrigger(handle.model_dump(mode="json"), after_step=20, **kwargs))
    assert (event["status"], event["after_step"]) == ("finished", 20)


def test_health_trigger_ends_with_the_run(tmp_path: Path) -> None:
    handle = fabricate(tmp_path, [Rank(exit_code=0), Rank(exit_code=0)])
    event = _first_event(HealthTrigger(handle.model_dump(mode="json"), agents={}, poll_interval_s=0.1))
    assert event["status"] == "finished"


def test_a_trigger_that_raises_fires_an_error_event_and_its_task_fails_with_the_class(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """The cncf-kubernetes provider's habit: the trigger's own failure is an event, not a
    traceback in the triggerer's log while the task waits forever."""
    from trainyard.plugins.attempt import watching
    from trainyard.sensors.watch import TriggerFailed, raise_trigger_error

    def broken(*args: object, **kwargs: object) -> None:
        raise PermissionError("the state database refused the lease renewal")

    monkeypatch.setattr(watching, "watch_once", broken)
    handle = fabricate(tmp_path, [Rank(step=3), Rank(step=3)])
    event = _first_event(TrainingTrigger(handle.model_dump(mode="json"), watch=NO_LEASE, poll_interval_s=0.1))
    assert (event["status"], event["error_class"]) == ("error", "builtins.PermissionError")
    assert event["message"] == "PermissionError: the state database refused the lease renewal"
    assert "in broken" in event["stack_trace"]
    with pytest.raises(TriggerFailed, match=r"builtins\.PermissionError: PermissionError: the state database"):
        raise_trigger_error(event)
    raise_trigger_error({"status": "finished"})  # any other event is the sensor's to read


class _TaskInstance:
    dag_id, run_id, task_id = "tiny", "manual__1", "watch_training"


@pytest.mark.parametrize(("marked", "stopped"), [
    ("its DAG run manual__1 was marked failed in Airflow", True),
    ("", False),  # the watcher was cleared (it re-attaches) or marked succeeded: training goes on
])
def test_on_kill_stops_the_gang_only_when_a_person_marked_it_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marked: str, stopped: bool) -> None:
    """`on_kill` runs only for a person's action (Airflow 3.3's triggerer; never on a restart):
    what it does then depends on what the person did. The stop and the note are recorded here
    instead of done — the fabricated ranks' pid is this test's own."""
    from trainyard.operators import common
    from trainyard.sensors import triggers

    handle = fabricate(tmp_path, [Rank(exit_code=None, step=20), Rank(exit_code=None, step=20)], alive_hung=True)
    asked, stops, notes = [], [], []
    monkeypatch.setattr(triggers, "marked_failed", lambda *ids: asked.append(ids) or marked)
    monkeypatch.setattr(triggers, "stop_marked_failed",
                        lambda h, why, runtime: stops.append((h.attempt, why)) or f"attempt 0: cancelled → {why}")
    monkeypatch.setattr(triggers, "_runtime", lambda: None)
    monkeypatch.setattr(common, "write_note", lambda *args: notes.append(args))
    kept: list[tuple[str, ...]] = []  # a DAG run marked failed is kept failed after its teardown
    monkeypatch.setattr(triggers, "keep_marked_failed", lambda *ids: kept.append(ids))
    trigger = TrainingTrigger(handle.model_dump(mode="json"), watch=NO_LEASE, poll_interval_s=0.1)
    trigger.task_instance = _TaskInstance()  # type: ignore[assignment]
    asyncio.run(trigger.on_kill())
    assert asked == [("tiny", "manual__1", "watch_training")]
    assert stops == ([(0, marked)] if stopped else [])
    assert notes == ([("tiny", "manual__1", f"attempt 0: cancelled → {marked}")] if stopped else [])
    assert kept == ([("tiny", "manual__1")] if stopped else [])


def test_on_kill_finishes_the_stop_when_the_triggerer_cancels_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The triggerer cancels a trigger it no longer wants again on each of its loops while
    `on_kill` runs: a stop cut short there would leave the run half-recorded and the note unwritten."""
    import time

    from trainyard.operators import common
    from trainyard.sensors import triggers

    handle = fabricate(tmp_path, [Rank(exit_code=None, step=20)], alive_hung=True)
    done, notes = [], []
    monkeypatch.setattr(triggers, "marked_failed", lambda *ids: "its DAG run manual__1 was marked failed in Airflow")
    monkeypatch.setattr(triggers, "stop_marked_failed",
                        lambda h, why, runtime: time.sleep(0.5) or done.append(why) or "attempt 0: cancelled")
    monkeypatch.setattr(triggers, "_runtime", lambda: None)
    monkeypatch.setattr(common, "write_note", lambda *args: notes.append(args))
    monkeypatch.setattr(triggers, "keep_marked_failed", lambda *ids: None)
    trigger = TrainingTrigger(handle.model_dump(mode="json"), watch=NO_LEASE, poll_interval_s=0.1)
    trigger.task_instance = _TaskInstance()  # type: ignore[assignment]

    async def cancelled_twice() -> None:
        task = asyncio.ensure_future(trigger.on_kill())
        for _ in range(2):
            await asyncio.sleep(0.1)
            task.cancel("user-action")
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancelled_twice())
    assert done == ["its DAG run manual__1 was marked failed in Airflow"]
    assert notes == [("tiny", "manual__1", "attempt 0: cancelled")]


def test_training_trigger_logs_a_progress_line_into_the_task_log(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The triggerer writes a trigger's log into its task's log: `watch_training` shows the step,
    rank 0's loss and tokens/s and each rank's phase while it waits, not a dict at the end."""
    import logging
    import os
    import time

    from trainyard.plugins.run.heartbeat import Heartbeat, write_heartbeat

    handle = fabricate(tmp_path, [Rank(exit_code=0, step=20), Rank(exit_code=0, step=20)])
    write_heartbeat(handle.heartbeat_dir, Heartbeat(job="tiny", rank=0, pid=os.getpid(), step=20, time=time.time(),
                                                    loss=3.14159, tokens_per_s=5210.4, phase="done"))
    trigger = TrainingTrigger(handle.model_dump(mode="json"), watch=NO_LEASE, poll_interval_s=0.1)
    trigger._log = logging.getLogger("trainyard.tests.trigger")  # structlog's proxy, read back as stdlib
    with caplog.at_level(logging.INFO, logger="trainyard.tests.trigger"):
        _first_event(trigger)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert line.startswith("step 20 · loss 3.1416 · 5,210 tokens/s · rank 0 ")
    assert "rank 1 " in line and "@20" in line


def test_the_other_watchers_of_an_attempt_look_again_as_soon_as_its_training_watcher_sees_it_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`classify_outcome` waits for all three watchers: the checkpoint and health watchers napping
    between their polls are woken by the training watcher's end, in the same event loop, instead
    of seeing it a poll later. Their interval here is an hour: without the wake-up this test
    would wait that long (and fail on its guard)."""
    from trainyard.plugins.attempt import watching
    from trainyard.sensors import triggers

    handle = fabricate(tmp_path / "runs", [Rank(exit_code=0, step=20), Rank(exit_code=0, step=20)])
    ended = asyncio.Event()  # set once the training watcher's first look is done
    real_poll = watching.poll

    def poll(h, runtime):  # the attempt runs until the training watcher has looked at it
        status = real_poll(h, runtime)
        return status if ended.is_set() else status.model_copy(update={"state": "running"})

    monkeypatch.setattr(watching, "poll", poll)
    naps: list[float] = []
    real_nap = triggers.nap

    async def nap(h, seconds):  # counted once the napper holds the attempt's event
        naps.append(seconds)
        await real_nap(h, seconds)

    monkeypatch.setattr(triggers, "nap", nap)
    monkeypatch.setattr(watching, "committed_after", lambda *args, **kwargs: [])
    serialized = handle.model_dump(mode="json")
    hour = 3600.0
    others = [CheckpointTrigger(dict(serialized), checkpoint_root=(tmp_path / "c").as_uri(), after_step=0,
                                poll_interval_s=hour),
              HealthTrigger(dict(serialized), agents={}, poll_interval_s=hour)]

    async def watch() -> list[dict]:
        napping = [asyncio.ensure_future(t.run().asend(None)) for t in others]
        while len(naps) < 2:  # both looked once (running) and nap
            await asyncio.sleep(0.01)
        assert not any(task.done() for task in napping)
        ended.set()
        training = TrainingTrigger(dict(serialized), watch=NO_LEASE, poll_interval_s=hour)
        assert (await training.run().asend(None)).payload["status"] == "finished"
        return [(await task).payload for task in napping]

    events = asyncio.run(asyncio.wait_for(watch(), timeout=60))
    assert [e["status"] for e in events] == ["finished", "finished"]
