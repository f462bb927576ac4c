"""A stand-in for `pynvml` on a machine without NVIDIA GPUs, held to the real interface.

Every `nvml*` function of the installed nvidia-ml-py is replaced by `create_autospec` of the
real function, so a call with a wrong signature raises TypeError exactly as the real call
would; constants, ctypes structures and the NVMLError class hierarchy are the real ones.
Handles and event sets are real ctypes pointers, and results are the real ctypes structures
(`c_nvmlUtilization_t`, `c_nvmlMemory_t`, `c_nvmlEventData_t`). A function the probe is not
expected to call raises AssertionError, so a new NVML call shows up in the tests.
"""

from __future__ import annotations

import ctypes
import inspect
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pynvml


def nvml_error(code: int) -> pynvml.NVMLError:
    """The real exception NVML raises for `code` (e.g. NVMLError_NotSupported)."""
    return pynvml.NVMLError(code)


NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@dataclass
class FakeGpu:
    """What one GPU answers; a field set to an NVML error code raises that error instead."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    utilization: int | None = 50
    memory_used: int = 10 * 2**30
    memory_total: int = 80 * 2**30
    temperature: int = 45
    power_mw: int = 300_000
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    """Field name ("utilization", "memory", "temperature", "power", "ecc_volatile",
    "ecc_aggregate", "register_events", "handle") → NVML error code to raise."""
    lost: bool = False


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None,
                 temperature_v: bool = True) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.temperature_v = temperature_v
        """False: the driver lacks nvmlDeviceGetTemperatureV (FunctionNotFound)."""
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self._devices = [pynvml.struct_c_nvmlDevice_t() for _ in gpus]
        self._event_sets: list[Any] = []
        self.module = self._build()

    def push_xid(self, gpu: int, xid: int) -> None:
        """Make the next `nvmlEventSetWait_v2` return an Xid event for `gpu`."""
        self.events.put((gpu, xid))

    def handle(self, index: int) -> Any:
        return pynvml.c_nvmlDevice_t(self._devices[index])

    def _build(self) -> _NvmlStandIn:
        return _NvmlStandIn({
            "nvmlInit": self._init,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlSystemGetDriverVersion": lambda: "570.86.15",
            "nvmlDeviceGetHandleByIndex": self._handle_by_index,
            "nvmlDeviceGetName": lambda h: self._gpu(h, "name").name,
            "nvmlDeviceGetUUID": lambda h: self._gpu(h, "uuid").uuid,
            "nvmlDeviceGetIndex": self._index,
            "nvmlDeviceGetUtilizationRates": self._utilization,
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetTemperatureV": self._temperature_v,
            "nvmlDeviceGetTemperature": lambda h, sensor: self._gpu(h, "temperature").temperature,
            "nvmlDeviceGetPowerUsage": lambda h: self._gpu(h, "power").power_mw,
            "nvmlDeviceGetTotalEccErrors": self._ecc,
            "nvmlEventSetCreate": self._event_set_create,
            "nvmlDeviceRegisterEvents": self._register,
            "nvmlEventSetWait_v2": self._wait,
            "nvmlEventSetFree": lambda event_set: None,
        })

    # --- behaviour -------------------------------------------------------------------------------
    def _init(self) -> None:
        if self.init_error is not None:
            raise nvml_error(self.init_error)

    def _handle_by_index(self, index: int) -> Any:
        if index >= len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if "handle" in gpu.errors:
            raise nvml_error(gpu.errors["handle"])
        return self.handle(index)

    def _index(self, handle: Any) -> int:
        address = ctypes.addressof(handle.contents)
        for index, device in enumerate(self._devices):
            if ctypes.addressof(device) == address:
                return index
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _gpu(self, handle: Any, what: str) -> FakeGpu:
        gpu = self.gpus[self._index(handle)]
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if what in gpu.errors:
            raise nvml_error(gpu.errors[what])
        return gpu

    def _utilization(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "utilization")
        return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization, memory=20)

    def _memory(self, handle: Any, version: Any = None) -> Any:
        gpu = self._gpu(handle, "memory")
        return pynvml.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used,
                                     used=gpu.memory_used)

    def _temperature_v(self, handle: Any, sensor: int, version: int = pynvml.nvmlTemperature_v1) -> int:
        if not self.temperature_v:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu(handle, "temperature").temperature

    def _ecc(self, handle: Any, error_type: int, counter_type: int) -> int:
        if error_type != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if counter_type == pynvml.NVML_VOLATILE_ECC:
            return self._gpu(handle, "ecc_volatile").ecc_volatile
        if counter_type == pynvml.NVML_AGGREGATE_ECC:
            return self._gpu(handle, "ecc_aggregate").ecc_aggregate
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _event_set_create(self) -> Any:
        event_set = pynvml.struct_c_nvmlEventSet_t()
        self._event_sets.append(event_set)
        return pynvml.c_nvmlEventSet_t(event_set)

    def _register(self, handle: Any, event_types: int, event_set: Any) -> None:
        if not isinstance(event_set, pynvml.c_nvmlEventSet_t):
            raise TypeError(f"event set must be a c_nvmlEventSet_t, got {type(event_set).__name__}")
        gpu = self._gpu(handle, "register_events")
        if event_types != pynvml.nvmlEventTypeXidCriticalError:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        del gpu

    def _wait(self, event_set: Any, timeout_ms: int) -> Any:
        try:
            gpu, xid = self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT) from None
        return pynvml.c_nvmlEventData_t(device=self.handle(gpu), eventType=pynvml.nvmlEventTypeXidCriticalError,
                                        eventData=xid)


class _NvmlStandIn:
    """Looks like the `pynvml` module: each `nvml*` function, on first use, becomes an autospec
    of the real one (with this fake's behaviour, or AssertionError); everything else (constants,
    structures, error classes) is the real object. A name pynvml lacks raises AttributeError."""

    def __init__(self, behaviour: dict[str, Callable[..., Any]]) -> None:
        self._behaviour = behaviour

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)
        if name.startswith("nvml") and inspect.isfunction(real):
            value = mock.create_autospec(real, side_effect=self._behaviour.get(name, _unexpected(name)))
        else:
            value = real
        setattr(self, name, value)  # later lookups find it without __getattr__
        return value


def _unexpected(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the probe called {name}, which the fake does not model")

    return fail
