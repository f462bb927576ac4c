"""Restore's fetch planning: who hashes which shared file, and catching a changed file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.plugins.checkpoint.fetch import assign_verifiers, same_bytes_everywhere


def test_each_shared_file_is_hashed_once_by_a_rank_that_reads_it() -> None:
    needed = [{"__0_0.distcp", "__1_0.distcp", "extra/rank-00000.json"},
              {"__1_0.distcp", "extra/rank-00001.json"}]
    sizes = {"__0_0.distcp": 500, "__1_0.distcp": 510, "extra/rank-00000.json": 1,
             "extra/rank-00001.json": 1}  # the shared file is the bigger one (it holds the
    # replicated optimizer step counters), which fooled a plain largest-first deal
    assert assign_verifiers(needed, sizes) == {
        "__0_0.distcp": 0, "__1_0.distcp": 1,  # rank 0 would otherwise hash both big files
        "extra/rank-00000.json": 0, "extra/rank-00001.json": 1}


@given(st.lists(st.sets(st.sampled_from([f"f{i}" for i in range(8)]), min_size=0, max_size=8),
                min_size=1, max_size=6),
       st.lists(st.integers(0, 1000), min_size=8, max_size=8))
def test_assignment_properties(needed: list[set[str]], size_list: list[int]) -> None:
    sizes = {f"f{i}": s for i, s in enumerate(size_list)}
    assignment = assign_verifiers(needed, sizes)
    assert set(assignment) == set().union(*needed)  # every file read by anyone gets a verifier
    for path, rank in assignment.items():
        assert path in needed[rank]  # ...that reads it (its link is the one it hashes)
    # no rank hashes more than the fair share plus the largest single file
    load = [sum(sizes[p] for p, r in assignment.items() if r == rank) for rank in range(len(needed))]
    total = sum(sizes[p] for p in assignment)
    readers_all = all(all(p in n for n in needed) for p in assignment)
    if readers_all and assignment:
        assert max(load) <= total / len(needed) + max(sizes[p] for p in assignment)


def test_links_to_different_inodes_are_reported() -> None:
    assert same_bytes_everywhere([{"a": (1, 10), "b": (1, 11)}, {"a": (1, 10)}]) == []
    assert same_bytes_everywhere([{"a": (1, 10)}, {"a": (1, 12)}, {}]) == ["a"]


def test_links_are_tried_not_assumed_from_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore links the store's files only where a link really works: one device under two
    mount points (a pod's emptyDir beside a shared store folder) refuses `link` with EXDEV, and
    then the files are copied and verified instead of the restore failing."""
    import errno

    from trainyard.plugins.checkpoint import fetch
    from trainyard.plugins.storage.store import LocalStore

    store = LocalStore(tmp_path / "store")
    store.put_bytes("step-00000010/MANIFEST.json", b"{}")
    local = tmp_path / "local"
    local.mkdir()
    record = SimpleNamespace(folder="step-00000010")
    assert fetch._can_link(store, record, local) is True  # type: ignore[arg-type]
    assert list(local.iterdir()) == []  # the probe is gone

    def across_mounts(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(fetch.os, "link", across_mounts)
    assert fetch._can_link(store, record, local) is False
