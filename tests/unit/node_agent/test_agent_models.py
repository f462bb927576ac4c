"""The NodeHealth contract: JSON round trip, tolerance of newer agents, cheap imports."""

from __future__ import annotations

from trainyard.node_agent.models import GpuStatus, NodeHealth, RankHeartbeat, Verdict


def _health() -> NodeHealth:
    return NodeHealth(
        node="gpu-node-17", time=1000.0, healthy=False, accelerator="nvidia", uptime_s=12.5,
        verdicts=[
            Verdict(kind="gpu_failed", gpu=3, xid=79, since=990.0, reason="Xid 79"),
            Verdict(kind="hang", job="llama", attempt=1, rank=5, since=300.0, reason="stale"),
            Verdict(kind="hang", job="other", attempt=0, rank=0, since=300.0, reason="stale"),
        ],
        gpus=[GpuStatus(index=3, temperature_celsius=71.0, xid_events={79: 1, 13: 2})],
        ranks=[RankHeartbeat(job="llama", attempt=1, rank=5, pid=9, phase="train", step=40, time=300.0,
                          age_s=700.0, hang_timeout_s=600.0, stale=True)],
    )


def test_json_round_trip() -> None:
    health = _health()
    again = NodeHealth.model_validate_json(health.model_dump_json())
    assert again == health
    assert again.gpus[0].xid_events == {79: 1, 13: 2}  # int keys survive JSON's string keys


def test_a_newer_agent_with_extra_fields_still_parses() -> None:
    data = _health().model_dump(mode="json")
    data["nic_errors"] = 4
    data["verdicts"][0]["severity"] = "critical"
    data["gpus"][0]["nvlink"] = {"up": 18}
    parsed = NodeHealth.model_validate(data)
    assert parsed.failed_gpus == [3]


def test_helpers_for_sensors() -> None:
    health = _health()
    assert health.failed_gpus == [3]
    assert [v.rank for v in health.verdicts_for("llama")] == [5]
    assert health.verdicts_for("llama", attempt=0) == []
    assert [v.kind for v in health.unhealthy_verdicts()] == ["gpu_failed"]


def test_models_and_client_import_nothing_heavy() -> None:
    """Sensors import these in the triggerer: no NVML, Prometheus, HTTP server, torch, Airflow."""
    from tests.support.imports import assert_none_loaded

    assert_none_loaded("node_agent", {"pynvml", "prometheus_client", "http.server", "torch", "airflow", "httpx",
                                      "fastapi"})
