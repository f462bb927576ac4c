"""Launchers: start a placed job, find it again from its `RunHandle`, stop it, read its logs.

- `base.py`         the `Launcher` protocol
- `model.py`        `RunHandle`, `RunStatus` (JSON: XCom and deferrable sensors carry them)
- `local.py`        `LocalLauncher`: detached torchrun agents on this host
- `agent.py`, `rank_exec.py`  the tiny wrappers that record exit codes, pids and logs
- `loopback.py`     a local run's stores listen on 127.0.0.1 only (torch's own bind is every interface)
- `activity.py`     a plain script's hang watch: its ranks' CPU time and I/O as their heartbeats
- `sources.py`      the job's code: a pinned git commit, a folder or an object-store prefix
- `processes.py`    liveness from /proc (zombies and recycled pids are not "alive")
- `manifests.py`    Volcano Job, Queues, PriorityClasses, node-agent DaemonSet
- `gang_pods.py`    a Volcano Job's tasks and pods, and their node ranks (c10d's order of their names)
- `pod_entry.py`    a gang pod's first process: hosts the rendezvous store or not, then torchrun
- `kueue_queues.py` the teams' Kueue ClusterQueues, LocalQueues, flavor and priorities; a Workload's state
- `kueue_job.py`    the Kueue path's gang: a suspended Indexed Job and its headless Service
- `volcano.py`      `KubernetesLauncher` over the `kubernetes` client (passed in): Volcano Jobs, or with
                    `queueing="kueue"` Indexed Jobs that Kueue admits
- `environment.py`  the `WorkerEnv` and process environment of a launch
- `exit_codes.py`   what a rank's exit code means (reads `plugins/run/exit_codes.py`)

No Airflow imports here; this package must stay importable from inside every rank.
"""
