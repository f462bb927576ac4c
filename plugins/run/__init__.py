"""The run's floor: what the processes of a run exchange, with one home each.

A run is several processes that never import each other's engines: the launcher and its agents,
each rank's wrapper and the worker, a node agent, the control plane's watcher and recovery. What
passes between them lives here, on the standard library and pydantic only, so each imports this
floor and none imports another for it:

- `records` — the files of a run folder (rank exits, stop requests, divergence and corrupt
  checkpoint records), read and written atomically;
- `model` — `RunHandle` (what a launch returns and every later call takes) and `RunStatus`;
- `exit_codes` — a training process's exit codes and what each means;
- `heartbeat` — the per-rank heartbeat file;
- `processes` — whether a process lives, and its process group, from /proc;
- `rules` — the hang rule and the node-lost rule, with their one constant each.
"""
