"""The emulated API server keeps the real server's contract where the launcher depends on it:
schema validation on every write (requests and the statuses the harness writes), owned
metadata, selectors, optimistic concurrency, preconditions, graceful deletion, the garbage
collector, watches and auth — all through the real `kubernetes` client over HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client import CoreV1Api, CustomObjectsApi, V1DeleteOptions, V1Preconditions
from kubernetes.client.exceptions import ApiException

from tests.support.kube import schemas
from tests.support.kube.control_plane import ControlPlane
from tests.support.require import missing
from trainyard.plugins.launch.kube_clients import clients_from_kubeconfig

NS = "trainyard"


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    try:
        schemas.check_crds_present()
    except schemas.SchemaMissing as e:
        missing("schemas", str(e))
    with ControlPlane(tmp_path) as p:
        yield p


@pytest.fixture
def core(plane: ControlPlane) -> CoreV1Api:
    return clients_from_kubeconfig(str(plane.kubeconfig)).core


@pytest.fixture
def custom(plane: ControlPlane) -> CustomObjectsApi:
    return clients_from_kubeconfig(str(plane.kubeconfig)).custom


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "i"}], **spec}}


def volcano_job(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name},
            "spec": {"minAvailable": 1, "queue": "default", "tasks": [
                {"name": "worker", "replicas": 1, "template": {"spec": {
                    "restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}], **spec}}


def refused(call: Any, *args: Any, **kwargs: Any) -> ApiException:
    with pytest.raises(ApiException) as caught:
        call(*args, **kwargs)
    return caught.value


def test_an_invalid_object_is_refused_with_422_naming_the_field(core: CoreV1Api, custom: CustomObjectsApi) -> None:
    bad_pod = pod("p")
    bad_pod["spec"]["containers"][0]["resource"] = {}  # resources, misspelt
    e = refused(core.create_namespaced_pod, NS, bad_pod)
    assert e.status == 422 and "'resource' was unexpected" in e.body and "spec.containers.0" in e.body
    bad_job = volcano_job("j")
    bad_job["spec"]["minAvailble"] = bad_job["spec"].pop("minAvailable")
    e = refused(custom.create_namespaced_custom_object, "batch.volcano.sh", "v1alpha1", NS, "jobs", bad_job)
    assert e.status == 422 and "minAvailble" in e.body


def test_a_status_the_harness_writes_is_validated_too(custom: CustomObjectsApi) -> None:
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", volcano_job("j"))
    e = refused(custom.patch_namespaced_custom_object_status, "batch.volcano.sh", "v1alpha1", NS, "jobs", "j",
                {"status": {"state": {"phase": "Exploded"}}})
    assert e.status == 422 and "status.state.phase" in e.body and "'Exploded' is not one of" in e.body
    done = custom.patch_namespaced_custom_object_status("batch.volcano.sh", "v1alpha1", NS, "jobs", "j",
                                                        {"status": {"state": {"phase": "Running"}}})
    assert done["status"]["state"]["phase"] == "Running"
    # the status subresource: a write to the object keeps the status
    kept = custom.patch_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", "j",
                                                 {"status": {"state": {"phase": "Failed"}}, "spec": {"maxRetry": 1}})
    assert kept["status"]["state"]["phase"] == "Running" and kept["spec"]["maxRetry"] == 1
    assert kept["metadata"]["generation"] == 2


def test_the_server_owns_uid_version_and_names_conflicts(core: CoreV1Api) -> None:
    created = core.create_namespaced_pod(NS, pod("p"))
    assert created.metadata.uid and created.metadata.resource_version and created.status.phase == "Pending"
    assert refused(core.create_namespaced_pod, NS, pod("p")).status == 409
    stale = core.read_namespaced_pod("p", NS)
    core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}}})
    assert refused(core.replace_namespaced_pod, "p", NS, stale).status == 409  # optimistic concurrency
    e = refused(core.patch_namespaced_pod, "p", NS, {"spec": {"nodeName": "elsewhere"}})
    assert e.status == 422 and "pod updates may not change" in e.body
    assert refused(core.create_namespaced_pod, "nowhere", pod("q")).status == 404  # no such namespace


def test_label_and_field_selectors(core: CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("a", {"job": "x", "attempt": "0"}))
    core.create_namespaced_pod(NS, pod("b", {"job": "x", "attempt": "1"}))
    core.create_namespaced_pod(NS, pod("c", {"job": "y"}))

    def names(**selectors: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(NS, **selectors).items]

    assert names(label_selector="job=x,attempt=1") == ["b"]
    assert names(label_selector="job in (x,y),attempt!=0") == ["b", "c"]
    assert names(label_selector="!attempt") == ["c"]
    assert names(field_selector="metadata.name=a") == ["a"]


def test_delete_preconditions_grace_and_the_foreground_garbage_collector(plane: ControlPlane, core: CoreV1Api,
                                                                         custom: CustomObjectsApi) -> None:
    owner = custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", volcano_job("j"))
    ref = {"apiVersion": owner["apiVersion"], "kind": "Job", "name": "j", "uid": owner["metadata"]["uid"],
           "controller": True, "blockOwnerDeletion": True}
    child = pod("j-worker-0", nodeName="n0")  # a bound pod: its deletion is graceful
    child["metadata"]["ownerReferences"] = [ref]
    core.create_namespaced_pod(NS, child)
    e = refused(custom.delete_namespaced_custom_object, "batch.volcano.sh", "v1alpha1", NS, "jobs", "j",
                body=V1DeleteOptions(preconditions=V1Preconditions(uid="someone-else")))
    assert e.status == 409 and "Precondition failed" in e.body
    custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", "j",
                                           body=V1DeleteOptions(propagation_policy="Foreground", grace_period_seconds=5))
    plane.server.store.collect_garbage()
    deleting = custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", "j")
    assert deleting["metadata"]["finalizers"] == ["foregroundDeletion"]  # waits for its pod
    terminating = core.read_namespaced_pod("j-worker-0", NS)
    assert terminating.metadata.deletion_timestamp and terminating.metadata.deletion_grace_period_seconds == 30
    core.delete_namespaced_pod("j-worker-0", NS, grace_period_seconds=3)  # a shorter grace wins
    assert core.read_namespaced_pod("j-worker-0", NS).metadata.deletion_grace_period_seconds == 3
    core.delete_namespaced_pod("j-worker-0", NS, grace_period_seconds=0)  # what the node does once it stopped
    plane.server.store.collect_garbage()
    assert refused(custom.get_namespaced_custom_object, "batch.volcano.sh", "v1alpha1", NS, "jobs", "j").status == 404


def test_a_watch_streams_the_changes(core: CoreV1Api) -> None:
    events: list[tuple[str, str]] = []
    started = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_pod, NS, label_selector="job=w", timeout_seconds=5):
            started.set()
            events.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                w.stop()

    core.create_namespaced_pod(NS, pod("first", {"job": "w"}))
    thread = threading.Thread(target=follow)
    thread.start()
    assert started.wait(10)
    core.create_namespaced_pod(NS, pod("ignored", {"job": "other"}))
    core.patch_namespaced_pod("first", NS, {"metadata": {"labels": {"job": "w", "seen": "yes"}}})
    core.delete_namespaced_pod("first", NS)
    thread.join(10)
    assert events == [("ADDED", "first"), ("MODIFIED", "first"), ("DELETED", "first")]


def test_without_the_token_the_server_answers_401(plane: ControlPlane) -> None:
    import urllib3

    response = urllib3.PoolManager().request("GET", f"{plane.url}/api/v1/nodes")
    assert response.status == 401
    assert plane.rest.request("GET", "/version")["gitVersion"].startswith("v1.")


def test_the_providers_sync_hook_reads_it_through_an_airflow_connection(plane: ControlPlane,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    plane.add_node("n0")
    monkeypatch.setenv("AIRFLOW_CONN_KUBE_SIM", plane.connection_uri)
    hook = KubernetesHook(conn_id="kube_sim")
    assert [n.metadata.name for n in hook.core_v1_client.list_node().items] == ["n0"]
