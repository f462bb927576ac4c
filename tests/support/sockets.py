"""The TCP ports processes listen on, read from the kernel's own tables (`/proc/net/tcp`, `tcp6`)
and the processes' socket inodes (`/proc/PID/fd`) — not from any configuration. Shared by the
stack's listener check and the local run's."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

LISTEN = "0A"
"""The TCP state LISTEN in /proc/net/tcp."""


def listening() -> dict[int, tuple[str, int]]:
    """Socket inode → (address, port) of every TCP socket listening on this machine."""
    found = {}
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state != LISTEN:
                continue
            raw, port = local.split(":")
            data = bytes.fromhex(raw)
            # the kernel prints each 32-bit word of the address in host (little-endian) order
            words = b"".join(data[i:i + 4][::-1] for i in range(0, width, 4))
            found[inode] = (str(ipaddress.ip_address(words)), int(port, 16))
    return found


def sockets_of(pid: int) -> set[int]:
    """The inodes of the sockets the process holds (empty when it has ended)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # ended meanwhile
        pass
    return inodes


def listeners_of(pids: Iterable[int]) -> dict[int, list[tuple[str, int]]]:
    """pid → the (address, port) each of its listening TCP sockets is bound to; pids without one
    are left out."""
    table = listening()
    held = {pid: sorted(table[i] for i in sockets_of(pid) if i in table) for pid in pids}
    return {pid: found for pid, found in held.items() if found}


def beyond_loopback(held: dict[int, list[tuple[str, int]]]) -> dict[int, list[tuple[str, int]]]:
    """The entries of `listeners_of` bound to an address that is not loopback (`::`, `0.0.0.0`
    and a LAN address alike)."""
    wide = {pid: [(a, p) for a, p in found if not ipaddress.ip_address(a).is_loopback] for pid, found in held.items()}
    return {pid: found for pid, found in wide.items() if found}
