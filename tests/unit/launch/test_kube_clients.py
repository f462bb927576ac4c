"""The launcher's default clients come from a kubeconfig (a real file; nothing is contacted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.config import ConfigException

from tests.unit.launch.kubeconfig import write_kubeconfig
from trainyard.plugins.launch.kube_clients import clients_from_kubeconfig
from trainyard.plugins.launch.volcano import KubernetesLauncher


def test_the_current_or_a_named_context(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path)
    clients = clients_from_kubeconfig(str(path))
    assert clients.custom.api_client.configuration.host == "https://one.example.com:6443"
    assert clients.core.api_client is clients.custom.api_client  # one connection pool
    assert clients_from_kubeconfig(str(path), "two").core.api_client.configuration.host == "https://two.example.com:6443"


def test_the_launcher_default_reads_KUBECONFIG(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path)))
    launcher = KubernetesLauncher.from_kubeconfig(context="two")
    assert launcher.api.api_client.configuration.host == "https://two.example.com:6443"
    assert launcher.core_api is not None


def test_no_credentials_at_all_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigException, match=r"no Kubernetes credentials.*not inside a pod"):
        clients_from_kubeconfig()
