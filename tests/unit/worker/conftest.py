"""The evaluation gate's tests (`test_evaluate.py`) score registered versions in the same
SQLite-backed MLflow store the tracking engine's tests use: one fixture, imported from there."""

from tests.unit.tracking.conftest import sqlite_tracking_uri  # noqa: F401
