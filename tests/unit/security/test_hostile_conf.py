"""Hostile DAG-run confs (the trigger form's Params, a hand-written conf, a templated string):
`parse_conf` parses every one through `AttemptConf` and ends in one `InvalidConf` that names
the field — unknown keys, run ids that are paths, absurd numbers — within the time bound."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.unit.security.hostile import TIMEOUT_S
from trainyard.plugins.attempt.conf import InvalidConf, parse_conf
from trainyard.plugins.errors import FatalError

pytestmark = pytest.mark.timeout(TIMEOUT_S)

WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

CONFS: dict[str, tuple[object, str]] = {
    "unknown key": ({"attempt": 0, "checkpoint_root": "s3://x/jobs/victim"}, "checkpoint_root"),
    "typo of a key": ({"max_step": 5}, "max_step"),
    "run id with ..": ({"run": "../x"}, "run"),
    "run id that is a path": ({"run": "victim/runs/r1"}, "run"),
    "run id with NUL": ({"run": "abc\x00def"}, "run"),
    "run id of 10 kB": ({"run": "a" * 10_000}, "run"),
    "negative attempt": ({"run": "r-1", "attempt": -1}, "attempt"),
    "absurd attempt": ({"run": "r-1", "attempt": 10**100}, "attempt"),
    "attempt as words": ({"run": "r-1", "attempt": "three"}, "attempt"),
    "templated attempt gone wrong": ({"run": "r-1", "attempt": "{{ dag_run.conf.attempt + 1 }}"}, "attempt"),
    "max steps 1e999": ({"max_steps": "1e999"}, "max_steps"),
    "max steps absurd": ({"max_steps": 10**30}, "max_steps"),
    "learning rate inf": ({"learning_rate": float("inf")}, "learning_rate"),
    "learning rate nan": ({"learning_rate": "nan"}, "learning_rate"),
    "a later attempt without a run": ({"attempt": 3}, "names no run"),
    "faults with an unknown kind": ({"faults": {"format_disk": True}}, "format_disk"),
    "a huge resume point": ({"run": "r-1", "attempt": 1, "resume_from": "s3://b/" + "x" * 100_000}, "resume_from"),
    "a huge plan": ({"plan": "{" * 2_000_000}, "plan"),
    "excluded nodes as a string": ({"exclude_nodes": "node-1"}, "exclude_nodes"),
    "history of junk": ({"history": [{"attempt": 0, "outcome": "pwned"}]}, "history"),
    "conf as a list": (["attempt", 1], "not a mapping"),
}


@pytest.mark.parametrize("case", list(CONFS))
def test_a_hostile_conf_ends_in_one_invalid_conf(case: str) -> None:
    conf, words = CONFS[case]
    with pytest.raises(InvalidConf) as caught:
        parse_conf(conf, dag_id="mallory", trigger_run_id="manual__1", when=WHEN)  # type: ignore[arg-type]
    message = str(caught.value)
    assert isinstance(caught.value, FatalError)  # the task fails at once, no retry
    assert words in message and len(message) < 3000, message


def test_a_good_conf_still_opens_its_run() -> None:
    conf = parse_conf({"max_steps": "60", "fault_kill_rank": None}, dag_id="mallory",
                        trigger_run_id="manual__1", when=WHEN)
    assert conf.max_steps == 60 and conf.run.startswith("20261130t120000-") and conf.attempt == 0


def test_a_conf_pointing_into_another_jobs_area_is_refused_before_placement(tmp_path: Path) -> None:
    from tests.unit.security.hostile import spec_doc
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.attempt.conf import check_conf_points
    from trainyard.plugins.recovery.model import AttemptConf

    job = TrainingJob.model_validate(spec_doc("mallory"))
    store = tmp_path.as_uri()
    theirs = f"{store}/jobs/victim/runs/r-1/checkpoints/step-00000005/MANIFEST.json"
    ours = f"{store}/jobs/mallory/runs/r-1/checkpoints/step-00000005/MANIFEST.json"
    check_conf_points(AttemptConf(start_from=ours), job, object_store=store)
    check_conf_points(AttemptConf(start_from="models:/m@prod"), job, object_store=store)  # at launch
    for conf in (AttemptConf(start_from=theirs), AttemptConf(run="r-1", attempt=1, resume_from=theirs),
                 AttemptConf(start_from=ours.replace("/jobs/mallory/", "/jobs/mallory/../victim/"))):
        with pytest.raises(InvalidConf, match="refused"):
            check_conf_points(conf, job, object_store=store)
