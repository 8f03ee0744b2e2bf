"""A bounded reorder buffer: items numbered 0, 1, 2, ... arrive in any order and leave in order."""
from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Reorder(Generic[T]):
    """Hold items that arrive early until every item before them has arrived.

    `put(number, item)` returns the items that may now leave, in number order. At most
    `capacity` items wait: the sender bounds what it has in flight, so more is a bug and
    raises instead of growing without limit. Not thread-safe: one thread owns it.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.next = 0                      # the number the buffer waits for
        self._waiting: dict[int, T] = {}

    def put(self, number: int, item: T) -> list[T]:
        if number < self.next or number in self._waiting:
            raise ValueError(f"item {number} was already put")
        if len(self._waiting) >= self.capacity:
            raise OverflowError(f"reorder buffer full ({self.capacity} items wait for item {self.next})")
        self._waiting[number] = item
        out: list[T] = []
        while self.next in self._waiting:
            out.append(self._waiting.pop(self.next))
            self.next += 1
        return out

    def __len__(self) -> int:
        return len(self._waiting)
