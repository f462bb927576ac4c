"""The rules every watcher of a run applies the same way: when ranks hang, when a node is lost.

A node agent judges the ranks it sees, the control plane's watcher the whole gang, the deferrable
sensor's trigger and recovery's classifier the nodes' agents; each reads the rule and its one
constant here, so a node agent and the control plane cannot disagree on what a hang is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from trainyard.plugins.run.model import RankStatus

MISSED_HEARTBEATS_LOST = 3
"""Polls in a row a node's agent may miss before the node counts as lost: one miss is a slow
answer, three (at the watch's poll interval) are a node that is gone or cut off."""

FINISHED_PHASES = frozenset({"done", "diverged"})
"""Phases after which a rank stops beating on purpose: its old file is not a hang."""



class Stalled(NamedTuple):
    """A live, unfinished rank of a gang, as `hang_culprits` weighs it."""

    rank: int
    step: int | None
    frozen: bool | None
    """No sign of life for half the hang timeout (`Heartbeat.frozen`); None: the writer does not say."""
    stale: bool = True
    """No step progress for the hang timeout."""
    activity: bool = False
    """Watched by its activity, not its steps (a plain script: `Heartbeat.signal`)."""


def hang_culprits(ranks: Iterable[Stalled]) -> list[int]:
    """The ranks to blame for a hang among a gang's live, unfinished ranks ([] when none is stale).

    In a gang, one stuck rank stops every other at its next collective, so all of them go
    stale and the whole gang looks hung. Told apart by, in order:
    1. the frozen ones — no sign of life at all (stopped, or stuck holding the interpreter),
       stale yet or not (the first rank to cross the timeout may be one waiting for them): the
       others are alive, waiting inside a collective;
    2. else the stale ones at the lowest step: the others finished that step and wait for them;
    3. else (the same step, all alive or all unknown) every stale one: nothing tells them apart.
    A node agent applies it to the ranks it sees; the control plane to the whole gang.

    Ranks watched by their activity (a plain script) hang only when every one of them is still:
    a rank waiting in a barrier uses no CPU either, and the one it waits for may be busy
    (rank 0 evaluating for minutes while the others wait).
    """
    ranks = sorted(ranks)
    stale = [r for r in ranks if r.stale]
    if not stale or (any(r.activity for r in ranks) and len(stale) < len(ranks)):
        return []
    frozen = [r.rank for r in ranks if r.frozen]
    if frozen and len(frozen) < len(ranks):
        return frozen
    lowest = min((r.step for r in stale if r.step is not None), default=None)
    return [r.rank for r in stale if lowest is None or r.step is None or r.step == lowest]


def stalled_ranks(ranks: Iterable[RankStatus], frozen: Mapping[int, bool | None]) -> list[Stalled]:
    """A launcher's ranks as `hang_culprits` weighs them: the live ones (flagged hung, or running
    with a pid), each with whether it is `frozen` (rank → None where nothing tells). The watcher
    reads `frozen` from the heartbeat files now, recovery's classifier from the evidence's last
    signs of life: one selection, two clocks."""
    return [Stalled(r.rank, r.step, frozen.get(r.rank), r.hung, r.signal == "activity")
            for r in ranks if r.hung or (r.pid is not None and r.exit_code is None)]
