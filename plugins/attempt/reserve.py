"""Place and reserve in one call — what the `place_gang` task and `trainyard launch` do.

The attempt engine's step, not placement's: the search (`plugins/placement/`) stays pure, and
the reservations live in the platform's SQL state (`plugins/state/reservations.py`); this is
where the two meet.

Between reading the free devices and committing the reservation another job may take some of
them; the reservation then fails with `ReservationConflict` (never double-books), and the gang
is placed again on the new state. An existing live reservation of the same (job, run, attempt) is
returned as it is, so a retried task re-attaches instead of booking twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainyard.config.cluster import Cluster
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest, Placement
from trainyard.plugins.state.reservations import (
    RESERVATION_LEASE_S,
    ReservationConflict,
    StateStore,
    free_devices,
)


def place_and_reserve(
    job: TrainingJob,
    plan: Plan,
    cluster: Cluster,
    store: StateStore,
    *,
    run: str = "",
    attempt: int = 0,
    exclude: Iterable[str] = (),
    lease_s: float = RESERVATION_LEASE_S,
    tries: int = 3,
    require_pp_in_rack: bool = False,
) -> Placement:
    """Raises `Unschedulable` (with the numbers) or, after `tries` lost races, `ReservationConflict`."""
    existing = store.placement(job.metadata.name, attempt, run=run)
    if existing is not None:
        return existing
    inventory = Inventory.from_cluster(cluster)
    request = GangRequest.for_job(job, plan, run=run, attempt=attempt, exclude=frozenset(exclude),
                                  require_pp_in_rack=require_pp_in_rack)
    capacity = {n.name: n.gpus for n in inventory.nodes}
    last: ReservationConflict | None = None
    for _ in range(max(tries, 1)):
        placement = place_gang(request, inventory, free_devices(store, capacity))
        try:
            return store.reserve(placement, lease_s=lease_s)
        except ReservationConflict as e:
            last = e
    raise ReservationConflict(f"lost the race for devices {tries} times; last: {last}") from last
