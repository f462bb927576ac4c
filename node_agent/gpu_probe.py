"""Reads the node's NVIDIA GPUs through NVML (`nvidia-ml-py`, imported as `pynvml`).

Two parts, both tolerant of what a given GPU or driver does not support:
- `NvmlProbe.read()` samples each GPU's utilisation, memory, temperature, power and
  uncorrectable ECC counters. A field the GPU does not support (`NVMLError_NotSupported`) is
  None; any other error is logged once per GPU and field; `NVMLError_GpuIsLost` marks the GPU
  lost (a failure verdict, like Xid 79).
- `XidWatcher` registers every GPU for `nvmlEventTypeXidCriticalError` on one NVML event set
  and waits on it in a background thread with a short timeout, so Xid events arrive as they
  happen rather than at the next poll, and `stop()` returns within one wait.

When `nvmlInit` fails (no library, no driver, …) `open()` returns False and records why; the
caller then reports CPU slots. The `nvml` argument is the `pynvml` module, or in unit tests a
stand-in built from its real functions (`create_autospec`) and its real error classes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from trainyard.node_agent.models import GpuStatus
from trainyard.node_agent.once import OnceLog

log = logging.getLogger(__name__)

XidCallback = Callable[[int | None, int], None]
"""Called with (GPU index or None when NVML cannot name it, Xid code)."""


class _GpuLost(Exception):
    """Raised inside one GPU's read when NVML answers `GPU is lost`."""


class NvmlProbe:
    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml as nvml  # only the agent process needs NVML
        self._nvml = nvml
        self._once = OnceLog(log)
        self._handles: list[Any] = []
        self._names: list[tuple[str, str]] = []
        self._lost_at_open: set[int] = set()
        self._initialised = False
        self._legacy_temperature = False
        self.available = False
        self.error: str | None = None
        """Why NVML is not usable here, or None."""
        self.driver_version: str | None = None

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    def open(self) -> bool:
        """Initialise NVML and find the GPUs; False (with `error` set) where there are none."""
        nv = self._nvml
        try:
            nv.nvmlInit()
            self._initialised = True
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            self.error = f"{type(e).__name__}: {e}"
            self.close()
            return False
        if count == 0:
            self.error = "NVML initialised but found no GPU"
            self.close()
            return False
        self.driver_version = self._optional(None, "driver version", nv.nvmlSystemGetDriverVersion)
        for index in range(count):
            self._handles.append(self._open_gpu(index))
        self.available = True
        return True

    def _open_gpu(self, index: int) -> Any:
        nv = self._nvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as e:
            if isinstance(e, nv.NVMLError_GpuIsLost):
                self._lost_at_open.add(index)
            else:
                self._once.warning((index, "handle"), "GPU %d: no NVML handle (%s: %s)", index, type(e).__name__, e)
            self._names.append(("", ""))
            return None
        try:
            name = self._optional(index, "name", nv.nvmlDeviceGetName, handle) or ""
            uuid = self._optional(index, "uuid", nv.nvmlDeviceGetUUID, handle) or ""
        except _GpuLost:
            self._lost_at_open.add(index)
            name = uuid = ""
        self._names.append((name, uuid))
        return handle

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            self.available = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.debug("nvmlShutdown: %s", e)

    def read(self) -> list[GpuStatus]:
        """One sample of every GPU (empty where NVML is not available)."""
        if not self.available:
            return []
        return [self._read_gpu(index, handle) for index, handle in enumerate(self._handles)]

    def _read_gpu(self, index: int, handle: Any) -> GpuStatus:
        nv = self._nvml
        name, uuid = self._names[index]
        if handle is None:
            return GpuStatus(index=index, name=name, uuid=uuid, lost=index in self._lost_at_open)
        try:
            util = self._optional(index, "utilization", nv.nvmlDeviceGetUtilizationRates, handle)
            memory = self._optional(index, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
            temperature = self._temperature(index, handle)
            power_mw = self._optional(index, "power", nv.nvmlDeviceGetPowerUsage, handle)
            ecc = {
                counter: self._optional(index, f"ecc {counter}", nv.nvmlDeviceGetTotalEccErrors, handle,
                                        nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter_type)
                for counter, counter_type in (("volatile", nv.NVML_VOLATILE_ECC),
                                              ("aggregate", nv.NVML_AGGREGATE_ECC))
            }
        except _GpuLost:
            return GpuStatus(index=index, name=name, uuid=uuid, lost=True)
        return GpuStatus(
            index=index, name=name, uuid=uuid,
            utilization_ratio=None if util is None else util.gpu / 100.0,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            ecc_volatile_uncorrectable=ecc["volatile"],
            ecc_aggregate_uncorrectable=ecc["aggregate"],
        )

    def _temperature(self, index: int, handle: Any) -> float | None:
        """`nvmlDeviceGetTemperatureV` (current API); the deprecated call on drivers without it."""
        nv = self._nvml
        if not self._legacy_temperature:
            try:
                return self._optional(index, "temperature", nv.nvmlDeviceGetTemperatureV, handle,
                                      nv.NVML_TEMPERATURE_GPU, reraise=nv.NVMLError_FunctionNotFound)
            except nv.NVMLError_FunctionNotFound:
                self._legacy_temperature = True
        return self._optional(index, "temperature", nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)

    def _optional(self, index: int | None, field: str, fn: Callable[..., Any], *args: Any,
                  reraise: type[BaseException] | None = None) -> Any:
        """`fn(*args)`, or None when the GPU does not support it (or on another error, logged once)."""
        nv = self._nvml
        try:
            return fn(*args)
        except nv.NVMLError_NotSupported:
            return None
        except nv.NVMLError_GpuIsLost as e:
            raise _GpuLost from e
        except nv.NVMLError as e:
            if reraise is not None and isinstance(e, reraise):
                raise
            where = "NVML" if index is None else f"GPU {index}"
            self._once.warning((index, field, e.value), "%s: reading %s failed (%s: %s)",
                               where, field, type(e).__name__, e)
            return None

    def watch_xids(self, on_xid: XidCallback, wait_ms: int = 1000) -> XidWatcher | None:
        """Start a background Xid watcher; None where no GPU supports Xid events."""
        if not self.available:
            return None
        handles = [(index, handle) for index, handle in enumerate(self._handles) if handle is not None]
        watcher = XidWatcher(self._nvml, handles, on_xid, wait_ms)
        return watcher if watcher.start() else None


class XidWatcher:
    """Waits on one NVML event set for Xid critical errors of every registered GPU."""

    def __init__(self, nvml: Any, handles: Sequence[tuple[int, Any]], on_xid: XidCallback,
                 wait_ms: int = 1000) -> None:
        self._nvml = nvml
        self._handles = list(handles)
        self._on_xid = on_xid
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._once = OnceLog(log)
        self.registered: list[int] = []
        """GPU indexes whose Xid events this watcher receives."""

    def start(self) -> bool:
        nv = self._nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.warning("Xid events unavailable: nvmlEventSetCreate failed (%s: %s)", type(e).__name__, e)
            return False
        for index, handle in self._handles:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._event_set)
                self.registered.append(index)
            except nv.NVMLError as e:
                log.warning("GPU %d: Xid events unavailable (%s: %s); ECC counters and lost-GPU "
                            "checks still apply", index, type(e).__name__, e)
        if not self.registered:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        nv = self._nvml
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, self._wait_ms)
            except nv.NVMLError_Timeout:
                continue
            except nv.NVMLError as e:
                self._once.warning(e.value, "waiting for Xid events failed (%s: %s)", type(e).__name__, e)
                self._stop.wait(self._wait_ms / 1000.0)
                continue
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                try:
                    self._on_xid(self._index_of(data.device), int(data.eventData))
                except Exception:  # the watcher must outlive a bug in its consumer
                    log.exception("recording Xid %d failed", int(data.eventData))

    def _index_of(self, device: Any) -> int | None:
        nv = self._nvml
        try:
            return int(nv.nvmlDeviceGetIndex(device))
        except nv.NVMLError:
            return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000.0 + 5.0)
            if self._thread.is_alive():  # stuck inside NVML: freeing the set under it could crash
                log.warning("Xid watcher did not stop within %d ms; leaving its event set", self._wait_ms)
                return
        self._free()

    def _free(self) -> None:
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except self._nvml.NVMLError as e:
                log.debug("nvmlEventSetFree: %s", e)
            self._event_set = None
