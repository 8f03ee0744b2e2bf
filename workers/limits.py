"""Resource limits a worker process sets on itself, first thing after it starts, and the cores a
process may run on (which size its threads and the pools)."""
from __future__ import annotations

import os

MB = 1024 * 1024


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def limit_memory(mb: int) -> None:
    """Cap this process's address space (RLIMIT_AS soft limit) at `mb` MB; 0 leaves it alone.

    Only the soft limit is set, so a helper this process starts (LibreOffice) may lift it again.
    An allocation past the limit fails (MemoryError in Python) instead of the kernel's OOM killer
    taking the worker, or a neighbour, at an unknown moment.
    """
    if mb <= 0:
        return
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mb * MB if hard == resource.RLIM_INFINITY else min(mb * MB, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
