"""`trainyard-node-agent` (also `python -m node_agent`): the per-node witness (DESIGN §8).

    trainyard-node-agent --node NAME --port 9420 --heartbeat-dir /var/lib/trainyard/heartbeats

`--once` prints one `NodeHealth` JSON report and exits (a quick look at a node, or a probe
check on a new machine). Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 cannot serve (port in
use), 2 usage errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from pydantic import ValidationError

from trainyard.node_agent.config import DEFAULT_PORT, AgentConfig

log = logging.getLogger("node_agent")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainyard-node-agent",
                                description="Per-node agent: heartbeats, GPU health, Prometheus metrics, health API.")
    p.add_argument("--node", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                   help="node name as the cluster knows it (default: $NODE_NAME, else the host name)")
    p.add_argument("--heartbeat-dir", default=os.environ.get("TRAINYARD_HEARTBEAT_DIR"),
                   help="root of the workers' heartbeat files, searched recursively (default: $TRAINYARD_HEARTBEAT_DIR)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; the DaemonSet passes 0.0.0.0: the pod's "
                        "interfaces, for the control plane on other nodes)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default: {DEFAULT_PORT})")
    p.add_argument("--poll-interval-s", type=float, default=5.0, help="NVML sampling period (default: 5)")
    p.add_argument("--thermal-threshold-c", type=float, default=83.0, help="thermal verdict threshold (default: 83)")
    p.add_argument("--thermal-window-s", type=float, default=60.0,
                   help="seconds above the threshold before the thermal verdict (default: 60)")
    p.add_argument("--cpu-slots", type=int, default=None,
                   help="slots to report on a node without NVIDIA GPUs (default: the CPU count)")
    p.add_argument("--forget-after-s", type=float, default=86400.0,
                   help="leave heartbeats older than this out of reports; 0 = never (default: 86400)")
    p.add_argument("--enable-fault-injection", action="store_true",
                   help="accept POST/DELETE /faults (tests and game days only)")
    p.add_argument("--once", action="store_true", help="print one NodeHealth JSON report and exit")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    values = {
        "node": args.node, "heartbeat_dir": args.heartbeat_dir, "host": args.host, "port": args.port,
        "poll_interval_s": args.poll_interval_s, "thermal_threshold_c": args.thermal_threshold_c,
        "thermal_window_s": args.thermal_window_s, "forget_after_s": args.forget_after_s,
        "enable_fault_injection": args.enable_fault_injection,
    }
    if args.cpu_slots is not None:
        values["cpu_slots"] = args.cpu_slots
    return AgentConfig.model_validate(values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.heartbeat_dir:
        parser.error("--heartbeat-dir is required (or set TRAINYARD_HEARTBEAT_DIR)")
    try:
        config = config_from_args(args)
    except ValidationError as e:
        parser.error("; ".join(f"--{'-'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}"
                               for err in e.errors()))

    # Imported here so `--help` and usage errors stay instant.
    from trainyard.node_agent.monitor import Monitor
    from trainyard.node_agent.server import AgentServer

    monitor = Monitor(config)
    monitor.open()
    if args.once:
        print(monitor.health().model_dump_json(indent=2))
        monitor.close()
        return 0
    try:
        server = AgentServer(monitor)
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", config.host, config.port, e)
        monitor.close()
        return 1
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    monitor.start()
    server.start()
    log.info("node %s: serving on http://%s:%d (heartbeats under %s, fault injection %s)", config.node,
             config.host, server.port, config.heartbeat_dir, "ON" if config.enable_fault_injection else "off")
    while not stop.wait(1.0):
        pass
    server.stop()
    monitor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
