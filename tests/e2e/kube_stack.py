"""The DAG on the real Kubernetes control plane, for the e2e tests (issue 55, Build 4): a
`RealKubeHarness` (kube-apiserver, kube-controller-manager, kube-scheduler, Kueue, simulated
nodes whose kubelets run the pods as uid 1000) under an embedded Airflow (`running_stack`).

    with kube_stack(nodes=NODES_WITH_SPARE) as (kube, stack):
        stack.add_jobs({...}); stack.client.trigger(...)

What it wires, as a deployment would:
- the cluster administrator's objects (`RealKubeHarness.apply_platform`: the teams' namespaces
  under Pod Security `restricted`, their quotas and Kueue queues, the control plane's RBAC), and
  Airflow's connection with the control plane's own ServiceAccount token, not an admin's;
- the object store as S3 (moto's server, `tests/support/s3_server.py`, a bucket of its own) and
  MLflow over HTTP (the stack's own server) — both on 127.0.0.1 only; Airflow uses them there,
  the pods through relays into the simulated network (`KubernetesOptions.pod_s3_endpoint_url`,
  `pod_mlflow_tracking_uri`), so nothing listens beyond loopback on this machine;
- per-run storage keys (`TRAINYARD_STORAGE_CREDENTIALS` stays `per-run`): the launcher issues
  them through moto's IAM and STS and puts them in the attempt's Secret, which the pods read
  by `secretKeyRef`. moto's in-process server does not enforce IAM (its switch is process-wide
  and `tests/integration/storage` turns it on in a server of its own): the keys are issued,
  stored and used, not proven to confine;
- the node agents as the rendered DaemonSet's pods on their nodes, reading the pods' `emptyDir`
  heartbeats in the kubelet's folder; the health watch finds them from the Node objects
  (`KubernetesLauncher.node_agents`: no `TRAINYARD_NODE_AGENTS` map) and reaches the nodes'
  addresses through the harness's proxy across each node's link (`http_proxy`, loopback direct).

The harness's folder lies under /var/tmp, mode 0711: the pods' mount points are under it and a
uid-1000 container must traverse to them (pytest's own temporary folders are 0700); not under
/tmp, which an init container's emptyDir may cover.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tests.e2e.airflow_stack import RunningStack, running_stack
from tests.support import procs
from tests.support.kube import netns
from tests.support.kube.harness import NODES_WITH_SPARE
from tests.support.kube.real_cluster import binaries_missing
from tests.support.kube.real_harness import RealKubeHarness
from tests.support.require import missing
from tests.support.s3_server import CREDENTIALS, running_s3_server

if TYPE_CHECKING:
    from trainyard.config.teams import Teams


@contextmanager
def kube_stack(*, nodes: Sequence[str] = NODES_WITH_SPARE, cpus_per_node: int = 1,
               teams: Teams | None = None) -> Iterator[tuple[RealKubeHarness, RunningStack]]:
    """The harness with `nodes` of `cpus_per_node` CPU "GPUs" each, and a stack launching on it
    (see the module docstring); `teams`: the teams whose namespaces and queues the administrator
    applies (default `config/teams.yaml`). Skips (fails where `TRAINYARD_REQUIRE` names `kube` or
    `netns`) without the Kubernetes binaries or network namespaces."""
    if binaries_missing():
        missing("kube", f"the Kubernetes binaries are not built: {', '.join(binaries_missing())}")
    root = Path(tempfile.mkdtemp(prefix="kube-e2e-", dir="/var/tmp"))
    root.chmod(0o711)
    try:
        try:
            harness = RealKubeHarness(root / "kube", tuple(nodes), cpus_per_node=cpus_per_node,
                                      node_agents=True).__enter__()
        except netns.NetnsUnavailable as e:
            missing("netns", f"the simulated nodes need network namespaces: {e}")
        with harness, running_s3_server() as s3:
            bucket = s3.new_bucket("trainyard")
            mlflow_port = procs.free_port()
            folder = root / "airflow"
            folder.mkdir()
            overrides = harness.airflow_overrides(folder, s3_endpoint_url=s3.endpoint_url,
                                                  mlflow_url=f"http://127.0.0.1:{mlflow_port}", teams=teams)
            overrides |= {"TRAINYARD_OBJECT_STORE": f"s3://{bucket}/trainyard", **CREDENTIALS}
            assert harness.proxy is not None
            overrides |= harness.proxy.env()
            with running_stack(folder / "home", overrides=overrides, mlflow_port=mlflow_port,
                               mlflow_hosts=(f"{netns.FABRIC_ADDRESS}:{mlflow_port}",)) as stack:
                yield harness, stack
    finally:
        shutil.rmtree(root, ignore_errors=True)
