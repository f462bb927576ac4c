"""The NVML probe against nvidia-ml-py's real interface (autospecced functions, real errors)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pynvml
import pytest

from tests.unit.node_agent.fake_nvml import NOT_SUPPORTED, FakeGpu, FakeNvml
from trainyard.node_agent.config import AgentConfig
from trainyard.node_agent.gpu_probe import NvmlProbe
from trainyard.node_agent.monitor import Monitor


def _gpus(n: int = 2) -> list[FakeGpu]:
    return [FakeGpu(uuid=f"GPU-{i}", temperature=40 + i, power_mw=250_500 + i) for i in range(n)]


def test_the_fake_holds_calls_to_the_real_signatures() -> None:
    fake = FakeNvml(_gpus(1))
    with pytest.raises(TypeError):
        fake.module.nvmlDeviceGetTemperature(fake.handle(0))  # the sensor argument is missing
    with pytest.raises(TypeError):
        fake.module.nvmlDeviceGetTotalEccErrors(fake.handle(0), pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
    with pytest.raises(AssertionError, match="does not model"):
        fake.module.nvmlDeviceGetClockInfo(fake.handle(0), 0)
    assert isinstance(pynvml.NVMLError(NOT_SUPPORTED), pynvml.NVMLError_NotSupported)


def test_the_real_library_on_this_machine() -> None:
    """No mock: on a machine without the NVIDIA driver, open() says why; with one, it reads."""
    probe = NvmlProbe()
    try:
        if probe.open():
            gpus = probe.read()
            assert len(gpus) == probe.gpu_count > 0
            assert all(g.memory_total_bytes and g.memory_total_bytes > 0 for g in gpus)
        else:
            assert probe.error is not None and probe.error.startswith("NVMLError_")
            assert probe.read() == []
            assert probe.watch_xids(lambda gpu, xid: None) is None
    finally:
        probe.close()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  pynvml.NVML_ERROR_NO_PERMISSION])
def test_init_failure_means_no_gpus(code: int) -> None:
    fake = FakeNvml(_gpus(), init_error=code)
    probe = NvmlProbe(fake.module)
    assert probe.open() is False
    assert probe.error == f"{type(pynvml.NVMLError(code)).__name__}: {pynvml.NVMLError(code)}"
    assert probe.read() == []
    probe.close()
    fake.module.nvmlShutdown.assert_not_called()  # never initialised, so nothing to shut down


def test_no_gpu_found_shuts_nvml_down() -> None:
    fake = FakeNvml([])
    probe = NvmlProbe(fake.module)
    assert probe.open() is False
    assert probe.error == "NVML initialised but found no GPU"
    fake.module.nvmlShutdown.assert_called_once_with()


def test_cpu_node_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    monitor = Monitor(AgentConfig(node="n", heartbeat_dir=tmp_path, cpu_slots=3), NvmlProbe(fake.module))
    with caplog.at_level(logging.INFO, logger="node_agent"):
        monitor.open()
        for _ in range(5):
            monitor.poll()
            health = monitor.health()
    said = [r for r in caplog.records if "no NVIDIA GPU/driver" in r.getMessage()]
    assert len(said) == 1
    assert "NVMLError_LibraryNotFound" in said[0].getMessage() and "3 CPU slots" in said[0].getMessage()
    assert [r.levelname for r in caplog.records if r.levelno >= logging.WARNING] == ["WARNING"]
    assert (health.accelerator, health.slots, health.gpus, health.healthy) == ("cpu", 3, [], True)
    assert [v.kind for v in health.verdicts] == ["no_gpu"]
    assert health.probe_error == "NVMLError_LibraryNotFound: NVML Shared Library Not Found"


def test_read_converts_units_and_asks_for_the_right_counters() -> None:
    fake = FakeNvml(_gpus())
    fake.gpus[1].ecc_aggregate = 2
    probe = NvmlProbe(fake.module)
    assert probe.open() is True
    g0, g1 = probe.read()
    assert (g0.index, g0.uuid, g0.name) == (0, "GPU-0", "NVIDIA H100 80GB HBM3")
    assert g0.utilization_ratio == 0.5
    assert (g0.memory_used_bytes, g0.memory_total_bytes) == (10 * 2**30, 80 * 2**30)
    assert (g0.temperature_celsius, g1.temperature_celsius) == (40.0, 41.0)
    assert g1.power_watts == pytest.approx(250.501)
    assert (g1.ecc_volatile_uncorrectable, g1.ecc_aggregate_uncorrectable) == (0, 2)
    m = fake.module
    handle = m.nvmlDeviceGetTotalEccErrors.call_args_list[0].args[0]
    m.nvmlDeviceGetTotalEccErrors.assert_any_call(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                  pynvml.NVML_VOLATILE_ECC)
    m.nvmlDeviceGetTotalEccErrors.assert_any_call(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                  pynvml.NVML_AGGREGATE_ECC)
    m.nvmlDeviceGetTemperatureV.assert_any_call(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert probe.driver_version == "570.86.15"


def test_unsupported_fields_are_none_and_quiet(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(_gpus(1))
    fake.gpus[0].errors = {f: NOT_SUPPORTED for f in ("power", "ecc_volatile", "ecc_aggregate", "utilization")}
    probe = NvmlProbe(fake.module)
    probe.open()
    with caplog.at_level(logging.DEBUG, logger="node_agent"):
        (gpu,) = probe.read()
    assert (gpu.power_watts, gpu.ecc_volatile_uncorrectable, gpu.ecc_aggregate_uncorrectable,
            gpu.utilization_ratio) == (None, None, None, None)
    assert gpu.temperature_celsius == 40.0 and gpu.memory_used_bytes == 10 * 2**30
    assert caplog.records == []


def test_other_field_errors_are_logged_once_per_gpu_and_field(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(_gpus(2))
    for gpu in fake.gpus:
        gpu.errors = {"power": pynvml.NVML_ERROR_NO_PERMISSION}
    probe = NvmlProbe(fake.module)
    probe.open()
    with caplog.at_level(logging.WARNING, logger="node_agent"):
        for _ in range(4):
            readings = probe.read()
    assert [g.power_watts for g in readings] == [None, None]
    assert sorted(r.getMessage() for r in caplog.records) == [
        "GPU 0: reading power failed (NVMLError_NoPermission: Insufficient Permissions)",
        "GPU 1: reading power failed (NVMLError_NoPermission: Insufficient Permissions)",
    ]


def test_a_lost_gpu_is_reported_and_fails(tmp_path: Path) -> None:
    fake = FakeNvml(_gpus(2))
    monitor = Monitor(AgentConfig(node="n", heartbeat_dir=tmp_path, xid_wait_ms=10), NvmlProbe(fake.module))
    monitor.open()
    try:
        assert monitor.health().healthy
        fake.gpus[1].lost = True  # falls off the bus while running
        monitor.poll()
        health = monitor.health()
    finally:
        monitor.close()
    assert [g.lost for g in health.gpus] == [False, True]
    assert health.gpus[1].temperature_celsius is None
    assert not health.healthy and health.failed_gpus == [1]
    assert "GPU 1 is lost" in health.unhealthy_verdicts()[0].reason


def test_a_gpu_lost_before_the_agent_started() -> None:
    fake = FakeNvml(_gpus(2))
    fake.gpus[0].lost = True
    probe = NvmlProbe(fake.module)
    probe.open()
    assert [(g.index, g.lost) for g in probe.read()] == [(0, True), (1, False)]


def test_old_drivers_fall_back_to_the_deprecated_temperature_call() -> None:
    fake = FakeNvml(_gpus(2), temperature_v=False)
    probe = NvmlProbe(fake.module)
    probe.open()
    for _ in range(3):
        assert [g.temperature_celsius for g in probe.read()] == [40.0, 41.0]
    assert fake.module.nvmlDeviceGetTemperatureV.call_count == 1  # tried once, then remembered
    assert fake.module.nvmlDeviceGetTemperature.call_count == 6


def _wait_for(predicate: object, timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():  # type: ignore[operator]
            return
        done.wait(0.01)
    raise AssertionError("condition not reached")


def test_xid_events_arrive_per_gpu_and_fatal_ones_fail_it(tmp_path: Path) -> None:
    fake = FakeNvml(_gpus(4))
    monitor = Monitor(AgentConfig(node="n", heartbeat_dir=tmp_path, xid_wait_ms=10), NvmlProbe(fake.module))
    monitor.open()
    try:
        fake.push_xid(2, 13)  # application error: counted, not judged
        fake.push_xid(3, 79)  # fallen off the bus
        fake.push_xid(3, 79)
        _wait_for(lambda: sum(sum(c.values()) for c in monitor.xid_counts().values()) == 3)
        health = monitor.health()
    finally:
        monitor.close()
    assert monitor.xid_counts() == {2: {13: 1}, 3: {79: 2}}
    assert [g.xid_events for g in health.gpus] == [{}, {}, {13: 1}, {79: 2}]
    assert health.failed_gpus == [3] and not health.healthy
    (verdict,) = health.unhealthy_verdicts()
    assert (verdict.kind, verdict.gpu, verdict.xid, verdict.injected) == ("gpu_failed", 3, 79, False)
    registered = fake.module.nvmlDeviceRegisterEvents.call_args_list
    assert len(registered) == 4
    assert all(c.args[1] == pynvml.nvmlEventTypeXidCriticalError for c in registered)
    fake.module.nvmlEventSetFree.assert_called_once()


def test_xid_events_not_supported_on_some_or_all_gpus(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(_gpus(2))
    fake.gpus[0].errors = {"register_events": NOT_SUPPORTED}
    probe = NvmlProbe(fake.module)
    probe.open()
    watcher = probe.watch_xids(lambda gpu, xid: None, wait_ms=10)
    assert watcher is not None and watcher.registered == [1]
    watcher.stop()
    assert "GPU 0: Xid events unavailable (NVMLError_NotSupported" in caplog.text

    fake.gpus[1].errors = {"register_events": NOT_SUPPORTED}
    assert probe.watch_xids(lambda gpu, xid: None, wait_ms=10) is None
    assert fake.module.nvmlEventSetFree.call_count == 2  # the unused set is freed too
    (reading,) = [g for g in probe.read() if g.index == 1]
    assert reading.temperature_celsius == 41.0  # the rest of the probe works without events
