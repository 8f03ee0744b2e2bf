"""Resource limits a worker process sets on itself, first thing after it starts, the cores a process
may run on (which size its threads and the pools), and the CPU time of a process and what it started."""
from __future__ import annotations

import functools
import os

MB = 1024 * 1024
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3      # glibc's mallopt options (malloc.h)


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


@functools.cache
def keep_heap() -> None:
    """Tune glibc's malloc for a process that makes and frees large buffers again and again (OCR: a page's
    render, ONNX Runtime's tensors; the run's supervisor: the pickle of every writer batch, ~1.4 MB, in the
    writer pool's thread): blocks under 32 MB come from the heap, not from fresh mmaps that the kernel zeroes
    page by page at every touch; the heap grows 256 MB at a time and goes back to the system only past 1 GB
    free at its top. An OCR worker's start and first scanned page cost 0.9 CPU-s less (bench/loader_start.py);
    the supervisor's thread that sends the writer batches, 5.1 to 2.9 us a chunk (bench/feed.py). Nothing where
    malloc is not glibc's. Under RLIMIT_AS a heap that cannot grow falls back to mmap, as before."""
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return
    for option, value in ((M_MMAP_THRESHOLD, 32 * MB), (M_TRIM_THRESHOLD, 1024 * MB), (M_TOP_PAD, 256 * MB)):
        mallopt(option, value)


def tree_cpu_s() -> float:
    """CPU seconds (user and system) used so far by this process and every process it started: its own and its
    reaped children's (getrusage), and the live descendants' with the children they reaped (psutil). The
    difference of two readings is what the tree used in between, whichever processes started or ended."""
    import resource

    import psutil

    used = sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:                 # it ended meanwhile: its time is its parent's once reaped
            continue
        used += t.user + t.system + t.children_user + t.children_system
    return used
