"""PostgreSQL: a collection's manifest and the run's hold on it, in the same database as its table.

Two tables beside the collection's: `<collection>__files` (one row a file: `Entry`'s fields and when it was
recorded) and `<collection>__meta` (key, value: the meta values, and the row `lease` naming the run that holds
the collection: host, pid, since, its server backend pid), each COMMENTed as ingest's; a table of those names
without that mark is refused, never changed.

NOTE (ownership): a run owns a collection by holding a session advisory lock (pg_try_advisory_lock on a key
hashed from the schema and the collection) on a connection of its own, the owner connection, for the whole
run; another run is refused at once, naming the holder from the `lease` row. PostgreSQL lets the lock go when
that session ends, however it ends (the run dies, its connection is lost or terminated), so nothing expires
by a clock. Every manifest write runs on the owner connection in one transaction whose first statement checks
that this session still holds the lock (pg_locks): the lock is then held until the transaction ends, so no
other run can own the collection while it commits, and a session that lost its connection commits nothing.
`PostgresStore.commit` deletes the stale rows in that same transaction.

NOTE (reconnect): an owner connection that ends (a server restart, `pg_terminate_backend`, a network cut) lets
the lock go. The next use of it (a commit, a manifest read, the heartbeat every HEARTBEAT_S) gets Disconnected
and, under `retry` (ingest.store.errors NOTE: reconnect protocol, bounded by [store] timeout_s), takes the
collection back on a new connection (`PgLease.reconnect`): the lock again, and only if the `lease` row still
names this run (host, pid, since). Every run that takes the collection writes its own row and its release
deletes it, so a row still ours proves no other run owned the collection meanwhile; then the row gets the new
backend pid and the transaction that failed runs again (a commit is idempotent: the same deletes, the same
upserts; one that was committed before its answer was lost changes nothing the second time). Another session
holding the lock, or a row not ours, is LeaseLost: "another run holds the collection", and the run stops with
nothing more deleted or recorded. A server still away after the bound stops the run with that cause. As with
Milvus, the writer processes' upserts are not fenced: a run that lost the collection may still add rows, never
their entries.
A session lock needs a session: behind PgBouncer, connect in session pooling mode (not transaction pooling).
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TypeVar

from ingest.store.base import LeaseLost, StoreError, one_line
from ingest.store.errors import Disconnected, retry
from ingest.store.manifest import Entry, Summary
from ingest.store.postgres_sql import MARK, connect, fail

if TYPE_CHECKING:
    from ingest.store.postgres import PostgresStore

T = TypeVar("T")
FILES, META = "__files", "__meta"
LEASE_KEY = "lease"
HEARTBEAT_S = 10.0
_FIELDS = Entry._fields
_HELD_BY = ("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) AND classid = %s::bigint::oid "
            "AND objid = %s::bigint::oid")


def _key(conn, collection: str) -> int:
    """The advisory lock key of `collection` in the connection's current schema (a signed 64-bit hash)."""
    schema = conn.execute("SELECT current_schema()").fetchone()[0] or ""
    digest = hashlib.blake2b(f"ingest\0{schema}\0{collection}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _held_by(conn, key: int) -> int | None:
    """The server backend pid that holds the lock `key`, if any (pg_locks shows a bigint key as two oids)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    row = conn.execute(_HELD_BY, (unsigned >> 32, unsigned & 0xFFFFFFFF)).fetchone()
    return row[0] if row else None


def _describe(conn, store: PostgresStore, backend: int) -> str:
    """Who holds the collection, from its `lease` row (if it names the backend that holds the lock)."""
    row = conn.execute(f"SELECT value FROM {store.table(META).as_string(conn)} WHERE key = %s", (LEASE_KEY,)).fetchone()
    lease = json.loads(row[0]) if row else {}
    if lease.get("backend") != backend:
        return f"another run (server backend pid {backend})"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lease["since"]))
    return f"the run on {lease['host']} (pid {lease['pid']}) since {since}"


def holder(store: PostgresStore) -> str | None:
    """Who owns `store`'s collection now; None if nobody (reads only)."""
    if not store.comment(META):
        return None
    with store._sql("read the lease"):
        backend = _held_by(store.conn, _key(store.conn, store.collection))
        return None if backend is None else _describe(store.conn, store, backend)


def read_summary(store: PostgresStore) -> Summary | None:
    """The manifest's Summary (`ingest status`), None if it has none; reads only, while a run holds it too."""
    if not store.comment(FILES) or not store.comment(META):
        return None
    with store._sql("read the manifest") as cur:
        meta = dict(cur.execute(f"SELECT key, value FROM {store.table(META).as_string(cur)} WHERE key <> %s",
                                (LEASE_KEY,)).fetchall())
        counts = cur.execute(f"SELECT format, status, count(*), coalesce(sum(chunks), 0) FROM "
                             f"{store.table(FILES).as_string(cur)} GROUP BY format, status ORDER BY 1, 2").fetchall()
    return Summary(meta, [(f, s, int(n), int(c)) for f, s, n, c in counts])


def own(store: PostgresStore) -> tuple[PgManifest, PgLease]:
    """Take the collection (StoreError naming its holder if another run has it), make its manifest tables on
    first use, record this run as the holder; the manifest and the lease."""
    conn = connect(store.address, store.uri, store.timeout_s)
    try:
        key = _key(conn, store.collection)
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            backend = _held_by(conn, key)
            who = _describe(conn, store, backend) if backend is not None and store.comment(META) else "another run"
            raise StoreError(f"collection {store.collection!r} on {store.uri} is in use by {who}; wait for it to "
                             "finish (a run that died lets go at once)")
        _ensure_tables(store, conn)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(), "backend": conn.info.backend_pid}
        lease = PgLease(store, conn, key, me)
        manifest = PgManifest(store, lease)
        with manifest.transaction("record this run as the holder") as cur:
            manifest._set(cur, LEASE_KEY, json.dumps(me))
        threading.Thread(target=lease.heartbeat, name="ingest-lease", daemon=True).start()
        return manifest, lease
    except BaseException as exc:
        conn.close()
        raise fail(store.uri, "take the collection", exc) from None


def _ensure_tables(store: PostgresStore, conn) -> None:
    """Make `<collection>__files` and `__meta` if missing; refuse tables of those names that are not ingest's."""
    from psycopg import sql

    ddl = {FILES: "source text PRIMARY KEY, size bigint NOT NULL, mtime_ns bigint NOT NULL, file_hash text NOT NULL, "
                  "status text NOT NULL, chunks bigint NOT NULL, format text NOT NULL, settings text NOT NULL, "
                  "updated double precision NOT NULL",
           META: "key text PRIMARY KEY, value text NOT NULL"}
    for suffix, columns in ddl.items():
        mark = store.comment(suffix)
        if mark is None:
            with conn.transaction():
                conn.execute(sql.SQL(f"CREATE TABLE {{}} ({columns})").format(store.table(suffix)))
                conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(store.table(suffix), sql.Literal(
                    json.dumps({MARK: "manifest", "collection": store.collection}))))
        elif mark.get(MARK) != "manifest":
            raise StoreError(f"table {store.collection + suffix!r} in {store.uri} was not made by ingest; nothing was "
                             "changed; choose another --collection")


class PgLease:
    """This run's hold on the collection: the advisory lock of its owner connection (NOTE: ownership, reconnect)."""

    def __init__(self, store: PostgresStore, conn, key: int, me: dict[str, Any]):
        self.store, self.conn, self.key, self.me = store, conn, key, me
        self.lock = threading.RLock()            # one user of the owner connection at a time
        self.lost: str | None = None
        self._stop = threading.Event()

    def check(self) -> None:
        if self.lost:
            raise LeaseLost(self.lost)

    def confirm(self, cur) -> None:
        """Raise LeaseLost unless this session holds the lock now (run in the caller's transaction)."""
        if _held_by(cur.connection, self.key) != self.conn.info.backend_pid:
            self.lose("another run holds the collection now")

    def lose(self, why: str, then: str = "run one ingest at a time per collection, then rerun") -> None:
        self.lost = (f"collection {self.store.collection!r} on {self.store.uri} is no longer held by this run ({why}); "
                     f"nothing more was deleted or recorded; {then}")
        raise LeaseLost(self.lost)

    def reconnect(self) -> None:
        """Take the collection back on a new owner connection (NOTE: reconnect): Disconnected while the server is
        away, LeaseLost if another run holds it or owned it meanwhile."""
        with self.lock:
            self.check()
            if not (self.conn.closed or self.conn.broken):
                return                            # another thread took it back already
            with suppress(Exception):
                self.conn.close()
            conn = connect(self.store.address, self.store.uri, self.store.timeout_s)
            try:
                if not conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0]:
                    backend = _held_by(conn, self.key)
                    self.lose("another run holds the collection: " + (
                        _describe(conn, self.store, backend) if backend is not None else "another session"))
                meta = self.store.table(META).as_string(conn)
                row = conn.execute(f"SELECT value FROM {meta} WHERE key = %s", (LEASE_KEY,)).fetchone()
                mine = json.loads(row[0]) if row else {}
                if any(mine.get(k) != self.me[k] for k in ("host", "pid", "since")):
                    self.lose("another run owned the collection while this run's connection was away")
                self.me = {**self.me, "backend": conn.info.backend_pid}
                conn.execute(f"UPDATE {meta} SET value = %s WHERE key = %s", (json.dumps(self.me), LEASE_KEY))
            except BaseException as exc:
                conn.close()
                raise fail(self.store.uri, "take the collection back", exc, conn) from None
            self.conn = conn

    def _ping(self) -> None:
        try:
            self.conn.execute("SELECT 1")
        except Exception as exc:
            raise _ended(self.store.uri, "check the hold on the collection", exc, self.conn) from None

    def heartbeat(self) -> None:
        """Every HEARTBEAT_S: is the owner connection still there? If not, take the collection back (NOTE:
        reconnect); the lease is lost if that fails."""
        while not self._stop.wait(HEARTBEAT_S) and not self.lost:
            with self.lock:
                if self._stop.is_set():
                    return
                try:
                    retry(self._ping, self.store.timeout_s, self.reconnect)
                except LeaseLost:
                    pass
                except Exception as exc:
                    cause = exc.cause if isinstance(exc, Disconnected) else "its connection to the server failed"
                    with suppress(LeaseLost):
                        self.lose(f"{cause}: {one_line(exc)}", "check the server, then rerun: the rerun resumes")

    def release(self) -> None:
        """Let the collection go: delete the lease row, unlock, close the owner connection."""
        self._stop.set()
        with self.lock:
            try:
                if not self.lost and not self.conn.closed:
                    self.conn.execute(f"DELETE FROM {self.store.table(META).as_string(self.conn)} WHERE key = %s",
                                      (LEASE_KEY,))
                    self.conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            except Exception:
                pass                              # closing the session lets the lock go anyway
            finally:
                self.conn.close()


class PgManifest:
    """The manifest of a PostgreSQL collection (as `SqliteManifest`); every write is one fenced transaction."""

    def __init__(self, store: PostgresStore, lease: PgLease):
        self.store, self.lease = store, lease
        self.files = store.table(FILES).as_string(lease.conn)
        self.meta = store.table(META).as_string(lease.conn)

    def close(self) -> None:
        """Nothing to close: the owner connection is the lease's."""

    def run(self, what: str, body: Callable[[Any], T]) -> T:
        """body(cursor) in one fenced transaction of the owner connection, run again on a new one if the old one
        ended (NOTE: reconnect)."""
        def once() -> T:
            with self.transaction(what) as cur:
                return body(cur)
        return retry(once, self.store.timeout_s, self.lease.reconnect)

    def _reading(self, what: str, body: Callable[[Any], T]) -> T:
        def once() -> T:
            with self._read(what) as cur:
                return body(cur)
        return retry(once, self.store.timeout_s, self.lease.reconnect)

    @contextmanager
    def transaction(self, what: str) -> Iterator[Any]:
        """A cursor of the owner connection in one transaction that begins with the fence (NOTE)."""
        with self.lease.lock:
            self.lease.check()
            conn = self.lease.conn
            try:
                with conn.transaction(), conn.cursor() as cur:
                    self.lease.confirm(cur)
                    yield cur
            except BaseException as exc:
                raise self._failure(what, exc) from None

    @contextmanager
    def _read(self, what: str) -> Iterator[Any]:
        with self.lease.lock:
            self.lease.check()
            try:
                with self.lease.conn.cursor() as cur:
                    yield cur
            except BaseException as exc:
                raise self._failure(what, exc) from None

    def _failure(self, what: str, exc: BaseException) -> BaseException:
        return exc if isinstance(exc, LeaseLost) else _ended(self.store.uri, what, exc, self.lease.conn)

    def fence(self) -> None:
        self.run("check the hold on the collection", lambda cur: None)

    def get_meta(self, key: str) -> str | None:
        row = self._reading("read the manifest", lambda cur: cur.execute(
            f"SELECT value FROM {self.meta} WHERE key = %s", (key,)).fetchone())
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.run("record a setting", lambda cur: self._set(cur, key, value))

    def _set(self, cur, key: str, value: str) -> None:
        cur.execute(f"INSERT INTO {self.meta} (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
                    "SET value = EXCLUDED.value", (key, value))

    def all(self) -> dict[str, Entry]:
        rows = self._reading("read the manifest", lambda cur: cur.execute(
            f"SELECT {', '.join(_FIELDS)} FROM {self.files}").fetchall())
        return {r[0]: Entry(*r) for r in rows}

    def record(self, entries: Iterable[Entry]) -> None:
        entries = list(entries)
        self.run("record written files", lambda cur: self.write(cur, entries, ()))

    def remove(self, sources: Iterable[str]) -> None:
        sources = list(sources)
        self.run("remove manifest entries", lambda cur: self.write(cur, (), sources))

    def clear(self) -> None:
        """Delete every entry and meta value; the lease stays."""
        def body(cur) -> None:
            cur.execute(f"DELETE FROM {self.files}")
            cur.execute(f"DELETE FROM {self.meta} WHERE key <> %s", (LEASE_KEY,))
        self.run("clear the manifest", body)

    def write(self, cur, entries: Iterable[Entry], removed: Iterable[str]) -> None:
        """Upsert `entries` and delete the entries of `removed` in the caller's transaction (one statement each)."""
        latest = {e.source: e for e in entries}
        if latest:
            columns = list(zip(*latest.values()))
            cur.execute(f"INSERT INTO {self.files} ({', '.join(_FIELDS)}, updated) SELECT *, %s FROM unnest("
                        "%s::text[], %s::bigint[], %s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::text[], "
                        "%s::text[]) ON CONFLICT (source) DO UPDATE SET "
                        + ", ".join(f"{f} = EXCLUDED.{f}" for f in (*_FIELDS[1:], "updated")),
                        (time.time(), *map(list, columns)))
        if removed := list(removed):
            cur.execute(f"DELETE FROM {self.files} WHERE source = ANY(%s::text[])", (removed,))


def _ended(uri: str, what: str, exc: BaseException, conn) -> BaseException:
    """`exc` as `fail` classes it, and Disconnected whenever it left the connection broken or closed."""
    error = fail(uri, what, exc, conn)
    if (conn.broken or conn.closed) and isinstance(error, StoreError) and not isinstance(error, Disconnected):
        return Disconnected(f"{error}", "connection ended")
    return error
