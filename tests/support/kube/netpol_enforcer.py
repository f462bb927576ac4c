"""A NetworkPolicy enforcer for the simulated nodes (issue 56): the network plugin this machine
lacks, small and for tests only, so that a rendered policy is proven to drop what it denies.

    with enforcing(kube.rest, kube.network) as enforcer:   # kube: a started RealKubeHarness
        kube.wait_for(lambda: "team-a/gpt-abc123" in enforcer.programmed, 30, "the policy")

What it does: whenever a watch on pods or NetworkPolicies reports a change, and every `TICK_S`
anyway, it lists pods, nodes, namespaces and NetworkPolicies through the API server, computes
which pods each policy isolates and what it allows them (networking.k8s.io/v1 semantics: a pod
selected by a policy of a direction is isolated in it, and allowed the union of those policies'
rules; replies of an allowed connection pass), and loads the result into nftables in the
simulated network's fabric namespace, where every node's traffic crosses the bridge: bridged
IPv4 packets go through that namespace's `forward` hook (bridge netfilter, on by default), a
node's packets to the fabric's own address through its `input` hook. One table, replaced
atomically (`nft -f`) when the objects change; nothing is loaded into this machine's own tables.

The granularity this simulation allows is the node: a pod's processes share its node's network
namespace, so a pod's address is its node's (`status.podIP`), and a packet says which node sent
it, not which pod. Hence what this enforcer cannot express:
- **pods of one node are one address**: a packet to or from a node must satisfy the policies of
  every isolated pod on it (their intersection: two runs' pods on one node restrict each other,
  fail closed), and a pod of that node not selected by any policy gets its neighbours' isolation;
- **traffic inside one node never crosses the bridge** (two pods of a node talk over its
  loopback): not policed;
- **the kubelet shares the node's address**: its connections to the API server (the fabric's
  `exempt_ports`, host network on a real cluster) are always allowed, so a pod could reach the
  API server on that port whatever its policy says;
- connections opened from the fabric namespace (this machine's side: the harness's relays and
  forwarders) are not policed (a real plugin lets a node reach its own pods too);
- IPv4 only: IPv6 crossing the fabric is dropped while the enforcer runs (the simulated network
  has IPv4 addresses alone; an IPv6 `ipBlock` allows nothing); named ports are refused
  (`errors`), as are protocols other than TCP, UDP and SCTP;
- a connection made before a policy appeared keeps flowing (its replies are conntrack's
  `established`), as with most plugins; a new one is judged by the policy. A pod's rules are
  loaded once its binding is seen (a watch), not before the kubelet may start its containers,
  as a plugin's are: a connection of its first fraction of a second may go unjudged;
- a denied connection is dropped (it times out), never refused: the kernel here has no bridge
  reject (`CONFIG_NFT_BRIDGE_REJECT` is off), as many plugins drop too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3

from tests.support.kube.harness import FABRIC_PORT
from tests.support.kube.netns import Network
from tests.support.kube.rest import Rest, resource_path
from tests.support.kube.volcano import selector_holds

TABLE = "trainyard_netpol"
TICK_S = 0.5
NETPOL = "networking.k8s.io/v1"
PROTOCOLS = ("TCP", "UDP", "SCTP")


@dataclass(frozen=True)
class Block:
    """An address range a rule allows, less its exceptions (a pod peer: its address, /32)."""
    cidr: str
    excepts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Port:
    protocol: str
    port: int | None = None
    """None: every port of `protocol`."""
    end: int | None = None


@dataclass(frozen=True)
class Match:
    """One rule of a policy: the far end within `peers` (None: anywhere) on one of `ports` (None: any)."""
    peers: tuple[Block, ...] | None
    ports: tuple[Port, ...] | None


@dataclass(frozen=True)
class Isolation:
    """What one isolated pod allows in one direction: the union of its policies' rules."""
    pod: str
    """`namespace/name`, for the comments of the ruleset."""
    address: str
    matches: tuple[Match, ...]


@dataclass(frozen=True)
class Model:
    ingress: tuple[Isolation, ...]
    egress: tuple[Isolation, ...]
    policies: frozenset[str]
    """`namespace/name` of the policies that isolate at least one pod."""


# --- what the objects say ---

def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A label selector against `labels` (the emulator's scheduler's, one home); None or {} selects all."""
    return selector_holds(labels, selector or {})


def node_addresses(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Node name → its InternalIP, as the kubelets report them."""
    return {n["metadata"]["name"]: a["address"] for n in nodes
            for a in (n.get("status") or {}).get("addresses") or [] if a["type"] == "InternalIP"}


def live_pods(pods: list[dict[str, Any]], nodes: dict[str, str]) -> list[tuple[dict[str, Any], str]]:
    """Pods that hold an address, with it: bound, not ended, not on the host network. A bound pod
    whose kubelet has not reported yet has its node's (`nodes`): the address is known from the
    binding on, so its rules are loaded while its containers start, as a plugin does before them."""
    out = []
    for pod in pods:
        status = pod.get("status") or {}
        address = status.get("podIP") or nodes.get(pod["spec"].get("nodeName") or "", "")
        if address and status.get("phase") not in ("Succeeded", "Failed") and not pod["spec"].get("hostNetwork"):
            out.append((pod, address))
    return out


def _peer_blocks(peer: dict[str, Any], namespace: str, pods: list[tuple[dict[str, Any], str]],
                 namespace_labels: dict[str, dict[str, str]]) -> list[Block]:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        if ipaddress.ip_network(block["cidr"], strict=False).version != 4:
            return []
        return [Block(block["cidr"], tuple(c for c in block.get("except") or []
                                           if ipaddress.ip_network(c, strict=False).version == 4))]
    if "namespaceSelector" in peer:
        spaces = {n for n, labels in namespace_labels.items() if selects(peer["namespaceSelector"], labels)}
    else:
        spaces = {namespace}
    addresses = {a for p, a in pods if p["metadata"]["namespace"] in spaces
                 and selects(peer.get("podSelector"), p["metadata"].get("labels") or {})}
    return [Block(f"{a}/32") for a in sorted(addresses)]


def _ports(rule: dict[str, Any]) -> tuple[Port, ...] | None:
    if not rule.get("ports"):
        return None
    out = []
    for item in rule["ports"]:
        protocol = item.get("protocol", "TCP")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r} is not enforced here (one of {PROTOCOLS})")
        port = item.get("port")
        if isinstance(port, str):
            raise ValueError(f"named port {port!r}: not enforced here (give the number)")
        out.append(Port(protocol, port, item.get("endPort")))
    return tuple(out)


def _matches(policy: dict[str, Any], direction: str, pods: list[tuple[dict[str, Any], str]],
             namespace_labels: dict[str, dict[str, str]]) -> list[Match]:
    namespace = policy["metadata"]["namespace"]
    far = "from" if direction == "ingress" else "to"
    out = []
    for rule in policy["spec"].get(direction) or []:
        peers = None
        if rule.get(far):
            peers = tuple(b for peer in rule[far] for b in _peer_blocks(peer, namespace, pods, namespace_labels))
        out.append(Match(peers, _ports(rule)))
    return out


def policy_types(policy: dict[str, Any]) -> list[str]:
    """`spec.policyTypes`, or what the API's default makes of its absence."""
    spec = policy["spec"]
    return spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])]


def model(pods: list[dict[str, Any]], policies: list[dict[str, Any]], namespaces: list[dict[str, Any]],
          nodes: list[dict[str, Any]] | None = None) -> Model:
    """Which pods the policies isolate, in which direction, and what each is allowed (`nodes`:
    the Node objects, whose addresses a bound pod has before its kubelet reports it)."""
    live = live_pods(pods, node_addresses(nodes or []))
    namespace_labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in namespaces}
    found: dict[str, list[Isolation]] = {"ingress": [], "egress": []}
    used = set()
    for pod, address in sorted(live, key=lambda pa: (pa[0]["metadata"]["namespace"], pa[0]["metadata"]["name"])):
        meta = pod["metadata"]
        mine = [p for p in policies if p["metadata"]["namespace"] == meta["namespace"]
                and selects(p["spec"].get("podSelector"), meta.get("labels") or {})]
        for direction in found:
            isolating = [p for p in mine if direction.capitalize() in policy_types(p)]
            if not isolating:
                continue
            used |= {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in isolating}
            matches = tuple(m for p in isolating for m in _matches(p, direction, live, namespace_labels))
            found[direction].append(Isolation(f"{meta['namespace']}/{meta['name']}", address, matches))
    return Model(tuple(found["ingress"]), tuple(found["egress"]), frozenset(used))


# --- the ruleset ---

def _port_clause(port: Port) -> str:
    proto = port.protocol.lower()
    if port.port is None:
        return f"meta l4proto {proto}"
    return f"{proto} dport {port.port}" + (f"-{port.end}" if port.end else "")


def _match_rules(match: Match, field: str) -> list[str]:
    """nft rules that `return` (this pod allows it) for what `match` allows; `field`: the far end."""
    if match.peers is None:
        peers = [""]
    else:
        peers = [f"{field} {b.cidr}" + (f" {field} != {{ {', '.join(b.excepts)} }}" if b.excepts else "")
                 for b in match.peers]
    ports = [""] if match.ports is None else [_port_clause(p) for p in match.ports]
    return [" ".join(part for part in (peer, port, "counter return") if part) for peer in peers for port in ports]


def chain_names(rules: Model) -> dict[str, str]:
    """Each pod chain's name → `namespace/pod direction`, the key of `NetpolEnforcer.verdicts`."""
    return {f"{direction}_{i}": f"{iso.pod} {direction}" for direction, isolations in
            (("egress", rules.egress), ("ingress", rules.ingress)) for i, iso in enumerate(isolations)}


def render(rules: Model, exempt_ports: tuple[int, ...] = (FABRIC_PORT,)) -> str:
    """The nft script that replaces the table: a chain per isolated pod and direction
    (`chain_names`), which returns when the packet is allowed and drops otherwise, counting
    either (only a connection's first packets reach it: replies and the rest of an allowed
    connection are accepted before); the hooks jump to each chain of the packet's source
    (egress) and destination (ingress) address in turn, so a packet passes only if every
    isolated pod of both nodes allows it."""
    chains, forward, inbound = [], [], []
    for direction, isolations, field, hook_field in (("egress", rules.egress, "ip daddr", "ip saddr"),
                                                     ("ingress", rules.ingress, "ip saddr", "ip daddr")):
        for i, iso in enumerate(isolations):
            name = f"{direction}_{i}"
            body = [r for m in iso.matches for r in _match_rules(m, field)]
            chains.append(f"  chain {name} {{\n" + "".join(f"    {r}\n" for r in [*body, "counter drop"]) + "  }\n")
            jump = f'{hook_field} {iso.address} jump {name} comment "{iso.pod} {direction}"'
            forward.append(jump)
            if direction == "egress":  # the fabric's own address is no pod: only egress applies there
                inbound.append(jump)
    head = ["ct state established,related accept", "meta nfproto ipv6 drop"]
    exempt = [f'tcp dport {{ {", ".join(map(str, exempt_ports))} }} accept comment "the API server (host network)"'] \
        if exempt_ports else []
    hooks = [("forward", [*head, *forward]), ("input", [*head, *exempt, *inbound])]
    text = "".join(chains) + "".join(
        f"  chain {hook} {{\n    type filter hook {hook} priority filter; policy accept;\n"
        + "".join(f"    {r}\n" for r in body) + "  }\n" for hook, body in hooks)
    return f"table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n{text}}}\n"


def nft(netns: str, script: str) -> None:
    """Load `script` with `nft -f -` inside network namespace `netns` (one transaction)."""
    result = subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script, capture_output=True,
                            text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"nft in {netns}: {result.stderr.strip() or result.returncode}")


def counted(listing: dict[str, Any], chains: dict[str, str]) -> dict[str, Counter[str]]:
    """The pod chains' counters in `nft -j list table` output: `namespace/pod direction` →
    packets `allowed` (the rules that return) and `dropped` (the chain's last rule)."""
    out: dict[str, Counter[str]] = {}
    for item in listing.get("nftables") or []:
        rule = item.get("rule")
        if not rule or rule["chain"] not in chains:
            continue
        packets = next((e["counter"]["packets"] for e in rule["expr"] if "counter" in e), 0)
        verdict = "dropped" if any("drop" in e for e in rule["expr"]) else "allowed"
        out.setdefault(chains[rule["chain"]], Counter())[verdict] += packets
    return out


# --- the controller ---

class NetpolEnforcer:
    """Keeps the fabric's table in step with the API server's pods and policies (`sync`)."""

    def __init__(self, rest: Callable[[], Rest], network: Network, exempt_ports: tuple[int, ...] = (FABRIC_PORT,)) -> None:
        self.rest = rest
        self.network = network
        self.exempt_ports = exempt_ports
        self.programmed: frozenset[str] = frozenset()
        """The policies (`namespace/name`) that isolate a pod in the table now loaded."""
        self.isolated: set[str] = set()
        """Every pod (`namespace/name`) isolated by a table once loaded: a test's evidence after it ended."""
        self.ruleset = ""
        self.errors: list[str] = []
        self._chains: dict[str, str] = {}
        self._before: dict[str, Counter[str]] = {}
        """The counters of the tables replaced so far (`verdicts`)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, urllib3.BaseHTTPResponse] = {}

    def sync(self) -> None:
        api = self.rest()
        rules = model(api.list("v1", "pods"), api.list(NETPOL, "networkpolicies"), api.list("v1", "namespaces"),
                      api.list("v1", "nodes"))
        script = render(rules, self.exempt_ports)
        with self._lock:
            if script != self.ruleset:
                self._before = self._add(self._before, self._loaded_counts())
                nft(self.network.fabric, script)
                self.ruleset, self._chains = script, chain_names(rules)
        self.programmed = rules.policies
        self.isolated |= {i.pod for i in (*rules.ingress, *rules.egress)}

    def verdicts(self) -> dict[str, Counter[str]]:
        """Connections judged so far by each pod's rules (`namespace/pod direction` → packets
        `allowed` and `dropped`), over every table loaded: what the policies decided."""
        with self._lock:
            return self._add(self._before, self._loaded_counts())

    def _loaded_counts(self) -> dict[str, Counter[str]]:
        if not self._chains:
            return {}
        result = subprocess.run(["ip", "netns", "exec", self.network.fabric, "nft", "-j", "list", "table", "inet",
                                 TABLE], capture_output=True, text=True, timeout=30, check=True)
        return counted(json.loads(result.stdout), self._chains)

    @staticmethod
    def _add(a: dict[str, Counter[str]], b: dict[str, Counter[str]]) -> dict[str, Counter[str]]:
        return {key: a.get(key, Counter()) + b.get(key, Counter()) for key in {*a, *b}}

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.sync()
            except Exception as e:  # noqa: BLE001 - keep enforcing; the test asserts `errors` is empty
                self.errors.append(f"{type(e).__name__}: {e}")
            self._wake.wait(TICK_S)

    def _watch(self, api_version: str, plural: str) -> None:
        """Wake the sync at once on any change of `plural` (a watch: a pod's binding is seen
        within milliseconds, where the simulated kubelet polls every 0.5 s)."""
        while not self._stop.is_set():
            api = self.rest()
            try:
                response = api.http.request(
                    "GET", api.url + resource_path(api_version, plural) + "?watch=true&timeoutSeconds=30",
                    headers=api.headers, preload_content=False, timeout=urllib3.Timeout(connect=5, read=35))
                self._watches[plural] = response
                if self._stop.is_set():  # stopped while this request was being made
                    response.shutdown()
                for _ in response.stream(4096):
                    self._wake.set()
                    if self._stop.is_set():
                        break
                response.release_conn()
            except (urllib3.exceptions.HTTPError, OSError):
                self._stop.wait(TICK_S)

    def start(self) -> NetpolEnforcer:
        self._threads = [threading.Thread(target=self._run, name="netpol-enforcer", daemon=True)]
        self._threads += [threading.Thread(target=self._watch, args=what, name=f"netpol-watch-{what[1]}", daemon=True)
                          for what in (("v1", "pods"), (NETPOL, "networkpolicies"))]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop syncing and delete the table (the fabric's traffic is unpoliced again)."""
        self._stop.set()
        self._wake.set()
        for response in list(self._watches.values()):  # an open watch would hold the API server's shutdown
            # a watch the API server ended meanwhile has given its connection back to the pool:
            # urllib3 then refuses the shutdown (RuntimeError; CI, once) — nothing is open to end
            with contextlib.suppress(OSError, urllib3.exceptions.HTTPError, RuntimeError, ValueError):
                response.shutdown()
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock, contextlib.suppress(RuntimeError, subprocess.SubprocessError):
            self._before, self._chains = self._add(self._before, self._loaded_counts()), {}
            nft(self.network.fabric, f"table inet {TABLE}\ndelete table inet {TABLE}\n")


@contextlib.contextmanager
def enforcing(rest: Callable[[], Rest], network: Network) -> Iterator[NetpolEnforcer]:
    enforcer = NetpolEnforcer(rest, network).start()
    try:
        yield enforcer
    finally:
        enforcer.stop()
