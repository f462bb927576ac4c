"""Stream training metrics to MLflow from inside the training process, without slowing it.

Rank 0 calls `MetricsStreamer.log(step, {...})` every step. The call only puts one tuple on an
in-memory queue; a background thread turns the queue into `MlflowClient.log_batch` calls of at
most `max_batch` points (MLflow refuses more than 1000 metrics per batch), every
`flush_every_s` seconds or as soon as a batch is full.

Why not `mlflow.log_metric` in the loop: each call is a round trip (a SQLite commit or an HTTP
request), i.e. milliseconds per metric on the training hot path, and an exception when the
tracking server blips. The seed (§1) asks for best-effort metrics: a point lost during a server
outage is acceptable, a training step blocked or crashed by tracking is not. So:

- `log()` never blocks and never raises. When the queue is full (the server has been down long
  enough for `max_queue` calls to pile up) the new point is dropped and counted; a warning
  with the running count is logged at 1, 10, 100, … drops, not once per drop.
- Transient errors (server unavailable, database locked, connection refused) are retried with
  tenacity (exponential backoff with jitter); a batch that still fails, or fails for a
  non-transient reason (deleted run, invalid value), is dropped and counted, and the thread
  carries on with the next one.
- Invalid metric names and values that are not numbers are dropped one by one in the thread,
  so one bad key never sinks the batch it travels in.
- `close()` flushes what is left within a deadline and reports what could not be sent.

**Replayed steps.** A resumed attempt restarts from its checkpoint and trains again the steps
the failed attempt had already logged (checkpoint at 100, crash at 120: steps 101–120 twice).
MLflow cannot delete a point, and two `loss` values at one step draw a zig-zag. So, by
default (`mark_replay=True`), the streamer reads once, when it starts, the last step each key
already has in the run, and logs a point at or below it as `<key>.replay`: `loss` keeps one
value per step (the first attempt's, the one the crash interrupted), and `loss.replay` shows
the recomputed stretch beside it — which, for a deterministic resume, overlays it exactly.

mlflow is imported in the background thread: importing it costs about a second, which a
training process should not pay before its first step, and importing this module stays cheap.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState

from trainyard.plugins.retry import policy

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

logger = logging.getLogger(__name__)

MLFLOW_MAX_METRICS_PER_BATCH = 1000
"""`mlflow.utils.validation.MAX_METRICS_PER_BATCH`: the server refuses larger batches."""

TRANSIENT_ERROR_CODES = frozenset({
    "TEMPORARILY_UNAVAILABLE",  # SQLAlchemy OperationalError (e.g. "database is locked"), HTTP 503
    "INTERNAL_ERROR",  # what the REST client raises once its own connection retries are spent
    "DEADLINE_EXCEEDED",
    "REQUEST_LIMIT_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "ABORTED",
})
"""MLflow error codes worth retrying; anything else (INVALID_PARAMETER_VALUE,
RESOURCE_DOES_NOT_EXIST, …) will fail the same way again."""

EXIT_FLUSH_S = 20.0
"""How long a process that exits without closing its streamer waits for the unsent points. Inside
torchrun's 30 s between the SIGTERM to a failed gang's survivors and its SIGKILL; 5 s lost every
point of a rank that crashed before its streamer's thread had imported mlflow on a loaded node (a
killed peer's survivor, 25 steps into the run: the loss of steps 1-10, which no attempt trains
again, was missing). Waits only while something is unsent."""

REPLAY_SUFFIX = ".replay"
"""Name suffix of the points of a step the run had already logged (a resumed attempt's replay).
A suffix, not a prefix: MLflow sorts `loss.replay` right after `loss`, where a `replay/` prefix
made a section of its own above the Model metrics (seen in Chromium)."""


def replay_key(key: str) -> str:
    """The key of `key`'s replayed points: `loss` → `loss.replay`."""
    return key + REPLAY_SUFFIX


def is_replay(key: str) -> bool:
    return key.endswith(REPLAY_SUFFIX)

SYSTEM_PREFIX = "system/"
"""MLflow's prefix for the run page's System metrics tab (its UI files every key under it there,
drawn against wall time; everything else is on the Model metrics tab)."""
AUXILIARY_PREFIXES = ("checkpoint/", "data/", "data_quality/", "recovery/")
AUXILIARY_NAMES = frozenset({"checkpoint_blocking_s", "data_stall_s", "recovery_events", "trainyard.attempt"})
"""The platform's own series: checkpoints, the data pipeline, recoveries, attempts; and the cost
figures (`cost.RUN_COST_METRICS`, one point each at step 0: a table column, not a curve)."""

RENAMED = {"grad_norm": "total_grad_norm"}
"""Training series whose MLflow key is not the name the worker gives them. MLflow sorts a tab's
charts by key, in code-point order, and `loss` is to be the first chart a person sees on a run's
page: `grad_norm` sorted before it. It is the total norm of the parameters' gradients (what
`clip_grad_norm_` returns), as its key now says."""


def series_key(name: str) -> str:
    """The MLflow key of a series: the platform's auxiliary ones under `system/`, the training's
    own (`loss`, `lr`, `tokens_per_s`, a script's `report(**metrics)`) as they are but for
    `RENAMED`.

    Why: MLflow 3.17's run page sorts the Model metrics tab into sections by key prefix, every
    prefixed section first (alphabetically) and the unprefixed `loss` last (issue 57: `loss` came
    after `checkpoint/loss`, `checkpoint/step` and flat `data/cache_*` charts), and it keeps a
    chart layout only in the browser's local storage, so no layout can be saved for a person.
    Under `system/` the platform's series fold into the System metrics tab and the Model metrics
    tab holds the training's curves alone, `loss` first (seen in Chromium:
    `tests/integration/tracking/test_mlflow_ui.py`). One level under it (`checkpoint/step` →
    `system/checkpoint.step`): the experiment's chart comparison makes a section of every
    `system/<group>/` and puts those sections above Model metrics."""
    if name in RENAMED:
        return RENAMED[name]
    if name.startswith(SYSTEM_PREFIX) or not (
            name in AUXILIARY_NAMES or name.startswith(AUXILIARY_PREFIXES) or name in _cost_names()):
        return name
    return SYSTEM_PREFIX + name.replace("/", ".")


@functools.cache
def _cost_names() -> frozenset[str]:
    from trainyard.plugins.tracking.cost import RUN_COST_METRICS  # pydantic models: not at import

    return frozenset(RUN_COST_METRICS)


@dataclass(frozen=True)
class StreamerStats:
    """What happened to the points given to `log()` so far (one point = one key at one step)."""

    logged: int
    """Points accepted by `log()` (queued)."""
    sent: int
    """Points the tracking store acknowledged."""
    dropped: int
    """Points refused by `log()` (queue full, streamer closed) or skipped in the thread
    (invalid name, value not a number)."""
    failed: int
    """Points in batches the store refused, or that failed after every retry."""
    pending: int
    """Points still in memory (queued or being sent); non-zero after a `close()` that timed out."""
    replayed: int = 0
    """Points of steps the run already had, logged as `replay/<key>` (see the module docstring)."""


class _Stop:
    """Queue sentinel: flush everything and end the thread."""


@dataclass
class _Flush:
    """Queue marker: flush everything queued before this marker, then set `done`."""

    done: threading.Event


def is_transient(error: BaseException) -> bool:
    """True for errors a retry may cure: MLflow's unavailable/internal codes, lost connections."""
    code = getattr(error, "error_code", None)
    if isinstance(code, str):
        return code in TRANSIENT_ERROR_CODES
    # requests' ConnectionError/Timeout, socket errors and TimeoutError are all OSErrors.
    return isinstance(error, OSError)


class MetricsStreamer:
    """Asynchronous, batched metrics logging to one MLflow run.

    Use one streamer per process (rank 0), as a context manager or with an explicit `close()`.
    If the process forgets to close it (a rank that dies of an exception), an `atexit` hook
    flushes for up to `EXIT_FLUSH_S`.
    """

    def __init__(
        self,
        tracking_uri: str,
        run_id: str,
        *,
        flush_every_s: float = 5.0,
        max_batch: int = 1000,
        max_queue: int = 100_000,
        retry_attempts: int = 5,
        retry_max_wait_s: float = 10.0,
        mark_replay: bool = True,
    ) -> None:
        if not tracking_uri:
            raise ValueError(f"tracking_uri must be a tracking store URI, got {tracking_uri!r}")
        if not run_id:
            raise ValueError(f"run_id must be an MLflow run id, got {run_id!r}")
        if not 1 <= max_batch <= MLFLOW_MAX_METRICS_PER_BATCH:
            raise ValueError(
                f"max_batch must be between 1 and {MLFLOW_MAX_METRICS_PER_BATCH} "
                f"(MLflow's limit per log_batch), got {max_batch}"
            )
        if not flush_every_s > 0:
            raise ValueError(f"flush_every_s must be > 0, got {flush_every_s}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if retry_attempts < 1:
            raise ValueError(f"retry_attempts must be >= 1, got {retry_attempts}")
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.flush_every_s = float(flush_every_s)
        self.max_batch = int(max_batch)
        self.max_queue = int(max_queue)
        self.retry_attempts = int(retry_attempts)
        self.retry_max_wait_s = float(retry_max_wait_s)
        self.mark_replay = bool(mark_replay)
        self._logged_through: dict[str, int] = {}
        """Last step each key had in the run when the streamer started (see "Replayed steps")."""
        self._replayed = 0

        # Unbounded queue with a soft bound checked in log(): close() must always be able to
        # enqueue its sentinel, even when the queue is "full".
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = threading.Event()
        self._close_deadline: float | None = None
        self._lock = threading.Lock()
        self._logged = 0
        self._sent = 0
        self._dropped = 0
        self._failed = 0
        self._skipped = 0
        self._valid_keys: set[str] = set()
        self._invalid_keys: set[str] = set()
        self._thread = threading.Thread(
            target=self._run, name=f"mlflow-metrics-{run_id[:8]}", daemon=True
        )
        self._thread.start()
        ref = weakref.ref(self)
        self._atexit = lambda: (s := ref()) is not None and s.close(timeout_s=EXIT_FLUSH_S)
        atexit.register(self._atexit)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> MetricsStreamer | None:
        """A streamer for `MLFLOW_TRACKING_URI` / `MLFLOW_RUN_ID` (set by the launcher, DESIGN §7),
        or None when the job runs without tracking."""
        import os

        env = os.environ if environ is None else environ
        uri, run_id = env.get("MLFLOW_TRACKING_URI", ""), env.get("MLFLOW_RUN_ID", "")
        if not uri or not run_id:
            return None
        return cls(uri, run_id, **kwargs)

    # -- the training side: cheap and safe -------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, float], timestamp_ms: int | None = None) -> None:
        """Queue `metrics` at `step`. Never blocks, never raises; see the module docstring."""
        try:
            n = len(metrics)
            if n == 0:
                return
            if self._closed.is_set() or self._queue.qsize() >= self.max_queue:
                self._count_drop(n, "streamer closed" if self._closed.is_set() else "queue full")
                return
            ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
            self._queue.put_nowait((int(step), ts, dict(metrics)))
            with self._lock:
                self._logged += n
        except Exception as e:  # noqa: BLE001 - tracking must never break training
            self._count_drop(1, f"log() failed: {type(e).__name__}: {e}")

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Send everything logged so far; True when it was sent (or given up) within `timeout_s`."""
        if self._closed.is_set() or not self._thread.is_alive():
            return False
        marker = _Flush(threading.Event())
        self._queue.put_nowait(marker)
        return marker.done.wait(timeout_s)

    def send_soon(self) -> None:
        """Have the thread send everything logged so far now, without waiting for it (a
        checkpoint's steps are never trained again: their points should not wait for the next
        `flush_every_s`)."""
        if not self._closed.is_set():
            self._queue.put_nowait(_Flush(threading.Event()))

    def close(self, timeout_s: float = 30.0) -> StreamerStats:
        """Flush what is left and stop the thread, waiting at most `timeout_s`.

        Retries stop at the deadline; whatever is not sent by then is reported as `pending`.
        Calling close twice is harmless.
        """
        if not self._closed.is_set():
            self._close_deadline = time.monotonic() + max(0.0, timeout_s)
            self._closed.set()
            self._queue.put_nowait(_Stop())
            atexit.unregister(self._atexit)
        self._thread.join(timeout=max(0.0, timeout_s))
        stats = self.stats
        if stats.pending or stats.dropped or stats.failed:
            logger.warning(
                "MLflow metrics for run %s: %d sent, %d dropped, %d failed, %d not sent before "
                "close()", self.run_id, stats.sent, stats.dropped, stats.failed, stats.pending,
            )
        return stats

    @property
    def stats(self) -> StreamerStats:
        with self._lock:
            pending = self._logged - self._sent - self._failed - self._skipped
            return StreamerStats(self._logged, self._sent, self._dropped, self._failed, max(0, pending),
                                 self._replayed)

    def __enter__(self) -> MetricsStreamer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the background thread ----------------------------------------------------------------

    def _count_drop(self, n: int, reason: str) -> None:
        with self._lock:
            before = self._dropped
            self._dropped += n
            after = self._dropped
        # Warn at 1, 10, 100, … dropped points: visible, but never a flood in a hot loop.
        if before == 0 or math.floor(math.log10(after)) > math.floor(math.log10(max(before, 1))):
            logger.warning("MLflow metrics for run %s: dropped %d point(s) so far (%s)",
                           self.run_id, after, reason)

    def _run(self) -> None:
        try:
            from trainyard.plugins.tracking.runs import client_for

            client = client_for(self.tracking_uri)
        except Exception:
            logger.exception("MLflow metrics streamer could not start; metrics are dropped")
            client = None
        if client is not None and self.mark_replay:
            self._logged_through = self._read_logged_through(client)
        pending: list[Metric] = []
        deadline = time.monotonic() + self.flush_every_s
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = None
            if isinstance(item, _Stop):
                self._drain_into(pending)
                self._send(client, pending)
                return
            if isinstance(item, _Flush):
                self._send(client, pending)
                item.done.set()
                deadline = time.monotonic() + self.flush_every_s
                continue
            try:
                if item is not None:
                    pending.extend(self._to_metrics(item))
                if len(pending) >= self.max_batch or time.monotonic() >= deadline:
                    self._send(client, pending)
                    deadline = time.monotonic() + self.flush_every_s
            except Exception:  # the thread must outlive any one bad item
                logger.exception("MLflow metrics streamer: unexpected error; carrying on")

    def _read_logged_through(self, client: MlflowClient) -> dict[str, int]:
        """{key: last step} of the run's metrics now: MLflow keeps each key's latest point, the
        one with the highest step. Unreadable (server down): {} — a replay then logs as usual."""
        try:
            run = client.get_run(self.run_id)
        except Exception as e:  # noqa: BLE001 - marking replays is a nicety, never a failure
            logger.info("MLflow metrics for run %s: could not read its last steps (%s); replayed "
                        "steps, if any, are logged under their own names", self.run_id, e)
            return {}
        # `_metric_objs`: the latest points with their steps (`data.metrics` keeps only values).
        through = {m.key: int(m.step) for m in run.data._metric_objs if not is_replay(m.key)}
        if through and max(through.values()) > 0:  # step 0 alone (the run's start figures) is no replay
            logger.info("MLflow metrics for run %s: steps up to %d already logged; a replay of them "
                        "is logged as <key>%s", self.run_id, max(through.values()), REPLAY_SUFFIX)
        return through

    def _drain_into(self, pending: list[Metric]) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Flush):
                item.done.set()
            elif not isinstance(item, _Stop):
                pending.extend(self._to_metrics(item))

    def _to_metrics(self, item: tuple[int, int, dict[str, Any]]) -> list[Metric]:
        from mlflow.entities import Metric

        step, ts, values = item
        out: list[Metric] = []
        for key, raw in values.items():
            reason = self._key_problem(key)
            value: float | None = None
            if reason is None:
                try:
                    value = float(raw)  # also takes numpy scalars and 0-d tensors
                except (TypeError, ValueError):
                    reason = f"value of {key!r} is not a number: {type(raw).__name__}"
            if reason is not None or value is None:
                with self._lock:
                    self._skipped += 1  # accepted by log(), so it leaves `pending` here
                self._count_drop(1, reason or "invalid value")
                continue
            key = series_key(key)
            # a platform series is drawn against wall time (System metrics): a replay draws no zig-zag there
            if step <= self._logged_through.get(key, -1) and not key.startswith(SYSTEM_PREFIX):
                key = replay_key(key)
                with self._lock:
                    self._replayed += 1
            out.append(Metric(key=key, value=value, timestamp=ts, step=step))
        return out

    def _key_problem(self, key: object) -> str | None:
        if isinstance(key, str) and key in self._valid_keys:
            return None
        if not isinstance(key, str) or key in self._invalid_keys:
            return f"invalid metric name {key!r}"
        from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, _validate_metric_name

        try:
            _validate_metric_name(key)
            if len(key) > MAX_ENTITY_KEY_LENGTH:
                raise ValueError(f"longer than {MAX_ENTITY_KEY_LENGTH} characters")
        except Exception as e:  # noqa: BLE001 - MlflowException or ValueError: both mean "skip it"
            self._invalid_keys.add(key)
            return f"invalid metric name {key!r}: {e}"
        self._valid_keys.add(key)
        return None

    def _send(self, client: MlflowClient | None, pending: list[Metric]) -> None:
        """Send and empty `pending`, in chunks of at most `max_batch` points."""
        while pending:
            chunk = pending[: self.max_batch]
            del pending[: self.max_batch]
            ok = client is not None and self._send_chunk(client, chunk)
            with self._lock:
                if ok:
                    self._sent += len(chunk)
                else:
                    self._failed += len(chunk)

    def _send_chunk(self, client: MlflowClient, chunk: list[Metric]) -> bool:
        retrying = policy(is_transient, attempts=self.retry_attempts, first_wait_s=0.5,
                          max_wait_s=self.retry_max_wait_s, extra_stop=self._past_close_deadline,
                          before_sleep=self._log_retry)
        try:
            for attempt in retrying:
                with attempt:
                    client.log_batch(self.run_id, metrics=chunk, synchronous=True)
        except Exception as e:  # noqa: BLE001 - a lost batch must not end the thread
            logger.warning("MLflow metrics for run %s: %d point(s) not logged: %s: %s",
                           self.run_id, len(chunk), type(e).__name__, e)
            return False
        return True

    def _past_close_deadline(self, state: RetryCallState) -> bool:
        return self._close_deadline is not None and time.monotonic() >= self._close_deadline

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        logger.info("MLflow metrics for run %s: attempt %d failed (%s); retrying",
                    self.run_id, state.attempt_number, error)
