"""The emulated Kubernetes API server: real HTTP in front of `store.Store`.

Why not `kmock`'s `KubernetesEmulator`: in kmock 0.8 a list ignores `labelSelector` and
`fieldSelector`, objects get no `uid` or `resourceVersion`, a delete knows no preconditions,
grace or propagation, `pods/<name>/log` answers with the pod's JSON, and nothing is validated —
the very things the launcher's contract rests on (re-attach by name + uid, pods of one run by
label, foreground deletion). Overriding all of that through its private request objects would
leave little of the library, so this is the smallest server that is honest about them
(`store.py` lists the rules it keeps and the ones it simplifies).

Paths: the REST layout of the real server — `/api/v1[/namespaces/<ns>]/<plural>[/<name>[/status|
/binding|/log]]`, `/apis/<group>/<version>/…` for the Volcano kinds — plus `/version`,
`/healthz`, and discovery (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`). Lists, watches
(`?watch=true`, chunked JSON lines, `resourceVersion`, `timeoutSeconds`), create, get, replace,
merge / strategic-merge / JSON patch, delete (one object or a collection by selector), pod
bindings and pod logs. Every request needs the bearer token of the harness's kubeconfig.

The server can listen on several sockets at once (the harness adds one inside the nodes'
network namespace, so the simulated kubelets reach it over the simulated network).
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.kube.store import BY_PATH, KINDS, POD, ApiError, Kind, Store

log = logging.getLogger(__name__)

LogPath = Callable[[dict[str, Any], str], Path | None]
"""(pod, container) → the file holding that container's output (None: not started yet)."""


class _Listener(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        """A client whose node was cut off (`KubeHarness.lose_node`) resets its connections: as a
        real API server, say nothing of it; print anything else (socketserver's default)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ApiServer:
    """The store, the token, and the HTTP listeners in front of them."""

    def __init__(self, token: str, *, log_path: LogPath | None = None) -> None:
        self.store = Store()
        self.token = token
        self.log_path = log_path
        self._servers: list[_Listener] = []
        self._closing = threading.Event()
        for name in ("default", "kube-system"):
            self.store.create(BY_PATH[("", "v1", "namespaces")], None,
                              {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def listen(self, sock: socket.socket | None = None, host: str = "127.0.0.1") -> str:
        """Serve on `sock` (already bound and listening) or on a free port of `host`; the URL."""
        server = _Listener((host, 0), _Handler, bind_and_activate=sock is None)
        if sock is not None:
            server.socket.close()
            server.socket = sock
            server.server_address = sock.getsockname()[:2]
        server.daemon_threads = True
        server.api = self  # type: ignore[attr-defined]
        self._servers.append(server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                         name=f"kube-api-{server.server_address[1]}", daemon=True).start()
        address, port = server.server_address[:2]
        return f"http://{address}:{port}"

    def close(self) -> None:
        self._closing.set()
        with self.store.cond:
            self.store.cond.notify_all()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    @property
    def closing(self) -> bool:
        return self._closing.is_set()


def _route(path: str) -> tuple[Kind, str | None, str | None, str | None]:
    """(kind, namespace, name, subresource) of a resource path; ApiError 404 otherwise."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    kind = BY_PATH.get((group, version, rest[0]))
    if kind is None or len(rest) > 3:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    if namespace is not None and not kind.namespaced:
        raise ApiError(404, "NotFound", f"{kind.key} is not namespaced")
    return kind, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None


def _discovery(path: str) -> dict[str, Any] | None:
    groups = sorted({(k.group, k.version) for k in KINDS if k.group})
    if path == "/version":
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-trainyard-emulator", "platform": "linux/amd64"}
    if path in ("/healthz", "/readyz", "/livez"):
        return {"status": "ok"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
             "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups]}
    for group, version in [("", "v1"), *groups]:
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        if path == prefix:
            resources = []
            for k in KINDS:
                if (k.group, k.version) == (group, version):
                    verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
                    resources.append({"name": k.plural, "singularName": k.kind.lower(), "namespaced": k.namespaced,
                                      "kind": k.kind, "verbs": verbs})
                    if k.status:
                        resources.append({"name": f"{k.plural}/status", "singularName": "", "namespaced": k.namespaced,
                                          "kind": k.kind, "verbs": ["get", "patch", "update"]})
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": prefix.split("/", 2)[-1],
                    "resources": resources}
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trainyard-kube-emulator"

    @property
    def api(self) -> ApiServer:
        return self.server.api  # type: ignore[attr-defined,no-any-return]

    def setup(self) -> None:
        super().setup()
        # headers and body leave in two writes: without this, Nagle + delayed ACK add ~40 ms a request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
        body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if self.headers.get("Authorization") != f"Bearer {self.api.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if method == "GET" and (found := _discovery(url.path.rstrip("/") or "/")) is not None:
                return self._send(200, found)
            body = json.loads(raw) if raw else None
            kind, namespace, name, sub = _route(url.path)
            self._resource(method, kind, namespace, name, sub, query, body)
        except ApiError as e:
            self._send(e.code, e.status())
        except json.JSONDecodeError as e:
            self._send(400, ApiError(400, "BadRequest", f"the request body is not JSON: {e}").status())
        except BrokenPipeError:
            pass

    def _resource(self, method: str, kind: Kind, namespace: str | None, name: str | None, sub: str | None,
                  query: dict[str, str], body: Any) -> None:
        store = self.api.store
        if sub not in (None, "status", "binding", "log") or (sub and kind is not POD and sub != "status"):
            raise ApiError(404, "NotFound", f"{kind.key} has no subresource {sub!r}")
        if name is None:
            if method == "GET" and query.get("watch", "").lower() in ("true", "1"):
                return self._watch(kind, namespace, query)
            if method == "GET":
                items, rv = store.list(kind, namespace, query.get("labelSelector"), query.get("fieldSelector"))
                return self._send(200, {"apiVersion": kind.api_version, "kind": f"{kind.kind}List",
                                        "metadata": {"resourceVersion": str(rv)}, "items": items})
            if method == "POST":
                return self._send(201, store.create(kind, namespace, body or {}))
            if method == "DELETE":
                items, rv = store.list(kind, namespace, query.get("labelSelector"), query.get("fieldSelector"))
                options = self._delete_options(query, body)
                deleted = [store.delete(kind, namespace, i["metadata"]["name"], options) for i in items]
                return self._send(200, {"apiVersion": kind.api_version, "kind": f"{kind.kind}List",
                                        "metadata": {"resourceVersion": str(rv)}, "items": deleted})
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
        if sub == "log" and method == "GET":
            return self._log(namespace, name, query)
        if sub == "binding" and method == "POST":
            return self._send(201, store.bind(namespace or "default", name, body or {}))
        status_only = sub == "status"
        if method == "GET":
            return self._send(200, store.get(kind, namespace, name))
        if method == "PUT":
            return self._send(200, store.replace(kind, namespace, name, body or {}, status_only=status_only))
        if method == "PATCH":
            return self._send(200, store.patch(kind, namespace, name, body, self.headers.get("Content-Type", ""),
                                               status_only=status_only))
        if method == "DELETE" and not sub:
            return self._send(200, store.delete(kind, namespace, name, self._delete_options(query, body)))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed here")

    @staticmethod
    def _delete_options(query: dict[str, str], body: Any) -> dict[str, Any]:
        options = dict(body or {})
        if "gracePeriodSeconds" in query:
            options.setdefault("gracePeriodSeconds", int(query["gracePeriodSeconds"]))
        if "propagationPolicy" in query:
            options.setdefault("propagationPolicy", query["propagationPolicy"])
        return options

    def _log(self, namespace: str | None, name: str, query: dict[str, str]) -> None:
        pod = self.api.store.get(POD, namespace, name)
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container") or (containers[0] if len(containers) == 1 else "")
        if container not in containers:
            raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}, choose one of: "
                           f"{containers}" if not container else f"container {container} is not valid for pod {name}")
        path = self.api.log_path(pod, container) if self.api.log_path else None
        if path is None or not path.exists():
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: '
                           "ContainerCreating")
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) > 0 else []
        self._send(200, "".join(lines), "text/plain")

    def _watch(self, kind: Kind, namespace: str | None, query: dict[str, str]) -> None:
        since = query.get("resourceVersion")
        events = self.api.store.watch(kind, namespace, query.get("labelSelector"), query.get("fieldSelector"),
                                      int(since) if since and since != "0" else None,
                                      float(query.get("timeoutSeconds") or 300), lambda: self.api.closing)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
