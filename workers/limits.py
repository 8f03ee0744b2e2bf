"""Resource limits a worker process sets on itself, first thing after it starts."""
from __future__ import annotations

MB = 1024 * 1024


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
