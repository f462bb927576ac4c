"""The emulated API server's object store: what etcd plus the API server's own rules do.

Kept honest where the launcher and the provider's hooks can tell the difference:

- every object written (create, replace, merge / strategic-merge / JSON patch, status writes)
  is validated against its real schema (`schemas.py`) and refused with 422 `Invalid`;
- metadata the server owns: `uid`, `resourceVersion` (one counter, optimistic concurrency
  on replace), `creationTimestamp`, `generation` (bumped when the spec changes);
- the status subresource: a write to the object keeps its status, a write to `/status`
  changes nothing else (pods, nodes, Volcano Jobs and Queues have one; PodGroups do not);
- a pod's spec is immutable once created, and `spec.nodeName` is set only by a Binding;
- label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`) and field selectors on
  any dotted path (`spec.nodeName`, `involvedObject.name`, …);
- deletion: preconditions (uid, resourceVersion → 409), graceful pod deletion
  (`deletionTimestamp` + `deletionGracePeriodSeconds`, shortened by a later delete, finished
  by the node with a grace-0 delete), finalizers, and the garbage collector's propagation
  (`Foreground`: the owner waits behind `foregroundDeletion` until its dependents are gone;
  `Background`: the owner goes now and its dependents after; `Orphan`: they stay);
- admission hooks per resource (the Volcano controller registers its webhook's checks).

Simplified, and said so: strategic merge patch merges lists of objects by `name` or `type`
(the patchMergeKeys of containers, env, volumes, conditions, …) and does not know `$patch`
directives; a list has no `continue` paging; watch history keeps the last 10,000 events.
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.kube import schemas


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status: bool
    """Has a status subresource."""
    keep_status_on_create: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


KINDS = (
    Kind("", "v1", "namespaces", "Namespace", False, True, keep_status_on_create=True),
    Kind("", "v1", "nodes", "Node", False, True, keep_status_on_create=True),
    Kind("", "v1", "pods", "Pod", True, True),
    Kind("", "v1", "events", "Event", True, False),
    Kind("", "v1", "services", "Service", True, True),
    Kind("batch.volcano.sh", "v1alpha1", "jobs", "Job", True, True),
    Kind("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", True, False),
    Kind("scheduling.volcano.sh", "v1beta1", "queues", "Queue", False, True),
)
BY_PATH = {(k.group, k.version, k.plural): k for k in KINDS}
BY_KIND = {(k.api_version, k.kind): k for k in KINDS}
POD = BY_PATH[("", "v1", "pods")]
TERMINAL_POD_PHASES = ("Succeeded", "Failed")


class ApiError(Exception):
    """An API answer that is not a success: the `Status` object the real server sends."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.key} "{name}" not found',
                    {"name": name, "group": kind.group, "kind": kind.plural})


def now_rfc3339(delta_s: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


# --- selectors --------------------------------------------------------------------------------

_SET_OP = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    """Split on commas outside parentheses (`a in (x,y),b=c`)."""
    parts, depth, current = [], 0, ""
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _label_term(term: str) -> tuple[str, str, frozenset[str]]:
    """(operator, key, values) of one label selector term."""
    if m := _SET_OP.match(term):
        return m.group(2), m.group(1), frozenset(v.strip() for v in m.group(3).split(","))
    if "!=" in term:
        key, value = (s.strip() for s in term.split("!=", 1))
        return "notin", key, frozenset({value})
    if "=" in term:
        key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
        return "in", key, frozenset({value})
    if term.startswith("!"):
        return "absent", term[1:].strip(), frozenset()
    return "exists", term, frozenset()


def _label_holds(labels: dict[str, str], op: str, key: str, values: frozenset[str]) -> bool:
    if op == "in":
        return labels.get(key) in values
    if op == "notin":
        return labels.get(key) not in values
    return (key in labels) == (op == "exists")


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    terms = [_label_term(t) for t in _split_selector(selector or "")]
    return lambda labels: all(_label_holds(labels, *t) for t in terms)


def _path_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _field_term(term: str) -> tuple[str, str, bool]:
    """(path, value, equal) of one field selector term."""
    if "!=" in term:
        path, value = term.split("!=", 1)
        return path.strip(), value.strip(), False
    if "=" in term:
        path, value = term.replace("==", "=").split("=", 1)
        return path.strip(), value.strip(), True
    raise ApiError(400, "BadRequest", f"invalid field selector term {term!r}")


def field_matcher(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    terms = [_field_term(t) for t in _split_selector(selector or "")]
    return lambda obj: all((_path_value(obj, path) == value) == equal for path, value, equal in terms)


# --- patches ----------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge patch, but lists of objects merge by their `name` or `type` (see the module docstring)."""
    if isinstance(patch, dict):
        if any(k.startswith("$") for k in patch):
            raise ApiError(415, "UnsupportedMediaType", "the emulator's strategic merge patch has no $-directives")
        out = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge_patch(out.get(key), value)
        return out
    if isinstance(patch, list) and isinstance(target, list):
        merge_key = next((k for k in ("name", "type") if patch and all(isinstance(i, dict) and k in i for i in patch)
                          and all(isinstance(i, dict) and k in i for i in target)), None)
        if merge_key is not None:
            merged = {i[merge_key]: i for i in target}
            for item in patch:
                merged[item[merge_key]] = strategic_merge_patch(merged.get(item[merge_key]), item)
            return list(merged.values())
    return copy.deepcopy(patch)


def apply_patch(obj: dict[str, Any], patch: Any, content_type: str, kind: Kind) -> dict[str, Any]:
    content_type = content_type.split(";")[0].strip()
    if content_type == "application/json-patch+json":
        import jsonpatch

        try:
            return jsonpatch.apply_patch(obj, patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            raise ApiError(422, "Invalid", f"the JSON patch does not apply: {e}") from e
    if content_type == "application/merge-patch+json":
        return merge_patch(obj, patch)
    if content_type == "application/strategic-merge-patch+json":
        if kind.group:  # what the real server says for custom resources
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types include: "
                           "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
        return strategic_merge_patch(obj, patch)
    raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {content_type!r}")


# --- the store --------------------------------------------------------------------------------

Admission = Callable[["Store", dict[str, Any]], None]


class Store:
    """All objects, one lock, one resourceVersion counter, and the event history for watches."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.rv = 0
        self.history: deque[tuple[int, str, str, dict[str, Any]]] = deque(maxlen=10_000)
        self.admission: dict[str, list[Admission]] = {}
        self.writes = 0
        """Objects validated and stored (a test can see the checks ran)."""

    # --- helpers ---

    def _bump(self, kind: Kind, event: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, kind.key, event, copy.deepcopy(obj)))
        self.cond.notify_all()

    def _key(self, kind: Kind, namespace: str | None, name: str) -> tuple[str, str, str]:
        return kind.key, (namespace or "") if kind.namespaced else "", name

    def _existing(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.objects.get(self._key(kind, namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return obj

    def _validate(self, kind: Kind, obj: dict[str, Any]) -> None:
        try:
            schemas.validate(obj)
        except schemas.Invalid as e:
            raise ApiError(422, "Invalid", str(e), {
                "name": e.name, "group": kind.group, "kind": kind.kind,
                "causes": [{"reason": "FieldValueInvalid", "message": e.reason, "field": e.field}]}) from e
        self.writes += 1

    def _store(self, kind: Kind, obj: dict[str, Any], event: str) -> dict[str, Any]:
        meta = obj["metadata"]
        finished = kind is not POD or meta.get("deletionGracePeriodSeconds", 0) == 0
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and finished:
            self.objects.pop(self._key(kind, meta.get("namespace"), meta["name"]), None)
            self._bump(kind, "DELETED", obj)
            return obj
        self.objects[self._key(kind, meta.get("namespace"), meta["name"])] = obj
        self._bump(kind, event, obj)
        return obj

    # --- reads ---

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
        with self.cond:
            return copy.deepcopy(self._existing(kind, namespace, name))

    def list(self, kind: Kind, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[dict[str, Any]], int]:
        labels, fields = label_matcher(label_selector), field_matcher(field_selector)
        with self.cond:
            items = [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items())
                     if k == kind.key and (not namespace or ns == namespace)
                     and labels(o["metadata"].get("labels") or {}) and fields(o)]
            return items, self.rv

    def watch(self, kind: Kind, namespace: str | None, label_selector: str | None, field_selector: str | None,
              since: int | None, timeout_s: float, stopped: Callable[[], bool]) -> Iterator[dict[str, Any]]:
        """Watch events after resourceVersion `since` (None: the current objects as ADDED first)."""
        labels, fields = label_matcher(label_selector), field_matcher(field_selector)

        def wanted(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return ((not namespace or meta.get("namespace") == namespace)
                    and labels(meta.get("labels") or {}) and fields(obj))

        import time

        deadline = time.monotonic() + timeout_s
        if since is None:
            items, since = self.list(kind, namespace, label_selector, field_selector)
            for item in items:
                yield {"type": "ADDED", "object": item}
        while not stopped():
            with self.cond:
                events = [(rv, e, o) for rv, k, e, o in self.history if rv > since and k == kind.key]
                if not events:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self.cond.wait(min(left, 1.0))
                    continue
            for rv, event, obj in events:
                since = rv
                if wanted(obj):
                    yield {"type": event, "object": obj}

    # --- writes ---

    def create(self, kind: Kind, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        if obj.get("apiVersion") != kind.api_version or obj.get("kind") != kind.kind:
            raise ApiError(400, "BadRequest", f"the object is {obj.get('apiVersion')}/{obj.get('kind')}, "
                           f"the request is for {kind.api_version}/{kind.kind}")
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match "
                               "the namespace sent on the request")
            meta["namespace"] = namespace = namespace or meta.get("namespace") or "default"
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value: "
                               "name or generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        with self.cond:
            if kind.namespaced and ("namespaces", "", namespace) not in self.objects:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})
            if self._key(kind, namespace, meta["name"]) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{kind.key} "{meta["name"]}" already exists',
                               {"name": meta["name"], "group": kind.group, "kind": kind.plural})
            for hook in self.admission.get(kind.key, []):
                hook(self, obj)
            for owned in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generation"):
                meta.pop(owned, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            if kind.status and not kind.keep_status_on_create:
                obj.pop("status", None)
            if kind is POD:
                obj["status"] = {"phase": "Pending"}
            elif kind.kind == "Namespace":
                obj["status"] = {"phase": "Active"}
            self._validate(kind, obj)
            return copy.deepcopy(self._store(kind, obj, "ADDED"))

    def _update(self, kind: Kind, old: dict[str, Any], new: dict[str, Any], *, status_only: bool) -> dict[str, Any]:
        if status_only:
            if not kind.status:
                raise not_found(kind, old["metadata"]["name"])
            new = dict(copy.deepcopy(old), status=new.get("status", {}))
        else:
            if kind.status:
                new = dict(new)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            meta = new.setdefault("metadata", {})
            for owned in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "generation"):
                if owned in old["metadata"]:
                    meta[owned] = old["metadata"][owned]
                else:
                    meta.pop(owned, None)
            if kind is POD and new.get("spec") != old.get("spec"):
                raise ApiError(422, "Invalid", f'Pod "{old["metadata"]["name"]}" is invalid: spec: Forbidden: '
                               "pod updates may not change fields other than those the emulator allows (none)")
            if new.get("spec") != old.get("spec"):
                meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        self._validate(kind, new)
        return copy.deepcopy(self._store(kind, new, "MODIFIED"))

    def replace(self, kind: Kind, namespace: str | None, name: str, body: dict[str, Any], *,
                status_only: bool = False) -> dict[str, Any]:
        with self.cond:
            old = self._existing(kind, namespace, name)
            asked = (body.get("metadata") or {}).get("resourceVersion")
            if asked and asked != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.key} "{name}": the object '
                               "has been modified; please apply your changes to the latest version and try again",
                               {"name": name, "group": kind.group, "kind": kind.plural})
            return self._update(kind, old, copy.deepcopy(body), status_only=status_only)

    def patch(self, kind: Kind, namespace: str | None, name: str, patch: Any, content_type: str, *,
              status_only: bool = False) -> dict[str, Any]:
        with self.cond:
            old = self._existing(kind, namespace, name)
            new = apply_patch(copy.deepcopy(old), patch, content_type, kind)
            if not isinstance(new, dict):
                raise ApiError(422, "Invalid", "a patch must leave an object")
            return self._update(kind, old, new, status_only=status_only)

    def bind(self, namespace: str, name: str, binding: dict[str, Any]) -> dict[str, Any]:
        """`POST pods/<name>/binding`: what a scheduler does to put a pod on a node."""
        self._validate(POD, {**binding, "apiVersion": "v1", "kind": "Binding"})
        with self.cond:
            pod = self._existing(POD, namespace, name)
            if pod["spec"].get("nodeName"):
                raise ApiError(409, "Conflict", f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
            if pod["metadata"].get("deletionTimestamp"):
                raise ApiError(409, "Conflict", f"pod {name} is being deleted, cannot be assigned to a host")
            new = copy.deepcopy(pod)
            new["spec"]["nodeName"] = binding["target"]["name"]
            self._validate(POD, new)
            self._store(POD, new, "MODIFIED")
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def delete(self, kind: Kind, namespace: str | None, name: str, options: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        options = options or {}
        with self.cond:
            old = self._existing(kind, namespace, name)
            meta = old["metadata"]
            pre = options.get("preconditions") or {}
            for field in ("uid", "resourceVersion"):
                if pre.get(field) and pre[field] != meta.get(field):
                    raise ApiError(409, "Conflict", f"Precondition failed: {field.upper() if field == 'uid' else field} "
                                   f"in precondition: {pre[field]}, {field} in object meta: {meta.get(field)}",
                                   {"name": name, "group": kind.group, "kind": kind.plural})
            obj = copy.deepcopy(old)
            meta = obj["metadata"]
            policy = options.get("propagationPolicy") or "Background"
            if policy == "Orphan":
                self._orphan(meta["uid"])
            if kind is POD and obj["spec"].get("nodeName"):
                grace = options.get("gracePeriodSeconds")
                grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace)
                if grace > 0:
                    current = meta.get("deletionGracePeriodSeconds")
                    if meta.get("deletionTimestamp") and current is not None and current <= grace:
                        return obj
                    meta.update(deletionTimestamp=now_rfc3339(grace), deletionGracePeriodSeconds=grace)
                    return copy.deepcopy(self._store(kind, obj, "MODIFIED"))
            finalizers = list(meta.get("finalizers") or [])
            if policy == "Foreground" and "foregroundDeletion" not in finalizers and self._dependents(meta["uid"]):
                finalizers.append("foregroundDeletion")
            if finalizers:
                meta["finalizers"] = finalizers
                meta.setdefault("deletionTimestamp", now_rfc3339())
                meta["deletionGracePeriodSeconds"] = 0
                return copy.deepcopy(self._store(kind, obj, "MODIFIED"))
            meta.setdefault("deletionTimestamp", now_rfc3339())
            meta["deletionGracePeriodSeconds"] = 0
            self.objects.pop(self._key(kind, meta.get("namespace"), name), None)
            self._bump(kind, "DELETED", obj)
            return obj

    # --- the garbage collector ---

    def _dependents(self, uid: str) -> list[tuple[str, str, str]]:
        return [key for key, o in self.objects.items()
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]

    def _orphan(self, uid: str) -> None:
        for key in self._dependents(uid):
            obj = self.objects[key]
            obj["metadata"]["ownerReferences"] = [r for r in obj["metadata"]["ownerReferences"] if r.get("uid") != uid]
            self._bump(_kind_of(key), "MODIFIED", obj)

    def collect_garbage(self) -> None:
        """One pass of the garbage collector (the harness runs it on every controller tick)."""
        with self.cond:
            uids = {o["metadata"]["uid"] for o in self.objects.values()}
            for key, obj in list(self.objects.items()):
                owners = obj["metadata"].get("ownerReferences") or []
                orphaned = owners and not any(r.get("uid") in uids for r in owners) and key in self.objects
                if orphaned and not obj["metadata"].get("deletionTimestamp"):
                    self.delete(_kind_of(key), key[1] or None, key[2], {"propagationPolicy": "Background"})
            for key, obj in list(self.objects.items()):
                meta = obj["metadata"]
                if not meta.get("deletionTimestamp") or "foregroundDeletion" not in (meta.get("finalizers") or []):
                    continue
                dependents = self._dependents(meta["uid"])
                for dep in dependents:
                    if not self.objects[dep]["metadata"].get("deletionTimestamp"):
                        self.delete(_kind_of(dep), dep[1] or None, dep[2], {"propagationPolicy": "Foreground"})
                if not dependents:
                    new = copy.deepcopy(obj)
                    new["metadata"]["finalizers"] = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
                    if not new["metadata"]["finalizers"]:
                        del new["metadata"]["finalizers"]
                    self._store(_kind_of(key), new, "MODIFIED")


def _kind_of(key: tuple[str, str, str]) -> Kind:
    return next(k for k in KINDS if k.key == key[0])
