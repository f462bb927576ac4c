"""A small client for node agents, for the control plane's sensors and triggers, and for tests.

Standard library HTTP only (`urllib`), and `trainyard.node_agent.models` (pydantic): importing this from
a trigger or a DAG-adjacent module costs next to nothing.

The two failure modes are separate exceptions because they mean different things to a sensor:
`AgentUnreachable` is a missed heartbeat (three in a row → node_lost, DESIGN §5), while
`AgentResponseError` means an agent answered but not with a report (a bug or a version skew).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from trainyard.node_agent.models import FaultRequest, NodeHealth
from trainyard.plugins.errors import FatalError, TrainyardError, TransientError


class NodeAgentError(TrainyardError):
    """Base of the client's errors; `url` names the agent."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url


class AgentUnreachable(NodeAgentError, TransientError):
    """No answer: refused, timed out, DNS failure. Counts as a missed node heartbeat; asking
    again later may get one."""


class AgentResponseError(NodeAgentError, FatalError):
    """The agent answered, but with an error status or a body that is not the expected JSON
    (a refused request, a bug, a version skew): asking again gets the same answer."""

    def __init__(self, url: str, message: str, status: int | None = None) -> None:
        super().__init__(url, message)
        self.status = status


def endpoint(base_url: str, path: str) -> str:
    """`http://node:9420` (or `.../health`, with or without a trailing slash) → `http://node:9420/<path>`."""
    parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
    root = parts.path.rstrip("/")
    for known in ("/health", "/metrics", "/faults", "/livez"):
        if root.endswith(known):
            root = root[: -len(known)]
            break
    return urlunsplit((parts.scheme, parts.netloc, f"{root}/{path.lstrip('/')}", "", ""))


def fetch_health(url: str, timeout: float = 5.0) -> NodeHealth:
    """`GET /health` of the agent at `url` (its base URL or its /health URL)."""
    return _report(endpoint(url, "health"), "GET", None, timeout)


def inject_fault(url: str, fault: FaultRequest, timeout: float = 5.0) -> NodeHealth:
    """`POST /faults`; the agent refuses (403 → AgentResponseError) unless fault injection is on."""
    body = fault.model_dump_json().encode()
    return _report(endpoint(url, "faults"), "POST", body, timeout)


def clear_faults(url: str, timeout: float = 5.0) -> NodeHealth:
    return _report(endpoint(url, "faults"), "DELETE", None, timeout)


def _report(url: str, method: str, body: bytes | None, timeout: float) -> NodeHealth:
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"Accept": "application/json", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read()
    except urllib.error.HTTPError as e:
        raise AgentResponseError(url, f"HTTP {e.code}: {_error_text(e)}", status=e.code) from e
    except (urllib.error.URLError, OSError) as e:  # refused, reset, DNS, timeout
        reason = getattr(e, "reason", e)
        raise AgentUnreachable(url, f"no answer ({reason})") from e
    try:
        return NodeHealth.model_validate_json(data)
    except ValidationError as e:
        raise AgentResponseError(url, f"not a NodeHealth report: {e.error_count()} error(s), "
                                      f"first: {e.errors()[0]['msg']}") from e


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read() or b"{}").get("error") or e.reason)
    except (ValueError, AttributeError, OSError):
        return str(e.reason)
