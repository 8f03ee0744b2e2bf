"""Named pebble process pools (spawn) that return Futures: a task's result, or its Failure as a value.

NOTE (timeout and crash protocol):
- Each task has its pool's timeout (+ `extra_s`), counted by pebble from the moment a worker
  picks the task up. On expiry pebble sends SIGTERM, waits 3 s, then SIGKILLs the worker and
  starts a fresh one; the task becomes Failure("timeout after N s") and is not retried.
- A worker that dies (segfault, os._exit, SIGKILL) costs only its task: pebble replaces it,
  the task is resubmitted once to a fresh worker, and a second death becomes
  Failure("worker killed by SIGSEGV", pid, exitcode).
- A Future from `submit` never raises: it resolves to fn(arg) or to a Failure, from pebble's
  result thread; nothing here blocks the caller. Retries happen inside, behind that Future.
- Every worker runs `watch_parent()` before the caller's initializer, so a SIGKILLed parent
  leaves no orphans. Pools start on first use: a pool nobody submits to costs nothing.
- stop() kills every worker at once (end of run, Ctrl-C); unfinished Futures resolve to
  Failure("cancelled (run interrupted)").
"""
from __future__ import annotations

from concurrent.futures import CancelledError, Future, TimeoutError as FutureTimeout
from typing import Any, Callable, Mapping

from pebble import ProcessExpired, ProcessPool

from .failure import Failure
from .spawn import SPAWN, watch_parent

RETRIES_AFTER_CRASH = 1


def _start_worker(initializer: Callable[..., None] | None, *initargs: Any) -> None:
    watch_parent()
    if initializer is not None:
        initializer(*initargs)


class Pools:
    """One pebble ProcessPool per name, sized by `sizes`, each task bounded by `timeouts[name]`."""

    def __init__(self, sizes: Mapping[str, int], timeouts: Mapping[str, float],
                 initializer: Callable[..., None] | None = None, initargs: tuple = ()):
        self._sizes, self._timeouts = dict(sizes), dict(timeouts)
        self._initargs = (initializer, *initargs)
        self._pools: dict[str, ProcessPool] = {}
        self._stopped = False

    def _pool(self, name: str) -> ProcessPool:
        if name not in self._pools:
            self._pools[name] = ProcessPool(max_workers=self._sizes[name], initializer=_start_worker,
                                            initargs=self._initargs, context=SPAWN)
        return self._pools[name]

    def submit(self, name: str, fn: Callable[[Any], Any], arg: Any, extra_s: float = 0.0) -> Future:
        """Run fn(arg) in pool `name` within its timeout (+ extra_s): a Future of the result or a Failure."""
        out: Future = Future()
        self._schedule(name, fn, arg, self._timeouts[name] + extra_s, out, 0)
        return out

    def _schedule(self, name: str, fn: Callable[[Any], Any], arg: Any, timeout: float, out: Future,
                  attempt: int) -> None:
        where = f"{name} pool"
        if self._stopped:
            out.set_result(Failure(where, "cancelled (run interrupted)"))
            return
        try:
            future = self._pool(name).schedule(fn, args=(arg,), timeout=timeout)
        except RuntimeError as exc:           # the pool is stopped or broken
            out.set_result(Failure(where, f"pool not running: {exc}"[:300]))
            return

        def done(f: Future) -> None:
            try:
                out.set_result(f.result())
            except FutureTimeout:
                out.set_result(Failure(where, f"timeout after {timeout:g} s"))
            except ProcessExpired as exc:
                if attempt < RETRIES_AFTER_CRASH:
                    self._schedule(name, fn, arg, timeout, out, attempt + 1)
                else:
                    out.set_result(Failure(where, Failure.describe_exit(exc.exitcode), pid=exc.pid,
                                           exitcode=exc.exitcode))
            except CancelledError:
                out.set_result(Failure(where, "cancelled (run interrupted)"))
            except Exception as exc:          # pickling or pool errors
                out.set_result(Failure(where, f"{type(exc).__name__}: {exc}"[:300]))

        future.add_done_callback(done)

    def stop(self) -> None:
        self._stopped = True
        for pool in self._pools.values():
            pool.stop()
        for pool in self._pools.values():
            pool.join(timeout=5)
        self._pools.clear()
