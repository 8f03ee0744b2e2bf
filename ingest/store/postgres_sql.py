"""PostgreSQL's connection and errors, shared by the store (`ingest.store.postgres`) and its manifest
(`ingest.store.postgres_manifest`): a bounded connection with pgvector's types, a psycopg error classed as the
rows' (StoreRejected) or the run's (StoreError), and the COMMENT key that marks ingest's tables."""
from __future__ import annotations

from ingest.store.errors import Disconnected, StoreError, StoreRejected, one_line

MARK = "ingest"                 # the COMMENT's key saying which of ingest's tables it is
VALUE_ERRORS = (ValueError, TypeError, OverflowError, UnicodeError)


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
            raise Disconnected(f"store {uri}: connection ended: {one_line(exc)}; check the server, then rerun: "
                               "the rerun resumes", "connection ended") from None
        raise StoreError(f"cannot use {uri}: {one_line(exc)}; check the server, then rerun") from None
    return conn


def fail(uri: str, what: str, exc: BaseException) -> BaseException:
    """`exc` (raised trying to `what`) as the store raises it: StoreRejected for a value the table cannot hold,
    StoreError for any other psycopg error; a StoreError, a bug or a KeyboardInterrupt unchanged."""
    import psycopg
    from psycopg import errors

    if isinstance(exc, StoreError) or not isinstance(exc, (psycopg.Error, *VALUE_ERRORS)):
        return exc
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
