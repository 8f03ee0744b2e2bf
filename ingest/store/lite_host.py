"""Milvus Lite in a process of its own: the run's .db served on a private Unix socket, off the supervisor's GIL.

Milvus Lite 3 runs its gRPC server as Python threads inside whichever process opens the .db.
Opened by the supervisor, the server side of every upsert (decoding, WAL, memtable) would share
the GIL with the dispatcher and the encode thread; the host process takes it away. `ingest search`
still opens Lite in its own process (one short call, no host), through a `LiteServer` of its own.

NOTE (who can connect): Milvus Lite has no users or passwords, so the server listens on nothing but
a Unix socket, `milvus.sock`, in a directory made for it by mkdtemp (mode 0700, owned by the run's
user, named ingest-lite-<pid>-*): only processes of that user (the run, its writer processes, the
Ray engine's writer actors on this machine) can reach it; no TCP port is opened. The directory goes
when the server stops; one left by a host killed together with its run (SIGKILL to both) is removed
by the next `LiteServer` of that user, once its pid is gone and its socket answers nobody.
The directory also holds `store`, the path of the .db it serves: `serving(path)` finds the host of a
.db that a run or `ingest watch` holds (flocked), for `ingest search`, which then reads through it.
It trusts only a directory of this user's, mode 0700, whose socket answers: another user can
neither reach this user's socket nor stand in for it.

NOTE (host protocol):
- `Store.serve()` starts the host in the run, after `Store.lock()` took the flock, so a second
  run fails on the flock before it starts a host. The host (spawn, no __main__ re-import) is
  shielded from a group-wide SIGINT/SIGTERM (the run decides when it stops: after Ctrl-C or
  `systemctl stop` it still writes what is encoded; workers/spawn.py NOTE), runs
  watch_parent, opens the .db (MilvusLite takes the data dir's own LOCK; a LOCK still held is
  retried for LOCK_WAIT_S: the host of a SIGKILLed run lives up to half a second more), listens
  on its private socket (above) and sends Ready(address, directory) or Failed(error) on its pipe.
  The parent waits for that at most START_S, checking that the host lives; a failure is one line
  (RuntimeError).
- The run's own client and its writer processes connect to `address` (unix:/.../milvus.sock).
- `stop()`: the parent sends None; the host stops the server (grace 2 s), closes the .db (which
  releases its LOCK), removes its directory and exits; the parent joins it for STOP_S, then
  SIGKILLs it and removes the directory itself. The store's flock is given back only after that
  (`Store.close`).
- The parent dies (SIGKILL included): the pipe reads EOF (or watch_parent fires) and the host
  removes its directory and exits at once, without closing: what the run flushed is durable, and
  the rerun redoes the rest.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from ingest.workers.failure import Failure
from ingest.workers.spawn import SHIELDED, pid_alive, watch_parent

START_S, STOP_S, LOCK_WAIT_S = 60.0, 10.0, 5.0
PREFIX, SOCKET, STORE = "ingest-lite-", "milvus.sock", "store"
SUN_PATH_MAX = 107                # bytes in a Unix socket's path (Linux; macOS allows 103)


@dataclass(frozen=True)
class Ready:
    address: str                  # unix:/<directory>/milvus.sock
    directory: str


@dataclass(frozen=True)
class Failed:
    error: str


class LiteServer:
    """Milvus Lite serving `data_dir` from this process's threads, on a Unix socket in a private
    directory (see the NOTE); `address` is what a MilvusClient connects to."""

    def __init__(self, data_dir: str):
        _sweep()
        self.directory = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")      # mode 0700
        self.address = f"unix:{self.directory}/{SOCKET}"
        try:
            if len(os.fsencode(self.address)) - len("unix:") > SUN_PATH_MAX:
                raise RuntimeError(f"the socket path {self.address[5:]} is too long; set TMPDIR to a shorter folder")
            Path(self.directory, STORE).write_text(str(Path(data_dir).resolve()), encoding="utf-8")
            self.server, self.db = _open(data_dir, self.address)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def close(self) -> None:
        """Stop the server (grace 2 s), close the .db (its LOCK goes) and remove the directory."""
        try:
            self.server.stop(grace=2).wait(STOP_S)
            self.db.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


class LiteHost:
    """The host process serving `data_dir`; started by the constructor, which returns once it listens."""

    def __init__(self, data_dir: str):
        ours, theirs = SHIELDED.Pipe()
        self._conn = ours
        self._directory: str | None = None
        self.process = SHIELDED.Process(target=_serve, args=(data_dir, theirs), name="ingest-lite-host", daemon=True)
        self.process.start()
        theirs.close()
        try:
            ready = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._directory, self.address = ready.directory, ready.address

    def _wait_ready(self) -> Ready:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and self.process.is_alive():
            if self._conn.poll(0.2):
                try:
                    message = self._conn.recv()
                except EOFError:
                    break
                if isinstance(message, Failed):
                    raise RuntimeError(message.error)
                return message
        if self.process.is_alive():
            raise RuntimeError(f"its Milvus Lite host process did not start within {START_S:g} s")
        raise RuntimeError(f"its Milvus Lite host process ended at start ({self.describe_exit()})")

    def alive(self) -> bool:
        return self.process.is_alive()

    def describe_exit(self) -> str:
        return Failure.describe_exit(self.process.exitcode).replace("worker", "host")

    def stop(self) -> None:
        """Stop the server and close the .db (graceful, STOP_S at most, then SIGKILL); remove the socket's directory."""
        try:
            self._conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(STOP_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(STOP_S)
        self._conn.close()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)


def _serve(data_dir: str, conn: Connection) -> None:
    """The host process: serve `data_dir` until told to stop or the parent is gone."""
    watch_parent("lite")                 # shown as ingest-lite in ps
    try:
        lite = LiteServer(data_dir)
    except Exception as exc:
        conn.send(Failed(" ".join(f"{type(exc).__name__}: {exc}".split())[:300]))
        return
    conn.send(Ready(lite.address, lite.directory))
    try:
        conn.recv()
    except EOFError:                    # the parent is gone: exit now (see NOTE)
        shutil.rmtree(lite.directory, ignore_errors=True)
        os._exit(0)
    lite.close()


def _open(data_dir: str, address: str):
    """(server, db) serving `data_dir` on `address`; waits LOCK_WAIT_S for a LOCK still held."""
    from milvus_lite.adapter.grpc.server import _build_server       # start_server_in_thread binds TCP only
    from milvus_lite.db import MilvusLite
    from milvus_lite.exceptions import DataDirLockedError

    # Its servicer logs a traceback per failed call (a full disk: one per batch); the client gets the reason
    # in the call's status, and the run says it in one line (ingest/store/milvus.py).
    logging.getLogger("milvus_lite").setLevel(logging.CRITICAL)

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            db = MilvusLite(data_dir)
            _sweep_unmade(Path(data_dir))      # under its LOCK: no other process is making one
            break
        except DataDirLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    server = _build_server(db, max_workers=10)
    try:
        if not server.add_insecure_port(address):
            raise RuntimeError(f"could not listen on {address}")
        server.start()
    except BaseException:
        server.stop(grace=0)
        db.close()
        raise
    return server, db


def _sweep_unmade(data_dir: Path) -> None:
    """Remove the folders of collections Milvus Lite began but never made. It makes the folder, then writes
    schema.json (a temp file renamed), and takes a folder without schema.json for no collection, yet refuses to
    make one there ("File exists"): a full disk at that moment would refuse the collection for good. Only a
    folder whose whole listing is that temp file (or nothing) goes: it holds no row."""
    for folder in (*data_dir.glob("collections/*"), *data_dir.glob("databases/*/collections/*")):
        try:
            unmade = folder.is_dir() and not folder.is_symlink() and \
                {p.name for p in folder.iterdir()} <= {"schema.json.tmp"}
            if unmade:
                shutil.rmtree(folder)
        except OSError:
            continue


def serving(data_dir: Path) -> str | None:
    """The address of a Milvus Lite server of this user's that serves `data_dir` (NOTE: who can connect), else None."""
    want = str(Path(data_dir).resolve())
    for d in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        try:
            info = d.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
                continue
            if (d / STORE).read_text(encoding="utf-8") == want and _answers(d / SOCKET):
                return f"unix:{d}/{SOCKET}"
        except (OSError, UnicodeDecodeError):
            continue
    return None


def _sweep() -> None:
    """Remove this user's socket directories whose process is gone and whose socket answers nobody."""
    base = Path(tempfile.gettempdir())
    for d in base.glob(f"{PREFIX}*-*"):
        try:
            pid = int(d.name[len(PREFIX):].split("-", 1)[0])
            info = d.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or pid_alive(pid) or _answers(d / SOCKET):
                continue
        except (ValueError, OSError):
            continue
        shutil.rmtree(d, ignore_errors=True)




def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False
