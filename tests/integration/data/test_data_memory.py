"""A dataset larger than the cache streams from a real S3 endpoint (moto's server) with bounded
memory: the peak resident set of a process that streams a whole epoch does not grow with the
dataset. Each stream runs in its own process and reports its own peak (`VmHWM`: a child's
`ru_maxrss` would be pytest's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.datasets import write_jsonl_dataset
from tests.support.procs import REPO_ROOT
from tests.support.s3_server import running_s3_server
from trainyard.plugins.storage.store import S3Store

pytestmark = pytest.mark.slow

SHARD_ROWS, ROW_BYTES = 500, 1000
"""~0.5 MB shards."""


def stream_epoch(uri: str, endpoint: str, cache_dir: Path, cache_bytes: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.stream_rss", "--uri", uri, "--endpoint-url", endpoint,
         "--cache-dir", str(cache_dir), "--cache-bytes", str(cache_bytes)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_peak_memory_does_not_grow_with_the_dataset(tmp_path: Path) -> None:
    with running_s3_server() as server:
        bucket = server.new_bucket("data")
        sizes = {}
        for name, shards in (("small", 6), ("large", 30)):
            store = S3Store(bucket, name, endpoint_url=server.endpoint_url)
            sizes[name] = write_jsonl_dataset(store, shards=shards, rows=SHARD_ROWS, row_bytes=ROW_BYTES)
        cache_bytes = sizes["small"] // 2  # both datasets are larger than the cache
        small = stream_epoch(f"s3://{bucket}/small", server.endpoint_url, tmp_path / "c1", cache_bytes)
        large = stream_epoch(f"s3://{bucket}/large", server.endpoint_url, tmp_path / "c2", cache_bytes)
    assert large["samples"] > 4 * small["samples"]
    assert large["cache"]["cache_evictions"] > 0 and large["cache"]["cache_bytes_fetched"] >= sizes["large"]
    growth_mb = large["peak_rss_mb"] - small["peak_rss_mb"]
    extra_data_mb = (sizes["large"] - sizes["small"]) / 2**20
    # Holding the data would add at least the extra bytes (windows as Python objects: more);
    # streaming adds noise only (0.5 MB here). A relative bound: a quarter of the extra data.
    assert growth_mb < 0.25 * extra_data_mb, (
        f"peak RSS grew by {growth_mb:.1f} MB for {extra_data_mb:.1f} MB more data: {small} {large}")
