"""A real kubeconfig file with two contexts (no server behind it: building clients connects to nothing)."""

from __future__ import annotations

from pathlib import Path

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c1
  cluster: {server: "https://one.example.com:6443", insecure-skip-tls-verify: true}
- name: c2
  cluster: {server: "https://two.example.com:6443", insecure-skip-tls-verify: true}
users:
- name: u1
  user: {token: token-of-u1}
contexts:
- name: one
  context: {cluster: c1, user: u1}
- name: two
  context: {cluster: c2, user: u1}
current-context: one
"""


def write_kubeconfig(folder: Path) -> Path:
    path = folder / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path
