"""A container's readiness and liveness probes, as the kubelet runs them (`kubelet.py` calls
`Prober.due` each sync).

Semantics kept from the kubelet: a probe first runs `initialDelaySeconds` after the container
started, then every `periodSeconds` (default 10); each try gets `timeoutSeconds` (default 1);
`failureThreshold` (default 3) failures in a row make it fail, `successThreshold` (1) successes
make it pass. A readiness probe's verdict is the container's `ready` (False until the first
success); a failed liveness probe has the container killed (and restarted as the pod's
`restartPolicy` says). A container without a readiness probe is ready while it runs.

Probe kinds: `httpGet` (a status 200-399 passes) and `tcpSocket` (a connection passes), both to
the pod's IP — the node's, since every simulated pod shares its node's network — unless the
probe names a `host`; a named port is looked up among the container's ports. `exec` and `grpc`
are not emulated: such a probe fails, saying so (in the events), rather than passing unseen.

The kubelet runs the probes in its own loop, one after another: a probe that hangs holds the
loop for its timeout (the node agent's are 5 s), as no probe here is expected to hang.
"""

from __future__ import annotations

import http.client
import socket
import time
from dataclasses import dataclass, field
from typing import Any

KINDS = ("readinessProbe", "livenessProbe")


@dataclass
class ProbeState:
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0
    passing: bool = False
    last_error: str = ""


@dataclass
class Prober:
    """The probes of one running container (started at `started`, monotonic)."""

    spec: dict[str, Any]
    address: str
    started: float = field(default_factory=time.monotonic)
    states: dict[str, ProbeState] = field(default_factory=dict)

    def due(self, now: float) -> list[tuple[str, bool, str]]:
        """Run the probes whose time has come: (kind, passed this try, why not)."""
        out = []
        for kind in KINDS:
            probe = self.spec.get(kind)
            if not probe:
                continue
            state = self.states.setdefault(kind, ProbeState())
            if now < self.started + probe.get("initialDelaySeconds", 0) or now < state.next_at:
                continue
            state.next_at = now + probe.get("periodSeconds", 10)
            error = self._try(probe)
            if error:
                state.failures, state.successes, state.last_error = state.failures + 1, 0, error
                if state.failures >= probe.get("failureThreshold", 3):
                    state.passing = False
            else:
                state.successes, state.failures = state.successes + 1, 0
                if state.successes >= probe.get("successThreshold", 1):
                    state.passing = True
            out.append((kind, not error, error))
        return out

    @property
    def ready(self) -> bool:
        if not self.spec.get("readinessProbe"):
            return True
        state = self.states.get("readinessProbe")
        return state is not None and state.passing

    @property
    def dead(self) -> bool:
        """The liveness probe has failed `failureThreshold` times in a row."""
        probe = self.spec.get("livenessProbe")
        state = self.states.get("livenessProbe")
        return bool(probe) and state is not None and state.failures >= probe.get("failureThreshold", 3)

    def _port(self, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for item in self.spec.get("ports") or []:
            if item.get("name") == port:
                return int(item["containerPort"])
        raise ValueError(f"port {port!r} is not a port of the container")

    def _try(self, probe: dict[str, Any]) -> str:
        """'' when the probe passes, else why not (the text of the kubelet's Unhealthy event)."""
        timeout = probe.get("timeoutSeconds", 1)
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                if get.get("scheme", "HTTP") != "HTTP":
                    return f"scheme {get['scheme']} is not emulated"
                conn = http.client.HTTPConnection(get.get("host") or self.address, self._port(get["port"]),
                                                  timeout=timeout)
                try:
                    conn.request("GET", get.get("path", "/"), headers={
                        h["name"]: h["value"] for h in get.get("httpHeaders") or []} | {"User-Agent": "kube-probe/1.37"})
                    status = conn.getresponse().status
                finally:
                    conn.close()
                return "" if 200 <= status < 400 else f"HTTP probe failed with statuscode: {status}"
            if "tcpSocket" in probe:
                tcp = probe["tcpSocket"]
                socket.create_connection((tcp.get("host") or self.address, self._port(tcp["port"])), timeout).close()
                return ""
        except (OSError, http.client.HTTPException, ValueError) as e:
            return f"Get probe: {type(e).__name__}: {e}"
        return f"probe kind {sorted(set(probe) & {'exec', 'grpc'})} is not emulated"
