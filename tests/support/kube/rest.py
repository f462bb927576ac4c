"""A small JSON client for the harness's own control-plane parts (the Volcano controller, the
gang scheduler, the node lifecycle controller, the simulated kubelets).

The product and the provider's hooks use the real `kubernetes` client against the emulator;
these parts play the roles Kubernetes writes in Go, so they speak plain JSON over the same
HTTP API — and what they write is validated by the server like any other request.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

MERGE = "application/merge-patch+json"


class RestError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status, self.body = status, body


def resource_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
                  sub: str | None = None) -> str:
    path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    path += f"/namespaces/{namespace}" if namespace else ""
    path += f"/{plural}" + (f"/{quote(name)}" if name else "") + (f"/{sub}" if sub else "")
    return path


class Rest:
    def __init__(self, url: str, token: str, *, timeout_s: float = 5.0, ca_file: str | None = None) -> None:
        """`ca_file`: the CA a real API server's certificate is checked against (HTTPS)."""
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        tls = {"ca_certs": ca_file} if ca_file else {}
        self.http = urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout_s), retries=False, **tls)

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                content_type: str = "application/json") -> Any:
        url = self.url + path + (f"?{urlencode(query)}" if query else "")
        headers = dict(self.headers, **({"Content-Type": content_type} if body is not None else {}))
        response = self.http.request(method, url, body=None if body is None else json.dumps(body), headers=headers)
        data = json.loads(response.data) if response.data else {}
        if response.status >= 400:
            raise RestError(response.status, data)
        return data

    def list(self, api_version: str, plural: str, namespace: str | None = None, *, labels: str = "",
             fields: str = "") -> list[dict[str, Any]]:
        query = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        return self.request("GET", resource_path(api_version, plural, namespace), query=query)["items"]

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
        return self.request("GET", resource_path(api_version, plural, namespace, name))

    def create(self, api_version: str, plural: str, namespace: str | None, body: dict[str, Any],
               sub: str | None = None, name: str | None = None) -> dict[str, Any]:
        return self.request("POST", resource_path(api_version, plural, namespace, name, sub), body)

    def patch(self, api_version: str, plural: str, namespace: str | None, name: str, patch: dict[str, Any],
              *, status: bool = False) -> dict[str, Any]:
        return self.request("PATCH", resource_path(api_version, plural, namespace, name, "status" if status else None),
                            patch, content_type=MERGE)

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str,
               options: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.request("DELETE", resource_path(api_version, plural, namespace, name),
                            {"apiVersion": "v1", "kind": "DeleteOptions", **(options or {})})

    def event(self, involved: dict[str, Any], reason: str, message: str, *, type_: str = "Warning",
              component: str = "trainyard-emulator") -> None:
        """Record an Event about `involved` (a core/v1 Event, what `kubectl describe` shows)."""
        from tests.support.kube.store import now_rfc3339

        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        self.create("v1", "events", namespace, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
            # a real API server's list items carry no apiVersion/kind: the kubelet's objects are pods
            "involvedObject": {"apiVersion": involved.get("apiVersion", "v1"), "kind": involved.get("kind", "Pod"),
                               "name": meta["name"],
                               "namespace": namespace, "uid": meta["uid"]},
            "reason": reason, "message": message, "type": type_, "count": 1,
            "firstTimestamp": now_rfc3339(), "lastTimestamp": now_rfc3339(),
            "source": {"component": component}, "reportingComponent": component,
        })
