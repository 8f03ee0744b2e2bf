"""Milvus Lite in a process of its own: the run's .db served on 127.0.0.1, off the supervisor's GIL.

Milvus Lite 3 runs its gRPC server as Python threads inside whichever process opens the .db.
Opened by the supervisor, the server side of every upsert (decoding, WAL, memtable) would share
the GIL with the dispatcher and the encode thread; the host process takes it away. `ingest search`
still opens Lite in its own process (one short call, no host).

NOTE (host protocol):
- `Store.serve()` starts the host in the run, after `Store.lock()` took the flock, so a second
  run fails on the flock before it starts a host. The host (spawn, no __main__ re-import) ignores
  SIGINT (the run decides when it stops: after Ctrl-C it still writes what is encoded), runs
  watch_parent, opens the .db (MilvusLite takes the data dir's own LOCK; a LOCK still held is
  retried for LOCK_WAIT_S: the host of a SIGKILLed run lives up to half a second more), binds
  127.0.0.1:0 and sends Ready(port) or Failed(error) on its pipe. The parent waits for that at
  most START_S, checking that the host lives; a failure is one line (RuntimeError).
- The run's own client and its writer processes connect to `address`.
- `stop()`: the parent sends None; the host stops the server (grace 2 s), closes the .db (which
  releases its LOCK) and exits; the parent joins it for STOP_S, then SIGKILLs it. The store's
  flock is given back only after that (`Store.close`).
- The parent dies (SIGKILL included): the pipe reads EOF (or watch_parent fires) and the host
  exits at once, without closing: what the run flushed is durable, and the rerun redoes the rest.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from ingest.workers.failure import Failure
from ingest.workers.spawn import SPAWN, watch_parent

START_S, STOP_S, LOCK_WAIT_S = 60.0, 10.0, 5.0


@dataclass(frozen=True)
class Ready:
    port: int


@dataclass(frozen=True)
class Failed:
    error: str


class LiteHost:
    """The host process serving `data_dir`; started by the constructor, which returns once it listens."""

    def __init__(self, data_dir: str):
        ours, theirs = SPAWN.Pipe()
        self._conn = ours
        self.process = SPAWN.Process(target=_serve, args=(data_dir, theirs), name="ingest-lite-host", daemon=True)
        self.process.start()
        theirs.close()
        try:
            self.port = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.address = f"http://127.0.0.1:{self.port}"

    def _wait_ready(self) -> int:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and self.process.is_alive():
            if self._conn.poll(0.2):
                try:
                    message = self._conn.recv()
                except EOFError:
                    break
                if isinstance(message, Failed):
                    raise RuntimeError(message.error)
                return message.port
        if self.process.is_alive():
            raise RuntimeError(f"its Milvus Lite host process did not start within {START_S:g} s")
        raise RuntimeError(f"its Milvus Lite host process ended at start ({self.describe_exit()})")

    def alive(self) -> bool:
        return self.process.is_alive()

    def describe_exit(self) -> str:
        return Failure.describe_exit(self.process.exitcode).replace("worker", "host")

    def stop(self) -> None:
        """Stop the server and close the .db (graceful, STOP_S at most, then SIGKILL)."""
        try:
            self._conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(STOP_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(STOP_S)
        self._conn.close()


def _serve(data_dir: str, conn: Connection) -> None:
    """The host process: serve `data_dir` until told to stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent("lite")                 # shown as ingest-lite in ps
    try:
        server, db, port = _open(data_dir)
    except Exception as exc:
        conn.send(Failed(" ".join(f"{type(exc).__name__}: {exc}".split())[:300]))
        return
    conn.send(Ready(port))
    try:
        conn.recv()
    except EOFError:                    # the parent is gone: exit now (see NOTE)
        os._exit(0)
    server.stop(grace=2).wait(STOP_S)
    db.close()


def _open(data_dir: str):
    """(server, db, port) serving `data_dir` on 127.0.0.1; waits LOCK_WAIT_S for a LOCK still held."""
    from milvus_lite.adapter.grpc.server import start_server_in_thread
    from milvus_lite.exceptions import DataDirLockedError

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            server, db, port = start_server_in_thread(data_dir=data_dir, host="127.0.0.1", port=0)
            break
        except DataDirLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    if not port:
        server.stop(grace=0)
        db.close()
        raise RuntimeError("could not listen on 127.0.0.1")
    return server, db, port
