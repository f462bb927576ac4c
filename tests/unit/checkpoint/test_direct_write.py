"""The O_DIRECT checkpoint writer: exact bytes and digest at any write size, and the buffered
fallback where the file system refuses O_DIRECT (at open or at a write)."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
from blake3 import blake3

from trainyard.plugins.checkpoint import direct_write
from trainyard.plugins.checkpoint.direct_write import CHUNK_BYTES, DirectHashingStream, open_direct


def _direct_or_skip(path: Path) -> DirectHashingStream:
    stream = open_direct(path)
    if stream is None:
        pytest.skip(f"{path.parent} refuses O_DIRECT")
    return stream


def _write_in_pieces(stream: DirectHashingStream, data: bytes) -> None:
    sizes = [1, 4095, 4097, CHUNK_BYTES - 3, 7, CHUNK_BYTES + 11]
    offset = i = 0
    while offset < len(data):
        piece = data[offset:offset + sizes[i % len(sizes)]]
        assert stream.write(piece) == len(piece)
        assert stream.tell() == offset + len(piece)
        offset += len(piece)
        i += 1


@pytest.mark.parametrize("size", [0, 5, 4096, CHUNK_BYTES, 2 * CHUNK_BYTES + 12_345])
def test_the_file_and_its_digest_are_exactly_the_bytes_written(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "shard.distcp"
    stream = _direct_or_skip(path)
    assert stream.algorithm == "blake3"  # what new manifests record
    _write_in_pieces(stream, data)
    stream.close()
    assert stream.direct
    assert path.read_bytes() == data  # the tail's padding was cut off
    assert (stream.size, stream.digest.hexdigest()) == (size, blake3(data).hexdigest())


@pytest.mark.parametrize(("algorithm", "threads"), [("blake3", 2), ("sha256", 1)])
def test_any_algorithm_and_thread_count_hash_the_bytes_written(tmp_path: Path, algorithm: str,
                                                                threads: int) -> None:
    """BLAKE3 split across threads gives the one-thread digest; SHA-256 (the algorithm of
    manifests written before) still works."""
    data = os.urandom(2 * CHUNK_BYTES + 5)
    stream = open_direct(tmp_path / "shard.distcp", algorithm, threads=threads)  # type: ignore[arg-type]
    if stream is None:
        pytest.skip(f"{tmp_path} refuses O_DIRECT")
    _write_in_pieces(stream, data)
    stream.close()
    reference = blake3 if algorithm == "blake3" else hashlib.sha256
    assert stream.digest.hexdigest() == reference(data).hexdigest()


def test_a_write_the_file_system_refuses_goes_on_buffered(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real_pwrite = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct_write.os, "pwrite", pwrite)
    data = os.urandom(CHUNK_BYTES + 999)
    path = tmp_path / "shard.distcp"
    stream = _direct_or_skip(path)
    _write_in_pieces(stream, data)
    stream.close()
    assert refused == [0] and not stream.direct
    assert path.read_bytes() == data
    assert stream.digest.hexdigest() == blake3(data).hexdigest()


def test_no_direct_stream_where_open_refuses_o_direct(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(direct_write.os, "open", refuse)
    assert open_direct(tmp_path / "x") is None


def test_a_failed_write_is_raised_by_close_and_frees_the_file(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.EIO, "Input/output error")

    path = tmp_path / "shard.distcp"
    stream = _direct_or_skip(path)
    monkeypatch.setattr(direct_write.os, "pwrite", broken)
    stream.write(b"x" * 100)
    with pytest.raises(OSError, match="Input/output error"):
        stream.close()
    assert stream.closed
    with pytest.raises(OSError):
        os.fstat(stream.fileno())  # the descriptor was closed
