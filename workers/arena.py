"""A pool's shared slots: a task's argument and its answer cross in memory both sides map, not the pipes (a pipe
costs the supervisor ~0.9 us a KB to read and ~0.5 to write here; a loader's answer is ~1.5 KB a chunk).

NOTE (shared slots): `Pools` makes one anonymous shared file (memfd, Linux) for each named pool, of `slots`
slots of SLOT_BYTES, maps it, and hands it to every worker of the pool at spawn like a pipe end (its
descriptor passed to the child; a replaced worker or pool gets the same file). A task takes a free slot in
the parent when it is scheduled: its argument is pickled into the slot there, and the worker reads it,
runs the task, and pickles the answer into the same slot before it answers `Placed` through the pipe; the
parent reads the answer from the slot, then frees it. So a slot belongs to one task from its scheduling to
its answer, and no side ever reads what the other is writing. A task whose worker did not answer (timeout,
crash, cancellation, a broken pool) never gives its slot back: a worker stopped too late could still write
there (the pool goes on with fewer slots, then through the pipes). An argument or answer over SLOT_BYTES,
no free slot, or no memfd: the pipes, as before. Nothing is left behind: the file has no name, and its
memory goes with the last process that maps it. Memory: what the tasks wrote stays until the pools stop, at
most the slots' size (SLOTS_PER_WORKER a worker, MAX_SLOTS at most), in practice a few answers' worth a slot.
"""
from __future__ import annotations

import mmap
import os
import pickle
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any, Callable

SLOT_BYTES = 2 << 20          # a batch of 16 small text files answers ~370 KB; a writer batch of 512 rows ~1.3 MB
SLOTS_PER_WORKER = 4
MAX_SLOTS = 64

_ARENA: Arena | None = None    # a worker's: its pool's slots (`attach`)


@dataclass(frozen=True)
class Placed:
    """A worker's answer: `nbytes` of pickle in the task's slot, or `data` where it did not fit."""
    nbytes: int
    data: bytes = b""


class Arena:
    """A pool's slots: the parent's side (which also hands them out) and a worker's."""

    def __init__(self, fd: int, slots: int, slot_bytes: int):
        self._fd: int | None = fd
        self.slots, self.slot_bytes = slots, slot_bytes
        self._map = mmap.mmap(fd, slots * slot_bytes)
        self._free = list(range(slots - 1, -1, -1))

    @classmethod
    def create(cls, name: str, workers: int, slot_bytes: int = SLOT_BYTES) -> Arena | None:
        """A pool's slots (None where the system has no memfd: the pipes carry everything)."""
        slots = min(MAX_SLOTS, SLOTS_PER_WORKER * max(1, workers))
        fd = memfd(f"ingest-{name}")
        try:
            if fd is not None:
                os.ftruncate(fd, slots * slot_bytes)
                return cls(fd, slots, slot_bytes)
        except OSError:
            os.close(fd)
        return None

    def __reduce__(self):
        return _attach, (reduction.DupFd(self._fd), self.slots, self.slot_bytes)

    def take(self) -> int | None:
        """A free slot, or None (list.pop and append are atomic: any thread)."""
        try:
            return self._free.pop()
        except IndexError:
            return None

    def give(self, slot: int) -> None:
        self._free.append(slot)

    def dump(self, slot: int, value: Any) -> int:
        """`value` pickled straight into `slot` (no bytes of it made first): its size, or 0 where it does not fit."""
        into = _Into(self._map, slot * self.slot_bytes, (slot + 1) * self.slot_bytes)
        try:
            pickle.Pickler(into, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except _Full:
            return 0
        return into.at - slot * self.slot_bytes

    def load(self, slot: int, nbytes: int) -> Any:
        at = slot * self.slot_bytes
        return pickle.loads(memoryview(self._map)[at:at + nbytes])

    def close(self) -> None:
        """Close the descriptor (the mapping goes with its last view)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def memfd(name: str) -> int | None:
    """A new anonymous shared file's descriptor (closed on exec), or None where the system has no memfd."""
    make = getattr(os, "memfd_create", None)
    try:
        return make(name, os.MFD_CLOEXEC) if make is not None else None
    except OSError:
        return None


class _Full(Exception):
    """A pickle that outgrew its slot."""


class _Into:
    """A file for pickle.Pickler that writes into a slot (pickle writes a frame, or a large object, at a time)."""
    __slots__ = ("map", "at", "end")

    def __init__(self, map_: mmap.mmap, at: int, end: int):
        self.map, self.at, self.end = map_, at, end

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if self.at + n > self.end:
            raise _Full
        self.map[self.at:self.at + n] = data
        self.at += n
        return n


def _attach(dup, slots: int, slot_bytes: int) -> Arena:
    arena = Arena(dup.detach(), slots, slot_bytes)
    arena.close()
    return arena


def attach(arena: Arena | None) -> None:
    """In a worker, at start: its pool's slots (None: the pipes only)."""
    global _ARENA
    _ARENA = arena


def in_slot(task: tuple[Callable[[Any], Any], int, int, Any]) -> Any:
    """In a worker: (fn, slot, nbytes, arg): fn of the argument in `slot` (nbytes of it; 0: `arg`), its answer
    put in the slot (`Placed`), or sent as pickled bytes where it does not fit."""
    fn, slot, nbytes, arg = task
    arena = _ARENA
    if arena is None:
        raise LookupError("a task for a pool's shared slots reached a worker without them")
    result = fn(arena.load(slot, nbytes) if nbytes else arg)
    size = arena.dump(slot, result)
    return Placed(size) if size else Placed(0, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
