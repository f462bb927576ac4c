"""The launcher as the control plane itself on the real control plane, for the launcher-level
tests (`tests/integration/launch/test_kueue_launch.py`, `test_kueue_preemption.py`,
`test_kube_node_loss.py`): their harness, the launcher, and waiting on its poll.

The administrator's part is `RealKubeHarness.apply_platform` (what `trainyard render k8s`
prints for the cluster: the teams' namespaces under Pod Security `restricted`, quotas, the
control plane's RBAC, priorities, the Kueue queues); the launcher then runs with the control
plane's own ServiceAccount token (`RealKubeHarness.control_plane_kubeconfig`), so every call it
makes is judged by the real authorizer — the same two steps the DAG's e2e stack takes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.kube import netns
from tests.support.kube.harness import DEFAULT_NODES, KubeHarness
from tests.support.kube.real_cluster import binaries_missing
from tests.support.kube.real_harness import RealKubeHarness
from tests.support.require import missing
from trainyard.plugins.launch.volcano import KubernetesLauncher

if TYPE_CHECKING:
    from trainyard.config.teams import Teams
    from trainyard.plugins.run.model import RunHandle, RunStatus


@contextmanager
def traversable_harness(prefix: str, nodes: Sequence[str] = DEFAULT_NODES, **kwargs: Any) -> Iterator[RealKubeHarness]:
    """The harness in a folder uid 1000 can traverse (pytest's own is 0700): the pods' volumes
    are mounted at paths under it, which a non-root container must reach, as in an image. Under
    /var/tmp, not /tmp: an init container's emptyDir mounts over /tmp. A missing part (the built
    binaries, network namespaces) skips, or fails where CI requires it."""
    if binaries_missing():
        missing("kube", f"the Kubernetes binaries are not built: {', '.join(binaries_missing())}")
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    root.chmod(0o711)
    try:
        try:
            harness = RealKubeHarness(root / "kube", tuple(nodes), **kwargs).__enter__()
        except netns.NetnsUnavailable as e:
            missing("netns", f"the simulated nodes need network namespaces: {e}")
        with harness:
            yield harness
    finally:
        shutil.rmtree(root, ignore_errors=True)


def control_plane_launcher(kube: RealKubeHarness, teams: Teams, **launcher_kwargs: Any) -> KubernetesLauncher:
    """`teams` applied by the administrator, then the launcher on the control plane's token, with
    the harness's options (`queueing="kueue"`) — and a shared filesystem: these tests' tiny job
    keeps the default `file://` home, which the simulated nodes see at the same paths."""
    kube.apply_platform(teams)
    kubeconfig = kube.control_plane_kubeconfig(kube.root / "control-plane.kubeconfig")
    return KubernetesLauncher.from_kubeconfig(str(kubeconfig), options=kube.launcher_options(shared_filesystem=True),
                                              **launcher_kwargs)


def trainer_log(kube: KubeHarness, pod: str, namespace: str, container: str = "trainer", *,
                tail: int | None = None) -> str:
    """A container's log as its node keeps it (the real API server would ask the kubelet's own
    server for it, which the simulated kubelet does not run): whole, for a test to search, or its
    last `tail` characters, for a failure to show (a search in a tail misses what a busy rank's
    warnings pushed out of it: CI's failure at 6eec54a)."""
    try:
        text = (kube.pod_dir(pod, namespace) / f"{container}.log").read_text(errors="replace")
        return text if tail is None else text[-tail:]
    except (OSError, KeyError) as e:
        return f"(no {container} log: {e})"


def wait_for_status(kube: KubeHarness, launcher: KubernetesLauncher, handle: RunHandle,
                    predicate: Callable[[RunStatus], Any], what: str, timeout_s: float = 180, *,
                    explain: Callable[[RunStatus | None], str] | None = None) -> RunStatus:
    """Poll the launcher until `predicate` holds of its status; on a timeout, the last status and
    `explain(last)` — by default the trainers' logs of its pods and the control plane's logs."""
    seen: list[RunStatus] = []

    def check() -> RunStatus | None:
        seen.append(launcher.poll(handle))
        return seen[-1] if predicate(seen[-1]) else None

    def trainers_and_plane(last: RunStatus | None) -> str:
        logs = "\n".join(f"==> {a.pod}\n{trainer_log(kube, a.pod, handle.namespace, tail=3000)}"
                         for a in (last.agents if last else []))
        return f"{logs}\n{kube.diagnostics()}"

    try:
        return kube.wait_for(check, timeout_s, what)
    except AssertionError as e:
        last = seen[-1] if seen else None
        raise AssertionError(f"{e}\nlast status: {last}\n{(explain or trainers_and_plane)(last)}") from None
