"""Who holds a server collection's lease, and whether that holder is gone: shared by the stores that keep a
lease row (Milvus: `ingest.store.server_manifest`; Qdrant: `ingest.store.qdrant_manifest`, whose NOTE
blocks give the protocol)."""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest.store.base import LeaseLost, StoreError, one_line
from ingest.workers.spawn import pid_alive

SUFFIX = "__files"        # a server collection's companion: its manifest and its lease
LEASE_TTL_S = 60.0        # a holder that stops renewing is stale after this
RENEW_EVERY_S = 10.0      # the heartbeat


def companion_name(collection: str) -> str:
    return collection + SUFFIX


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, and until when (epoch seconds); `boot` and `pidns` say where its pid lives."""
    host: str
    pid: int
    run: str
    since: float
    expires: float
    boot: str = ""                   # "": unknown (a lease written before they were recorded)
    pidns: str = ""

    def stale(self, now: float) -> bool:
        """Expired (no heartbeat for LEASE_TTL_S), or held by a pid of this host, boot and pid namespace
        that no longer exists."""
        here = self.boot and self.pidns and (self.host, self.boot, self.pidns) == where()
        return self.expires < now or bool(here and not pid_alive(self.pid))

    def describe(self) -> str:
        return (f"the run on {self.host} (pid {self.pid}) since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.since))}")


def where() -> tuple[str, str, str]:
    """(host name, boot id, pid namespace) of this process; "" where Linux does not tell."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        boot = pidns = ""
    return socket.gethostname(), boot, pidns


class LeaseRow:
    """This run's lease kept as one row (a point) of a server collection's manifest: the protocol both lease
    stores share (taking it, renewal from a daemon thread, the fence, the release). A subclass makes the
    collection that holds it (`_prepare`) and reads, writes and deletes the row (`_read`, `_write`, `_delete`)."""
    row = "row"                                  # what the store calls it, for messages
    confirm_after_s = 0.0                        # > 0: the store has no conditional write (acquire)

    def __init__(self, store: Any):
        self.store, self.name = store, companion_name(store.collection)
        now = time.time()
        host, boot, pidns = where()
        self.me = Holder(host, os.getpid(), uuid.uuid4().hex, now, now + LEASE_TTL_S, boot, pidns)
        self.lost: str | None = None                 # why the lease was lost; None while held
        self._stop = threading.Event()
        self._lock = threading.Lock()                # a renewal and the release never overlap

    @classmethod
    def acquire(cls, store: Any) -> LeaseRow:
        """Take the lease of `store`'s collection or raise StoreError naming its holder; renew it from then on. A
        write the store cannot condition is confirmed by a re-read `confirm_after_s` later: the later writer wins."""
        lease = cls(store)
        lease._prepare()
        holder = lease._read()
        if holder is not None and not holder.stale(time.time()):
            raise lease._in_use(holder)
        lease._write(stale=holder)
        time.sleep(lease.confirm_after_s)
        holder = lease._read()
        if holder is None or holder.run != lease.me.run:        # another run's write won
            raise lease._in_use(holder)
        threading.Thread(target=lease._renew_loop, name="ingest-lease", daemon=True).start()
        return lease

    def _prepare(self) -> None:
        """Make the collection that holds the row, if missing."""
        raise NotImplementedError

    def _read(self) -> Holder | None:
        raise NotImplementedError

    def _write(self, stale: Holder | None = None) -> None:
        """Write this run's row, renewed (where it is ours, or still `stale`'s, if the store can condition it)."""
        raise NotImplementedError

    def _delete(self) -> None:
        """Delete the row if it is still this run's."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise LeaseLost if the lease was lost (another run took the collection, or renewal failed)."""
        if self.lost:
            raise LeaseLost(self.lost)

    def confirm(self) -> None:
        """Re-read the row now: raise LeaseLost unless it is still this run's (the fence before a delete)."""
        self.check()
        holder = self._read()
        if holder is None or holder.run != self.me.run:
            self.lost = self._taken_over(holder)
            raise LeaseLost(self.lost)

    def release(self) -> None:
        """Stop renewing and delete the row if it is still ours (a failure here only lets it expire)."""
        self._stop.set()
        with self._lock:
            if self.lost:
                return
            try:
                self._delete()
            except Exception:
                pass                 # the row expires after LEASE_TTL_S; a rerun on this host takes it at once

    def _in_use(self, holder: Holder | None) -> StoreError:
        who = holder.describe() if holder else "another run"
        return StoreError(f"collection {self.store.collection!r} on {self.store.uri} is in use by {who}; wait "
                          f"for it to finish (the lease of a run that died expires within {LEASE_TTL_S:.0f} s)")

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S) and not self.lost:
            with self._lock:
                if not self._stop.is_set():
                    self._renew()

    def _taken_over(self, holder: Holder | None) -> str:
        other = holder.describe() if holder else f"nobody (the lease {self.row} was deleted)"
        return (f"collection {self.store.collection!r} on {self.store.uri} was taken over by {other} while this "
                "run held it; nothing more was deleted or recorded; run one ingest at a time per collection, "
                "then rerun")

    def _renew(self) -> None:
        try:
            holder = self._read()
            if holder is None or holder.run != self.me.run:
                self.lost = self._taken_over(holder)
                return
            if time.time() >= self.me.expires:      # expired meanwhile: another run may take it any moment
                raise TimeoutError("the lease expired before it was renewed")
            self._write()
        except Exception as exc:
            if time.time() + RENEW_EVERY_S >= self.me.expires:
                self.lost = (f"collection {self.store.collection!r} on {self.store.uri}: could not renew this "
                             f"run's lease in time ({one_line(exc)}); check the server, then rerun")


class LeasedManifest:
    """The face a server manifest shares (the `Manifest` protocol of `ingest.store.manifest`): its writes need
    the lease, its fence re-reads it; a subclass reads and writes its entries."""

    def __init__(self, store: Any, lease: LeaseRow | None):
        self.store, self.lease = store, lease        # None: to read only
        self.name = companion_name(store.collection)

    def close(self) -> None:
        """Nothing to close: the client is the store's, the lease the collection's."""

    def fence(self) -> None:
        """Raise LeaseLost unless the lease, read now, is still this run's."""
        self.lease.confirm()
