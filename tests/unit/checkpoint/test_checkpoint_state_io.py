"""Extra-state JSON, verified transfers and the allow-list unpickler: data in, data out,
never code."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainyard.plugins.checkpoint import state_json
from trainyard.plugins.checkpoint.dcp_io import load_metadata
from trainyard.plugins.checkpoint.rng import capture_rng_state, restore_rng_state
from trainyard.plugins.checkpoint.transfer import download_verified, upload_file
from trainyard.plugins.storage.errors import IntegrityError
from trainyard.plugins.storage.store import ObjectStore


def test_state_json_round_trips_what_state_dicts_hold() -> None:
    value = {
        "last_epoch": 7, "lr": [0.1, 1e-5], "betas": (0.9, 0.999), "none": None, "flag": True,
        "by_int": {0: "a", 3: (1, 2)}, "dunder": {"__tuple__": "not a tag"}, "raw": b"\x00\xff",
        "inf": float("inf"),
        "t_bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "t_scalar": torch.tensor(3.5), "t_empty": torch.empty(0, 4), "t_bool": torch.tensor([True]),
        "np": np.arange(5, dtype=np.uint32), "np_scalar": np.float64(2.5),
    }
    back = state_json.loads(state_json.dumps(value))
    assert back["betas"] == (0.9, 0.999) and back["by_int"] == {0: "a", 3: (1, 2)}
    assert back["dunder"] == {"__tuple__": "not a tag"}
    assert back["raw"] == b"\x00\xff" and back["inf"] == float("inf")
    for key in ("t_bf16", "t_scalar", "t_empty", "t_bool"):
        assert back[key].dtype == value[key].dtype and torch.equal(back[key], value[key])
    assert back["np"].dtype == np.uint32 and (back["np"] == value["np"]).all()
    assert back["np_scalar"] == 2.5


def test_state_json_refuses_arbitrary_objects() -> None:
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"\$\.sched\.fn"):
        state_json.dumps({"sched": {"fn": Opaque()}})
    with pytest.raises(TypeError):
        state_json.dumps({"a": np.array([object()])})


def test_rng_states_round_trip_through_json() -> None:
    state = state_json.loads(state_json.dumps(capture_rng_state()))
    expected = (random.random(), np.random.rand(), torch.rand(2))
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    restore_rng_state(state)
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_upload_and_verified_download(store: ObjectStore, tmp_path: Path, compression: str) -> None:
    src = tmp_path / "shard.bin"
    data = os.urandom(1 << 20) + bytes(3 << 20)  # compressible tail
    src.write_bytes(data)
    entry = upload_file(store, "step-00000001", "__0_0.distcp", src,
                        compression=compression, rank=3)  # type: ignore[arg-type]
    assert (entry.path, entry.raw_size, entry.rank, entry.compression) == (
        "__0_0.distcp", len(data), 3, compression)
    assert (entry.size < len(data)) if compression == "zstd" else (entry.size == len(data))
    dest = tmp_path / "down" / "__0_0.distcp"
    assert download_verified(store, "step-00000001", entry, dest) == entry.size
    assert dest.read_bytes() == data


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_corrupt_download_raises_and_leaves_nothing(store: ObjectStore, tmp_path: Path,
                                                    compression: str) -> None:
    src = tmp_path / "shard.bin"
    src.write_bytes(os.urandom(256 << 10))
    entry = upload_file(store, "step-00000001", "x", src, compression=compression)  # type: ignore[arg-type]
    stored = bytearray(store.get_bytes("step-00000001/x"))
    stored[len(stored) // 2] ^= 0x10
    store.put_bytes("step-00000001/x", bytes(stored))
    dest = tmp_path / "down" / "x"
    with pytest.raises(IntegrityError, match=r"corrupt|decompress"):
        download_verified(store, "step-00000001", entry, dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    store.delete("step-00000001/x")
    with pytest.raises(IntegrityError, match="missing"):
        download_verified(store, "step-00000001", entry, dest)


class _Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/trainyard-pwned",))


def test_metadata_unpickler_refuses_anything_off_the_allow_list(tmp_path: Path) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(pickle.UnpicklingError, match=r"(posix|os)\.system"):
        load_metadata(path)
    path.write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(pickle.UnpicklingError, match="not DCP Metadata"):
        load_metadata(path)
    assert not Path("/tmp/trainyard-pwned").exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_hashing_writer_knows_each_file_hash(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from blake3 import blake3

    from trainyard.plugins.checkpoint.dcp_io import HashingFileSystemWriter

    model = torch.nn.Linear(64, 32)
    writer = HashingFileSystemWriter(tmp_path, single_file_per_rank=True, sync_files=False)
    dcp.save({"model": model.state_dict(), "note": {"x": 1}}, storage_writer=writer, no_dist=True)
    files = sorted(p for p in tmp_path.iterdir() if p.is_file())
    assert {p.name for p in files} == {".metadata", "__0_0.distcp"}
    for path in files:
        data = path.read_bytes()
        assert writer.digest_of(path) == (len(data), blake3(data).hexdigest())
    (tmp_path / "__0_0.distcp").write_bytes(b"changed")  # a later change is noticed
    assert writer.digest_of(tmp_path / "__0_0.distcp") is None


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_hashing_writer_hashes_large_writes_aside_and_exactly(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from blake3 import blake3

    from trainyard.plugins.checkpoint.dcp_io import HASH_ASIDE_BYTES, HashingFileSystemWriter

    big = torch.randn(3 * HASH_ASIDE_BYTES // 4 + 7)  # 3 MiB + 28 bytes: hashed on the side
    writer = HashingFileSystemWriter(tmp_path, single_file_per_rank=True, sync_files=False)
    dcp.save({"big": big, "small": torch.arange(5)}, storage_writer=writer, no_dist=True)
    data = (tmp_path / "__0_0.distcp").read_bytes()
    assert len(data) > big.numel() * 4
    assert writer.digest_of(tmp_path / "__0_0.distcp") == (len(data), blake3(data).hexdigest())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_safe_reader_reads_tensors_straight_into_their_destination(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from trainyard.plugins.checkpoint.dcp_io import SafeFileSystemReader, SafeLoadPlanner

    saved = {"w": torch.randn(64, 48), "bf16": torch.randn(33).to(torch.bfloat16),
             "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3),
             "view": torch.arange(40.0).reshape(8, 5)[2:6], "strided": torch.randn(6, 4),
             "note": {"epoch": 3}}
    dcp.save(saved, checkpoint_id=tmp_path, no_dist=True)
    into_t = torch.zeros(4, 6)
    loaded = {k: torch.zeros_like(v) for k, v in saved.items() if isinstance(v, torch.Tensor)}
    loaded["strided"] = into_t.t()  # a non-contiguous destination: DCP's own path fills it
    loaded["note"] = {"epoch": 0}
    direct: list[str] = []

    class Spy(SafeFileSystemReader):
        def _read_into(self, stream, item, planner):  # type: ignore[no-untyped-def]
            done = super()._read_into(stream, item, planner)
            if done:
                direct.append(item.dest_index.fqn)
            return done

    dcp.load(loaded, storage_reader=Spy(tmp_path), planner=SafeLoadPlanner(), no_dist=True)
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    assert loaded["note"] == {"epoch": 3}
    assert sorted(direct) == ["bf16", "scalar", "view", "w"]  # DCP reads no bytes for "empty"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_safe_reader_names_a_file_cut_short(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from trainyard.plugins.checkpoint.dcp_io import SafeFileSystemReader, SafeLoadPlanner

    dcp.save({"w": torch.randn(256, 256)}, checkpoint_id=tmp_path, no_dist=True)
    shard = tmp_path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-120_000])
    with pytest.raises(dcp.api.CheckpointException) as caught:
        dcp.load({"w": torch.zeros(256, 256)}, storage_reader=SafeFileSystemReader(tmp_path),
                 planner=SafeLoadPlanner(), no_dist=True)
    (failure,) = caught.value.failures.values()
    assert "__0_0.distcp: item w is not a readable tensor record" in str(failure)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_direct_io_writer_files_load_back_and_match_their_hash(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from blake3 import blake3

    from trainyard.plugins.checkpoint.dcp_io import (
        HashingFileSystemWriter,
        SafeFileSystemReader,
        SafeLoadPlanner,
    )

    saved = {"big": torch.randn(2_100_003), "small": torch.arange(5), "note": {"epoch": 2}}
    writer = HashingFileSystemWriter(tmp_path, single_file_per_rank=True, sync_files=False,
                                     direct_io=True)
    dcp.save(saved, storage_writer=writer, no_dist=True)
    for path in (tmp_path / "__0_0.distcp", tmp_path / ".metadata"):
        data = path.read_bytes()
        assert writer.digest_of(path) == (len(data), blake3(data).hexdigest())
    loaded = {"big": torch.zeros(2_100_003), "small": torch.zeros(5, dtype=torch.long),
              "note": {"epoch": 0}}
    dcp.load(loaded, storage_reader=SafeFileSystemReader(tmp_path), planner=SafeLoadPlanner(),
             no_dist=True)
    assert torch.equal(loaded["big"], saved["big"]) and torch.equal(loaded["small"], saved["small"])
    assert loaded["note"] == {"epoch": 2}


def _record_crcs(saved: object) -> list[int]:
    import io
    import zipfile

    buffer = io.BytesIO()
    torch.save(saved, buffer)
    return [info.CRC for info in zipfile.ZipFile(buffer).infolist() if "/data/" in info.filename]


def test_checkpoint_files_go_without_the_zip_crc_and_torch_save_gets_it_back() -> None:
    """The CRC-32 is off only while a checkpoint is written (the SHA-256 covers the bytes),
    until the last of several concurrent writers ends; then torch.save has it as before."""
    from trainyard.plugins.checkpoint.dcp_io import without_zip_crc32

    tensor = torch.arange(1000.0)
    assert all(_record_crcs(tensor))
    with without_zip_crc32():
        assert _record_crcs(tensor) == [0]
        with without_zip_crc32():
            assert _record_crcs(tensor) == [0]
        assert _record_crcs(tensor) == [0]  # the other writer is still writing
    assert all(_record_crcs(tensor)) and torch.serialization.get_crc32_options()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_files_without_the_zip_crc_load_by_both_reading_paths(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from trainyard.plugins.checkpoint.dcp_io import (
        HashingFileSystemWriter,
        SafeFileSystemReader,
        SafeLoadPlanner,
    )

    saved = {"w": torch.randn(64, 48), "strided": torch.randn(6, 4), "note": {"epoch": 4}}
    dcp.save(saved, storage_writer=HashingFileSystemWriter(tmp_path, single_file_per_rank=True,
                                                           sync_files=False), no_dist=True)
    loaded = {"w": torch.zeros(64, 48), "strided": torch.zeros(4, 6).t(), "note": {"epoch": 0}}
    dcp.load(loaded, storage_reader=SafeFileSystemReader(tmp_path), planner=SafeLoadPlanner(),
             no_dist=True)  # "strided" goes through DCP's own torch.load
    assert torch.equal(loaded["w"], saved["w"]) and torch.equal(loaded["strided"], saved["strided"])
    assert loaded["note"] == {"epoch": 4}
