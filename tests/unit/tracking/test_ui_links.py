"""Links into MLflow's and Airflow's UIs: MLflow 3.17 opens its GenAI pages unless the URL asks for
the model-training ones (`workflowType`, read by its UI before the browser's stored choice)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from trainyard.plugins.tracking.ui_links import (
    airflow_dag_run_url,
    experiment_url,
    mlflow_run_url,
    model_version_url,
)


def _route_query(url: str) -> dict[str, list[str]]:
    """The query of the hash route (MLflow's UI routes inside the fragment)."""
    return parse_qs(urlsplit(urlsplit(url).fragment).query)


def test_every_mlflow_link_asks_for_the_model_training_pages() -> None:
    for url in (mlflow_run_url("http://m:5000/", "3", "abc"), mlflow_run_url("http://m:5000", "3", "abc",
                                                                            tab="model-metrics"),
                experiment_url("http://m:5000", "3"), model_version_url("http://m:5000", "demo/tiny lm", 2)):
        assert _route_query(url) == {"workflowType": ["machine_learning"]}, url
    assert mlflow_run_url("http://m:5000/", "3", "abc").startswith("http://m:5000/#/experiments/3/runs/abc?")
    assert urlsplit(mlflow_run_url("http://m", "3", "abc", tab="model-metrics")).fragment.startswith(
        "/experiments/3/runs/abc/model-metrics?")
    assert "/#/models/demo%2Ftiny%20lm/versions/2?" in model_version_url("http://m", "demo/tiny lm", 2)


def test_a_dag_run_link_quotes_the_run_id() -> None:
    assert airflow_dag_run_url("http://af:8080/", "tiny-lm", "manual__2026-05-01T12:00:00+00:00") == \
        "http://af:8080/dags/tiny-lm/runs/manual__2026-05-01T12%3A00%3A00%2B00%3A00"
    assert airflow_dag_run_url("", "tiny-lm", "r__attempt-1") == "/dags/tiny-lm/runs/r__attempt-1"
