"""The node agent: one per node, beside the workers (DESIGN §8, seed §5 "Failure Detection").

It watches the node's GPUs through NVML and the training ranks through their heartbeat files,
judges them (fatal Xid / uncorrectable ECC / lost → gpu_failed, sustained heat → thermal,
stale heartbeat → hang), and serves `GET /health` (`models.NodeHealth`) and `GET /metrics`
(Prometheus). The control plane reads it with `client.fetch_health`; it never shells into nodes.

    heartbeat.py         the heartbeat file contract (workers write, the agent reads)
    models.py            NodeHealth & co. — pydantic only, cheap to import from sensors
    client.py            fetch_health / inject_fault / clear_faults (urllib)
    gpu_probe.py         NVML sampling and the Xid event watcher
    heartbeat_reader.py  recursive, cached, garbage-tolerant heartbeat scan
    verdicts.py          the rules, including the fatal Xid list and why
    monitor.py           state + the poller; assembles one NodeHealth
    metrics.py           Prometheus collector over a NodeHealth
    server.py            the HTTP API;  __main__.py  the `trainyard-node-agent` command

This package never imports Airflow, and importing it (this file) imports nothing else.
"""
