"""A job reads and writes only its own area: hostile URIs, planted manifests, foreign resume
points and CLI arguments end in a clear error — and the store shows that nothing of the other
job was read or written (an audit hook records every file the process opens or lists)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.unit.security.audit import recording, snapshot, touched_under
from tests.unit.security.hostile import (
    MALLORY,
    OTHER_RUN,
    RUN,
    TIMEOUT_S,
    VICTIM,
    World,
    write_spec,
)
from trainyard.cli.main import main
from trainyard.plugins.checkpoint.catalog import latest_valid, scan
from trainyard.plugins.checkpoint.errors import OutsideJobPrefixError
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, step_dir
from trainyard.plugins.checkpoint.uris import job_area_uri, require_job_prefix, resolve_in_area
from trainyard.plugins.storage.errors import UnsafeKeyError

pytestmark = [pytest.mark.timeout(TIMEOUT_S),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

AREA = "s3://store/jobs/mallory"


@pytest.mark.parametrize("uri", [
    "s3://store/jobs/victim/checkpoints/mallory/step-00000001/MANIFEST.json",  # the case
    "s3://store/jobs/mallory-2/runs/r/checkpoints",
    "s3://store/jobs/malloryx",
    "s3://store/jobs",
    "s3://other-bucket/jobs/mallory/runs/r/checkpoints",
    "file:///store/jobs/mallory/runs/r/checkpoints",
    "s3://store/mallory/jobs/mallory",
])
def test_a_uri_outside_the_area_is_refused_by_structure(uri: str) -> None:
    with pytest.raises(OutsideJobPrefixError, match="outside the job's area"):
        resolve_in_area(uri, AREA)


@pytest.mark.parametrize("uri", [
    "s3://store/jobs/mallory/../victim/runs/r/checkpoints",
    "s3://store/jobs/mallory/%2E%2E/victim/runs/r/checkpoints",
    "s3://store/jobs/mallory/./runs",
    "file:///store/jobs/mallory/\x00/x",
    "s3://store/jobs/mallory/" + "a/" * 5000,
    "",
])
def test_an_unsafe_uri_is_refused_before_any_comparison(uri: str) -> None:
    with pytest.raises(UnsafeKeyError):
        resolve_in_area(uri, AREA)


def test_a_uri_claiming_the_job_only_by_a_segment_is_not_the_jobs() -> None:
    assert require_job_prefix(f"{AREA}/runs/{RUN}/checkpoints", MALLORY)
    # a store that itself lives under a folder named `jobs`
    assert require_job_prefix(f"file:///srv/jobs/objects/jobs/mallory/runs/{RUN}/checkpoints", MALLORY)
    for uri in ("s3://store/jobs/victim/checkpoints/mallory", "s3://store/victim/mallory/checkpoints",
                "s3://mallory/checkpoints",
                f"s3://store/jobs/victim/runs/{RUN}/checkpoints/jobs/mallory/runs/{RUN}/checkpoints",
                "s3://store/jobs/victim/checkpoints/jobs/mallory",
                "s3://store/jobs/mallory/runs/r/jobs/victim"):
        with pytest.raises(OutsideJobPrefixError):
            require_job_prefix(uri, MALLORY)
    for job in ("../victim", "a/b", "", ".", "x\x00"):
        with pytest.raises(ValueError):
            job_area_uri("s3://store", job)


def _plant(world: World, folder: str, manifest: dict | bytes, *, copy_files_from: Path | None = None) -> Path:
    """Write a manifest (and files copied from another checkpoint) into mallory's run."""
    target = world.root(MALLORY) / folder
    if copy_files_from is not None:
        shutil.copytree(copy_files_from, target)
    target.mkdir(parents=True, exist_ok=True)
    body = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    (target / MANIFEST_NAME).write_bytes(body)
    return target


def _victim_manifest(world: World) -> dict:
    return json.loads((world.root(VICTIM) / step_dir(5) / MANIFEST_NAME).read_bytes())


def _planted_cases(world: World) -> dict[str, tuple[dict | bytes, str]]:
    victims = _victim_manifest(world)
    ours = json.loads((world.root(MALLORY) / step_dir(1) / MANIFEST_NAME).read_bytes())
    return {
        "another job's manifest": ({**victims, "step": 9}, "claims job 'victim'"),
        "another run's manifest": ({**ours, "step": 9, "run": OTHER_RUN}, f"claims run '{OTHER_RUN}'"),
        "no run": ({**ours, "step": 9, "run": None}, "claims run ''"),
        "path traversal": ({**ours, "step": 9, "files": [{**ours["files"][0], "path": "../../../../victim/x"}]},
                           "unsafe path"),
        "absolute path": ({**ours, "step": 9, "files": [{**ours["files"][0], "path": "/etc/passwd"}]},
                          "unsafe path"),
        "nested JSON": (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
        "5000-digit step": (b'{"step": ' + b"9" * 5000 + b"}", "digits"),
        "unknown keys": ({**ours, "step": 9, "owner": "victim"}, "Extra inputs"),
    }


CASES = ["another job's manifest", "another run's manifest", "no run", "path traversal",
         "absolute path", "nested JSON", "5000-digit step", "unknown keys"]


@pytest.mark.parametrize("case", CASES)
def test_a_planted_manifest_is_invalid_never_restored_nor_exported(
        world: World, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainyard.plugins.checkpoint.export import export_safetensors

    manifest, words = _planted_cases(world)[case]
    _plant(world, step_dir(9), manifest, copy_files_from=world.root(VICTIM) / step_dir(5))
    before = snapshot(world.area(VICTIM))
    with recording() as touched:
        found = scan(world.store(MALLORY))
        assert step_dir(9) in found.invalid and words in found.invalid[step_dir(9)], found.invalid
        assert [r.step for r in found.committed] == [1]
        assert latest_valid(world.store(MALLORY)).step == 1  # never the planted one
        with pytest.raises(ValueError):
            export_safetensors(world.manifest_uri(MALLORY, 9), world.home / "out.safetensors", job=MALLORY)
        assert main(["checkpoints", "verify", MALLORY]) == 1
        assert main(["checkpoints", "export", MALLORY, "--step", "9", "--out",
                     str(world.home / "out.safetensors")]) == 1
    out = capsys.readouterr().out
    assert f"✗ step 9 ({step_dir(9)}): invalid manifest" in out, out
    assert touched_under(touched, world.area(VICTIM)) == []
    assert snapshot(world.area(VICTIM)) == before and not (world.home / "out.safetensors").exists()


def test_verify_json_names_the_invalid_manifest(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    _plant(world, step_dir(9), {**_victim_manifest(world), "step": 9})
    assert main(["checkpoints", "verify", MALLORY, "--json"]) == 1
    reports = json.loads(capsys.readouterr().out)
    assert [(r["folder"], r["ok"]) for r in reports] == [(step_dir(1), True), (step_dir(9), False)]
    assert "claims job 'victim'" in reports[1]["problems"][0]


@pytest.mark.parametrize("argv", [
    ["checkpoints", "verify", "../victim"],
    ["checkpoints", "list", "jobs/victim"],
    ["checkpoints", "list", MALLORY, "--run", "../../victim/runs/x"],
    ["checkpoints", "list", MALLORY, "--run", "x" * 10_000],
    ["checkpoints", "verify", MALLORY, "--uri", "{victim_root}"],
    ["checkpoints", "verify", MALLORY, "--uri", "{victim_root}/../../../mallory/runs/r/checkpoints"],
    ["checkpoints", "prune", MALLORY, "--uri", "{victim_root}"],
    ["checkpoints", "export", MALLORY, "--uri", "{victim_root}", "--out", "{home}/x.safetensors"],
    ["checkpoints", "verify", MALLORY, "--spec", "{victim_spec}"],
])
def test_cli_arguments_outside_the_area_exit_2_touching_nothing(
        world: World, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    victim_spec = write_spec(world.home / "victim.yaml", VICTIM)
    argv = [a.format(victim_root=world.root(VICTIM).as_uri(), home=world.home, victim_spec=victim_spec)
            for a in argv]
    before = snapshot(world.objects)
    with recording() as touched:
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err and len(err) < 3000, err
    assert touched_under(touched, world.area(VICTIM)) == []
    assert snapshot(world.objects) == before


def test_launch_with_a_foreign_resume_point_stops_before_anything_starts(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    spec = world.jobs_dir / f"{MALLORY}.yaml"
    for resume in (world.manifest_uri(VICTIM, 5), "file:///etc/passwd",
                   world.manifest_uri(MALLORY, 1).replace(f"/jobs/{MALLORY}/", f"/jobs/{MALLORY}/../{VICTIM}/"),
                   f"{world.area(MALLORY).as_uri()}/runs/{RUN}/checkpoints"):  # a folder, not a manifest
        with recording() as touched:
            assert main(["launch", "--local", "--resume-from", resume, str(spec)]) == 2
        err = capsys.readouterr().err
        assert "--resume-from" in err and "refused" in err and "Traceback" not in err, err
        assert touched_under(touched, world.area(VICTIM)) == []
        assert touched_under(touched, Path("/etc/passwd")) == []
        assert not (world.home / "runs").exists() and not (world.home / "state.db").exists()


@pytest.mark.parametrize("argv", [
    ["--run", "../victim"], ["--run", "victim/runs/x"], ["--run", "x" * 10_000],
    ["--attempt", "-1"], ["--attempt", str(10**30)],
])
def test_launch_with_hostile_run_or_attempt_exits_2_before_anything_starts(
        world: World, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with recording() as touched:
        assert main(["launch", "--local", *argv, str(world.jobs_dir / f"{MALLORY}.yaml")]) == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err and len(err) < 3000, err
    assert touched_under(touched, world.area(VICTIM)) == []
    assert not (world.home / "runs").exists() and not (world.home / "state.db").exists()


def test_resume_points_of_a_run_stay_in_the_area_or_are_the_specs_init_from(world: World) -> None:
    from trainyard.config.loader import load_spec_file
    from trainyard.plugins.attempt.conf import InvalidConf, resume_point
    from trainyard.plugins.recovery.model import AttemptConf

    job = load_spec_file(world.jobs_dir / f"{MALLORY}.yaml")
    ours, theirs = world.manifest_uri(MALLORY, 1), world.manifest_uri(VICTIM, 5)
    other_run = world.manifest_uri(MALLORY, 1, run=OTHER_RUN)
    assert resume_point(AttemptConf(run=RUN, start_from=ours), job, tracking_uri="", object_store=world.object_store) == ours
    assert resume_point(AttemptConf(run=RUN, start_from=other_run), job, tracking_uri="",
                        object_store=world.object_store) == other_run  # another run of the same job
    for conf in (AttemptConf(run=RUN, start_from=theirs), AttemptConf(run=RUN, attempt=1, resume_from=theirs),
                 AttemptConf(run=RUN, start_from="/etc/passwd"),
                 AttemptConf(run=RUN, attempt=2, resume_from=ours.replace(MALLORY, f"{MALLORY}/../{VICTIM}", 1))):
        with pytest.raises(InvalidConf, match="refused"):
            resume_point(conf, job, tracking_uri="", object_store=world.object_store)
    fine_tune = job.model_copy(update={"spec": job.spec.model_copy(update={
        "checkpoint": job.spec.checkpoint.model_copy(update={"init_from": theirs})})})
    assert resume_point(AttemptConf(run=RUN, start_from=theirs), fine_tune, tracking_uri="",
                        object_store=world.object_store) == theirs


def test_a_manager_restores_only_its_own_area_and_reads_init_from_without_writing(
        world: World, tmp_path: Path) -> None:
    import torch

    from trainyard.plugins.checkpoint.manager import CheckpointManager

    def manager(job: str, **kwargs: str) -> CheckpointManager:
        return CheckpointManager(checkpoint_uri=world.root(job, OTHER_RUN).as_uri(), job=job, rank=0,
                                 world_size=1, staging_dir=tmp_path / f"staging-{job}",
                                 area=job_area_uri(world.object_store, job), **kwargs)

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    with manager(VICTIM) as victim:
        saved = victim.save_sync(3, model=model, optimizer=None)
    written = json.loads((world.root(VICTIM, OTHER_RUN) / step_dir(3) / MANIFEST_NAME).read_bytes())
    assert (written["job"], written["run"]) == (VICTIM, OTHER_RUN)  # the manifest carries both
    before = snapshot(world.area(VICTIM))
    fresh = torch.nn.Linear(4, 2)
    with recording() as touched, manager(MALLORY) as ours:
        with pytest.raises(OutsideJobPrefixError):
            ours.restore(model=fresh, manifest_uri=saved.manifest_uri)
        assert ours.restore(model=fresh) is None  # its own run is empty: a fresh start
    assert touched_under(touched, world.area(VICTIM)) == []
    with manager(MALLORY, init_from=saved.manifest_uri) as ours:  # the spec's explicit initFrom
        assert ours.restore(model=fresh, manifest_uri=saved.manifest_uri).step == 3
        assert torch.equal(fresh.weight, model.weight)
        ours.save_sync(4, model=fresh, optimizer=None)
    assert snapshot(world.area(VICTIM)) == before  # read, never written
    assert (world.root(MALLORY, OTHER_RUN) / step_dir(4) / MANIFEST_NAME).is_file()


def test_the_audit_sees_what_a_reader_touches(world: World) -> None:
    """The store-side check above can fail: a read, a listing and a write inside the other
    job's area all show up."""
    with recording() as touched:
        scan(world.store(VICTIM))
        (world.area(VICTIM) / "planted").write_text("x")
    events = {e for e, _ in touched_under(touched, world.area(VICTIM))}
    assert "open" in events and events & {"os.scandir", "os.listdir"}, events
