"""The agent's HTTP API, on the standard library's `ThreadingHTTPServer`.

Four small endpoints do not justify an ASGI stack: the standard library server starts in
milliseconds, has no event loop to block, and one thread per request is plenty for a few
scrapers per node.

    GET    /health   NodeHealth JSON (200 even when unhealthy: it is a report, not a probe)
    GET    /metrics  Prometheus text (OpenMetrics when the scraper asks for it)
    GET    /livez    "ok": the process serves; for the Kubernetes liveness probe
    POST   /faults   inject a fault (FaultRequest JSON) — 403 unless --enable-fault-injection
    DELETE /faults   clear injected faults            — 403 unless --enable-fault-injection
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder
from pydantic import ValidationError

from trainyard.node_agent.metrics import build_registry
from trainyard.node_agent.models import FaultRequest
from trainyard.node_agent.monitor import Monitor

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024
SHUTDOWN_POLL_S = 0.1
"""How often the serving loop checks for `stop()` (the standard library's default is 0.5 s)."""


class AgentServer:
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.registry = build_registry(monitor)
        config = monitor.config
        self._httpd = ThreadingHTTPServer((config.host, config.port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the OS's choice when the config said 0)."""
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(SHUTDOWN_POLL_S,),
                                        name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def _make_handler(server: AgentServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        agent = server

    return Handler


class _Handler(BaseHTTPRequestHandler):
    agent: AgentServer
    timeout = 10.0
    """Seconds a client may take to send its request before its thread gives up on it."""
    server_version = "trainyard-node-agent"

    def do_GET(self) -> None:
        self._dispatch({"/health": self._health, "/metrics": self._metrics, "/livez": self._livez})

    def do_POST(self) -> None:
        self._dispatch({"/faults": self._inject})

    def do_DELETE(self) -> None:
        self._dispatch({"/faults": self._clear})

    def _dispatch(self, routes: dict[str, Callable[[], None]]) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        route = routes.get(path)
        try:
            if route is not None:
                route()
            elif path in ("/health", "/metrics", "/livez", "/faults"):
                self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed on {path}")
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")
        except Exception:
            log.exception("%s %s failed", self.command, self.path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error (see the agent's log)")

    def _health(self) -> None:
        self._send(HTTPStatus.OK, self.agent.monitor.health().model_dump_json().encode(), "application/json")

    def _metrics(self) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        self._send(HTTPStatus.OK, encoder(self.agent.registry), content_type)

    def _livez(self) -> None:
        self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")

    def _inject(self) -> None:
        if not self._faults_allowed():
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes, limit {MAX_BODY_BYTES}")
            return
        try:
            fault = FaultRequest.model_validate_json(self.rfile.read(length) or b"{}")
            self.agent.monitor.inject(fault)
        except ValidationError as e:
            self._error(HTTPStatus.BAD_REQUEST, "; ".join(err["msg"] for err in e.errors()))
            return
        except ValueError as e:
            self._error(HTTPStatus.BAD_REQUEST, str(e))
            return
        self._health()

    def _clear(self) -> None:
        if self._faults_allowed():
            self.agent.monitor.clear_faults()
            self._health()

    def _faults_allowed(self) -> bool:
        if self.agent.monitor.config.enable_fault_injection:
            return True
        self._error(HTTPStatus.FORBIDDEN, "fault injection is disabled (start the agent with --enable-fault-injection)")
        return False

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)
