"""The gang pods' first process: decides whether this pod's torchrun agent hosts the c10d
rendezvous store, then becomes `python -m torch.distributed.run` (stdlib only, an `exec`: the
agent is the container's process, as before).

Every pod of a task runs one command (a Volcano task is one pod template with `replicas`), so
the command cannot say which pod hosts the store. The agent whose `--local-addr` (its pod's DNS
name, `$(POD_NAME).<service>`, expanded by the kubelet) is the host of `--rdzv-endpoint` is the
host: this adds `--rdzv-conf is_host=true` there and `is_host=false` everywhere else. Said
explicitly rather than left to torch's guess (`_matches_machine_hostname`), which compares
addresses and would also say yes in a pod that shares its node's network (hostNetwork).

Usage: `python -m trainyard.plugins.launch.pod_entry <torchrun options> -m <module> …` — the
arguments are torchrun's, unchanged but for `--rdzv-conf`; only the options before the first
`-m` (or the first argument that is not an option) are read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def _options(argv: Sequence[str]) -> dict[str, str]:
    """torchrun's `--name value` / `--name=value` options before the script (or `-m`)."""
    found: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        name, eq, value = argv[i].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                break
            value, i = argv[i + 1], i + 1
        found[name] = value
        i += 1
    return found


def endpoint_host(endpoint: str) -> str:
    """The host of `host[:port]` (an IPv6 address in brackets loses them)."""
    if endpoint.startswith("["):
        return endpoint[1:].partition("]")[0]
    return endpoint.rpartition(":")[0] if endpoint.count(":") == 1 else endpoint


def with_is_host(argv: Sequence[str]) -> list[str]:
    """`argv` with `--rdzv-conf is_host=…` decided (see the module docstring); an existing
    `--rdzv-conf` keeps its other keys."""
    options = _options(argv)
    local, endpoint = options.get("--local-addr"), options.get("--rdzv-endpoint")
    if not local or not endpoint:
        raise SystemExit("pod_entry: --local-addr and --rdzv-endpoint are both required")
    if "$(" in local:
        raise SystemExit(f"pod_entry: --local-addr {local!r} was not expanded (POD_NAME missing from the env)")
    is_host = f"is_host={'true' if local == endpoint_host(endpoint) else 'false'}"
    out = list(argv)
    if "--rdzv-conf" in options:
        i = next(i for i, a in enumerate(out) if a == "--rdzv-conf" or a.startswith("--rdzv-conf="))
        conf = [kv for kv in options["--rdzv-conf"].split(",") if kv and not kv.startswith("is_host=")]
        joined = ",".join([*conf, is_host])
        out[i:i + (1 if out[i].startswith("--rdzv-conf=") else 2)] = ["--rdzv-conf", joined]
        return out
    return ["--rdzv-conf", is_host, *out]


def main(argv: Sequence[str] | None = None) -> None:
    args = with_is_host(sys.argv[1:] if argv is None else argv)
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *args])


if __name__ == "__main__":
    main()
