"""Heartbeat scanning: nested folders, garbage skipped with one warning per file, never a crash."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import procs
from tests.support.require import missing
from trainyard.node_agent.heartbeat_reader import MAX_HEARTBEAT_BYTES, HeartbeatReader
from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path, write_heartbeat


def _beat(rank: int, step: int = 1, job: str = "j") -> Heartbeat:
    return Heartbeat(job=job, rank=rank, pid=1, step=step, time=1.0)


BAD_FILES: dict[str, bytes] = {
    "half-written": _beat(7).model_dump_json().encode()[:25],
    "foreign JSON": b'{"kind": "something else", "rank": "seven"}',
    "a JSON array": b"[1, 2, 3]",
    "empty": b"",
    "binary": bytes(range(256)),
    "too large": b" " * (MAX_HEARTBEAT_BYTES + 1),
}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_finds_heartbeats_in_nested_folders(tmp_path: Path) -> None:
    write_heartbeat(tmp_path / "job-a" / "attempt-0", _beat(0, job="a"))
    write_heartbeat(tmp_path / "job-a" / "attempt-0", _beat(1, job="a"))
    write_heartbeat(tmp_path / "deep" / "er" / "still", _beat(0, job="b"))
    (tmp_path / "job-a" / "attempt-0" / "notes.json").write_text("{}")  # not a heartbeat name
    found = HeartbeatReader(tmp_path).scan()
    assert sorted((b.job, b.rank) for _, b in found) == [("a", 0), ("a", 1), ("b", 0)]


def test_a_glob_root_reads_only_the_kubelets_heartbeat_volumes(tmp_path: Path) -> None:
    """On a cluster the root is the kubelet's pods folder, globbed to each pod's `heartbeats`
    emptyDir: a heartbeat-named file in another volume of a pod (a dataset) is not read."""
    pods = tmp_path / "kubelet" / "pods"
    for uid, job in (("uid-1", "a"), ("uid-2", "b")):
        write_heartbeat(pods / uid / "volumes" / "kubernetes.io~empty-dir" / "heartbeats" / job / "0", _beat(0, job=job))
    write_heartbeat(pods / "uid-1" / "volumes" / "kubernetes.io~csi" / "dataset" / "mount", _beat(3, job="data"))
    (pods / "uid-3" / "volumes").mkdir(parents=True)  # a pod without heartbeats
    reader = HeartbeatReader(pods / "*" / "volumes" / "kubernetes.io~empty-dir" / "heartbeats")
    assert [p.parts[-4] for p in reader.roots()] == ["uid-1", "uid-2"]
    assert sorted((b.job, b.rank) for _, b in reader.scan()) == [("a", 0), ("b", 0)]
    assert HeartbeatReader(tmp_path / "absent" / "*" / "heartbeats").scan() == []


@pytest.mark.parametrize("what", sorted(BAD_FILES))
def test_bad_files_are_skipped_with_one_warning_each(tmp_path: Path, what: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    write_heartbeat(tmp_path, _beat(0))
    bad = heartbeat_path(tmp_path, 7)
    bad.write_bytes(BAD_FILES[what])
    reader = HeartbeatReader(tmp_path)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            found = reader.scan()
            assert [b.rank for _, b in found] == [0]
            assert reader.invalid_files == 1
    (warning,) = _warnings(caplog)
    assert warning.startswith(f"skipping heartbeat file {bad}: ")


def test_a_file_that_heals_and_breaks_again_is_warned_about_again(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = heartbeat_path(tmp_path, 3)
    reader = HeartbeatReader(tmp_path)
    with caplog.at_level(logging.WARNING):
        path.write_text("{not json")
        reader.scan()
        path.write_text("{still not json}")  # changed but still broken: no second warning
        reader.scan()
        write_heartbeat(tmp_path, _beat(3, step=5))
        assert [b.step for _, b in reader.scan()] == [5]
        assert reader.invalid_files == 0
        path.write_text("")
        assert reader.scan() == []
    assert len(_warnings(caplog)) == 2


def test_unchanged_files_are_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rank in range(4):
        write_heartbeat(tmp_path, _beat(rank))
    reader = HeartbeatReader(tmp_path)
    calls: list[object] = []
    real = Heartbeat.model_validate_json

    def counting(data: object, **kw: object) -> Heartbeat:
        calls.append(data)
        return real(data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Heartbeat, "model_validate_json", counting)
    reader.scan()
    reader.scan()
    assert len(calls) == 4
    write_heartbeat(tmp_path, _beat(2, step=99))
    assert {b.rank: b.step for _, b in reader.scan()}[2] == 99
    assert len(calls) == 5


def test_missing_root_and_vanishing_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reader = HeartbeatReader(tmp_path / "not-yet")
    with caplog.at_level(logging.INFO):
        assert reader.scan() == [] and reader.scan() == []
    assert sum("does not exist (yet)" in r.getMessage() for r in caplog.records) == 1
    write_heartbeat(tmp_path / "not-yet", _beat(0))
    assert len(reader.scan()) == 1
    heartbeat_path(tmp_path / "not-yet", 0).unlink()
    assert reader.scan() == []


def test_the_reader_writes_nothing(tmp_path: Path) -> None:
    write_heartbeat(tmp_path / "x", _beat(0))
    heartbeat_path(tmp_path / "x", 1).write_text("garbage")
    before = sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    reader = HeartbeatReader(tmp_path)
    reader.scan()
    reader.scan()
    assert sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before


SCAN_WITHOUT_PRIVILEGES = """
import json, sys
from trainyard.node_agent.heartbeat_reader import HeartbeatReader
reader = HeartbeatReader(sys.argv[1])
print(json.dumps({"valid": len(reader.scan()), "invalid": reader.invalid}))
"""


def test_an_unreadable_file_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = heartbeat_path(tmp_path, 0)
    path.write_text(_beat(0).model_dump_json())
    path.chmod(0)
    if os.geteuid() != 0:
        assert HeartbeatReader(tmp_path).scan() == []
        assert "unreadable" in caplog.text
        return
    # Root reads any file whatever its mode (CI runs as root): scan as root without its
    # privileges — an ordinary user in a user namespace, to whom root's files are its own —
    # so the mode applies and the open really fails.
    if shutil.which("unshare") is None:
        missing("netns", "unshare (util-linux) is needed to drop root's file privileges")
    done = subprocess.run(["unshare", "--user", "--map-user=65534", "--map-group=65534", sys.executable,
                           "-c", SCAN_WITHOUT_PRIVILEGES, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env=procs.test_env())
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["valid"] == 0
    assert result["invalid"] == {str(path): "unreadable (Permission denied)"}
    assert "unreadable" in done.stderr  # the warning, in the log


def test_a_folder_named_like_a_heartbeat_is_ignored(tmp_path: Path) -> None:
    heartbeat_path(tmp_path, 9).mkdir()
    write_heartbeat(tmp_path, _beat(0))
    reader = HeartbeatReader(tmp_path)
    assert [b.rank for _, b in reader.scan()] == [0] and reader.invalid_files == 0
