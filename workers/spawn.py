"""The spawn context every ingest process is started with, and the parent watchdog.

NOTE (spawn safety): spawn children normally re-import the parent's __main__ module, which
re-runs an unguarded script (no `if __name__ == "__main__"`) and breaks in notebooks.
`IngestProcess.start()` sets a thread-local flag around the spawn; while it is set (that
thread, that start only) we drop the main-module entries from the preparation data, so a
child imports nothing but the worker target's own module. Process names are left alone:
pebble's atexit cleanup finds its workers by the name "pebble_pool_worker". Worker targets
therefore live at module level in ingest's packages and never in __main__.

NOTE (orphans): every worker runs `watch_parent()` first: a daemon thread that polls the
parent's sentinel every 0.5 s and calls os._exit when the parent is gone (SIGKILL
included), like torch's ManagerWatchdog. Workers never outlive their parent by more than ~1 s.
"""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.context
import multiprocessing.spawn as _spawn
import os
import threading
import time

_original_preparation_data = _spawn.get_preparation_data
_starting = threading.local()           # .ours is True while IngestProcess.start() spawns


def _preparation_data(name: str) -> dict:
    data = _original_preparation_data(name)
    if getattr(_starting, "ours", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


_spawn.get_preparation_data = _preparation_data


class IngestProcess(multiprocessing.context.SpawnProcess):
    """A spawn process that does not re-import __main__ (its name is kept as given)."""

    def start(self) -> None:
        _starting.ours = True
        try:
            super().start()
        finally:
            _starting.ours = False


class IngestContext(multiprocessing.context.SpawnContext):
    Process = IngestProcess


SPAWN = IngestContext()


def watch_parent(role: str = "", interval_s: float = 0.5, exit_code: int = 70) -> None:
    """Exit this process as soon as its parent dies. Call first thing in every worker; `role` names
    the process `ingest-<role>` for ps, top and bench/feed.py's per-stage CPU."""
    if role:
        name_process(role)
    parent = mp.parent_process()
    ppid = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(interval_s)
            if (parent is not None and not parent.is_alive()) or os.getppid() != ppid:
                os._exit(exit_code)

    threading.Thread(target=loop, name="ingest-parent-watchdog", daemon=True).start()


def name_process(role: str) -> None:
    """Show this process as `ingest-<role>` (Linux: the kernel's 15-character comm); a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, f"ingest-{role}".encode()[:15], 0, 0, 0)      # PR_SET_NAME
    except (OSError, AttributeError):
        pass
