"""A process's own peak and current memory, for the memory tests and the benchmarks."""

from __future__ import annotations

import resource
import sys


def peak_rss_mb() -> float:
    """This process's peak resident set in MiB: Linux's `VmHWM`, not `ru_maxrss`, which a
    process started by fork + exec inherits from its parent (getrusage(2)) — a small child of
    a large parent (pytest, a benchmark holding a dataset, torchrun's agent) would report the
    parent's peak, and a test comparing two children would compare the parent with itself."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 / (1024 if sys.platform == "darwin" else 1)  # bytes on macOS


def rss_mb() -> float:
    """This process's resident set now in MiB (Linux's `VmRSS`; the peak where there is none)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return peak_rss_mb()
