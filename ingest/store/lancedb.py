"""LanceDB: one table of a LanceDB folder (the Lance columnar format, versioned; a Rust core).

    lancedb:///absolute/dir            the folder (made on first use)
    lancedb://relative/dir             the same, relative to the working directory

The table `<collection>` holds the Milvus schema's fields; its Arrow schema's metadata {"ingest": {role, model,
dim, backend, schema}} marks it as ingest's (a table without it is never written, dropped or re-embedded).
Searches: dense by cosine (an exact scan below INDEX_ROWS rows; above, an IVF-Flat index built by `finish` at the
end of a run that was not stopped, when the table has none, as PostgreSQL's HNSW is), bm25 over Lance's
full-text index of `search_text`, and hybrid (both lists fused by reciprocal rank, k = RRF_K).

NOTE (last good copy): the run's writer processes append their rows to a second table, `<collection>__staged`,
which no search reads (Lance resolves concurrent appends: several writers at once). `commit` then publishes the
files' staged rows and removes the versions they replace in ONE Lance commit: a `merge_insert` on `id` (rows
already there are updated, so it is idempotent) with a delete of the main table's rows that the source does
not match, restricted to the replaced versions. A Lance commit is atomic (a new manifest, renamed into place):
a SIGKILL at any point leaves the old version or the new, never both and never neither. Staged rows of a
failed file are simply never published. The manifest (SQLite beside the folder, as for Milvus Lite) records
the files after that commit; a crash in between leaves the old entry, and the rerun redoes the file (the
merge updates the same ids). What a killed run left staged is never published by another file's commit (a
commit reads only its files' versions, one row per id) and is dropped by the next `finish` that wrote.
`flush` (not used by the run: `Capabilities.staged`) publishes every staged row.
A merge reads every id of the table, so files new to the manifest are appended in a Lance commit of their own
while the table holds exactly the rows the manifest records (checked at this object's first commit): a commit
killed before its record leaves rows the manifest lacks, and the next run merges everything (idempotent).

NOTE (ownership): a run flocks `<folder>.lock` (one run at a time, the second refused in one line); searches
need no lock (`Capabilities.shared_reads`): a reader sees the last committed version. Every connection reads
with `read_consistency_interval=0`, so it sees other processes' commits at once.
"""
from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ingest.store.base import (MODES, ROWS_SOURCES, RRF_K, Capabilities, StoreBase, StoreError, StoreRejected, flock, hit,
                               one_line)
from ingest.store.errors import disk_full, is_disk_full
from ingest.store.lance_folder import committed, foreign_folder, remove_unmade
from ingest.store.manifest import Entry, Manifest, SqliteManifest, Summary, manifest_path, read_summary
from ingest.store.schema import Columns
from ingest.store.uri import local_path

META = b"ingest"                  # the schema metadata key that marks ingest's tables
STAGED = "__staged"               # the suffix of the staging table's name
INDEX_ROWS = 50_000               # rows past which `finish` builds IVF-Flat (bench/lance_index.py); exact below
STRINGS = ("id", "text", "source", "format", "file_hash", "title", "headings", "element", "bbox", "search_text")
HIT_FIELDS = ["text", "source", "page", "chunk", "format", "title", "headings", "element", "bbox"]
KEEP_VERSIONS = timedelta(hours=1)    # `finish` removes older versions' files (a search may still read one)
CAPS = Capabilities("LanceDB", embedded=True, writers=None, modes=MODES, transactional=False, staged=True, shared_reads=True)


def quote(value: str) -> str:
    """A SQL string literal (Lance's filters: DataFusion)."""
    return "'" + value.replace("'", "''") + "'"


def sources_in(sources: Sequence[str]) -> str:
    return f"source IN ({', '.join(map(quote, sources))})"


def arrow_schema(dim: int, metadata: dict[bytes, bytes] | None = None) -> Any:
    import pyarrow as pa

    fields = [pa.field("id", pa.string()), pa.field("vector", pa.list_(pa.float32(), dim)),
              pa.field("page", pa.int64()), pa.field("chunk", pa.int64())]
    fields += [pa.field(name, pa.string()) for name in STRINGS[1:]]
    return pa.schema(fields, metadata=metadata)


def dedupe(table: Any) -> Any:
    """The Arrow table with one row per id (a batch a dead writer had written, then its resubmit)."""
    ids = table.column("id").to_pylist()
    first = list({i: n for n, i in reversed(list(enumerate(ids)))}.values())
    return table if len(first) == len(ids) else table.take(sorted(first))


class LanceStore(StoreBase):
    """NOTE (errors): every call goes through `call`. Bad rows (a vector of another dimension, a field Arrow
    cannot convert) are StoreRejected (the file's); any other failure (the disk, permissions, a damaged table)
    is a StoreError: the run stops, and a rerun resumes."""
    caps = CAPS

    def __init__(self, uri: str, collection: str, timeout_s: float = 60.0, address: str | None = None):
        super().__init__(uri, collection, timeout_s, address)
        self._db: Any = None
        self._pid: int | None = None
        self._tables: dict[str, Any] = {}
        self._lock_file = None
        self._in_step: bool | None = None     # the table holds exactly the manifest's rows (NOTE: last good copy)

    @property
    def local_path(self) -> Path:
        return local_path(self.address)

    @property
    def staged(self) -> str:
        return self.collection + STAGED

    # -- connection -----------------------------------------------------------------
    @property
    def db(self) -> Any:
        if self._db is None or self._pid != os.getpid():        # a forked child opens its own
            import lancedb

            if refused := foreign_folder(self.local_path, self.uri):
                raise StoreError(refused)
            self._tables = {}
            self._db = self.call("open the store", lambda: lancedb.connect(
                str(self.local_path), read_consistency_interval=timedelta(0)))
            self._pid = os.getpid()
        return self._db

    def table(self, name: str | None = None) -> Any:
        name = name or self.collection
        if name not in self._tables or self._pid != os.getpid():
            db = self.db
            self._tables[name] = self.call("open the table", db.open_table, name)
        return self._tables[name]

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs); a failure becomes StoreRejected or StoreError (NOTE: errors)."""
        import pyarrow as pa

        try:
            return fn(*args, **kwargs)
        except StoreError:
            raise
        except Exception as exc:
            if is_disk_full(exc):
                raise disk_full(self.local_path) from None
            if isinstance(exc, (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError)):
                raise StoreRejected(f"the store refused to {what}: {one_line(exc)}") from None
            raise StoreError(f"store {self.uri} failed to {what}: {one_line(exc)}; check the folder "
                             f"{self.local_path}, then rerun") from None

    def lock(self) -> None:
        """Own the folder for this run (its flock `<folder>.lock`), without opening it (an unchanged rerun never
        does: the collection's Trusted)."""
        if self._lock_file is not None:
            return
        if refused := foreign_folder(self.local_path, self.uri):
            raise StoreError(refused)
        try:
            self._lock_file = flock(self.local_path, self.uri, "a LanceDB store takes one run at a time")
        except OSError as exc:
            raise StoreError(f"cannot lock store {self.uri}: {one_line(exc)}; check that its folder is "
                             "writable") from None

    def close(self) -> None:
        self._tables, self._db = {}, None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def has_manifest(self) -> bool:
        return manifest_path(self.uri, self.collection).exists()

    def summary(self) -> Summary | None:
        path = manifest_path(self.uri, self.collection)
        return read_summary(path) if path.exists() else None

    # -- collection -----------------------------------------------------------------
    def _has(self, name: str) -> bool:
        """Whether table `name` exists (its folder `<name>.lance` with a version: nothing is made to tell)."""
        return committed(self.local_path / f"{name}.lance")

    def exists(self) -> bool:
        return self._has(self.collection)

    def marks(self) -> dict[str, Any] | None:
        if not self.exists():
            return None
        raw = (self.table().schema.metadata or {}).get(META)
        try:
            marks = json.loads(raw) if raw else None
        except ValueError:
            return None
        return marks if isinstance(marks, dict) and marks.get("role") == "chunks" else None

    def recorded(self) -> tuple[str, int, str] | None:
        m = self.marks()
        return None if m is None else (str(m.get("model")), int(m.get("dim", 0)), str(m.get("backend")))

    def schema(self) -> tuple[int, bool]:
        return int((self.marks() or {}).get("schema", self.SCHEMA_VERSION)), True

    def ensure_collection(self, model: str, dim: int, backend: str) -> None:
        """Create the table (and its staging table, its full-text and id indexes) on first use; refuse a
        foreign one, or one of another model, dimension, backend or shape, in one line and untouched."""
        if not self.exists():                  # a folder a full disk left without a version: made anew (lance_folder)
            remove_unmade(self.local_path / f"{self.collection}.lance")
            marks = {"role": "chunks", "model": model, "dim": dim, "backend": backend, "schema": self.SCHEMA_VERSION}
            schema = arrow_schema(dim, {META: json.dumps(marks).encode()})
            self.call("create the collection", self.db.create_table, self.collection, schema=schema)
        self.refuse_other(self.recorded(), model, dim, backend)
        main = self.table()
        if main.schema.remove_metadata() != arrow_schema(dim):
            raise StoreError(f"collection {self.collection!r} in {self.uri} is not of the shape ingest makes "
                             f"(vector: {dim} float32, and the Milvus schema's fields); use another --collection")
        self._indexes(main)
        if not self._has(self.staged):
            remove_unmade(self.local_path / f"{self.staged}.lance")
            self.call("create the staging table", self.db.create_table, self.staged, schema=arrow_schema(dim),
                      exist_ok=True)

    def _indexes(self, main: Any) -> set[tuple[str, ...]]:
        """Make the full-text and id indexes the table lacks (a full disk stopped them); the columns it had indexed."""
        from lancedb.index import FTS, BTree

        indexed = {tuple(i.columns) for i in self.call("list the indexes", main.list_indices)}
        for column, config in (("search_text", FTS(with_position=False)), ("id", BTree())):
            if (column,) not in indexed:
                self.call("index the collection", main.create_index, column, config=config)
        return indexed

    def drop(self) -> None:
        """Drop the table and its staged rows, never a table ingest did not make (StoreError, untouched)."""
        if self.exists() and self.recorded() is None:
            raise StoreError(f"collection {self.collection!r} in {self.uri} was not made by ingest; it was not "
                             "dropped: choose another --collection")
        for name in (self.collection, self.staged):
            if self._has(name):
                self.call("drop the collection", self.db.drop_table, name)
                self._tables.pop(name, None)

    # -- rows -----------------------------------------------------------------------
    def upsert_columns(self, columns: Columns) -> None:
        """Append the rows to the staging table (one Lance commit), where `commit` or `flush` publishes them.
        A vector of another dimension, or a value Arrow cannot convert, is StoreRejected."""
        import pyarrow as pa

        n = len(columns.ids)
        if not n:
            return
        what = f"store {n} rows"
        staged = self._staging()
        dim = staged.schema.field("vector").type.list_size

        def build() -> Any:
            vectors = np.ascontiguousarray(columns.vectors, dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape != (n, dim):
                raise pa.ArrowInvalid(f"vectors of shape {vectors.shape} for {n} rows of dimension {dim}")
            c = columns
            data = {"id": c.ids, "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim),
                    "page": c.pages, "chunk": c.chunks, "text": c.texts, "source": c.sources, "format": c.formats,
                    "file_hash": c.file_hashes, "title": c.titles, "headings": c.headings, "element": c.elements,
                    "bbox": c.bboxes, "search_text": c.search_texts}
            return pa.table(data, schema=arrow_schema(dim))

        self.call(what, staged.add, self.call(what, build))

    def _staging(self) -> Any:
        if not self._has(self.staged):
            raise StoreError(f"collection {self.collection!r} in {self.uri} has no staging table; rerun")
        return self.table(self.staged)

    def _publish(self, where: str | None, doomed: str | None) -> None:
        """One Lance commit: the staged rows that `where` selects (all: None) merged into the table by id, and
        the table's rows that `doomed` selects and the staged rows do not hold, deleted."""
        staged = self.table(self.staged) if self._has(self.staged) else None
        query = None if staged is None else staged.search().limit(None)
        rows = None if query is None else self.call("read the staged rows", (query.where(where) if where else query).to_arrow)
        main = self.table()
        if rows is not None and rows.num_rows:
            merge = main.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
            if doomed:
                merge = merge.when_not_matched_by_source_delete(doomed)
            self.call("replace rows", merge.execute, dedupe(rows))
        elif doomed:
            self.call("delete old rows", main.delete, doomed)

    def _appendable(self, manifest: Manifest, publish: Sequence[Entry], keep: Mapping[str, str]) -> set[str]:
        """The sources of `publish` whose rows may simply be appended (NOTE: last good copy)."""
        if self._in_step is None:
            self._in_step = isinstance(manifest, SqliteManifest) and (
                not self.exists() or self.call("count the rows", self.table().count_rows) == manifest.chunks_recorded())
        if not self._in_step or not isinstance(manifest, SqliteManifest):
            return set()
        new = sorted({e.source for e in publish} - set(keep))
        return set(new) - manifest.recorded_of(new)

    def _append(self, want: dict[str, str]) -> None:
        """One Lance commit: the staged rows of the versions `want` maps each source to, appended to the table."""
        import pyarrow as pa
        import pyarrow.compute as pc

        query = self.table(self.staged).search().limit(None).where(sources_in(sorted(want)))
        self._in_step, rows = False, self.call("read the staged rows", query.to_arrow)   # in step again once recorded
        wanted = pa.array([want[s] for s in rows.column("source").to_pylist()], pa.string())
        rows = dedupe(rows.filter(pc.equal(rows.column("file_hash"), wanted)))
        if rows.num_rows:
            self.call("store rows", self.table().add, rows)

    def commit(self, manifest: Manifest, keep: Mapping[str, str], entries: Sequence[Entry], removed: Sequence[str]) -> None:
        """Fence, then in one Lance commit publish the staged rows of the versions `entries` record and delete the
        versions `keep` replaces (NOTE: last good copy); clear those sources' staged rows; record the entries."""
        if not (keep or entries or removed):
            return
        manifest.fence()
        publish = [e for e in entries if e.chunks]
        if new := self._appendable(manifest, publish, keep):
            self._append({e.source: e.file_hash for e in publish if e.source in new})
            publish = [e for e in publish if e.source not in new]
        where = " OR ".join(f"(source = {quote(e.source)} AND file_hash = {quote(e.file_hash)})" for e in publish)
        doomed = " OR ".join(f"(source = {quote(s)}" + (f" AND file_hash != {quote(h)})" if h else ")")
                             for s, h in keep.items())
        if publish or doomed:
            self._publish(where or "false", doomed or None)
        done = sorted({*keep, *(e.source for e in entries), *removed})
        if done and self._has(self.staged):
            self.call("clear the staged rows", self.table(self.staged).delete, sources_in(done))
        if entries:
            manifest.record(entries)
            self._in_step = self._in_step or bool(new)
        if removed:
            manifest.remove(removed)

    def delete_stale(self, keep: Mapping[str, str]) -> None:
        """Remove every row of each source of `keep` but those of the version it maps to ("": all), in one call."""
        doomed = " OR ".join(f"(source = {quote(s)}" + (f" AND file_hash != {quote(h)})" if h else ")")
                             for s, h in keep.items())
        if doomed:
            self.call("delete old rows", self.table().delete, doomed)

    def flush(self) -> None:
        """Publish every staged row (the run does not call it: its commits publish their files' rows)."""
        if self._has(self.staged) and self.table(self.staged).count_rows():
            self._publish(None, None)
            self.call("clear the staged rows", self.table(self.staged).delete, "true")

    def finish(self) -> None:
        """At the end of a run that was not stopped: drop what is left staged (failed files'), fold new rows into
        the full-text and id indexes, compact, remove versions older than KEEP_VERSIONS, and past INDEX_ROWS rows
        build the vector index if there is none (IVF-Flat, cosine)."""
        if self._db is None or not self.exists():       # nothing written by this process: nothing to do
            return
        if self._has(self.staged) and self.table(self.staged).count_rows():
            self.call("clear the staged rows", self.table(self.staged).delete, "true")
        main = self.table()
        if ("vector",) not in self._indexes(main) and main.count_rows() >= INDEX_ROWS:
            from lancedb.index import IvfFlat

            self.call("build the vector index", main.create_index, "vector", config=IvfFlat(distance_type="cosine"))
        if self.call("read the index", main.index_stats, "search_text_idx").num_unindexed_rows:
            self.call("optimize the collection", main.optimize, cleanup_older_than=KEEP_VERSIONS)

    def rows(self, fields: Sequence[str], sources: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """`fields` of every published row, or of `sources`' rows, ROWS_SOURCES sources a read ("vector": a list
        of floats)."""
        if not self.exists():
            return []
        todo = [None] if sources is None else sorted(set(sources))
        out: list[dict[str, Any]] = []
        for i in range(0, len(todo), ROWS_SOURCES):
            query = self.table().search().limit(None).select(list(fields))
            query = query if sources is None else query.where(sources_in(todo[i:i + ROWS_SOURCES]))
            out.extend(self.call("read rows", query.to_arrow).to_pylist())
        return out

    def search(self, vector: Sequence[float] | None, k: int, mode: str = "dense", query: str = "") -> list[dict[str, Any]]:
        """The k best chunks: by cosine (dense), by BM25 on `query` (bm25), or max(4k, 20) of each fused by
        reciprocal rank (hybrid)."""
        if mode == "dense":
            return [hit(r, 1.0 - r["_distance"]) for r in self._dense(vector, k)]
        if mode == "bm25":
            return [hit(r, r["_score"]) for r in self._bm25(query, k)]
        wide = max(4 * k, 20)
        fused: dict[tuple[str, int], float] = {}
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for ranked in (self._dense(vector, wide), self._bm25(query, wide)):
            for rank, r in enumerate(ranked, 1):
                key = (r["source"], r["chunk"])
                fused[key] = fused.get(key, 0.0) + 1.0 / (RRF_K + rank)
                rows.setdefault(key, r)
        best = sorted(fused, key=fused.__getitem__, reverse=True)[:k]
        return [hit(rows[key], fused[key]) for key in best]

    def _dense(self, vector: Sequence[float] | None, k: int) -> list[dict[str, Any]]:
        q = self.table().search(np.asarray(vector, dtype=np.float32), vector_column_name="vector")
        q = q.distance_type("cosine").limit(k).select([*HIT_FIELDS, "_distance"])
        return self.call("search", q.to_list)

    def _bm25(self, query: str, k: int) -> list[dict[str, Any]]:
        if not query.strip():
            return []
        q = self.table().search(query, query_type="fts", fts_columns="search_text").limit(k)
        q = q.select([*HIT_FIELDS, "_score"])
        return self.call("search", q.to_list)

    def sources_like(self, source: str, limit: int) -> list[str]:
        """Up to `limit` distinct sources equal to `source` or ending in "/" + it."""
        where = f"source = {quote(source)} OR ends_with(source, {quote('/' + source)})"
        found = self.call("list the sources", self.table().search().where(where).select(["source"]).limit(None).to_arrow)
        return sorted(set(found.column("source").to_pylist()))[:limit]
