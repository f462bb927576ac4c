"""The maintenance engine across jobs and runs, on a real store with fabricated checkpoints: the
audit names every corrupt checkpoint it samples; the sweep applies each job's policy, keeps the
newest valid checkpoint and every quarantined one, and leaves live runs and unknown jobs alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.plugins.checkpoint.catalog import QUARANTINE_NAME, list_checkpoints, quarantine, scan
from trainyard.plugins.checkpoint.maintenance import AuditFailed, RunRoot, audit, run_roots, sweep
from trainyard.plugins.checkpoint.manifest import step_dir
from trainyard.plugins.checkpoint.retention import RetentionPolicy
from trainyard.plugins.checkpoint.uris import checkpoint_root
from trainyard.plugins.storage.store import open_store

OLD = datetime(2026, 1, 1, tzinfo=UTC)
RUN_A, RUN_B = "20260101t000000-aaaaaa", "20260102t000000-bbbbbb"


def fabricate(store_uri: str, job: str, run: str, steps: list[int]) -> str:
    root = checkpoint_root(store_uri, job, run)
    store = open_store(root)
    for step in steps:
        make_checkpoint(store, step, job=job, created_at=OLD + timedelta(minutes=step))
    return root


def corrupt(root: str, step: int) -> None:
    path = Path(open_store(root).key_uri(f"{step_dir(step)}/__0_0.distcp").removeprefix("file://"))
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def objects(tmp_path: Path) -> str:
    uri = (tmp_path / "objects").as_uri()
    fabricate(uri, "alpha", RUN_A, [10, 20, 30])
    fabricate(uri, "alpha", RUN_B, [10, 20])
    fabricate(uri, "beta", RUN_A, [5, 15, 25, 35])
    return uri


def test_run_roots_finds_every_run_of_every_job(objects: str) -> None:
    roots = run_roots(objects)
    assert [(r.job, r.run) for r in roots] == [("alpha", RUN_A), ("alpha", RUN_B), ("beta", RUN_A)]
    assert roots[0].uri == checkpoint_root(objects, "alpha", RUN_A)


def test_audit_of_everything_passes_and_names_each_corrupt_checkpoint(objects: str) -> None:
    roots = run_roots(objects)
    clean = audit(roots, sample=100)
    assert (clean.population, len(clean.findings), clean.bad) == (9, 9, [])
    clean.raise_if_bad()
    corrupt(roots[0].uri, 20)
    corrupt(roots[2].uri, 35)
    report = audit(roots, sample=100)
    assert {(b.job, b.run, b.step) for b in report.bad} == {("alpha", RUN_A, 20), ("beta", RUN_A, 35)}
    with pytest.raises(AuditFailed) as failed:
        report.raise_if_bad()
    message = str(failed.value)
    assert "2 of 9" in message and "corrupt" in message
    assert f"alpha/runs/{RUN_A}/checkpoints/step-00000020/MANIFEST.json" in message
    assert f"beta/runs/{RUN_A}/checkpoints/step-00000035/MANIFEST.json" in message


def test_audit_samples_at_random_reproducibly(objects: str) -> None:
    roots = run_roots(objects)
    picks = {tuple((f.job, f.run, f.step) for f in audit(roots, sample=3, seed=s).findings) for s in range(6)}
    assert all(len(p) == 3 for p in picks)
    assert len(picks) > 1  # different seeds, different samples
    again = audit(roots, sample=3, seed=4).findings
    assert [(f.job, f.run, f.step) for f in again] == [(f.job, f.run, f.step) for f in audit(roots, sample=3, seed=4).findings]
    with pytest.raises(ValueError, match="sample must be"):
        audit(roots, sample=0)


def test_sweep_applies_policies_and_never_deletes_newest_valid_or_quarantined(objects: str) -> None:
    roots = run_roots(objects)
    beta = checkpoint_root(objects, "beta", RUN_A)
    quarantine(f"{beta}/{step_dir(5)}/MANIFEST.json", "restore failed verification")
    corrupt(beta, 35)  # the newest does not verify: 25 is the newest valid one
    policies = {"beta": RetentionPolicy(keep_last=1)}
    report = sweep(roots, policies, live_runs={}, now=OLD + timedelta(days=30))
    assert report.deleted == {beta: [15]}
    assert [r.step for r in list_checkpoints(beta)] == [25, 35]  # newest and newest valid
    assert step_dir(5) in scan(beta).quarantined  # kept, marker and all
    assert open_store(beta).exists(f"{step_dir(5)}/{QUARANTINE_NAME}")
    assert set(report.skipped) == {r.uri for r in roots if r.job == "alpha"}
    assert "no retention policy" in report.skipped[roots[0].uri]


def test_sweep_leaves_live_runs_to_their_sensor_and_dry_run_deletes_nothing(objects: str) -> None:
    roots = run_roots(objects)
    policies = {"alpha": RetentionPolicy(keep_last=1)}
    dry = sweep(roots, policies, live_runs={"alpha": {RUN_B}}, dry_run=True, now=OLD + timedelta(days=30))
    a = checkpoint_root(objects, "alpha", RUN_A)
    assert dry.deleted == {} and [d.step for d in dry.runs[a].decisions if not d.keep] == [10, 20]
    assert "still live" in dry.skipped[checkpoint_root(objects, "alpha", RUN_B)]
    done = sweep([RunRoot("alpha", RUN_A, a)], policies, now=OLD + timedelta(days=30))
    assert done.deleted == {a: [10, 20]} and [r.step for r in list_checkpoints(a)] == [30]
