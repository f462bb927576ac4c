"""The one home of content digests: each algorithm gives the package's own digest, however it
is fed (whole, streamed, read ahead from a file) and on however many threads."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest
from blake3 import blake3

from trainyard.plugins.storage.hashing import CHUNK_BYTES, copy_hashing, digest_file, new_hasher

REFERENCE = {"blake3": blake3, "sha256": hashlib.sha256}


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
@pytest.mark.parametrize("size", [0, 1, 20_000, CHUNK_BYTES, 2 * CHUNK_BYTES + 17])
def test_every_way_of_hashing_gives_the_packages_digest(tmp_path: Path, algorithm: str,
                                                        size: int) -> None:
    data = os.urandom(size)
    expected = REFERENCE[algorithm](data).hexdigest()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert digest_file(path, algorithm, threads=2) == (size, expected)  # type: ignore[arg-type]
    out = io.BytesIO()
    assert copy_hashing(io.BytesIO(data), out, algorithm) == (size, expected)  # type: ignore[arg-type]
    assert out.getvalue() == data
    hasher = new_hasher(algorithm, threads=4)  # type: ignore[arg-type]
    for start in range(0, size, 3 << 20):
        hasher.update(memoryview(data)[start:start + (3 << 20)])
    assert hasher.hexdigest() == expected


def test_an_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="must be one of"):
        new_hasher("md5")  # type: ignore[arg-type]
