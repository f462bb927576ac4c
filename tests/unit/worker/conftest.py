"""The evaluation gate's tests (`test_evaluate.py`) and the session's metrics tests use the same
SQLite-backed MLflow store the tracking engine's tests use: one fixture, imported from there."""

from tests.unit.tracking.conftest import mlflow_run, sqlite_tracking_uri  # noqa: F401
