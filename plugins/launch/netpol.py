"""A job's NetworkPolicy (issue 56): its pods talk to each other, to the object store, the
tracker and DNS, and hear only from each other and the node agent.

Why per job rather than per team: NCCL and the rendezvous store open connections between the
job's own pods on any port (NCCL picks ephemeral ones), and two jobs of one team must not see
each other's traffic either; the pods of one run are selected by `trainyard.io/job` and
`trainyard.io/run` (every attempt of the run: a restarted attempt keeps its peers).

How each endpoint becomes a peer (a NetworkPolicy names addresses, never DNS names):
- an IP address: an `ipBlock` of that one address, on the URL's port;
- an in-cluster Service (`<svc>.<namespace>.svc[.cluster.local]`): every pod of that namespace
  (`kubernetes.io/metadata.name`), any port — a policy matches the pod's port after the
  Service's translation, which the URL does not tell;
- any other host name (AWS S3, an external MLflow): that port to any address. NetworkPolicy
  cannot say less; an egress gateway or a CNI's FQDN policy can, and is the cluster's choice.
A `spec.source.git` repository is one more endpoint (its init container fetches through the
same policy), scp-like `git@host:path` as `ssh://`. `file://` and SQLite settings are no network endpoint (and are refused in clusters by
`cluster_settings`). DNS is kube-system's `k8s-app: kube-dns` pods on port 53, UDP and TCP.

A policy is only as good as the network plugin that enforces it; the API server validates its
shape and stores it whether or not one does (README, Security).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

DNS_SELECTOR = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
NODE_AGENT_LABELS = {"app.kubernetes.io/name": "trainyard-node-agent"}
_DEFAULT_PORTS = {"http": 80, "https": 443, "s3": 443, "ssh": 22, "git": 9418}
_SCP_LIKE = re.compile(r"^[\w.-]+@([\w.-]+):")


def endpoint_rule(url: str) -> dict[str, Any] | None:
    """The egress rule that lets a pod reach `url`; None for what is not a network endpoint."""
    scp = _SCP_LIKE.match(url)
    parts = urlsplit(f"ssh://{scp.group(1)}/" if scp else url)
    if parts.scheme == "s3":  # s3://bucket/prefix without an endpoint: the AWS S3 service
        return {"ports": [{"protocol": "TCP", "port": 443}]}
    if parts.scheme not in ("http", "https", "ssh", "git") or not parts.hostname:
        return None
    host = parts.hostname
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        labels = host.split(".")
        if len(labels) >= 3 and labels[2] == "svc":
            return {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": labels[1]}}}]}
        return {"ports": [{"protocol": "TCP", "port": port}]}
    return {"to": [{"ipBlock": {"cidr": f"{address}/{address.max_prefixlen}"}}],
            "ports": [{"protocol": "TCP", "port": port}]}


def render_network_policy(name: str, namespace: str, job_selector: dict[str, str], *, endpoints: list[str],
                          platform_namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The NetworkPolicy of one run's pods (`job_selector`: their labels that name the run).

    `endpoints`: the URLs the pods reach (the object store's endpoint or bucket, the tracker)."""
    peers = {"podSelector": {"matchLabels": dict(job_selector)}}
    agent = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": platform_namespace}},
             "podSelector": {"matchLabels": NODE_AGENT_LABELS}}
    dns = {"to": [DNS_SELECTOR], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    egress = [{"to": [peers]}, dns]
    for url in endpoints:
        rule = endpoint_rule(url)
        if rule is not None and rule not in egress:
            egress.append(rule)
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "podSelector": {"matchLabels": dict(job_selector)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [peers, agent]}],
            "egress": egress,
        },
    }
