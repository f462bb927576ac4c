"""Kubernetes clients from Airflow's `KubernetesHook` (a real hook and connection; nothing is
contacted), and from the kubeconfig where the provider is absent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.unit.launch.kubeconfig import write_kubeconfig
from trainyard.config.settings import get_settings
from trainyard.operators.kubernetes_clients import kubernetes_clients, kubernetes_launcher


@pytest.fixture
def connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow connection (env secrets backend) naming the kubeconfig and its second context."""
    extra = {"kube_config_path": str(write_kubeconfig(tmp_path)), "cluster_context": "two"}
    monkeypatch.setenv("AIRFLOW_CONN_TRAINING_K8S", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    return "training_k8s"


def test_clients_come_from_the_hooks_connection(connection: str) -> None:
    clients = kubernetes_clients(connection)
    assert clients.custom.api_client.configuration.host == "https://two.example.com:6443"
    assert clients.core.api_client is clients.custom.api_client


def test_the_connection_id_comes_from_settings(connection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_KUBERNETES_CONN_ID", connection)
    get_settings.cache_clear()
    try:
        launcher = kubernetes_launcher()
    finally:
        get_settings.cache_clear()
    assert launcher.api.api_client.configuration.host == "https://two.example.com:6443"


def test_without_the_provider_the_kubeconfig_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    connection: str) -> None:
    monkeypatch.setitem(sys.modules, "airflow.providers.cncf.kubernetes.hooks.kubernetes", None)  # ImportError
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path)))
    assert kubernetes_clients(connection).custom.api_client.configuration.host == "https://one.example.com:6443"


def test_importing_the_adapter_imports_no_airflow() -> None:
    from tests.support.imports import assert_none_loaded

    assert_none_loaded("kubernetes_adapter", {"airflow"})
