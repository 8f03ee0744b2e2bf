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
- A pool whose idle worker died, or whose workers cannot start, is broken for pebble
  (schedule raises RuntimeError, in-flight tasks get BrokenProcessPool): it is retired and
  a fresh pool started on next use, and its tasks are retried there. A break is not charged
  as the task's crash: pebble also breaks a pool when a worker dies before it acknowledged
  its task, so a crash next door (or a task's own retry) can break it under innocent tasks.
  A task is retried after each of up to MAX_BREAKS breaks; after MAX_BREAKS breaks in a row with
  no task done (workers that cannot start), tasks fail at once instead of starting pool after pool.
- stop() kills every worker at once (end of run, Ctrl-C); unfinished Futures resolve to
  Failure("cancelled (run interrupted)"). `_stopped` is read and set under the lock that creates
  pools, so no pool starts after stop() (a task scheduled meanwhile is cancelled, never started).
- Shared slots (workers/arena.py NOTE): a pool's tasks take their argument and give their answer in memory
  both sides map where they fit; a task that ends without its worker's answer keeps its slot out of use.
- Stop signals: workers of a `shielded` pool (writers) ignore a group-wide SIGINT/SIGTERM and end
  when the parent stops them; the others (loaders) are killed by a SIGTERM (workers/spawn.py NOTE).
"""
from __future__ import annotations

import pickle
import threading
from concurrent.futures import CancelledError, Future, TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Mapping

from pebble import ProcessExpired, ProcessPool

from .arena import Arena, Placed, attach, in_slot
from .failure import Failure
from .spawn import SHIELDED, SPAWN, watch_parent

RETRIES_AFTER_CRASH = 1
BROKEN = ("its worker processes cannot start or keep dying (a [loaders] plugin failing in the worker?); "
          "see the worker's error above")
CANCELLED = "cancelled (run interrupted)"
MAX_BREAKS = 3          # a pool broken this many times in a row, with no task done between, is not retried


def _start_worker(role: str, arena: Arena | None, initializer: Callable[..., None] | None, *initargs: Any) -> None:
    watch_parent(role)
    attach(arena)
    if initializer is not None:
        initializer(*initargs)


class Pools:
    """One pebble ProcessPool per name, sized by `sizes`, each task bounded by `timeouts[name]`;
    `shielded`: its workers leave stopping to this process (NOTE)."""

    def __init__(self, sizes: Mapping[str, int], timeouts: Mapping[str, float],
                 initializer: Callable[..., None] | None = None, initargs: tuple = (), shielded: bool = False):
        self._sizes, self._timeouts = dict(sizes), dict(timeouts)
        self._context = SHIELDED if shielded else SPAWN
        self._initargs = (initializer, *initargs)
        self._pools: dict[str, ProcessPool] = {}
        self._retired: list[ProcessPool] = []
        self._lock = threading.Lock()          # _schedule runs in the caller's thread and in pebble's
        self._stopped = False
        self._breaks: dict[str, int] = {}      # pools of this name broken since its last task succeeded
        self._arenas: dict[str, Arena | None] = {}     # each name's shared slots (NOTE), made with its first pool
        self.replaced = 0                      # broken pools replaced so far

    def _pool(self, name: str) -> ProcessPool | None:
        """The running pool `name` (started now if need be); None once stopped."""
        with self._lock:
            if self._stopped:
                return None
            if name not in self._pools:
                if name not in self._arenas:
                    self._arenas[name] = Arena.create(name, self._sizes[name])
                self._pools[name] = ProcessPool(max_workers=self._sizes[name], initializer=_start_worker,
                                                initargs=(name, self._arenas[name], *self._initargs),
                                                context=self._context)
            return self._pools[name]

    def _replace(self, name: str, broken: ProcessPool) -> None:
        """Retire a broken pool (once, however many of its tasks report it); the next use starts a new one."""
        with self._lock:
            if self._pools.get(name) is broken:
                self._breaks[name] = self._breaks.get(name, 0) + 1
                del self._pools[name]
                broken.stop()
                self._retired.append(broken)
                self.replaced += 1

    def submit(self, name: str, fn: Callable[[Any], Any], arg: Any, extra_s: float = 0.0) -> Future:
        """Run fn(arg) in pool `name` within its timeout (+ extra_s): a Future of the result or a Failure."""
        out: Future = Future()
        self._schedule(name, fn, arg, self._timeouts[name] + extra_s, out, 0, 0)
        return out

    def _schedule(self, name: str, fn: Callable[[Any], Any], arg: Any, timeout: float, out: Future,
                  attempt: int, breaks: int) -> None:
        """Schedule fn(arg) in pool `name`; `attempt` counts the task's crashes, `breaks` the pools broken under it."""
        where = f"{name} pool"
        if self._breaks.get(name, 0) >= MAX_BREAKS:
            out.set_result(Failure(where, BROKEN))
            return
        pool = self._pool(name)
        if pool is None:
            out.set_result(Failure(where, CANCELLED))
            return
        arena = self._arenas.get(name)
        slot = arena.take() if arena is not None else None
        try:
            if slot is None:
                future = pool.schedule(fn, args=(arg,), timeout=timeout)
            else:
                size = arena.dump(slot, arg)
                future = pool.schedule(in_slot, args=((fn, slot, size, None if size else arg),), timeout=timeout)
        except RuntimeError:                  # broken: an idle worker died, or workers cannot start
            if slot is not None:
                arena.give(slot)
            self._broken(name, fn, arg, timeout, out, attempt, breaks, pool)
            return
        except Exception as exc:              # the argument cannot be pickled
            if slot is not None:
                arena.give(slot)
            out.set_result(Failure(where, f"{type(exc).__name__}: {exc}"[:300]))
            return

        def done(f: Future) -> None:
            try:
                result = f.result()
                if isinstance(result, Placed):
                    result = arena.load(slot, result.nbytes) if result.nbytes else pickle.loads(result.data)
                    arena.give(slot)        # answered: nobody writes it any more (NOTE: shared slots)
                self._breaks[name] = 0
                out.set_result(result)
            except FutureTimeout:
                out.set_result(Failure(where, f"timeout after {timeout:g} s"))
            except ProcessExpired as exc:
                if attempt < RETRIES_AFTER_CRASH:
                    self._schedule(name, fn, arg, timeout, out, attempt + 1, breaks)
                else:
                    out.set_result(Failure(where, Failure.describe_exit(exc.exitcode), pid=exc.pid,
                                           exitcode=exc.exitcode))
            except CancelledError:
                out.set_result(Failure(where, CANCELLED))
            except (BrokenProcessPool, RuntimeError):
                self._broken(name, fn, arg, timeout, out, attempt, breaks, pool)
            except Exception as exc:          # pickling errors
                out.set_result(Failure(where, f"{type(exc).__name__}: {exc}"[:300]))

        future.add_done_callback(done)

    def _broken(self, name: str, fn: Callable[[Any], Any], arg: Any, timeout: float, out: Future, attempt: int,
                breaks: int, pool: ProcessPool) -> None:
        """The pool broke under this task: replace it and retry the task (see NOTE), else fail it."""
        self._replace(name, pool)
        if self._stopped:                     # stop() stopped the pool under the task
            out.set_result(Failure(f"{name} pool", CANCELLED))
        elif breaks < MAX_BREAKS and self._breaks.get(name, 0) < MAX_BREAKS:
            self._schedule(name, fn, arg, timeout, out, attempt, breaks + 1)
        else:
            out.set_result(Failure(f"{name} pool", BROKEN))

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            pools = list(self._pools.values()) + self._retired
            self._pools.clear()
            self._retired.clear()
        for pool in pools:
            pool.stop()
        for pool in pools:
            pool.join(timeout=5)
        for arena in self._arenas.values():
            if arena is not None:
                arena.close()
