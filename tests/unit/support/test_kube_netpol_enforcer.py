"""The simulated nodes' policy enforcer, without a kernel: which pods a policy isolates, what it
allows them at node granularity, and the nft ruleset that says so (the kernel's part is
`tests/integration/kube/test_netpol_enforced.py`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.kube.netpol_enforcer import (
    Block,
    Match,
    Port,
    chain_names,
    counted,
    model,
    render,
)
from trainyard.plugins.launch.netpol import render_network_policy

RUN_A = {"trainyard.io/job": "gpt", "trainyard.io/run": "r-a"}
RUN_B = {"trainyard.io/job": "gpt", "trainyard.io/run": "r-b"}
AGENT = {"app.kubernetes.io/name": "trainyard-node-agent"}


def pod(name: str, address: str, labels: dict[str, str], *, namespace: str = "team-a", phase: str = "Running",
        host_network: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"hostNetwork": host_network}, "status": {"phase": phase, "podIP": address}}


def namespaces(*names: str) -> list[dict[str, Any]]:
    return [{"metadata": {"name": n, "labels": {"kubernetes.io/metadata.name": n}}} for n in names]


def policy_a(*endpoints: str) -> dict[str, Any]:
    return render_network_policy("gpt-r-a", "team-a", RUN_A, endpoints=list(endpoints), platform_namespace="trainyard")


def test_the_rendered_policy_isolates_its_run_and_allows_its_peers_the_agent_and_the_store() -> None:
    pods = [pod("a-0", "10.0.0.10", RUN_A), pod("a-1", "10.0.0.11", RUN_A), pod("b-2", "10.0.0.12", RUN_B),
            pod("a-elsewhere", "10.0.0.13", RUN_A, namespace="team-b"),
            pod("agent", "10.0.0.14", AGENT, namespace="trainyard")]
    rules = model(pods, [policy_a("http://10.0.0.1:9000/")], namespaces("team-a", "team-b", "trainyard", "kube-system"))

    assert [i.pod for i in rules.ingress] == [i.pod for i in rules.egress] == ["team-a/a-0", "team-a/a-1"]
    assert rules.policies == {"team-a/gpt-r-a"}
    peers = (Block("10.0.0.10/32"), Block("10.0.0.11/32"))  # not the same labels in another namespace
    assert rules.ingress[0].matches == (Match((*peers, Block("10.0.0.14/32")), None),)
    assert rules.egress[0].matches == (
        Match(peers, None),
        Match((), (Port("UDP", 53), Port("TCP", 53))),  # no kube-dns pod here: allows nothing
        Match((Block("10.0.0.1/32"),), (Port("TCP", 9000),)))


def test_pods_without_an_address_ended_or_on_the_host_network_are_neither_isolated_nor_peers() -> None:
    pods = [pod("a-0", "10.0.0.10", RUN_A), pod("a-done", "10.0.0.11", RUN_A, phase="Succeeded"),
            pod("a-pending", "", RUN_A, phase="Pending"), pod("a-host", "10.0.0.12", RUN_A, host_network=True)]
    rules = model(pods, [policy_a()], namespaces("team-a"))
    assert [i.pod for i in rules.ingress] == ["team-a/a-0"]
    assert rules.ingress[0].matches[0].peers == (Block("10.0.0.10/32"),)


def test_a_bound_pod_has_its_nodes_address_before_its_kubelet_reports_one() -> None:
    bound = pod("a-1", "", RUN_A, phase="Pending")
    bound["spec"]["nodeName"] = "node-1"
    nodes = [{"metadata": {"name": "node-1"}, "status": {"addresses": [{"type": "Hostname", "address": "node-1"},
                                                                        {"type": "InternalIP", "address": "10.0.0.11"}]}}]
    rules = model([pod("a-0", "10.0.0.10", RUN_A), bound], [policy_a()], namespaces("team-a"), nodes)
    assert [(i.pod, i.address) for i in rules.ingress] == [("team-a/a-0", "10.0.0.10"), ("team-a/a-1", "10.0.0.11")]
    assert rules.egress[0].matches[0].peers == (Block("10.0.0.10/32"), Block("10.0.0.11/32"))


def test_policy_types_decide_the_directions_and_ip_blocks_keep_their_exceptions() -> None:
    ingress_only = {"metadata": {"name": "in", "namespace": "team-a"},
                    "spec": {"podSelector": {"matchExpressions": [{"key": "trainyard.io/run", "operator": "In",
                                                                   "values": ["r-a"]}]},
                             "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.12/32"]}},
                                                   {"ipBlock": {"cidr": "fd00::/64"}}],
                                          "ports": [{"port": 7000, "endPort": 7010}]}]}}
    rules = model([pod("a-0", "10.0.0.10", RUN_A), pod("b-2", "10.0.0.12", RUN_B)], [ingress_only],
                  namespaces("team-a"))
    assert rules.egress == ()  # no policyTypes, no egress section: Ingress only (the API's default)
    assert [i.pod for i in rules.ingress] == ["team-a/a-0"]
    assert rules.ingress[0].matches == (Match((Block("10.0.0.0/24", ("10.0.0.12/32",)),), (Port("TCP", 7000, 7010),)),)


def test_an_empty_rule_list_denies_everything_and_an_empty_rule_allows_everything() -> None:
    deny = {"metadata": {"name": "deny", "namespace": "team-a"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [{}]}}
    rules = model([pod("a-0", "10.0.0.10", RUN_A)], [deny], namespaces("team-a"))
    assert rules.ingress[0].matches == (Match(None, None),)
    assert rules.egress[0].matches == ()


def test_a_named_port_is_refused_rather_than_enforced_wrongly() -> None:
    named = {"metadata": {"name": "named", "namespace": "team-a"},
             "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": "rendezvous"}]}]}}
    with pytest.raises(ValueError, match="named port 'rendezvous'"):
        model([pod("a-0", "10.0.0.10", RUN_A)], [named], namespaces("team-a"))


def chain(table: str, name: str) -> list[str]:
    """The rules of chain `name` in the rendered table, one a line."""
    return [line.strip() for line in table.split(f"  chain {name} {{\n")[1].split("\n  }\n")[0].splitlines()]


def test_the_ruleset_makes_every_isolated_pod_of_both_nodes_allow_a_packet() -> None:
    """Two runs' pods on one node (one address): both chains are jumped to, so the node's
    traffic must satisfy both policies (fail closed); replies pass; the API server port is
    exempt on the fabric's own address, where only egress applies."""
    policy_b = render_network_policy("gpt-r-b", "team-a", RUN_B, endpoints=[], platform_namespace="trainyard")
    pods = [pod("a-0", "10.0.0.10", RUN_A), pod("b-0", "10.0.0.10", RUN_B), pod("a-1", "10.0.0.11", RUN_A)]
    script = render(model(pods, [policy_a(), policy_b], namespaces("team-a")), exempt_ports=(6443,))
    head, table = script.split("table inet trainyard_netpol {\n")
    assert head == "table inet trainyard_netpol\ndelete table inet trainyard_netpol\n"  # one transaction
    forward, inbound = chain(table, "forward"), chain(table, "input")
    jumps = [line.split(" comment ")[0] for line in forward if "jump" in line]
    assert jumps == ["ip saddr 10.0.0.10 jump egress_0", "ip saddr 10.0.0.11 jump egress_1",
                     "ip saddr 10.0.0.10 jump egress_2", "ip daddr 10.0.0.10 jump ingress_0",
                     "ip daddr 10.0.0.11 jump ingress_1", "ip daddr 10.0.0.10 jump ingress_2"]
    assert forward[1] == "ct state established,related accept"
    assert [line.split(" comment ")[0] for line in inbound if "jump" in line] == jumps[:3]
    assert any(line.startswith("tcp dport { 6443 } accept") for line in inbound)
    assert chain(table, "ingress_2") == ["ip saddr 10.0.0.10/32 counter return", "counter drop"]  # b-0: itself


def test_without_a_policy_the_ruleset_isolates_nothing() -> None:
    script = render(model([pod("a-0", "10.0.0.10", RUN_A)], [], namespaces("team-a")))
    assert "jump" not in script and "drop\n" not in script.replace("ipv6 drop", "")


def test_the_counters_of_each_pods_chain_say_what_its_rules_allowed_and_dropped() -> None:
    """`nft -j list table`'s shape (nftables 1.0): a rule's expressions hold its counter and verdict."""
    rules = model([pod("a-0", "10.0.0.10", RUN_A), pod("a-1", "10.0.0.11", RUN_A)], [policy_a()], namespaces("team-a"))
    chains = chain_names(rules)
    assert chains == {"egress_0": "team-a/a-0 egress", "egress_1": "team-a/a-1 egress",
                      "ingress_0": "team-a/a-0 ingress", "ingress_1": "team-a/a-1 ingress"}

    def rule(chain: str, packets: int, verdict: str) -> dict[str, Any]:
        return {"rule": {"family": "inet", "table": "trainyard_netpol", "chain": chain, "handle": 4, "expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.0.0.11"}},
            {"counter": {"packets": packets, "bytes": 60 * packets}}, {verdict: None}]}}

    listing = {"nftables": [{"metainfo": {"version": "1.0.6"}}, rule("ingress_0", 2, "return"),
                            rule("ingress_0", 1, "return"), rule("ingress_0", 3, "drop"),
                            rule("forward", 9, "return")]}
    assert counted(listing, chains) == {"team-a/a-0 ingress": {"allowed": 3, "dropped": 3}}
