"""PostgreSQL + pgvector: one table per collection, reached with psycopg 3 (a connection per process).

The table is named as the collection (a quoted identifier): `id text primary key`, `vector vector(dim)`, the
fields of the Milvus schema (`ingest.store.schema`), a btree on `source`, and a generated `tsv` (to_tsvector(
'simple', search_text): no stemming nor stop words, every language alike) with a GIN index. Its COMMENT is ingest's mark: JSON with the model, dim, backend and schema
version; a table without it is someone else's, refused and never dropped or changed. The manifest and the
ownership live in the same database (`ingest.store.postgres_manifest`).

Search: dense by cosine distance (an HNSW index, vector_cosine_ops); `bm25` is PostgreSQL full-text search,
ts_rank_cd of the rows matching ANY of the query's words (an AND of a long question matches nothing). That
ranking is NOT BM25 (no inverse document frequency, no saturation of a word's count): only its name is
shared with Milvus' mode. `hybrid` fuses both lists, each max(4k, 20) long, by reciprocal rank (RRF_K) in SQL.

NOTE (loads): rows arrive by binary COPY straight into the table; a batch whose ids are already there
(a resumed run, a retried batch) is COPYed into a temp table instead and upserted from it (INSERT ... ON
CONFLICT (id) DO UPDATE), so an upsert stays idempotent. The HNSW index is built after a first load, not
before it (inserting into an HNSW index costs about 1 ms a row): `finish()`, at the end of a run that was
not stopped, builds it when it is missing (until then a dense search is an exact scan). Every call has
statement_timeout = timeout_s (the index build INDEX_TIMEOUT_S); connecting has connect_timeout and a dead
peer is noticed by TCP keepalives and tcp_user_timeout. Errors: a value the table cannot hold (a NUL byte, a
dimension, an overflow) is StoreRejected, anything else StoreError; messages go through `one_line`, which
redacts URIs, and never show the conninfo.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from contextlib import contextmanager, nullcontext, suppress
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ingest.store.base import (MODES, ROWS_SOURCES, RRF_K, Capabilities, StoreBase, StoreError, StoreRejected, hit,
                               one_line)
from ingest.store.errors import retried
from ingest.store.postgres_sql import MARK, VALUE_ERRORS, bound, connect, fail
from ingest.store.schema import Columns

CAPS = Capabilities("PostgreSQL + pgvector", embedded=False, writers=None, modes=MODES, transactional=True)
NAME_MAX = 63                   # PostgreSQL truncates longer identifiers (NAMEDATALEN - 1 bytes)
INDEX_TIMEOUT_S = 3 * 3600      # the HNSW build of a large first load
COLUMNS = ("id", "vector", "text", "source", "page", "chunk", "format", "file_hash", "title", "headings", "element",
           "bbox", "search_text")
TYPES = ["text", "vector", "text", "text", "int8", "int8"] + ["text"] * 7
_TABLE = ("CREATE TABLE {t} (id text PRIMARY KEY, vector vector({dim}) NOT NULL, text text NOT NULL, source text "
          "NOT NULL, page bigint NOT NULL, chunk bigint NOT NULL, format text NOT NULL, file_hash text NOT NULL, title "
          "text NOT NULL, headings text NOT NULL, element text NOT NULL, bbox text NOT NULL, search_text text NOT NULL, "
          "tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, search_text)) STORED); "
          "CREATE INDEX ON {t} (source); CREATE INDEX ON {t} USING gin (tsv); COMMENT ON TABLE {t} IS {mark}")
HIT_FIELDS = ("text", "source", "page", "chunk", "format", "title", "headings", "element", "bbox")


class PostgresStore(StoreBase):
    """One collection: a table of a PostgreSQL database with pgvector (module docstring)."""
    caps = CAPS

    def __init__(self, uri: str, collection: str, timeout_s: float = 60.0, address: str | None = None):
        super().__init__(uri, collection, timeout_s, address)
        self._conn = None
        self._pid: int | None = None
        self._lock = threading.RLock()         # one transaction at a time on the connection

    # -- connection -----------------------------------------------------------------
    @property
    def conn(self):
        """This process's connection (made on first use, never carried across a fork)."""
        if self._conn is None or self._pid != os.getpid() or self._conn.closed:
            if len((self.collection + "__files").encode()) > NAME_MAX or "\x00" in self.collection:
                raise StoreError(f"collection name {self.collection!r} is too long for PostgreSQL (at most "
                                 f"{NAME_MAX - 7} bytes); choose a shorter --collection")
            self._conn = connect(self.address, self.uri, self.timeout_s)
            self._pid = os.getpid()
        return self._conn

    @contextmanager
    def _sql(self, what: str, transaction: bool = False) -> Iterator[Any]:
        """A cursor of this process's connection (in one transaction if asked); errors as `fail` classes them."""
        with self._lock:
            conn = self.conn
            try:
                with conn.transaction() if transaction else nullcontext(), conn.cursor() as cur:
                    yield cur
            except BaseException as exc:
                raise fail(self.uri, what, exc, conn) from None

    def table(self, suffix: str = ""):
        """The quoted identifier of table `<collection><suffix>`."""
        from psycopg import sql
        return sql.Identifier(self.collection + suffix)

    def reconnect(self) -> None:
        """Drop this process's connection: the next call makes a new one (ingest.store.errors NOTE: reconnect)."""
        self.close()

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            with suppress(Exception):
                self._conn.close()
        self._conn = None

    # -- ownership and the manifest (ingest.store.postgres_manifest) -------------------
    def own(self):
        from ingest.store.postgres_manifest import own
        return own(self)

    def holder(self) -> str | None:
        from ingest.store.postgres_manifest import holder
        return holder(self)

    def has_manifest(self) -> bool:
        from ingest.store.postgres_manifest import FILES
        return bool(self.comment(FILES))

    def summary(self):
        from ingest.store.postgres_manifest import read_summary
        return read_summary(self)

    def commit(self, manifest, keep: Mapping[str, str], entries: Sequence[Any], removed: Sequence[str]) -> None:
        """Fence, delete the stale rows, record `entries` and remove `removed` in one transaction on the
        connection that holds the collection (`PgManifest.run`): all of it, or nothing; all of it again if that
        connection ended (postgres_manifest NOTE: reconnect)."""
        from ingest.store.postgres_manifest import PgManifest

        if not isinstance(manifest, PgManifest):
            return super().commit(manifest, keep, entries, removed)
        def body(cur) -> None:
            if keep:
                self._delete_stale(cur, keep)
            manifest.write(cur, entries, removed)
        if keep or entries or removed:
            manifest.run("record written files", body)        # again on a new connection if it ended

    # -- collection -----------------------------------------------------------------
    def comment(self, suffix: str = "") -> dict[str, Any] | None:
        """The JSON mark of table `<collection><suffix>`: None if there is no such table, {} if it is not ingest's."""
        with self._sql("look up the collection") as cur:
            found = cur.execute("SELECT obj_description(c.oid, 'pg_class') FROM pg_class c WHERE c.oid = to_regclass(%s)",
                                (self.table(suffix).as_string(cur),)).fetchone()
        if found is None:
            return None
        with suppress(ValueError):
            mark = json.loads(found[0] or "{}")
            return mark if isinstance(mark, dict) and MARK in mark else {}
        return {}

    def exists(self) -> bool:
        return self.comment() is not None

    def recorded(self) -> tuple[str, int, str] | None:
        mark = self.comment()
        if not mark or mark.get(MARK) != "collection":
            return None
        return mark["model"], int(mark["dim"]), mark["backend"]

    def schema(self) -> tuple[int, bool]:
        return int((self.comment() or {}).get("schema", self.SCHEMA_VERSION)), True

    def foreign(self, also: str = "") -> StoreError:
        return StoreError(f"table {self.collection!r} in {self.uri} was not made by ingest{also}; nothing was "
                          "changed; choose another --collection")

    @retried
    def ensure_collection(self, model: str, dim: int, backend: str) -> None:
        """Create the table on first use; refuse another tool's table, or one of another model, dim, backend or
        shape."""
        recorded = self.recorded()
        if recorded is not None or self.exists():
            self.refuse_other(recorded, model, dim, backend)
            self._check_shape()
            return
        self._ensure_extension()
        mark = json.dumps({MARK: "collection", "model": model, "dim": dim, "backend": backend,
                           "schema": self.SCHEMA_VERSION})
        from psycopg import sql
        with self._sql("create the collection", transaction=True) as cur:
            cur.execute(sql.SQL(_TABLE).format(t=self.table(), dim=sql.Literal(int(dim)), mark=sql.Literal(mark)))

    def _ensure_extension(self) -> None:
        import psycopg

        conn = self.conn
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except psycopg.Error as exc:
                raise StoreError(f"the pgvector extension is missing in database {conn.info.dbname!r} of {self.uri} "
                                 f"and this user cannot create it ({one_line(exc)}); run `CREATE EXTENSION vector;` "
                                 "in that database as a superuser (pgvector must be installed on the server), then "
                                 "rerun") from None
            self.close()                    # reconnect: pgvector's types are registered on connecting

    def _check_shape(self) -> None:
        """Refuse a table marked as ingest's whose columns are not the ones ingest makes."""
        with self._sql("look up the collection") as cur:
            names = {r[0] for r in cur.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
                (self.table().as_string(cur),))}
        if names != {*COLUMNS, "tsv"}:
            raise StoreError(f"table {self.collection!r} in {self.uri} does not have the columns ingest makes; nothing "
                             "was changed; rerun with --reembed to rebuild it, or use another --collection")

    def has_index(self) -> bool:
        """Whether the table has its HNSW index."""
        with self._sql("look up the vector index") as cur:
            return cur.execute("SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a "
                               "ON a.oid = c.relam WHERE i.indrelid = to_regclass(%s) AND a.amname = 'hnsw'",
                               (self.table().as_string(cur),)).fetchone() is not None

    @retried
    def finish(self) -> None:
        """At the end of a run that was not stopped: build the HNSW index (cosine) if the table has rows and no index yet
        (a first load, or the rest of one a stopped run left unindexed). Searches before it are exact scans."""
        from psycopg import sql

        if not self.exists() or self.has_index():
            return
        with self._sql("build the vector index", transaction=True) as cur, bound(cur.connection, INDEX_TIMEOUT_S):
            if cur.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(self.table())).fetchone() is None:
                return
            cur.execute("SELECT set_config('statement_timeout', %s, true), "
                        "set_config('maintenance_work_mem', '512MB', true)", (str(INDEX_TIMEOUT_S * 1000),))
            cur.execute(sql.SQL("CREATE INDEX ON {} USING hnsw (vector vector_cosine_ops)").format(self.table()))

    def drop(self) -> None:
        """Drop the table, never one ingest did not make (StoreError)."""
        from psycopg import sql

        if self.exists() and self.recorded() is None:
            raise self.foreign("; it was not dropped")
        if self.exists():
            with self._sql("drop the collection") as cur:
                cur.execute(sql.SQL("DROP TABLE {}").format(self.table()))

    # -- rows -----------------------------------------------------------------------
    @retried
    def upsert_columns(self, columns: Columns) -> None:
        """Binary COPY of the rows; if some of their ids are there already, through a temp table and ON CONFLICT."""
        from psycopg import errors, sql

        if not (n := len(columns.ids)):
            return
        what = f"store {n} rows"
        rows = _rows(columns, what)
        cols = sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
        copy = "COPY {} ({}) FROM STDIN (FORMAT BINARY)"
        conn = None
        try:
            with self._lock:
                conn = self.conn
                with conn.transaction(), conn.cursor() as cur:
                    _copy(cur, sql.SQL(copy).format(self.table(), cols), rows)
            return
        except errors.UniqueViolation:
            pass                                    # some rows are there: upsert them all
        except BaseException as exc:
            raise fail(self.uri, what, exc, conn) from None
        temp = sql.Identifier("ingest_upsert_" + hashlib.blake2b(self.collection.encode(), digest_size=6).hexdigest())
        update = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in COLUMNS[1:])
        with self._sql(what, transaction=True) as cur:
            cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {}) ON COMMIT DELETE ROWS").format(
                temp, self.table()))
            _copy(cur, sql.SQL(copy).format(temp, cols), rows)
            cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT DISTINCT ON (id) {} FROM {} ON CONFLICT (id) DO UPDATE "
                                "SET {}").format(self.table(), cols, cols, temp, update))

    @retried
    def delete_stale(self, keep: Mapping[str, str]) -> None:
        if keep:
            with self._sql(f"delete old rows of {len(keep)} files", transaction=True) as cur:
                self._delete_stale(cur, keep)

    def _delete_stale(self, cur, keep: Mapping[str, str]) -> None:
        """One DELETE for every source of `keep` (the btree on source finds their rows)."""
        from psycopg import sql

        sources = sorted(keep)
        cur.execute(sql.SQL("DELETE FROM {} t USING unnest(%s::text[], %s::text[]) AS k(source, keep) "
                            "WHERE t.source = k.source AND (k.keep = '' OR t.file_hash <> k.keep)").format(self.table()),
                    (sources, [keep[s] for s in sources]))

    def flush(self) -> None:
        """Nothing to do: every write is committed when it returns."""

    @retried
    def rows(self, fields: Sequence[str], sources: Sequence[str] | None = None) -> list[dict[str, Any]]:
        from psycopg import sql

        if unknown := set(fields) - set(COLUMNS):
            raise ValueError(f"no such fields: {sorted(unknown)}")
        todo = [None] if sources is None else sorted(set(sources))
        out: list[dict[str, Any]] = []
        with self._sql("read rows") as cur:
            for i in range(0, len(todo), ROWS_SOURCES):
                cur.execute(sql.SQL("SELECT {} FROM {}" + ("" if sources is None else " WHERE source = ANY(%s)")).format(
                    sql.SQL(", ").join(map(sql.Identifier, fields)), self.table()),
                    () if sources is None else (todo[i:i + ROWS_SOURCES],))
                out.extend({f: v.to_list() if f == "vector" else v for f, v in zip(fields, r)} for r in cur)
        return out

    @retried
    def sources_like(self, source: str, limit: int) -> list[str]:
        from psycopg import sql

        pattern = "%/" + source.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        with self._sql("look up a source") as cur:
            cur.execute(sql.SQL("SELECT DISTINCT source FROM {} WHERE source = %s OR source LIKE %s ESCAPE '\\' "
                                "LIMIT %s").format(self.table()), (source, pattern, limit))
            return sorted(r[0] for r in cur)

    @retried
    def search(self, vector: Sequence[float] | None, k: int, mode: str = "dense", query: str = "") -> list[dict[str, Any]]:
        """The k best chunks (module docstring: `bm25` here is full-text search ranked by ts_rank_cd, not BM25)."""
        vec = None if vector is None else np.asarray(vector, dtype=np.float32)
        wide = max(4 * k, 20)
        with self._sql("search", transaction=True) as cur:
            cur.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(min(1000, max(40, wide))),))
            cur.execute(_statement(self.table(), mode), {"v": vec, "q": query, "k": k, "wide": wide, "rrf": RRF_K})
            return [hit(dict(zip(HIT_FIELDS, r[:-1])), r[-1]) for r in cur]


def _rows(c: Columns, what: str) -> list[tuple]:
    """The rows as COPY sends them; StoreRejected for a value PostgreSQL text cannot hold (a NUL byte)."""
    vectors = np.ascontiguousarray(c.vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(c.ids):
        raise StoreRejected(f"the store refused to {what}: vectors of shape {vectors.shape} for {len(c.ids)} rows")
    for name in ("ids", "texts", "sources", "formats", "file_hashes", "titles", "headings", "elements", "bboxes",
                 "search_texts"):
        if any("\x00" in v for v in getattr(c, name)):
            raise StoreRejected(f"the store refused to {what}: a value of {name} holds a NUL byte, which PostgreSQL "
                                "text cannot hold")
    return list(zip(c.ids, vectors, c.texts, c.sources, c.pages, c.chunks, c.formats, c.file_hashes, c.titles,
                    c.headings, c.elements, c.bboxes, c.search_texts))


def _copy(cur, statement, rows: list[tuple]) -> None:
    with cur.copy(statement) as copy:
        copy.set_types(TYPES)
        for row in rows:
            copy.write_row(row)


_DENSE = "SELECT {f}, 1 - (vector <=> %(v)s) FROM {t} ORDER BY vector <=> %(v)s, id LIMIT %(k)s"
# The query's words as an OR tsquery: its lexemes (to_tsvector, as the rows'), each quoted for tsquery input.
_WORDS = ("WITH q AS (SELECT string_agg('''' || replace(replace(w, '\\', '\\\\'), '''', '''''') || '''', ' | ')"
          "::tsquery AS q FROM unnest(tsvector_to_array(to_tsvector('simple'::regconfig, %(q)s))) AS w) ")
_BM25 = _WORDS + ("SELECT {f}, ts_rank_cd(tsv, q.q, 1) AS score FROM {t}, q WHERE tsv @@ q.q "
                  "ORDER BY score DESC, id LIMIT %(k)s")
_HYBRID = _WORDS + (
    ", dense AS (SELECT id, row_number() OVER (ORDER BY d, id) AS r FROM (SELECT id, vector <=> %(v)s AS d FROM {t} "
    "ORDER BY vector <=> %(v)s LIMIT %(wide)s) x), "
    "words AS (SELECT id, row_number() OVER (ORDER BY s DESC, id) AS r FROM (SELECT id, ts_rank_cd(tsv, q.q, 1) AS s "
    "FROM {t}, q WHERE tsv @@ q.q ORDER BY s DESC, id LIMIT %(wide)s) y), "
    "fused AS (SELECT id, sum(1.0 / (%(rrf)s + r)) AS score FROM (SELECT * FROM dense UNION ALL SELECT * FROM words) u "
    "GROUP BY id ORDER BY score DESC, id LIMIT %(k)s) "
    "SELECT {f}, fused.score FROM fused JOIN {t} USING (id) ORDER BY fused.score DESC, id")


def _statement(table, mode: str):
    """The SQL of a search in `mode` on `table` (parameters v, q, k, wide, rrf); each row: HIT_FIELDS, score."""
    from psycopg import sql

    fields = sql.SQL(", ").join(sql.SQL("{}.{}").format(table, sql.Identifier(f)) for f in HIT_FIELDS)
    return sql.SQL({"dense": _DENSE, "bm25": _BM25, "hybrid": _HYBRID}[mode]).format(f=fields, t=table)
