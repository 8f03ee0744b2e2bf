"""One pebble process pool per loader format (txt, pdf, ocr, docx, pptx), sized from config.

NOTE (timeout and crash protocol):
- Each task has the timeout of its pool (`[loaders.X] timeout_s`; for OCR, per page),
  counted by pebble from the moment a worker picks the task up. On expiry pebble sends
  SIGTERM, waits 3 s, then SIGKILLs the worker and starts a fresh one; the task becomes
  Failure("timeout after N s") and is not retried.
- A worker that dies (segfault, os._exit, SIGKILL) costs only its task: pebble replaces
  it, we resubmit the task once to a fresh worker, and a second death becomes
  Failure("worker killed by SIGSEGV", pid, exitcode).
- Results (or Failures) are handed to `on_done` from pebble's result thread; nothing
  here blocks the caller. Workers watch their parent (workers.spawn.watch_parent) and
  exit when it dies, so a SIGKILLed supervisor leaves no orphans.
- stop() kills every worker at once (end of run, Ctrl-C).
"""
from __future__ import annotations

from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from typing import Any, Callable

from pebble import ProcessExpired, ProcessPool

from .load_tasks import init_worker
from .messages import Failure
from .spawn import SPAWN

RETRIES_AFTER_CRASH = 1


class LoaderPools:
    def __init__(self, sizes: dict[str, int], timeouts: dict[str, float], plugins: tuple[str, ...] = ()):
        self._sizes = sizes
        self._timeouts = timeouts
        self._plugins = plugins
        self._pools: dict[str, ProcessPool] = {}

    def _pool(self, name: str) -> ProcessPool:
        if name not in self._pools:         # started on first use: unused formats cost nothing
            self._pools[name] = ProcessPool(max_workers=self._sizes[name], initializer=init_worker,
                                            initargs=(self._plugins,), context=SPAWN)
        return self._pools[name]

    def submit(self, pool: str, fn: Callable[[Any], Any], task: Any, on_done: Callable[[Any], None],
               extra_s: float = 0.0, _attempt: int = 0) -> None:
        """Run fn(task) in `pool` within its timeout (+ extra_s); call on_done(result or Failure) once."""
        timeout = self._timeouts[pool] + extra_s
        future = self._pool(pool).schedule(fn, args=(task,), timeout=timeout)

        def done(f) -> None:
            try:
                on_done(f.result())
            except FutureTimeout:
                on_done(Failure(where=f"{pool} loader", error=f"timeout after {timeout:g} s"))
            except ProcessExpired as exc:
                if _attempt < RETRIES_AFTER_CRASH:
                    self.submit(pool, fn, task, on_done, extra_s, _attempt + 1)
                else:
                    on_done(Failure(where=f"{pool} loader", error=Failure.describe_exit(exc.exitcode),
                                    pid=exc.pid, exitcode=exc.exitcode))
            except CancelledError:
                on_done(Failure(where=f"{pool} loader", error="cancelled (run interrupted)"))
            except Exception as exc:     # pickling or pool errors
                on_done(Failure(where=f"{pool} loader", error=f"{type(exc).__name__}: {exc}"[:300]))

        future.add_done_callback(done)

    def stop(self) -> None:
        for pool in self._pools.values():
            pool.stop()
        for pool in self._pools.values():
            pool.join(timeout=5)
        self._pools.clear()
