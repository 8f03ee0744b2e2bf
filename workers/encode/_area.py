"""An encode worker's shared area: one slot per batch it may hold, each with room for the batch's token ids
going in and its vectors coming back, so neither crosses a pipe.

NOTE (shared area): the parent makes an anonymous shared file (memfd, Linux) for each worker it starts and
hands it over at spawn like a pipe end (its descriptor passed to the child). The worker, once it knows its
device, model and batch plan, sizes it (IN_FLIGHT slots of `ids_cap` int32 ids and `rows_cap` float32
vectors) and says the sizes in WorkerReady; the parent maps it then. A slot belongs to one batch from its
dispatch (the coordinator writes the ids, the task names the slot) to its TaskDone or TaskFailed (the worker
wrote the vectors before sending TaskDone; the coordinator copies them into the window before the slot can
be given again), so no side ever reads a slot the other is writing. A batch that does not fit a slot, or a
worker with no area (no memfd here), goes through the pipe as before. Nothing is left behind: the file has
no name, and its memory goes with the last process that maps it. A worker replaced gets a new area.
"""
from __future__ import annotations

import mmap
import os
from multiprocessing import reduction

import numpy as np

from ..arena import memfd

IN_FLIGHT = {"cpu": 2, "cuda": 6}     # batches a worker holds (launched + queued): its slots


class Area:
    """One worker's shared area; the parent's side and the worker's (rebuilt from the descriptor)."""

    def __init__(self, fd: int):
        self._fd: int | None = fd
        self.slots = 0
        self.ids_cap = self.rows_cap = self.dim = 0
        self._ids: list[np.ndarray] = []
        self._vectors: list[np.ndarray] = []

    @classmethod
    def create(cls, name: str) -> Area | None:
        """A new, empty area (None where the system has no memfd: the pipes carry everything)."""
        fd = memfd(name)
        return None if fd is None else cls(fd)

    def __reduce__(self):
        return _rebuild, (reduction.DupFd(self._fd),)      # at spawn: the descriptor goes to the child

    def size(self, slots: int, ids_cap: int, rows_cap: int, dim: int) -> None:
        """The worker's side: give the area its size and map it."""
        os.ftruncate(self._fd, slots * (ids_cap + rows_cap * dim) * 4)
        self.map(slots, ids_cap, rows_cap, dim)

    def map(self, slots: int, ids_cap: int, rows_cap: int, dim: int) -> None:
        """Map the area as sized (the parent's side, from WorkerReady); the descriptor is closed after."""
        slot_bytes = (ids_cap + rows_cap * dim) * 4
        if slots and slot_bytes:
            whole = mmap.mmap(self._fd, slots * slot_bytes)
            for k in range(slots):
                at = k * slot_bytes
                self._ids.append(np.frombuffer(whole, np.int32, ids_cap, at))
                self._vectors.append(np.frombuffer(whole, np.float32, rows_cap * dim, at + ids_cap * 4)
                                     .reshape(rows_cap, dim))
            self.slots, self.ids_cap, self.rows_cap, self.dim = slots, ids_cap, rows_cap, dim
        self.close()

    def fits(self, ids: np.ndarray) -> bool:
        return ids.size <= self.ids_cap and len(ids) <= self.rows_cap

    def put_ids(self, slot: int, ids: np.ndarray) -> None:
        self._ids[slot][:ids.size].reshape(ids.shape)[...] = ids

    def ids(self, slot: int, rows: int, width: int) -> np.ndarray:
        return self._ids[slot][:rows * width].reshape(rows, width)

    def vectors(self, slot: int, rows: int) -> np.ndarray:
        return self._vectors[slot][:rows]

    def close(self) -> None:
        """Close the descriptor (the mapping, if any, stays until its arrays are gone)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _rebuild(dup) -> Area:
    return Area(dup.detach())
