"""A job's NetworkPolicy as rendered: peers, node agent, DNS and each kind of endpoint."""

from __future__ import annotations

from tests.unit.launch.launch_fixtures import validate_k8s
from trainyard.plugins.launch.netpol import DNS_SELECTOR, endpoint_rule, render_network_policy

RUN = {"trainyard.io/job": "gpt", "trainyard.io/run": "r-1"}


def test_ingress_from_the_runs_pods_and_the_node_agent_egress_to_peers_dns_and_endpoints() -> None:
    policy = render_network_policy("gpt-abc123", "team-a", RUN, platform_namespace="trainyard",
                                   endpoints=["http://10.0.0.9:9000", "http://mlflow.ml.svc:5000"])
    validate_k8s(policy)
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": RUN} and spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"from": [
        {"podSelector": {"matchLabels": RUN}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "trainyard"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "trainyard-node-agent"}}}]}]
    assert spec["egress"] == [
        {"to": [{"podSelector": {"matchLabels": RUN}}]},
        {"to": [DNS_SELECTOR], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [{"ipBlock": {"cidr": "10.0.0.9/32"}}], "ports": [{"protocol": "TCP", "port": 9000}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml"}}}]},
    ]


def test_each_kind_of_endpoint() -> None:
    assert endpoint_rule("https://[fd00::5]/") == {"to": [{"ipBlock": {"cidr": "fd00::5/128"}}],
                                                   "ports": [{"protocol": "TCP", "port": 443}]}
    assert endpoint_rule("s3://bucket/prefix") == {"ports": [{"protocol": "TCP", "port": 443}]}
    assert endpoint_rule("http://minio.example.com:9000") == {"ports": [{"protocol": "TCP", "port": 9000}]}
    assert endpoint_rule("http://store.data.svc.cluster.local:9000") == {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "data"}}}]}
    assert endpoint_rule("git@github.com:org/repo.git") == {"ports": [{"protocol": "TCP", "port": 22}]}
    assert endpoint_rule("ssh://git@10.1.2.3:2222/repo") == {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],
                                                             "ports": [{"protocol": "TCP", "port": 2222}]}
    assert endpoint_rule("file:///var/objects") is None
    assert endpoint_rule("sqlite:////tmp/mlflow.db") is None


def test_one_rule_per_endpoint_even_when_two_settings_name_the_same() -> None:
    policy = render_network_policy("j", "team-a", RUN, platform_namespace="trainyard",
                                   endpoints=["s3://a/b", "s3://c/d", "https://tracker.example.com"])
    assert policy["spec"]["egress"][2:] == [{"ports": [{"protocol": "TCP", "port": 443}]}]
