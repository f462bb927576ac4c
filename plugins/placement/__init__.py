"""Gang placement: where a job's ranks go, who may use the cluster, and what is reserved.

- rank order and process groups: `plugins/advisor/rank_layout.py` (`RankLayout`, the worker's
  mesh order pp, dp, cp, tp), shared with the advisor and the worker
- `model.py`       `GangRequest`, `Placement` (nodes in rank order + group → node map),
                   `Unschedulable` / `PendingReason` (why, in numbers)
- `inventory.py`   the placer's view of a cluster (from `config/clusters/*.yaml` or node labels),
                   indexed by GPU type and rack; `FreeDevices`, a free map that keeps its index
- `gang.py`        the search: all or nothing, best fit over racks, candidates scored by
                   `scoring.py`; `baseline.py` is first-fit, for comparison
- `constraints.py` an independent check of the hard constraints
- `fairshare.py`   effective priority (seed §4) and whole-gang preemption
- allocations (reserve, lease, release; `usage_by_team()` for the quota check) live with the
  rest of the platform's SQL state: `plugins/state/reservations.py`; placing and reserving in
  one call, re-placing after a lost race, is an attempt step: `plugins/attempt/reserve.py`

No Airflow imports here.
"""
