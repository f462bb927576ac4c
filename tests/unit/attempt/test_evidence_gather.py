"""`gather` reads the failed ranks' logs through the `Launcher` protocol, so an attempt on
Kubernetes (no run folder on this machine) has its log tails too, and a log that cannot be
read leaves the evidence without it instead of failing the classification."""

from __future__ import annotations

from trainyard.plugins.attempt.evidence import gather
from trainyard.plugins.recovery.classify import classify
from trainyard.plugins.run.model import RankStatus, RunHandle, RunStatus

OOM = "step 4 loss 2.0\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


class PodLogs:
    """The one `Launcher` method `gather` uses, as a Kubernetes launcher answers it: the log of
    the pod holding the rank."""

    def __init__(self, logs: dict[int, str], broken: frozenset[int] = frozenset()) -> None:
        self.asked: list[tuple[int | None, int]] = []
        self._logs, self._broken = logs, broken

    def logs(self, handle: RunHandle, rank: int | None = None, tail: int = 200) -> str:
        self.asked.append((rank, tail))
        if rank in self._broken:
            raise RuntimeError("the API server said 500")
        return self._logs.get(rank, "")


def kube(world_size: int = 2) -> RunHandle:
    return RunHandle(kind="kubernetes", job="tiny", attempt=0, world_size=world_size, namespace="ml",
                     name="tiny-0", nodes=["kube-0", "kube-1"])


def test_a_kubernetes_attempt_has_the_failed_ranks_log_tails() -> None:
    status = RunStatus(state="failed", ranks=[RankStatus(rank=0, node="kube-0", exit_code=0, step=4),
                                              RankStatus(rank=1, node="kube-1", exit_code=1, step=4)])
    launcher = PodLogs({0: "fine\n", 1: OOM})
    ev = gather(kube(), status, launcher=launcher, run="r-1", tail_lines=30)
    assert launcher.asked == [(1, 30)]  # only the failed rank's log, the tail asked for
    assert ev.log_tails == {1: OOM}
    assert classify(ev).outcome == "oom"


def test_a_log_that_cannot_be_read_is_left_out() -> None:
    status = RunStatus(state="failed", ranks=[RankStatus(rank=0, exit_code=-9), RankStatus(rank=1, exit_code=1)])
    ev = gather(kube(), status, launcher=PodLogs({1: "ValueError: bad row\n"}, broken=frozenset({0})))
    assert ev.log_tails == {1: "ValueError: bad row\n"}
