"""PostgreSQL's connection and errors, shared by the store (`ingest.store.postgres`) and its manifest
(`ingest.store.postgres_manifest`): a bounded connection with pgvector's types, a psycopg error classed as the
rows' (StoreRejected) or the run's (StoreError), and the COMMENT key that marks ingest's tables."""
from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from contextlib import contextmanager, suppress
from typing import Iterator

from ingest.store.errors import Disconnected, StoreError, StoreRejected, one_line

MARK = "ingest"                 # the COMMENT's key saying which of ingest's tables it is
VALUE_ERRORS = (ValueError, TypeError, OverflowError, UnicodeError)
ANSWER_GRACE_S = 5.0            # past statement_timeout, before a busy connection is cut (NOTE: client-side bound)

# NOTE (client-side bound): statement_timeout is the server's bound on a statement; a server that stops
# answering altogether (SIGSTOPped, a hung host behind a peer whose kernel still ACKs) never sends it, and libpq
# would wait forever (TCP keepalives and tcp_user_timeout see a live peer). So every connection `connect` makes
# is watched: a daemon thread (started on the first connection, never at import) looks every WATCH_EVERY_S at
# each one's libpq state, and a connection busy with one statement for longer than its bound (timeout_s +
# ANSWER_GRACE_S; `bound` lifts it for the HNSW build) has its socket shut down. The call waiting on it fails at
# once; `fail(..., conn)` then says "did not answer within N s" (Disconnected: the reconnect protocol of
# ingest.store.errors takes over).
WATCH_EVERY_S = 1.0
_watched: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # conn -> [bound_s, busy since, cut]
_watch_lock = threading.Lock()
_watcher: threading.Thread | None = None


def _watch() -> None:
    from psycopg.pq import TransactionStatus

    while True:
        time.sleep(WATCH_EVERY_S)
        now = time.monotonic()
        with _watch_lock:
            items = list(_watched.items())
        for conn, state in items:
            with suppress(Exception):
                busy = not conn.closed and conn.pgconn.transaction_status == TransactionStatus.ACTIVE
                if not busy:
                    state[1] = None
                elif state[1] is None:
                    state[1] = now
                elif now - state[1] > state[0] and not state[2]:
                    state[2] = True
                    cut = socket.socket(fileno=os.dup(conn.pgconn.socket))
                    with suppress(OSError):
                        cut.shutdown(socket.SHUT_RDWR)
                    cut.close()


def _watch_conn(conn, bound_s: float) -> None:
    global _watcher
    with _watch_lock:
        _watched[conn] = [bound_s, None, False]
        if _watcher is None or not _watcher.is_alive():
            _watcher = threading.Thread(target=_watch, name="ingest-pg-watch", daemon=True)
            _watcher.start()


def was_cut(conn) -> bool:
    """Whether the watcher cut `conn` for not answering (NOTE: client-side bound)."""
    state = _watched.get(conn) if conn is not None else None
    return bool(state and state[2])


@contextmanager
def bound(conn, seconds: float) -> Iterator[None]:
    """`conn`'s statements may run `seconds` (+ ANSWER_GRACE_S) meanwhile (the HNSW build)."""
    state = _watched.get(conn)
    old = state[0] if state else None
    if state:
        state[0] = seconds + ANSWER_GRACE_S
    try:
        yield
    finally:
        if state:
            state[0] = old


def connect(address: str, uri: str, timeout_s: float):
    """A psycopg connection (autocommit) to `address`, every statement bounded by `timeout_s`, pgvector's types
    registered when the extension is there. StoreError, one line, if it cannot."""
    import psycopg

    try:
        conn = psycopg.connect(address, autocommit=True, connect_timeout=max(2, round(timeout_s)),
                               fallback_application_name="ingest", keepalives=1, keepalives_idle=30,
                               keepalives_interval=10, keepalives_count=3, tcp_user_timeout=round(timeout_s * 1000))
    except psycopg.Error as exc:
        if _away(exc):             # refused, shutting down, starting up: a restart may end (NOTE: reconnect)
            raise Disconnected(f"store {uri}: server unreachable: {one_line(exc)}; check the server, then rerun: "
                               "the rerun resumes", "server unreachable") from None
        raise StoreError(f"cannot connect to {uri}: {one_line(exc)}; check the server, the database, the user and "
                         "its password (PGPASSWORD and the other PG* variables apply), then rerun") from None
    _watch_conn(conn, timeout_s + ANSWER_GRACE_S)
    try:
        ms = str(round(timeout_s * 1000))
        conn.execute("SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
                     (ms, ms))
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
            from pgvector.psycopg import register_vector
            register_vector(conn)
    except psycopg.Error as exc:
        conn.close()
        if _away(exc) or conn.broken:
            raise fail(uri, "start a session", exc, conn) from None
        raise StoreError(f"cannot use {uri}: {one_line(exc)}; check the server, then rerun") from None
    return conn


def fail(uri: str, what: str, exc: BaseException, conn=None) -> BaseException:
    """`exc` (raised trying to `what`) as the store raises it: StoreRejected for a value the table cannot hold,
    Disconnected if the server went away (`conn` cut by the watcher: it did not answer in time), StoreError for
    any other psycopg error; a StoreError, a bug or a KeyboardInterrupt unchanged."""
    import psycopg
    from psycopg import errors

    if isinstance(exc, StoreError) or not isinstance(exc, (psycopg.Error, *VALUE_ERRORS)):
        return exc
    if was_cut(conn):
        seconds = _watched[conn][0]
        return Disconnected(f"store {uri} did not answer within {seconds:g} s (trying to {what}); check the server, "
                            "then rerun: the rerun resumes", f"did not answer within {seconds:g} s")
    if isinstance(exc, (errors.QueryCanceled, errors.LockNotAvailable)):
        return StoreError(f"store {uri} did not answer in time (trying to {what}): {one_line(exc)}; check the "
                          "server, then rerun: the rerun resumes")
    if isinstance(exc, (psycopg.DataError, psycopg.IntegrityError, errors.CardinalityViolation, *VALUE_ERRORS)):
        return StoreRejected(f"the store refused to {what}: {one_line(exc)}")
    if isinstance(exc, psycopg.InterfaceError) or isinstance(exc, psycopg.OperationalError) and _away(exc):
        return Disconnected(f"store {uri}: connection ended (trying to {what}): {one_line(exc)}; check the server, "
                            "then rerun: the rerun resumes", "connection ended")
    if isinstance(exc, psycopg.OperationalError):
        return StoreError(f"store {uri} did not answer (trying to {what}): {one_line(exc)}; check the server, then "
                          "rerun: the rerun resumes")
    return StoreError(f"store {uri} failed to {what}: {one_line(exc)}")


def _away(exc: BaseException) -> bool:
    """Whether a psycopg error says the server went away (the connection ended or could not be made: no
    SQLSTATE, or class 08 connection exception, 57P admin/crash shutdown, cannot connect now), not that it
    refused (a password, a missing database)."""
    state = getattr(exc, "sqlstate", None) or ""
    return not state or state.startswith(("08", "57P"))
