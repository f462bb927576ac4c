"""A container's Linux capabilities and `allowPrivilegeEscalation`, as a container runtime sets
them (the simulated kubelet's shim calls `restrict` in the container's first process, before it
changes user and execs).

What a pod gets: the runtime's default set (`RUNTIME_DEFAULT`, containerd's and CRI-O's), less
`securityContext.capabilities.drop` (`ALL` empties it), plus `.add`; `privileged` would give
every capability (the API server here refuses privileged pods). How it is enforced: every
capability outside that set leaves the bounding set and the inheritable and ambient sets are
cleared, so after `execve` a root process holds exactly the set (a root exec's permitted set is
the bounding set) and a non-root one holds none (as on Kubernetes, where added capabilities
reach a non-root container's effective set only through ambient capabilities, which it does
not set). `allowPrivilegeEscalation: false` is `no_new_privs`.

Why it matters here: the node agent's DaemonSet pod runs as root with every capability dropped
but `DAC_READ_SEARCH` (`manifests.render_node_agent_daemonset`): without this module it would
run with all of root's, and a rendering that forgot `DAC_READ_SEARCH` would still read the
workers' 0600 heartbeat files.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

NAMES = ("CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
         "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
         "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
         "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
         "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
         "CHECKPOINT_RESTORE")
"""Capability numbers are the positions in this tuple (linux/capability.h)."""
RUNTIME_DEFAULT = frozenset({"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
                             "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"})
"""What containerd and CRI-O give a container that names no capabilities."""
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
CAP_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _name(raw: str) -> str:
    name = raw.upper().removeprefix("CAP_")
    if name != "ALL" and name not in NAMES:
        raise ValueError(f"unknown capability {raw!r}")
    return name


def container_set(context: dict[str, Any]) -> frozenset[str]:
    """The capabilities a container with this (merged) securityContext runs with."""
    if context.get("privileged"):
        return frozenset(NAMES)
    caps = context.get("capabilities") or {}
    drop = {_name(c) for c in caps.get("drop") or []}
    kept = set() if "ALL" in drop else set(RUNTIME_DEFAULT) - drop
    return frozenset(kept | {_name(c) for c in caps.get("add") or []} - {"ALL"})


def restrict(keep: frozenset[str], *, no_new_privs: bool) -> None:
    """In the container's process, before it changes user and execs: the bounding set down to
    `keep`, inheritable and ambient cleared, `no_new_privs` if asked. Raises OSError."""
    libc = ctypes.CDLL(None, use_errno=True)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for number in range(last + 1):
        if number >= len(NAMES) or NAMES[number] not in keep:
            _call(libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0), f"drop capability {number} from the bounding set")
    header, data = _Header(CAP_VERSION_3, 0), (_Data * 2)()
    _call(libc.capget(ctypes.byref(header), data), "capget")
    for half in data:
        half.inheritable = 0
    _call(libc.capset(ctypes.byref(header), data), "capset")
    _call(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear the ambient set")
    if no_new_privs:
        _call(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _call(rc: int, what: str) -> None:
    if rc != 0:
        import os

        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
