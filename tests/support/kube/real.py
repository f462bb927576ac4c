"""A real Kubernetes control plane on 127.0.0.1: etcd and kube-apiserver built by
`make kube-components` (`components.py`), RBAC on, a self-signed serving certificate, service
account tokens signed with a key of its own (issue 55, Build 2 — the first part: the API server;
controllers, scheduling and the nodes' kubelets are not started here yet).

One administrator identity (a static token in group `system:masters`) sets a test up; what the
product does is then done with the identity the product renders for itself (`TokenRequest` for
its ServiceAccount), so RBAC is judged by the real authorizer, not by our emulator.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.kube import components
from tests.support.procs import free_port

START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ControlPlane:
    url: str
    """https://127.0.0.1:<port> of the API server."""
    ca_file: Path
    """The API server's self-signed serving certificate (its own CA)."""
    admin_token: str
    logs: Path

    def client(self, token: str | None = None) -> object:
        """A `kubernetes.client.ApiClient` for `token` (default: the administrator)."""
        return api_client(self.url, self.ca_file, token or self.admin_token)


def api_client(url: str, ca_file: Path, token: str) -> Any:
    """A `kubernetes.client.ApiClient` for `token` on the API server at `url` (its CA: `ca_file`)."""
    from kubernetes import client

    config = client.Configuration()
    config.host = url
    config.ssl_ca_cert = str(ca_file)
    config.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(config)


def binaries_missing() -> list[str]:
    return components.missing(tuple(c for c in components.COMPONENTS if c.name in ("kubernetes", "etcd")))


def _service_account_key(folder: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = folder / "sa.key", folder / "sa.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def start_process(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_ready(url: str, ca_file: Path | None, token: str, process: subprocess.Popen[bytes], log: Path,
               *, what: str = "kube-apiserver", path: str = "/readyz", timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll `url + path` until it answers 200; fail with the log's tail if `process` exits or
    `timeout_s` passes. `ca_file=None` checks no certificate (a component's self-signed one)."""
    import ssl
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode}: {log.read_text()[-3000:]}")
        if ca_file is None or ca_file.exists():
            context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else ssl._create_unverified_context()
            try:
                request = urllib.request.Request(f"{url}{path}", headers={"Authorization": f"Bearer {token}"})
                with urllib.request.urlopen(request, context=context, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (OSError, ssl.SSLError):
                pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready in {timeout_s:g} s: {log.read_text()[-3000:]}")


@contextmanager
def control_plane(folder: Path) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on loopback ports, stopped (process groups) on exit."""
    bin_dir = components.bin_dir()
    folder.mkdir(parents=True, exist_ok=True)
    etcd_client, etcd_peer, secure = free_port(), free_port(), free_port()
    admin = secrets.token_hex(16)
    (folder / "tokens.csv").write_text(f'{admin},admin,admin,"system:masters"\n')
    private, public = _service_account_key(folder)
    started: list[subprocess.Popen[bytes]] = []
    try:
        started.append(start_process([str(bin_dir / "etcd"), "--data-dir", str(folder / "etcd"),
                               "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
                               "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
                               "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                               "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                               "--initial-cluster", f"default=http://127.0.0.1:{etcd_peer}",
                               "--log-level", "warn"], folder / "etcd.log"))
        certs = folder / "certs"
        started.append(start_process([
            str(bin_dir / "kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{etcd_client}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(secure),
            "--cert-dir", str(certs),  # no --tls-cert-file: it makes and serves a self-signed pair
            "--authorization-mode", "RBAC", "--token-auth-file", str(folder / "tokens.csv"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(public), "--service-account-signing-key-file", str(private),
            "--service-cluster-ip-range", "10.96.0.0/24", "--allow-privileged=false",
            "--endpoint-reconciler-type", "none",  # the loopback address may not be published as an endpoint
            "--enable-priority-and-fairness=false", "--v=1"], folder / "kube-apiserver.log"))
        ca_file = certs / "apiserver.crt"
        url = f"https://127.0.0.1:{secure}"
        wait_ready(url, ca_file, admin, started[-1], folder / "kube-apiserver.log")
        yield ControlPlane(url=url, ca_file=ca_file, admin_token=admin, logs=folder)
    finally:
        for process in reversed(started):
            stop_process(process)
