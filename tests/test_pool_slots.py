"""The pools' shared slots (workers/arena.py NOTE): a task's argument and answer cross in memory both sides
map; what does not fit goes through the pipes; a task that ends without its worker's answer (a crash, a
timeout) keeps its slot out of use, and the pool goes on. Real pebble pools, real worker processes."""
from __future__ import annotations

import os
import pickle
import time

import pytest

from ingest.workers.arena import SLOT_BYTES
from ingest.workers.failure import Failure
from ingest.workers.pool import Pools


def test_tasks_cross_in_shared_slots_and_a_task_its_worker_never_answered_keeps_its_slot() -> None:
    pools = Pools({"a": 1}, {"a": 3.0})
    try:
        assert pools.submit("a", bytes, 1000).result(timeout=60) == bytes(1000)
        arena = pools._arenas["a"]
        assert arena is not None and len(arena._free) == arena.slots
        assert pickle.loads(arena._map[0:SLOT_BYTES]) == bytes(1000)          # the answer was in slot 0
        assert pools.submit("a", bytes, SLOT_BYTES + 1).result(timeout=60) == bytes(SLOT_BYTES + 1)   # the pipe
        long = "x" * (SLOT_BYTES + 10)                                            # an argument over a slot
        assert pools.submit("a", len, long).result(timeout=60) == len(long)
        free = len(arena._free)
        assert free == arena.slots
        dead = pools.submit("a", os._exit, 7).result(timeout=60)                # dies, retried once, dies again
        assert isinstance(dead, Failure) and dead.exitcode == 7, dead
        assert len(arena._free) == free - 2
        slow = pools.submit("a", time.sleep, 30).result(timeout=60)
        assert isinstance(slow, Failure) and "timeout" in slow.error, slow
        assert len(arena._free) == free - 3
        assert pools.submit("a", abs, -3).result(timeout=60) == 3               # the pool goes on
    finally:
        pools.stop()


def test_without_memfd_every_task_goes_through_the_pipes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "memfd_create")
    pools = Pools({"a": 1}, {"a": 30.0})
    try:
        assert pools.submit("a", bytes, 1000).result(timeout=60) == bytes(1000)
        assert pools._arenas["a"] is None
    finally:
        pools.stop()
