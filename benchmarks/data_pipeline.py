"""Data pipeline benchmark: the streaming reader against a plain sequential loop, in one run.

    .venv/bin/python benchmarks/data_pipeline.py [--dataset-mb 64] [--seq-len 256] [--steps 30] [--rounds 3]

Starts a real S3 endpoint (moto's server, in its own process as a remote store would be: in
this process it would compete for the GIL with the reader it serves) and writes a synthetic
JSONL dataset of `--dataset-mb` in ~1 MB shards (2 KB rows). Then, in this one run:

- `baseline_samples_s`: a plain sequential loop written out in this file (so it does not speed
  up when the pipeline does) that makes the *same* batches of 16: one `get_object` per shard
  in the epoch's order, `json.loads` per line, windows sliced one by one, blocks put in the
  pipeline's order — one epoch. The run first checks, untimed, that it and both streamed
  passes produce byte-identical batches (a SHA-256 over all of them), so the ratios compare
  like with like; the timed passes only make the batches;
- `sequential_stream_samples_s` (context): the pipeline's own parser and cutter fed by one
  sequential `get_object` per shard — what parsing alone gains, without overlap or cache;
- `fetch_only_samples_s` (context): the dataset's bytes alone, fetched as the pipeline fetches
  them (`ShardStream`: ranged GETs, three shards in flight) and thrown away — the most the
  endpoint and the client's HTTP stack deliver on this machine, the cold pass's ceiling;
- competitors and ceilings from `benchmarks/data_competitors.py`, same shards, same run:
  `dataloader_samples_s` — a `torch.utils.data.DataLoader` with `num_workers=2` (boto3
  `get_object`, orjson, the same tokenizer, the same windows and block shuffle);
  `parse_only_samples_s` — the same bytes from memory through the pipeline's own parser,
  tokenizer and cutter (the parse ceiling), beside the same with the parsers it was measured
  against (`parse_only_samples_s` by parser: `line_parse_only_samples_s` — orjson a line, what
  the pipeline used before; `pyarrow_parse_only_samples_s` — pyarrow's multi-threaded JSON
  reader, outside the GIL; `process_pool_parse_only_samples_s` — the pipeline's parser in two
  worker processes; each checked, untimed, to make the pipeline's token ids; `parse_only_cpu_s`
  the CPU seconds each pass cost, this process's and the pool's workers'); `mmap_samples_s` — the same batches cut from the
  same token ids in one memory-mapped file (the warm cache's ceiling; checked byte for byte
  against the baseline, untimed), and `mmap_verified_samples_s` the same after a hash of the
  file with the cache's hash, BLAKE3 (what the cache's check of a hit another process wrote
  costs on top);
- `stream_samples_s`: `StreamingReader` (cold cache: the next shards fetched by ranged GETs and
  tokenized as they arrive by other threads, their token ids stored in the cache, batches cut
  by a background thread into a bounded queue), the same batches;
- `stream_pyarrow_samples_s`, `stream_process_pool_samples_s`: the cold pass again with the
  reader's jsonl parser swapped for pyarrow's JSON reader, or for the pipeline's parser in the
  two-process pool (`data_competitors.jsonl_parser`) — the parse-only levers measured where
  the fetch, the cut and the cache's writes share the machine with them (each checked to make
  the pipeline's token ids, untimed, and the same number of samples); `stream_cpu_s_by_parser`
  the CPU seconds of each cold pass, this process's and the pool's workers' (`product`: the
  reader's own parser);
- `bpe_batched_mb_s`, `bpe_per_document_mb_s` (the tokenizer lever): one shard's documents
  (`BPE_ROWS` rows) encoded by a byte-level BPE tokenizer trained here on them, in the
  pipeline's one `encode_batch` call, or one `encode` per document (`bpe_*_cpu_s`: the CPU
  seconds each cost, the library's threads included; each round checks they gave the same ids);
- `stream_botocore_samples_s` (context): the cold pass again with the store's ranged GETs sent
  through botocore's `get_object` (the path behind a proxy) instead of presigned URLs over
  urllib3 (`S3Store._plain_http`) — what botocore's per-request cost takes from the cold pass;
- `cached_samples_s`: the same again on the warm cache: every shard's tokenized copy (stored by
  the cold pass as it parsed) a memory-mapped hit — no parsing, and no hashing either: this
  process wrote those files and knows their hashes (`trainyard.plugins.data.cache`: a process hashes a
  file once). Given the manifest, as a warm epoch of a run is (the reader lists once per
  run) and as the memory map is given its spans;
- `dp8_rank_vs_dp1_time` (context): on the warm cache, the seconds data-parallel rank 0 of 8
  takes for its eighth of the epoch (`cached_dp8_rank_s`) over the seconds one rank takes for all
  of it (`cached_dp1_s`), both given the manifest (listed once per run, not per rank and epoch:
  ~25 ms against moto here); 0.125 would mean a rank pays for its share only. With the default 8
  stripes it reads its stripe's shards only (`trainyard.plugins.data.stripes`);
  `dp8_one_stream_rank_vs_dp1_time` is the same with `stripes: 1`, where every rank walks the
  whole stream and keeps every 8th sample — each rank pays for the global batch;
- `peak_rss_mb`: the peak resident set of a child process streaming one epoch with a cache of a
  tenth of the dataset (`dataset_mb`), beside `peak_rss_quarter_mb` for a quarter of the data
  under the same cache (flat memory: the two are close), and `rss_start_mb` / `rss_end_mb` the
  same child's resident set after its first batch and after its last;
- `stall_fraction`: the tiny training job (the demo's Llama on CPU, one process) reading the demo
  dataset from the S3 endpoint through a cold cache for `--steps` steps: the time spent waiting
  for batches over the time of the steps, first step excluded (`first_batch_s` beside it: the
  listing and the first shard's fetch).

Where the cold pass's time goes: `stream_cpu_s` / `baseline_cpu_s` are this process's CPU
seconds (all threads) in one cold streamed / baseline pass, beside `stream_wall_s` /
`baseline_wall_s`, and `stream_endpoint_cpu_s` the endpoint process's CPU in the cold pass (moto
is the "remote" store, on this machine's cores); `fetch_only_cpu_s` / `fetch_only_endpoint_cpu_s`
the same for the fetch-only pass — on a machine whose cores are busy, a pass's wall time
follows the CPU it asks of them: `stream_cpu_ceiling_vs_fetch_only`, the ratio of the two
passes' CPU (fetch-only's over the cold pass's, endpoint included), is the most the cold pass
can reach against fetch-only there; on cores otherwise idle the most is its CPU spread over all
of them, perfectly overlapped (`stream_parallel_bound_vs_fetch_only`: fetch-only's wall time ×
cores / the cold pass's CPU); `missed` names these figures where the cold pass misses. CPU close to wall means the pass is bound by one
interpreter's CPU (the GIL), not by the endpoint or the network. `stream_thread_cpu_s` splits the
cold pass's CPU by the reader's threads (`thread_cpu`): `consumer` (this loop), `cut` (the
producer: windows, shuffle, batches), `prefetch` (tokenize and store each shard's tokens; a
shard of one chunk, as here, is fetched by that thread too) and `connections` (the ranged GETs
of larger shards) — where a cheaper pass would have to come from.

The throughputs are the medians of `--rounds` rounds (each round: baseline, sequential stream,
fetch only, parse only, DataLoader, cold stream, cold stream through botocore, warm cache,
memory map; `rounds` lists them all), so a burst of load from other processes does not decide
a ratio; the warm cache and both memory-map passes, ~60 ms each, run `WARM_REPEATS` (5) times
a round, interleaved, and the round keeps each one's median. Every figure is from the same run. `targets` holds issue 32's goals (cold stream ≥ 1.0×
the DataLoader and ≥ 0.8× the lower of the fetch-only and parse-only ceilings, whose name is
`binding_ceiling`; cached ≥ 0.8× the memory map; RSS flat — the quarter dataset's peak within
10 % of the full one's; stall < 5 %). Prints one JSON line, with `cpu_count` and the 1-minute
load average before and after (`load_avg_1m_start`, `load_avg_1m`). Issue 58's targets are
in `targets` beside issue 32's: cold stream ≥ 1.5× the DataLoader and ≥ 0.8× the lower ceiling,
cached ≥ 0.9× the memory map, RSS flat (the end within 10 % of the start); `missed` names, for
each one missed, the figure that binds it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.support.s3_server import S3Server
    from trainyard.plugins.data.manifest import ShardManifest

REPO = Path(__file__).resolve().parent.parent
DP_SHARE = 8
"""The data-parallel size of `dp8_rank_vs_dp1_time`."""
SHARD_ROWS, ROW_BYTES = 500, 2000
BPE_ROWS = 100
"""Rows (of one shard) the tokenizer lever encodes per pass: BPE on the benchmark's hex rows
runs at ~1-2 MB/s here, so a whole shard a pass would cost the run ~10 s."""
WARM_REPEATS = 5
"""Warm-cache and memory-map passes per round (their median is the round's figure)."""


@contextlib.contextmanager
def moto_process() -> Iterator[tuple[S3Server, int]]:
    """`python -m moto.server` on a free port, in a child process (and its pid); dummy credentials."""
    import urllib.request

    from tests.support.procs import free_port
    from tests.support.s3_server import CREDENTIALS, S3Server

    os.environ.update(CREDENTIALS)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"moto server did not answer at {url}")
        yield S3Server(url), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def sequential_baseline(store: object, seq_len: int, batch_size: int,
                        digest: hashlib._Hash | None = None) -> tuple[int, float]:
    """The plain way to make the same batches, written out here so it never changes with the
    pipeline: one `get_object` per shard in the epoch's order, `json.loads` per line, tokens
    in a bytearray, each window sliced, each block of 256 put in the pipeline's order (its
    `block_permutation`: the one definition of the order, not the pipeline's machinery), batches
    stacked into arrays (and added to `digest`, for the check). Returns (samples, seconds)."""
    import json

    import numpy as np

    from trainyard.plugins.data.manifest import list_manifest
    from trainyard.plugins.data.stream import ORDER_VERSION, block_permutation, epoch_order

    start = time.perf_counter()
    manifest = list_manifest(store, "jsonl")  # type: ignore[arg-type]
    span, samples = seq_len + 1, 0
    pending: list[bytes] = []
    for i in epoch_order(len(manifest.shards), 0, 0):
        key = manifest.shards[i].key
        tokens = bytearray()
        for line in store.get_bytes(key).splitlines():  # type: ignore[attr-defined]
            if line.strip():
                tokens += json.loads(line)["text"].encode("utf-8")
                tokens.append(0)
        windows = [bytes(tokens[k:k + span]) for k in range(0, len(tokens) - span + 1, seq_len)]
        for number, b in enumerate(range(0, len(windows), 256)):
            block = windows[b:b + 256]
            pending.extend(block[i] for i in block_permutation(len(block), 0, 0, key, number, ORDER_VERSION))
        done = 0
        while len(pending) - done >= batch_size:
            batch = np.frombuffer(b"".join(pending[done:done + batch_size]), np.uint8).reshape(batch_size, span)
            if digest is not None:
                digest.update(batch)
            samples += batch_size
            done += batch_size
        pending = pending[done:]
    return samples, time.perf_counter() - start


def sequential_stream(store: object, seq_len: int) -> tuple[int, float]:
    """The pipeline's own parser and cutter (`SampleStream`) fed by one whole-shard
    `get_object` at a time, no cache, no prefetch: what the overlap of I/O and parsing adds."""
    from trainyard.plugins.data.documents import ByteTokenizer
    from trainyard.plugins.data.manifest import list_manifest
    from trainyard.plugins.data.stream import SampleStream, StreamPosition

    start, samples = time.perf_counter(), 0
    manifest = list_manifest(store, "jsonl")  # type: ignore[arg-type]
    stream = SampleStream(manifest, lambda shard: io.BytesIO(store.get_bytes(shard.key)),  # type: ignore[attr-defined]
                          ByteTokenizer(), seq_len=seq_len, seed=0)
    for block in stream.blocks(StreamPosition()):
        if block.epoch > 0:
            break
        samples += len(block.windows)
    return samples, time.perf_counter() - start


THREAD_ROLES = (("MainThread", "consumer"), ("data-producer", "cut"), ("shard-prefetch", "prefetch"),
                ("shard-get", "connections"))
"""The reader's threads by the start of their names, as `stream_thread_cpu_s` names them."""


def thread_cpu() -> dict[str, float]:
    """CPU seconds each role's live threads (`THREAD_ROLES`; any other: `other`) have used so
    far, read from each thread's own CPU clock."""
    used: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except OSError:  # the thread ended meanwhile
            continue
        role = next((role for prefix, role in THREAD_ROLES if thread.name.startswith(prefix)), "other")
        used[role] = used.get(role, 0.0) + seconds
    return used


def streamed(store: object, seq_len: int, cache_dir: Path, cache_bytes: int, batch_size: int,
             batches: int, digest: hashlib._Hash | None = None,
             cpu: dict[str, float] | None = None, dp_size: int = 1,
             stripes: int | None = None, manifest: ShardManifest | None = None) -> tuple[int, float]:
    """The streaming reader (data-parallel rank 0 of `dp_size`), `batches` batches (added to
    `digest`, for the check); returns (samples, seconds). `cpu` is given the pass's CPU seconds
    by thread role (`thread_cpu`), read before the reader's threads end. With `manifest`, the
    reader does not list the dataset (as when its checkpoint or rank 0 gives it the manifest)."""
    from trainyard.plugins.data.cache import ShardCache
    from trainyard.plugins.data.reader import StreamingReader

    cache = ShardCache(cache_dir, cache_bytes)
    reader = StreamingReader(store, "jsonl", cache=cache, seq_len=seq_len, batch_size=batch_size,  # type: ignore[arg-type]
                             dp_rank=0, dp_size=dp_size, seed=0, stripes=stripes)
    reader.manifest = manifest
    before = thread_cpu()
    start, samples = time.perf_counter(), 0
    for _ in range(batches):
        batch = reader.next_batch().samples
        if digest is not None:
            digest.update(batch)
        samples += len(batch)
    seconds = time.perf_counter() - start
    if cpu is not None:
        cpu.update({role: used - before.get(role, 0.0) for role, used in thread_cpu().items()})
    reader.close()
    cache.close()
    return samples, seconds


def fetch_only(store: object, in_flight: int = 3) -> float:
    """Seconds to read every shard's bytes through `ShardStream`, `in_flight` shards at once."""
    from concurrent.futures import ThreadPoolExecutor

    from trainyard.plugins.data.cache import CHUNK_BYTES
    from trainyard.plugins.data.fetch import open_stream
    from trainyard.plugins.data.manifest import list_manifest

    start = time.perf_counter()
    manifest = list_manifest(store, "jsonl")  # type: ignore[arg-type]
    with ThreadPoolExecutor(8) as connections, ThreadPoolExecutor(in_flight) as shards:
        def read(shard: object) -> int:
            with open_stream(store, manifest, shard, connections, chunk_bytes=CHUNK_BYTES) as f:  # type: ignore[arg-type]
                return len(f.read())

        fetched = sum(shards.map(read, manifest.shards))
    assert fetched == manifest.total_bytes
    return time.perf_counter() - start


def child_rss(uri: str, endpoint: str, cache_dir: Path, cache_bytes: int, seq_len: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.support.stream_rss", "--uri", uri,
                           "--endpoint-url", endpoint, "--cache-dir", str(cache_dir),
                           "--cache-bytes", str(cache_bytes), "--seq-len", str(seq_len)],
                          cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def train_child(args: argparse.Namespace) -> int:
    """The tiny training job, one process, streaming the demo dataset; prints its stall figures."""
    import torch

    from trainyard.config.loader import load_spec_file
    from trainyard.worker.data import open_streaming_data
    from trainyard.worker.distributed.mesh import build_mesh
    from trainyard.worker.distributed.parallelize import parallelize
    from trainyard.worker.models.llama import Llama, LlamaConfig
    from trainyard.worker.session import SessionConfig, TrainingSession
    from trainyard.worker.step import train_step

    spec = load_spec_file(REPO / "config/jobs/demo-tiny-lm.yaml")
    config = dataclasses.replace(SessionConfig.from_env({}, spec=spec, world_size=1),
                                 checkpoint_interval_steps=None, checkpoint_interval_s=None)
    hints, plan = spec.spec.parallelism.hints, config.plan
    assert hints is not None
    stalls, steps = [], []
    with TrainingSession(config):
        torch.manual_seed(0)
        model = parallelize(Llama(LlamaConfig.from_hints(hints)), plan, build_mesh(plan, "cpu"),
                            precision=hints.mixed_precision)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = plan.micro_batch_size * plan.num_micro_batches
        data = open_streaming_data(spec.spec.dataset.source, object_store=config.object_store,
                                   seq_len=hints.sequence_length, batch_size=batch, dp_rank=0,
                                   dp_size=1, seed=0, endpoint_url=config.endpoint_url)
        for _ in range(args.steps):
            t0 = time.perf_counter()
            inputs, targets = data.next_batch()
            t1 = time.perf_counter()
            train_step(model, optimizer, None, inputs, targets)
            stalls.append(t1 - t0)
            steps.append(time.perf_counter() - t0)
        metrics = data.metrics()
        data.close()
    print(json.dumps({"first_batch_s": stalls[0], "stall_s": sum(stalls[1:]), "step_s": sum(steps[1:]),
                      "data": metrics}))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset-mb", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=256)
    # 30, not 60: the training child was half the run (76 s of 150 at load 7 on 2 cores, the
    # other half every pass above), and the run must stay under 3 minutes on a busy machine.
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    if args.train_child:
        return train_child(args)

    import numpy as np

    from benchmarks import data_competitors as rivals
    from tests.support.datasets import write_jsonl_dataset
    from trainyard.plugins.data.manifest import list_manifest
    from trainyard.plugins.data.stream import epoch_order
    from trainyard.plugins.run import processes
    from trainyard.plugins.storage.store import S3Store, open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    load_start = os.getloadavg()[0]
    shards = max(4, args.dataset_mb)  # ~1 MB each
    with moto_process() as (server, endpoint_pid), tempfile.TemporaryDirectory(prefix="data-pipeline-") as tmp:
        root = Path(tmp)
        bucket = server.new_bucket("bench")
        full = S3Store(bucket, "full", endpoint_url=server.endpoint_url)
        quarter = S3Store(bucket, "quarter", endpoint_url=server.endpoint_url)
        dataset_bytes = write_jsonl_dataset(full, shards=shards, rows=SHARD_ROWS, row_bytes=ROW_BYTES)
        quarter_bytes = write_jsonl_dataset(quarter, shards=shards // 4, rows=SHARD_ROWS, row_bytes=ROW_BYTES)

        batch = 16
        # The check, untimed: the baseline and both streamed passes make byte-identical batches
        # (so the ratios compare like with like). Hashing inside the timed loops would cost the
        # warm pass more than the pipeline itself, mostly in GIL hand-overs between its threads.
        digests = {name: hashlib.sha256() for name in ("baseline", "stream", "cached")}
        base_n, _ = sequential_baseline(full, args.seq_len, batch, digests["baseline"])
        for name in ("stream", "cached"):  # cold, then warm
            streamed(full, args.seq_len, root / "check", 2 * dataset_bytes, batch, base_n // batch, digests[name])
        shutil.rmtree(root / "check")
        listed = list_manifest(full, "jsonl")
        blobs = {shard.key: full.get_bytes(shard.key) for shard in listed.shards}
        token_file = root / "tokens.u8"
        spans = rivals.write_token_file(listed, blobs, token_file)
        digests["mmap"] = hashlib.sha256()
        rivals.mmap_pass(token_file, spans, args.seq_len, batch, digests["mmap"])
        if len({d.hexdigest() for d in digests.values()}) != 1:
            raise RuntimeError("the passes read different samples: the comparison would be unfair")
        keys = [shard.key for shard in listed.shards]
        order = [keys[i] for i in epoch_order(len(keys), 0, 0)]

        rivals.check_parsers(listed, blobs)
        pool = rivals.parser_pool()
        texts = [json.loads(line)["text"] for line in blobs[keys[0]].splitlines()[:BPE_ROWS]]
        bpe = rivals.bpe_tokenizer(texts)
        bpe_mb = sum(len(t.encode()) for t in texts) / 2**20
        bpe_rates: dict[str, list[float]] = {"batched": [], "per_document": []}
        bpe_cpu: dict[str, list[float]] = {"batched": [], "per_document": []}
        rates: dict[str, list[float]] = {"baseline": [], "sequential_stream": [], "fetch_only": [],
                                         "parse_only": [], "line_parse_only": [], "pyarrow_parse_only": [],
                                         "process_pool_parse_only": [], "dataloader": [], "stream": [],
                                         "stream_botocore": [], "stream_pyarrow": [],
                                         "stream_process_pool": [], "cached": [], "mmap": [],
                                         "mmap_verified": []}
        botocore_path = S3Store(bucket, "full", endpoint_url=server.endpoint_url)
        botocore_path.__dict__["_plain_http"] = None  # as behind a proxy: get_object
        cpu: dict[str, list[float]] = {"baseline": [], "stream": [], "stream_endpoint": [], "fetch_only": [],
                                       "fetch_only_endpoint": []}
        parse_cpu: dict[str, list[float]] = {parser: [] for parser in rivals.PARSERS}
        cold_cpu: dict[str, list[float]] = {parser: [] for parser in ("product", "pyarrow", "process_pool")}
        by_thread: dict[str, list[float]] = {}
        # On the warm cache, given the manifest: one rank's epoch, and rank 0 of DP_SHARE's share of it
        # (default stripes, and one stream).
        share_s: dict[str, list[float]] = {"dp1": [], "dp8": [], "dp8_one_stream": []}
        for r in range(args.rounds):  # each round: every pass once, interleaved
            own = time.process_time()
            base_n, base_s = sequential_baseline(full, args.seq_len, batch)
            cpu["baseline"].append(time.process_time() - own)
            seq_n, seq_s = sequential_stream(full, args.seq_len)
            own, endpoint = time.process_time(), processes.cpu_seconds(endpoint_pid)
            fetch_s = fetch_only(full)
            cpu["fetch_only"].append(time.process_time() - own)
            after = processes.cpu_seconds(endpoint_pid)
            if endpoint is not None and after is not None:
                cpu["fetch_only_endpoint"].append(after - endpoint)
            for parser in rivals.PARSERS:  # the pipeline's first
                before = _parse_cpu(pool)
                n, seconds = rivals.parse_only_pass(listed, blobs, args.seq_len, parser, pool)
                parse_cpu[parser].append(_parse_cpu(pool) - before)
                if parser == "product":
                    parse_n, parse_s = n, seconds
                elif n != parse_n:
                    raise RuntimeError(f"the {parser} parser made {n} samples, the pipeline's {parse_n}")
                else:
                    rates[f"{parser}_parse_only"].append(n / seconds)
            loader_n, loader_s = rivals.dataloader_pass(bucket, "full", order, server.endpoint_url,
                                                        args.seq_len, batch)
            cache_dir = root / f"cache-{r}"
            own, endpoint = time.process_time(), processes.cpu_seconds(endpoint_pid)
            cold_before = _parse_cpu(pool)
            roles: dict[str, float] = {}
            stream_n, stream_s = streamed(full, args.seq_len, cache_dir, 2 * dataset_bytes, batch, base_n // batch,
                                          cpu=roles)
            for role, seconds in roles.items():
                by_thread.setdefault(role, []).append(seconds)
            cpu["stream"].append(time.process_time() - own)
            cold_cpu["product"].append(_parse_cpu(pool) - cold_before)
            after = processes.cpu_seconds(endpoint_pid)
            if endpoint is not None and after is not None:
                cpu["stream_endpoint"].append(after - endpoint)
            boto_n, boto_s = streamed(botocore_path, args.seq_len, root / f"cache-boto-{r}", 2 * dataset_bytes, batch,
                                      base_n // batch)
            shutil.rmtree(root / f"cache-boto-{r}")
            for parser in ("pyarrow", "process_pool"):  # the levers, inside the reader
                cold_before = _parse_cpu(pool)
                with rivals.jsonl_parser(parser, pool):
                    n, seconds = streamed(full, args.seq_len, root / f"cache-{parser}-{r}", 2 * dataset_bytes,
                                          batch, base_n // batch)
                cold_cpu[parser].append(_parse_cpu(pool) - cold_before)
                shutil.rmtree(root / f"cache-{parser}-{r}")
                if n != stream_n:
                    raise RuntimeError(f"the cold pass with the {parser} parser made {n} samples, not {stream_n}")
                rates[f"stream_{parser}"].append(n / seconds)
            ids = {}
            for way in ("batched", "per_document"):
                ids[way], seconds, used = rivals.bpe_pass(bpe, texts, way == "batched")
                bpe_rates[way].append(bpe_mb / seconds)
                bpe_cpu[way].append(used)
            if not np.array_equal(ids["batched"], ids["per_document"]):
                raise RuntimeError("batched and per-document BPE encoding gave different ids")
            # The warm passes take ~60 ms each: one of each per round swung by ±25 %, so each
            # round runs WARM_REPEATS of each, interleaved, and keeps their median.
            warm: dict[str, list[float]] = {"cached": [], "mmap": [], "mmap_verified": []}
            for _ in range(WARM_REPEATS):
                cached_n, seconds = streamed(full, args.seq_len, cache_dir, 2 * dataset_bytes, batch,
                                             base_n // batch, manifest=listed)
                warm["cached"].append(seconds)
                mmap_n, seconds = rivals.mmap_pass(token_file, spans, args.seq_len, batch)
                warm["mmap"].append(seconds)
                verified_n, seconds = rivals.mmap_pass(token_file, spans, args.seq_len, batch, verify=True)
                warm["mmap_verified"].append(seconds)
            cached_s, mmap_s, verified_s = (statistics.median(warm[k]) for k in ("cached", "mmap", "mmap_verified"))
            for name, dp, stripes in (("dp1", 1, None), ("dp8", DP_SHARE, None), ("dp8_one_stream", DP_SHARE, 1)):
                share_s[name].append(streamed(full, args.seq_len, cache_dir, 2 * dataset_bytes, batch,
                                              base_n // (batch * dp), dp_size=dp, stripes=stripes,
                                              manifest=listed)[1])
            if not 0 <= seq_n - base_n < batch:
                raise RuntimeError(f"the sequential stream read {seq_n} samples, the baseline {base_n}")
            for name, n, seconds in (("baseline", base_n, base_s), ("sequential_stream", seq_n, seq_s),
                                     ("fetch_only", base_n, fetch_s), ("stream", stream_n, stream_s),
                                     ("stream_botocore", boto_n, boto_s),
                                     ("cached", cached_n, cached_s), ("parse_only", parse_n, parse_s),
                                     ("dataloader", loader_n, loader_s), ("mmap", mmap_n, mmap_s),
                                     ("mmap_verified", verified_n, verified_s)):
                rates[name].append(n / seconds)
            shutil.rmtree(cache_dir)
        pool.shutdown()
        median = {name: statistics.median(values) for name, values in rates.items()}
        share = {name: statistics.median(values) for name, values in share_s.items()}
        cache_bytes = dataset_bytes // 10
        big = child_rss(full.uri, server.endpoint_url, root / "rss-full", cache_bytes, args.seq_len)
        small = child_rss(quarter.uri, server.endpoint_url, root / "rss-quarter", cache_bytes, args.seq_len)

        objects = f"s3://{bucket}/objects"
        prepare_demo_dataset(open_store(objects, endpoint_url=server.endpoint_url).child(DEMO_PREFIX.rstrip("/")))
        env = dict(os.environ, PYTHONPATH=str(REPO), TRAINYARD_HOME=str(root / "home"),
                   TRAINYARD_OBJECT_STORE=objects, TRAINYARD_S3_ENDPOINT_URL=server.endpoint_url)
        for name in ("RANK", "WORLD_SIZE", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "TRAINYARD_JOB"):
            env.pop(name, None)
        done = subprocess.run([sys.executable, __file__, "--train-child", "--steps", str(args.steps)],
                              cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            return done.returncode
        train = json.loads(done.stdout.strip().splitlines()[-1])

    result = {
        "stream_samples_s": round(median["stream"], 1),
        "baseline_samples_s": round(median["baseline"], 1),
        "sequential_stream_samples_s": round(median["sequential_stream"], 1),
        "fetch_only_samples_s": round(median["fetch_only"], 1),
        "stream_botocore_samples_s": round(median["stream_botocore"], 1),
        "stream_pyarrow_samples_s": round(median["stream_pyarrow"], 1),
        "stream_process_pool_samples_s": round(median["stream_process_pool"], 1),
        "bpe_batched_mb_s": round(statistics.median(bpe_rates["batched"]), 2),
        "bpe_per_document_mb_s": round(statistics.median(bpe_rates["per_document"]), 2),
        "bpe_batched_cpu_s": round(statistics.median(bpe_cpu["batched"]), 3),
        "bpe_per_document_cpu_s": round(statistics.median(bpe_cpu["per_document"]), 3),
        "bpe_mb": round(bpe_mb, 2),
        "dataloader_samples_s": round(median["dataloader"], 1),
        "parse_only_samples_s": round(median["parse_only"], 1),
        "line_parse_only_samples_s": round(median["line_parse_only"], 1),
        "pyarrow_parse_only_samples_s": round(median["pyarrow_parse_only"], 1),
        "process_pool_parse_only_samples_s": round(median["process_pool_parse_only"], 1),
        "mmap_samples_s": round(median["mmap"], 1),
        "mmap_verified_samples_s": round(median["mmap_verified"], 1),
        "cached_samples_s": round(median["cached"], 1),
        "peak_rss_mb": big["peak_rss_mb"],
        "dataset_mb": round(dataset_bytes / 2**20, 1),
        "stall_fraction": round(train["stall_s"] / train["step_s"], 4),
        "peak_rss_quarter_mb": small["peak_rss_mb"],
        "rss_start_mb": big["rss_start_mb"],
        "rss_end_mb": big["rss_end_mb"],
        "quarter_dataset_mb": round(quarter_bytes / 2**20, 1),
        "rss_cache_mb": round(cache_bytes / 2**20, 1),
        "samples_per_epoch": base_n,
        "seq_len": args.seq_len,
        "first_batch_s": round(train["first_batch_s"], 3),
        "train_steps": args.steps,
        "train_cache_hit_rate": train["data"].get("cache_hit_rate"),
        "stream_vs_baseline": round(median["stream"] / median["baseline"], 2),
        "cached_vs_baseline": round(median["cached"] / median["baseline"], 2),
        "cached_dp1_s": round(share["dp1"], 3),
        "cached_dp8_rank_s": round(share["dp8"], 3),
        "dp8_rank_vs_dp1_time": round(share["dp8"] / share["dp1"], 3),
        "cached_dp8_one_stream_rank_s": round(share["dp8_one_stream"], 3),
        "dp8_one_stream_rank_vs_dp1_time": round(share["dp8_one_stream"] / share["dp1"], 3),
        "fetch_only_vs_baseline": round(median["fetch_only"] / median["baseline"], 2),
        "stream_botocore_vs_baseline": round(median["stream_botocore"] / median["baseline"], 2),
        "stream_cpu_s": round(statistics.median(cpu["stream"]), 3),
        "stream_wall_s": round(base_n / median["stream"], 3),
        "stream_endpoint_cpu_s": round(statistics.median(cpu["stream_endpoint"]), 3) if cpu["stream_endpoint"] else None,
        "fetch_only_cpu_s": round(statistics.median(cpu["fetch_only"]), 3),
        "fetch_only_endpoint_cpu_s": (round(statistics.median(cpu["fetch_only_endpoint"]), 3)
                                      if cpu["fetch_only_endpoint"] else None),
        "stream_thread_cpu_s": {role: round(statistics.median(v), 3) for role, v in sorted(by_thread.items())},
        "baseline_cpu_s": round(statistics.median(cpu["baseline"]), 3),
        "parse_only_cpu_s": {parser: round(statistics.median(v), 3) for parser, v in parse_cpu.items()},
        "stream_cpu_s_by_parser": {parser: round(statistics.median(v), 3) for parser, v in cold_cpu.items()},
        "baseline_wall_s": round(base_n / median["baseline"], 3),
        "rounds": {name: [round(v) for v in values] for name, values in rates.items()},
        "cpu_count": os.cpu_count(),
        "load_avg_1m_start": round(load_start, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    result["bpe_batched_vs_per_document"] = round(result["bpe_batched_mb_s"] / result["bpe_per_document_mb_s"], 2)
    result.update(_against_competitors(median, big, small, result["stall_fraction"], result))
    print(json.dumps(result))
    return 0


def _parse_cpu(pool: object) -> float:
    """CPU seconds so far of this process (all threads) and of the parser pool's workers: what a
    parse-only pass costs the machine, whichever parser (its wall time, on a loaded machine, also
    rewards the parser with more threads with a larger share of the cores)."""
    from trainyard.plugins.run import processes

    workers = getattr(pool, "_processes", None) or {}
    return time.process_time() + sum(processes.cpu_seconds(pid) or 0.0 for pid in workers)


def _against_competitors(median: dict[str, float], big: dict[str, float], small: dict[str, float],
                         stall: float, figures: dict[str, object]) -> dict[str, object]:
    """Issue 32's and issue 58's ratios and targets; the lower of the two cold-pass ceilings
    binds, and each target missed is named with the figure that binds it (`missed`) — for the
    cold pass, beside the ceiling, the CPU it and the fetch-only pass ask of the machine's cores
    (this process's and the endpoint's, from `figures`) and the load they were shared at."""
    ceilings = {"fetch_only": median["fetch_only"], "parse_only": median["parse_only"]}
    binding = min(ceilings, key=ceilings.__getitem__)
    rss_full, rss_quarter = big["peak_rss_mb"], small["peak_rss_mb"]
    ratios = {
        "stream_vs_dataloader": median["stream"] / median["dataloader"],
        "stream_vs_lower_ceiling": median["stream"] / ceilings[binding],
        "stream_vs_parse_only": median["stream"] / median["parse_only"],
        "stream_vs_fetch_only": median["stream"] / median["fetch_only"],
        "cached_vs_mmap": median["cached"] / median["mmap"],
        "cached_vs_mmap_verified": median["cached"] / median["mmap_verified"],
        "dataloader_vs_baseline": median["dataloader"] / median["baseline"],
        "rss_quarter_vs_full": rss_quarter / rss_full,
        "rss_end_vs_start": big["rss_end_mb"] / big["rss_start_mb"],
        "parse_only_vs_line_parse_only": median["parse_only"] / median["line_parse_only"],
        "parse_only_vs_pyarrow_parse_only": median["parse_only"] / median["pyarrow_parse_only"],
        "parse_only_vs_process_pool_parse_only": median["parse_only"] / median["process_pool_parse_only"],
        "stream_pyarrow_vs_stream": median["stream_pyarrow"] / median["stream"],
        "stream_process_pool_vs_stream": median["stream_process_pool"] / median["stream"],
    }
    cpu = {name: (figures[f"{name}_cpu_s"], figures[f"{name}_endpoint_cpu_s"]) for name in ("stream", "fetch_only")}
    if None not in cpu["stream"] + cpu["fetch_only"]:
        # Where the cores are the limit, a pass's rate goes as 1 / the CPU it asks of them: the
        # most the cold pass can reach against the fetch-only pass on a busy machine.
        ratios["stream_cpu_ceiling_vs_fetch_only"] = sum(cpu["fetch_only"]) / sum(cpu["stream"])  # type: ignore[arg-type]
        # With the cores otherwise idle, a pass cannot end before its CPU spread over all of them
        # (perfect overlap of its threads and the endpoint): the most the cold pass can reach then.
        fetch_only_wall = figures["samples_per_epoch"] / median["fetch_only"]  # type: ignore[operator]
        ratios["stream_parallel_bound_vs_fetch_only"] = \
            fetch_only_wall * (os.cpu_count() or 1) / sum(cpu["stream"])  # type: ignore[arg-type]
    cold = (f"{binding}_samples_s {ceilings[binding]:.0f}; CPU a pass (this process + endpoint): cold stream "
            f"{cpu['stream'][0]} + {cpu['stream'][1]}, fetch only {cpu['fetch_only'][0]} + {cpu['fetch_only'][1]}, "
            f"on {os.cpu_count()} cores at load {figures['load_avg_1m_start']}->{figures['load_avg_1m']}: "
            f"CPU-bound, the cold pass can reach {ratios.get('stream_cpu_ceiling_vs_fetch_only', float('nan')):.2f}x "
            f"fetch-only on busy cores, {ratios.get('stream_parallel_bound_vs_fetch_only', float('nan')):.2f}x on idle "
            "ones (its CPU over all of them, perfectly overlapped)")
    targets = {
        "stream_ge_1.0x_dataloader": ratios["stream_vs_dataloader"] >= 1.0,
        "stream_ge_0.8x_lower_ceiling": ratios["stream_vs_lower_ceiling"] >= 0.8,
        "cached_ge_0.8x_mmap": ratios["cached_vs_mmap"] >= 0.8,
        "rss_flat_within_10pct": ratios["rss_quarter_vs_full"] >= 0.9,
        "stall_lt_5pct": stall < 0.05,
        "stream_ge_1.5x_dataloader": ratios["stream_vs_dataloader"] >= 1.5,
        "cached_ge_0.9x_mmap": ratios["cached_vs_mmap"] >= 0.9,
        "rss_end_within_10pct_of_start": ratios["rss_end_vs_start"] <= 1.1,
    }
    binds = {  # what holds each target down, with its figure
        "stream_ge_1.0x_dataloader": f"dataloader_samples_s {median['dataloader']:.0f}",
        "stream_ge_1.5x_dataloader": f"dataloader_samples_s {median['dataloader']:.0f}",
        "stream_ge_0.8x_lower_ceiling": cold,
        "cached_ge_0.8x_mmap": f"mmap_samples_s {median['mmap']:.0f}",
        "cached_ge_0.9x_mmap": f"mmap_samples_s {median['mmap']:.0f}",
        "rss_flat_within_10pct": f"peak_rss_mb {rss_full} vs quarter {rss_quarter}",
        "rss_end_within_10pct_of_start": f"rss_start_mb {big['rss_start_mb']} rss_end_mb {big['rss_end_mb']}",
        "stall_lt_5pct": f"stall_fraction {stall}",
    }
    return {
        **{k: round(v, 2) for k, v in ratios.items()},
        "binding_ceiling": binding,
        "binding_ceiling_samples_s": round(ceilings[binding], 1),
        "targets": targets,
        "missed": {name: binds[name] for name, met in targets.items() if not met},
    }


if __name__ == "__main__":
    sys.exit(main())
