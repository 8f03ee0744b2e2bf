"""The coordinator's two kinds of descriptor: its wake-up pipe and the reading end of each worker's
result pipe.

NOTE (descriptors): a descriptor number is reused by the next open() once closed, so nothing here
uses a number after its close. WakePipe is written by any thread (callers, feeders, pebble's
threads) and read by the coordinator thread alone: every write and the close take one lock, so a
write after close() is a no-op instead of a byte in someone else's file, and the coordinator
closes it only when its own thread ends (nobody polls it after). MessageReader never blocks: it
reads what has arrived and unpickles only whole messages, so a worker that stops halfway through
a message (hung, stopped, starved) cannot block the coordinator, whose deadlines then catch it.
"""
from __future__ import annotations

import math
import os
import select
import struct
import threading
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

READ_BYTES = 1 << 20


class WakePipe:
    """A self-pipe: `wake()` from any thread makes the coordinator's wait return."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._closed = False

    def fileno(self) -> int:
        """For multiprocessing.connection.wait, in the coordinator thread (which closes the pipe)."""
        return self._read

    def wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._write, b"\0")
            except BlockingIOError:             # full: a wake-up is pending anyway
                pass

    def drain(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)


class Poller:
    """multiprocessing.connection.wait without its new selector and registrations on every call: the
    coordinator sleeps a few thousand times a run. The descriptors are registered again only when they
    change (a number is polled as whatever it names now: _pipes NOTE)."""

    def __init__(self) -> None:
        self._fds: tuple[int, ...] = ()
        self._poll = select.poll()

    def wait(self, handles: list[Any], timeout_s: float) -> None:
        """Until one of `handles` (descriptors, or objects with fileno()) is readable or closed, or the timeout."""
        fds = tuple(h if isinstance(h, int) else h.fileno() for h in handles)
        if fds != self._fds:
            self._poll = select.poll()
            for fd in fds:
                self._poll.register(fd, select.POLLIN)
            self._fds = fds
        self._poll.poll(math.ceil(timeout_s * 1000))


class MessageReader:
    """The parent's end of a worker's result Pipe, read without blocking. The worker sends with
    Connection.send: a 4-byte big-endian length (-1, then 8 bytes, past 2 GiB), then the pickle."""

    def __init__(self, conn: Connection):
        self.conn = conn
        os.set_blocking(conn.fileno(), False)
        self._buffer = bytearray()

    def fileno(self) -> int:
        return self.conn.fileno()              # raises OSError once closed: the number is never reused here

    def messages(self) -> list[Any]:
        """The whole messages that have arrived, in order; EOFError when the worker's end is closed and
        no whole message is left."""
        ended = False
        while True:
            try:
                data = os.read(self.conn.fileno(), READ_BYTES)
            except BlockingIOError:
                break
            if not data:
                ended = True
                break
            self._buffer += data
        out = []
        while (message := self._next()) is not None:
            out.append(message)
        if ended and not out:
            raise EOFError
        return out

    def _next(self) -> Any:
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        size, head = struct.unpack_from("!i", buffer)[0], 4
        if size == -1:
            if len(buffer) < 12:
                return None
            size, head = struct.unpack_from("!Q", buffer, 4)[0], 12
        end = head + size
        if len(buffer) < end:
            return None
        with memoryview(buffer) as whole, whole[head:end] as body:
            message = ForkingPickler.loads(body)
        del buffer[:end]
        return message

    def close(self) -> None:
        self.conn.close()
