"""MetricsStreamer through a real `mlflow server` (REST), including a server that starts late."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.tracking.mlflow_servers import MlflowServer, start_mlflow_server
from tests.support import procs
from trainyard.plugins.tracking.metrics import MetricsStreamer

pytestmark = pytest.mark.waits  # for its server's restart and the streamer's retries


def test_metrics_reach_the_server_in_batches(mlflow_server: MlflowServer) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    run_id = client.create_run(client.create_experiment("streamer-rest")).info.run_id
    with MetricsStreamer(mlflow_server.uri, run_id, flush_every_s=0.5, max_batch=500) as s:
        for step in range(600):
            s.log(step, {"loss": 10.0 - step / 100, "grad_norm": 1.0})
    assert (s.stats.sent, s.stats.failed, s.stats.dropped) == (1200, 0, 0)
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert len(loss) == 600 and loss[-1] == (599, pytest.approx(4.01))


@pytest.mark.slow
def test_points_logged_while_the_server_is_down_arrive_when_it_comes_up(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    backend = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = MlflowClient(backend).create_run("0").info.run_id  # the run exists; the server does not yet
    port = procs.free_port()
    s = MetricsStreamer(f"http://127.0.0.1:{port}", run_id, flush_every_s=0.2, retry_attempts=20)
    for step in range(50):
        s.log(step, {"loss": float(step)})
    server = start_mlflow_server(backend, tmp_path / "artifacts", tmp_path / "server.log", port=port)
    try:
        stats = s.close(timeout_s=240)
        assert (stats.sent, stats.failed, stats.pending) == (50, 0, 0), server.log_tail()
        history = MlflowClient(server.uri).get_metric_history(run_id, "loss")
        assert sorted(m.step for m in history) == list(range(50))
    finally:
        server.stop()
