"""Hostile spec and cluster files: each ends in one clear problem (a spec) or one line and a
usage exit (a cluster), within the time bound — never a hang, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.unit.security.hostile import (
    ALIAS_BOMB,
    MERGE_BOMB,
    TIMEOUT_S,
    World,
    spec_doc,
    write_spec,
)
from trainyard.cli.main import main
from trainyard.config.cluster import ClusterFileError, load_cluster, parse_cluster
from trainyard.config.loader import read_spec_file
from trainyard.config.problems import Code
from trainyard.config.rules import check_spec

pytestmark = pytest.mark.timeout(TIMEOUT_S)

LOCAL = Path(__file__).resolve().parents[3] / "config" / "clusters" / "local.yaml"


def _valid_spec_text() -> str:
    return yaml.safe_dump(spec_doc("mallory"))


SPECS: list[tuple[str, bytes, Code, str]] = [
    ("alias bomb", ALIAS_BOMB, Code.NOT_YAML, "expands to more than"),
    ("merge-key bomb", MERGE_BOMB, Code.NOT_YAML, "expands to more than"),
    ("bomb inside a valid spec", _valid_spec_text().encode().replace(
        b"metadata:", ALIAS_BOMB.replace(b"a:", b"x-a:", 1) + b"metadata:", 1), Code.NOT_YAML, "expands"),
    ("recursive alias", b"a: &a [*a]\n", Code.NOT_YAML, "recursive alias"),
    ("recursive mapping", b"a: &a {b: *a}\n", Code.NOT_YAML, "recursive alias"),
    ("deep nesting", b"a: " + b"[" * 200 + b"]" * 200 + b"\n", Code.NOT_YAML, "nested deeper"),
    ("deep flow nesting past libyaml", b"[" * 5000 + b"]" * 5000, Code.NOT_YAML, "not valid YAML"),
    ("5000-digit integer", b"apiVersion: " + b"9" * 5000 + b"\n", Code.NOT_YAML, "cannot be read"),
    ("binary", b"\x7fELF\x02\x01\x01\x00\x00", Code.NOT_YAML, "binary"),
    ("latin-1", "name: caf\xe9\n".encode("latin-1"), Code.NOT_YAML, "not UTF-8"),
    ("duplicate key", b"kind: TrainingJob\nkind: TrainingJob\n", Code.DUPLICATE_KEY, "duplicate key"),
    ("python tag", b"a: !!python/object/apply:os.system ['true']\n", Code.NOT_YAML, "not valid YAML"),
    ("a list", b"- 1\n- 2\n", Code.NOT_A_MAPPING, "a list"),
    ("two documents", b"a: 1\n---\nb: 2\n", Code.NOT_A_MAPPING, "2 YAML documents"),
]


@pytest.mark.parametrize(("content", "code", "words"), [c[1:] for c in SPECS], ids=[c[0] for c in SPECS])
def test_hostile_spec_files_end_in_one_clear_problem(tmp_path: Path, content: bytes, code: Code,
                                                      words: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    job, problems = read_spec_file(path)
    assert job is None and problems, problems
    assert problems[0].code == code and words in problems[0].message, problems
    assert all(len(p.render()) < 2000 for p in problems)  # a bounded preview, whatever the input


def test_a_huge_value_in_a_field_is_previewed_not_rendered(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"  # 900 kB in one value: under the file limit, far over a message
    path.write_text(_valid_spec_text().replace("gpuCount: 2", "gpuCount: '" + "x" * 900_000 + "'"))
    job, problems = read_spec_file(path)
    assert job is None
    (problem,) = [p for p in problems if p.path == "spec.hardware.gpuCount"]
    assert len(problem.message) < 300, problem.message


def test_a_huge_unknown_key_is_previewed(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(_valid_spec_text().replace("metadata:", "? " + "k" * 500_000 + "\n: 1\nmetadata:", 1))
    job, problems = read_spec_file(path)
    assert job is None and [p.code for p in problems] == [Code.UNKNOWN_FIELD], problems
    assert len(problems[0].render()) < 1000


def test_a_spec_file_that_is_a_folder_fifo_device_or_missing_is_one_problem(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    for path in (tmp_path, tmp_path / "missing.yaml", fifo, Path("/dev/zero")):
        job, problems = read_spec_file(path)
        assert job is None and [p.code for p in problems] == [Code.FILE_UNREADABLE], problems
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(ClusterFileError, match=r"not a regular file|is a folder"):
            load_cluster(path)


@pytest.mark.parametrize(("storage", "words"), [
    ("s3://ckpt/jobs/victim/checkpoints/mallory", "inside 'jobs/victim/'"),
    ("s3://ckpt/jobs/victim/mallory/", "inside 'jobs/victim/'"),
    ("s3://ckpt/victim/runs/x/mallory", "inside 'runs/x/'"),
    ("s3://ckpt/mallory/../victim", "'..'"),
    ("s3://ckpt/mallory/%2e%2e/victim/mallory", "'..'"),
    ("s3://ckpt/victim", "last segment must be 'mallory'"),
    ("gs://ckpt/mallory", "scheme 'gs'"),
    ("file:///data/mallory\x00/x/mallory", "NUL"),
    ("s3://ckpt/" + "m/" * 3000 + "mallory", "characters (limit"),
])
def test_a_storage_inside_another_jobs_area_is_invalid(storage: str, words: str) -> None:
    from trainyard.config.spec import TrainingJob

    job = TrainingJob.model_validate(spec_doc("mallory", storage=storage))
    (problem,) = [p for p in check_spec(job) if p.code == Code.CHECKPOINT_PREFIX]
    assert problem.path == "spec.checkpoint.storage" and words in problem.message, problem
    assert len(problem.message) <= 300


@pytest.mark.parametrize("init_from", [
    "s3://ckpt/jobs/victim/runs/r1/checkpoints/step-00000005",  # a folder, not its manifest
    "s3://ckpt/jobs/victim/runs/r1/checkpoints/step-5/MANIFEST.json",
    "s3://ckpt/jobs/victim/../../etc/step-00000005/MANIFEST.json",
    "ftp://ckpt/step-00000005/MANIFEST.json",
])
def test_init_from_must_name_a_manifest(init_from: str) -> None:
    from trainyard.config.spec import TrainingJob

    job = TrainingJob.model_validate(spec_doc("mallory", initFrom=init_from))
    problems = [p for p in check_spec(job) if p.code == Code.CHECKPOINT_PREFIX]
    assert [p.path for p in problems] == ["spec.checkpoint.initFrom"], problems


CLUSTERS: list[tuple[str, bytes, str]] = [
    ("binary", b"\x00\x01\x02", "binary"),
    ("not yaml", b"kind: Cluster\n  bad: [\n", "is not valid YAML"),
    ("a list", b"- a\n- b\n", "holds a list"),
    ("empty", b"", "holds 0 documents"),
    ("alias bomb", ALIAS_BOMB, "expands to more than"),
    ("recursive alias", b"a: &a [*a]\n", "recursive alias"),
    ("not a cluster", b"kind: TrainingJob\nmetadata: {name: x}\n", "is not a valid Cluster"),
    ("a billion nodes", LOCAL.read_bytes().replace(b"count: 2", b"count: 1000000000"),
     "expand to"),
    ("attribute access in a name", LOCAL.read_bytes().replace(b'name: "local-{index}"', b'name: "{index.__class__}"', 1),
     "is not allowed"),
    ("huge width in a name", LOCAL.read_bytes().replace(b'name: "local-{index}"', b'name: "{index:>999999999}"', 1),
     "is not allowed"),
    ("unknown placeholder", LOCAL.read_bytes().replace(b'name: "local-{index}"', b'name: "{colour}"', 1),
     "is not allowed"),
]


def test_the_local_cluster_still_loads() -> None:
    text = LOCAL.read_bytes()  # the cases below edit these two spots
    assert len(load_cluster(LOCAL).nodes) == 2
    assert text.count(b'name: "local-{index}"') == 1 and text.count(b"count: 2") == 1


@pytest.mark.parametrize(("content", "words"), [c[1:] for c in CLUSTERS], ids=[c[0] for c in CLUSTERS])
def test_hostile_cluster_files_are_one_line(tmp_path: Path, content: bytes, words: str) -> None:
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster(content, where="c.yaml")
    message = str(caught.value)
    assert words in message and "\n" not in message and len(message) < 1000, message


@pytest.mark.parametrize("case", ["folder", "binary", "alias bomb", "not a cluster", "missing"])
def test_validate_with_a_bad_cluster_file_exits_2_with_one_line(
        world: World, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path / "mallory.yaml", "mallory")
    target = {"folder": tmp_path, "missing": tmp_path / "nope.yaml"}.get(case, tmp_path / "cluster.yaml")
    if case not in ("folder", "missing"):
        target.write_bytes({name: content for name, content, _ in CLUSTERS}[case])
    assert main(["validate", "--offline", "--cluster", str(target), str(spec)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err


@pytest.mark.parametrize("command", [["plan"], ["launch", "--local"]])
def test_plan_and_launch_with_a_bomb_as_spec_end_with_its_problem(
        world: World, tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bomb.yaml"
    spec.write_bytes(ALIAS_BOMB)
    assert main([*command, str(spec)]) == 1
    captured = capsys.readouterr()
    assert "expands to more than" in captured.err + captured.out and "Traceback" not in captured.err
    assert not (world.home / "runs").exists()  # nothing was launched


@pytest.mark.parametrize("cluster", ["folder", "binary", "alias bomb"])
def test_a_bad_configured_cluster_is_one_line_for_any_command(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`TRAINYARD_CLUSTER` naming a bad file reaches commands that do not catch it: the CLI's
    net turns the refusal into one line and the usage exit."""
    from trainyard.config.settings import get_settings

    path = tmp_path / "cluster-folder" if cluster == "folder" else tmp_path / "cluster.yaml"
    if cluster == "folder":
        path.mkdir()
    else:
        path.write_bytes({name: content for name, content, _ in CLUSTERS}[cluster])
    monkeypatch.setenv("TRAINYARD_CLUSTER", str(path))
    get_settings.cache_clear()
    assert main(["nodes", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainyard nodes: error: cluster file") and err.count("\n") == 1, err
