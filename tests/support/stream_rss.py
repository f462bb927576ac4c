"""Stream one epoch of a dataset through `StreamingReader` in this process and print one JSON
line: `{"samples", "peak_rss_mb", "rss_start_mb", "rss_end_mb", "seconds", "cache": {...}}` (the
resident set after the first batch and after the last: flat memory keeps them close). Run as a
child process by the memory test and `benchmarks/data_pipeline.py`, so its peak resident set is
its own.

    python -m tests.support.stream_rss --uri s3://bucket/ds --endpoint-url URL \\
        --cache-dir DIR --cache-bytes N [--seq-len 256] [--batch 16] [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--endpoint-url")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--cache-bytes", type=int, required=True)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=1)
    args = p.parse_args(argv)

    from tests.support.memory import peak_rss_mb, rss_mb
    from trainyard.plugins.data.cache import ShardCache
    from trainyard.plugins.data.reader import StreamingReader
    from trainyard.plugins.storage.store import open_store

    store = open_store(args.uri, endpoint_url=args.endpoint_url)
    cache = ShardCache(args.cache_dir, args.cache_bytes)
    reader = StreamingReader(store, "jsonl", cache=cache, seq_len=args.seq_len, batch_size=args.batch,
                             dp_rank=0, dp_size=1, seed=0)
    start = time.perf_counter()
    samples = len(reader.next_batch().samples)
    rss_start = rss_mb()
    while reader.position.epoch < args.epochs:
        samples += len(reader.next_batch().samples)
    seconds = time.perf_counter() - start
    rss_end = rss_mb()
    reader.close()
    cache.close()
    print(json.dumps({"samples": samples, "peak_rss_mb": round(peak_rss_mb(), 1),
                      "rss_start_mb": round(rss_start, 1), "rss_end_mb": round(rss_end, 1),
                      "seconds": round(seconds, 3), "cache": cache.stats.as_metrics()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
