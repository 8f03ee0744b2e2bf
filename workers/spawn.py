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

NOTE (stop signals): `systemctl stop`, a shell's Ctrl-C and `kill -- -PGID` signal the whole
process group, children included, but only the run knows what is safe to finish. So every
child starts with SIGINT and SIGTERM blocked (`start()` blocks them in the spawning thread
around the fork, and the child inherits the mask), then its `run()` settles them before the
target runs, by the context it was started with:
- SPAWN (loader workers, which may simply be stopped): both unblocked, as a plain process has them.
- SHIELDED (encode workers, writers, tokenizer processes, the Lite host: "the parent decides"):
  SIGINT ignored; SIGTERM stays blocked in every thread, and a daemon thread takes each one with
  sigwaitinfo: sent by the parent (pebble's terminate, EncodeProcess.finish), it kills the process
  with SIGTERM as before; sent by anyone else (a group-wide stop), it is ignored. Such a child
  still ends with its parent, through the parent's protocol or watch_parent.
Without sigwaitinfo (macOS) a shielded child ignores SIGINT and keeps SIGTERM's default. The mask
is inherited across exec: a shielded child must not start programs (the loaders, which run
LibreOffice and Tesseract, are not shielded).
"""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.context
import multiprocessing.spawn as _spawn
from multiprocessing import resource_tracker
import ctypes
import os
import signal
import threading
import time

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
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
    """A spawn process that does not re-import __main__ (its name is kept as given) and starts with
    the stop signals blocked; `run()` settles them (NOTE: stop signals)."""

    shielded = False

    def start(self) -> None:
        _starting.ours = True
        resource_tracker.ensure_running()      # first, as it unblocks both signals after starting itself
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            _starting.ours = False

    def run(self) -> None:
        if self.shielded:
            _shield()
        else:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        super().run()


class ShieldedProcess(IngestProcess):
    shielded = True


class IngestContext(multiprocessing.context.SpawnContext):
    Process = IngestProcess


class ShieldedContext(multiprocessing.context.SpawnContext):
    Process = ShieldedProcess


SPAWN = IngestContext()
SHIELDED = ShieldedContext()


def _shield() -> None:
    """In a new child, before any other thread: ignore SIGINT; take SIGTERM in a thread of its own and
    obey only the parent's (NOTE: stop signals)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if not hasattr(signal, "sigwaitinfo"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        return
    parent = os.getppid()

    def take() -> None:
        while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent:
            pass
        # The parent stops us: die of SIGTERM, as an unshielded process would. The disposition is
        # reset in C, since a Python handler (pebble's) would wait for a main thread that may be
        # blocked in a read.
        ctypes.CDLL(None).signal(int(signal.SIGTERM), int(signal.SIG_DFL))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=take, name="ingest-stop-signals", daemon=True).start()


def watch_parent(role: str = "", interval_s: float = 0.5, exit_code: int = 70, parent_pid: int | None = None) -> None:
    """Exit this process as soon as its parent dies. Call first thing in every worker; `role` names
    the process `ingest-<role>` for ps, top and bench/feed.py's per-stage CPU. `parent_pid`: the pid the
    parent gave us (a process it did not start through multiprocessing), so a parent that died before
    this call is noticed too."""
    if role:
        name_process(role)
    parent = mp.parent_process()
    ppid = os.getppid() if parent_pid is None else parent_pid

    def loop() -> None:
        while True:
            time.sleep(interval_s)
            if (parent is not None and not parent.is_alive()) or os.getppid() != ppid:
                os._exit(exit_code)

    threading.Thread(target=loop, name="ingest-parent-watchdog", daemon=True).start()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts: it is alive, only not ours to signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def name_process(role: str) -> None:
    """Show this process as `ingest-<role>` (Linux: the kernel's 15-character comm); a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, f"ingest-{role}".encode()[:15], 0, 0, 0)      # PR_SET_NAME
    except (OSError, AttributeError):
        pass
