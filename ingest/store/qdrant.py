"""Qdrant: one collection of a Qdrant server, or of the client's local mode (a folder this process opens).

    qdrant://host:6333[/prefix]        a server over REST (port 6333 when none is given)
    qdrants://host:6333                the same over TLS (https)
    qdrant:///absolute/dir             local mode: the folder, one process at a time

A server's API key: the URI's password (qdrants://:KEY@host), else `?api_key=KEY`, else $QDRANT_API_KEY (redacted).

Points: our 32-hex chunk id as a UUID; the payload holds the Milvus schema's fields, with keyword indexes on
`source` and `file_hash` (a server's: local mode has none); the dense vector `dense` (cosine) and the sparse
vector `bm25` with Qdrant's IDF modifier, its values computed by ingest from `search_text`
(`ingest.store.sparse`): with the IDF, BM25. Hybrid search fuses a dense and a sparse prefetch by reciprocal
rank (k = RRF_K). The collection's metadata {"ingest": {role, model, dim, backend, schema}} marks it as
ingest's: one without it is never written, dropped or re-embedded. Needs Qdrant 1.16 or later (metadata,
conditional upserts, parametrized RRF). A Qdrant server was not tested here (local mode was).

Local mode keeps everything in this process: no writer processes (`hosted` False), and every call on its
one client serialized by a lock (the local client is not thread safe; the run calls from its committer and
writer threads). Its manifest is SQLite beside the folder, and `lock()` flocks `<folder>.lock`. It finds a
source's points in an index of its own and writes each call in one SQLite commit (`ingest.store.qdrant_local`). A server
keeps the manifest and the run's lease in `<collection>__files` (`ingest.store.qdrant_manifest`).
"""
from __future__ import annotations

import math
import os
import sqlite3
import threading
import uuid
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np

from ingest.store.base import (MODES, ROWS_SOURCES, RRF_K, Capabilities, StoreBase, StoreError, StoreRejected, flock,
                               hit, one_line)
from ingest.store.manifest import Summary, manifest_path, read_summary
from ingest.store import qdrant_manifest as server
from ingest.store.qdrant_local import LOCAL_MARK, LocalMode, SourceIndex, foreign_folder
from ingest.store.schema import Columns
from ingest.store.sparse import document_vector, query_vector
from ingest.store.uri import kind, local_path

DENSE, SPARSE = "dense", "bm25"               # the vectors' names
META = "ingest"                               # the collection metadata key that marks ingest's collections
HIT_FIELDS = ["text", "source", "page", "chunk", "format", "title", "headings", "element", "bbox"]
FIELDS = (*HIT_FIELDS, "file_hash", "search_text")     # the payload: the Milvus schema's fields
DELETE_SOURCES = 256      # delete_stale: sources of one filtered delete
SCROLL = 1000             # points of one scroll page
FACET_LIMIT = 100_000     # distinct sources read by sources_like
LOCAL = Capabilities("Qdrant (local mode)", embedded=True, writers=1, modes=MODES, transactional=False, hosted=False)
SERVER = Capabilities("Qdrant", embedded=False, writers=None, modes=MODES, transactional=False)


def point_id(chunk_id: str) -> str:
    """Our 32-hex chunk id as Qdrant's UUID point id (ValueError if it is not 32 hex digits)."""
    if len(chunk_id) != 32:
        raise ValueError(f"chunk id {chunk_id[:40]!r} is not 32 hex digits")
    return str(uuid.UUID(hex=chunk_id))


def server_options(address: str, timeout_s: float) -> dict[str, Any]:
    """QdrantClient's arguments for a server URI (qdrant://, qdrants://), the API key included."""
    u = urlsplit(address)
    host = u.hostname or "localhost"
    key = unquote(u.password) if u.password else None
    key = key or (parse_qs(u.query).get("api_key") or [None])[0] or os.environ.get("QDRANT_API_KEY") or None
    https = u.scheme.lower() == "qdrants"
    return {"url": f"{'https' if https else 'http'}://{f'[{host}]' if ':' in host else host}",
            "port": u.port or 6333, "https": https, "prefix": u.path.strip("/") or None, "api_key": key,
            "timeout": max(1, math.ceil(timeout_s)), "check_compatibility": False}


class QdrantStore(LocalMode, StoreBase):
    """NOTE (errors): every call goes through `call`. A server's answer of 401/403 is a StoreError (the API
    key); any other 4xx refuses the rows or the request (StoreRejected). Another failure is classed by a
    short ping, as Milvus' are: if the server still answers, the call was refused (StoreRejected), else the
    store is unreachable or stalled (StoreError: the run stops, and a rerun resumes). In local mode a bad
    value is StoreRejected, a failing disk or SQLite a StoreError."""

    def __init__(self, uri: str, collection: str, timeout_s: float = 60.0, address: str | None = None):
        super().__init__(uri, collection, timeout_s, address)
        self.local = kind(self.address) == "qdrant-local"
        self._client: Any = None
        self._pid: int | None = None
        self._lock_file = None
        self._mutex: Any = threading.RLock() if self.local else nullcontext()
        self._sources: SourceIndex | None = None      # local mode: the points of each source (qdrant_local)

    @property
    def caps(self) -> Capabilities:
        return LOCAL if self.local else SERVER

    @property
    def local_path(self) -> Path | None:
        return local_path(self.address)

    # -- connection -----------------------------------------------------------------
    @property
    def client(self) -> Any:
        with self._mutex:
            if self._client is None or self._pid != os.getpid():
                self._client = None                        # a forked child's copy is its parent's
                self._client = self._open()
                self._pid = os.getpid()
            return self._client

    def _open(self) -> Any:
        from qdrant_client import QdrantClient

        if self.local:
            if refused := foreign_folder(self.local_path, self.uri):
                raise StoreError(refused)
            try:
                return QdrantClient(path=str(self.local_path), force_disable_check_same_thread=True)
            except Exception as exc:
                busy = "already accessed" in str(exc)         # the client's own lock on the folder
                raise StoreError(f"store {self.uri} is in use by another process; wait for it to finish (Qdrant's "
                                 "local mode allows one process per folder)" if busy else
                                 f"cannot open store {self.uri}: {one_line(exc)}; check the folder") from None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")          # "Api key is used with an insecure connection"
                return QdrantClient(**server_options(self.address, self.timeout_s))
        except Exception as exc:
            raise StoreError(f"cannot open store {self.uri}: {one_line(exc)}; check the URI") from None

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """client.method(*args, **kwargs); a failure becomes StoreRejected or StoreError (NOTE: errors)."""
        with self._mutex:
            client = self.client
            try:
                return getattr(client, method)(*args, **kwargs)
            except Exception as exc:
                raise self._classify(what, exc) from None

    def _classify(self, what: str, exc: Exception) -> StoreError:
        from qdrant_client.http.exceptions import UnexpectedResponse

        reason = _reason(exc)
        if self.local:
            if isinstance(exc, (OSError, sqlite3.Error, RuntimeError)):
                return StoreError(f"store {self.uri} failed to {what}: {reason}; check the folder, then rerun")
            return StoreRejected(f"the store refused to {what}: {reason}")
        status = getattr(exc, "status_code", None) if isinstance(exc, UnexpectedResponse) else None
        if status in (401, 403):
            return StoreError(f"store {self.uri} refused the API key (HTTP {status}); pass the right key as the URI's "
                              "password, its ?api_key= or QDRANT_API_KEY")
        if status is not None and 400 <= status < 500 or self._answers():
            return StoreRejected(f"the store refused to {what}: {reason}")
        return StoreError(f"store {self.uri} did not answer (trying to {what}, timeout {self.timeout_s:g} s): "
                          f"{reason}; check that the server is running and reachable, then rerun: the rerun resumes")

    def _answers(self) -> bool:
        try:
            self._client.get_collections()
            return True
        except Exception:
            return False

    def lock(self) -> None:
        """Local mode: own the folder for this process (its flock `<folder>.lock`); a no-op for a server."""
        if self.local and self._lock_file is None:
            if refused := foreign_folder(self.local_path, self.uri):
                raise StoreError(refused)
            self._lock_file = flock(self.local_path, self.uri, "Qdrant's local mode allows one process per folder")

    def close(self) -> None:
        """Close the client (this process's only), then give the flock back."""
        self._forget()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def own(self) -> tuple[server.QdrantManifest, server.QdrantLease]:
        """A server collection: its lease and its manifest in `<collection>__files` (`qdrant_manifest`)."""
        if self.local:
            raise NotImplementedError("local mode keeps its manifest in SQLite beside the folder")
        lease = server.QdrantLease.acquire(self)
        return server.QdrantManifest(self, lease), lease

    def holder(self) -> str | None:
        return None if self.local else server.read_holder(self)

    def has_manifest(self) -> bool:
        return super().has_manifest() if self.local else self.has(server.companion_name(self.collection))

    def summary(self) -> Summary | None:
        if self.local:
            path = manifest_path(self.uri, self.collection)
            return read_summary(path) if path.exists() else None
        return server.read_summary(self)

    # -- collection -----------------------------------------------------------------
    def exists(self) -> bool:
        return self.has(self.collection)

    def has(self, name: str) -> bool:
        """Whether collection `name` exists (local mode: without creating the folder)."""
        if self.local and not (self.local_path / LOCAL_MARK).is_file():
            return False
        return bool(self.call("look up the collection", "collection_exists", name))

    def marks(self, name: str | None = None) -> dict[str, Any] | None:
        """ingest's metadata of collection `name` (this one by default); None if it is missing or not ingest's."""
        name = name or self.collection
        if not self.has(name):
            return None
        marks = (self.call("describe the collection", "get_collection", name).config.metadata or {}).get(META)
        return marks if isinstance(marks, dict) else None

    def recorded(self) -> tuple[str, int, str] | None:
        m = self.marks() or {}
        return (str(m.get("model")), int(m.get("dim", 0)), str(m.get("backend"))) if m.get("role") == "chunks" else None

    def schema(self) -> tuple[int, bool]:
        return int((self.marks() or {}).get("schema", self.SCHEMA_VERSION)), True

    def ensure_collection(self, model: str, dim: int, backend: str) -> None:
        """Create the collection on first use; refuse a foreign one, or one of another model, dimension, backend
        or shape, in one line and untouched."""
        if not self.exists():
            if self._create(model, dim, backend):
                return
        self.refuse_other(self.recorded(), model, dim, backend)
        params = self.call("describe the collection", "get_collection", self.collection).config.params
        dense = (params.vectors or {}).get(DENSE) if isinstance(params.vectors, dict) else None
        sparse = (params.sparse_vectors or {}).get(SPARSE)
        if dense is None or dense.size != dim or str(getattr(dense.distance, "value", dense.distance)) != "Cosine" \
                or sparse is None or str(getattr(sparse.modifier, "value", sparse.modifier)) != "idf":
            raise StoreError(f"collection {self.collection!r} in {self.uri} is not of the shape ingest makes (vectors "
                             f"{DENSE!r}: cosine, dim {dim}; {SPARSE!r}: IDF); use another --collection")

    def _create(self, model: str, dim: int, backend: str) -> bool:
        """Create the collection; False if another process created one meanwhile (then check that one)."""
        from qdrant_client import models as m

        marks = {"role": "chunks", "model": model, "dim": dim, "backend": backend, "schema": self.SCHEMA_VERSION}
        try:
            self.call("create the collection", "create_collection", self.collection,
                      vectors_config={DENSE: m.VectorParams(size=dim, distance=m.Distance.COSINE)},
                      sparse_vectors_config={SPARSE: m.SparseVectorParams(modifier=m.Modifier.IDF)},
                      metadata={META: marks})
        except StoreRejected:
            if self.exists():
                return False
            raise
        if self.recorded() != (model, dim, backend):         # a server too old to keep metadata: undo ours
            self.call("drop the collection", "delete_collection", self.collection)
            raise StoreError(f"store {self.uri} keeps no collection metadata (Qdrant older than 1.16?); upgrade "
                             "the server: nothing was kept")
        if not self.local:                                    # local mode has no payload indexes
            for field in ("source", "file_hash"):
                self.call("index the collection", "create_payload_index", self.collection, field,
                          field_schema=m.PayloadSchemaType.KEYWORD, wait=True)
        return True

    def drop(self) -> None:
        """Drop the collection, never one ingest did not make (StoreError, untouched)."""
        if not self.exists():
            return
        if self.recorded() is None:
            raise StoreError(f"collection {self.collection!r} in {self.uri} was not made by ingest; it was not "
                             "dropped: choose another --collection")
        self._sources = None
        self.call("drop the collection", "delete_collection", self.collection)

    # -- rows -----------------------------------------------------------------------
    def upsert_columns(self, columns: Columns) -> None:
        """Upsert the rows (one request, wait=True: applied and durable when it returns), their sparse vectors
        computed here from search_text. An id that is not 32 hex digits, or a vector of another shape, is
        StoreRejected."""
        from qdrant_client import models as m

        n = len(columns.ids)
        if not n:
            return
        what = f"store {n} rows"
        try:
            ids = [point_id(i) for i in columns.ids]
            vectors = np.asarray(columns.vectors, dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[0] != n:
                raise ValueError(f"vectors of shape {vectors.shape} for {n} rows")
            sparse = [m.SparseVector(indices=i, values=v) for i, v in map(document_vector, columns.search_texts)]
            c = columns
            payloads = [{"text": c.texts[j], "source": c.sources[j], "page": int(c.pages[j]),
                         "chunk": int(c.chunks[j]), "format": c.formats[j], "file_hash": c.file_hashes[j],
                         "title": c.titles[j], "headings": c.headings[j], "element": c.elements[j],
                         "bbox": c.bboxes[j], "search_text": c.search_texts[j]} for j in range(n)]
        except (TypeError, ValueError, IndexError) as exc:
            raise StoreRejected(f"the store refused to {what}: {one_line(exc)}") from None
        batch = m.Batch(ids=ids, vectors={DENSE: vectors.tolist(), SPARSE: sparse}, payloads=payloads)
        self._write(what, "upsert", points=batch)
        if self._sources is not None:
            self._sources.add(list(zip(ids, c.sources, c.file_hashes)))

    def delete_stale(self, keep: Mapping[str, str]) -> None:
        """Remove every row of each source of `keep` but those of the version it maps to ("": all): in local mode
        by their ids (the source index), in one call and one SQLite commit; on a server DELETE_SOURCES sources in
        one filtered delete: source in the batch, and any of its sources' other versions."""
        from qdrant_client import models as m

        if self.local:
            return self._delete_by_index(keep)

        def version(source: str, file_hash: str) -> m.Filter:
            other = [m.FieldCondition(key="file_hash", match=m.MatchValue(value=file_hash))] if file_hash else None
            return m.Filter(must=[m.FieldCondition(key="source", match=m.MatchValue(value=source))], must_not=other)

        todo = sorted(keep)
        for i in range(0, len(todo), DELETE_SOURCES):
            batch = todo[i:i + DELETE_SOURCES]
            stale = m.Filter(must=[m.FieldCondition(key="source", match=m.MatchAny(any=batch))],
                             should=[version(s, keep[s]) for s in batch])
            self.call("delete old rows", "delete", self.collection, points_selector=m.FilterSelector(filter=stale),
                      wait=True)

    def flush(self) -> None:
        """Nothing to do: every write waits until it is applied (wait=True), and local mode commits each call."""

    def rows(self, fields: Sequence[str], sources: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """`fields` of every row, or of the rows of `sources` ("id": our hex id; "vector": the dense vector)."""
        from qdrant_client import models as m

        payload = [f for f in fields if f in FIELDS]
        todo = [None] if sources is None else sorted(set(sources))
        out: list[dict[str, Any]] = []
        if self.local and sources is not None:          # by id: a filter would be evaluated over every point
            points = self._retrieve(todo, payload or False, "vector" in fields and [DENSE])
            return [self._row(p, fields) for p in points]
        for i in range(0, len(todo), ROWS_SOURCES):
            where = None if sources is None else m.Filter(must=[m.FieldCondition(
                key="source", match=m.MatchAny(any=todo[i:i + ROWS_SOURCES]))])
            offset = None
            while True:
                points, offset = self.call("read rows", "scroll", self.collection, limit=SCROLL, offset=offset,
                                           scroll_filter=where, with_payload=payload or False,
                                           with_vectors="vector" in fields and [DENSE])
                out += [self._row(p, fields) for p in points]
                if offset is None:
                    break
        return out

    @staticmethod
    def _row(point: Any, fields: Sequence[str]) -> dict[str, Any]:
        row = {"id": uuid.UUID(str(point.id)).hex, "vector": (point.vector or {}).get(DENSE), **(point.payload or {})}
        return {f: row.get(f) for f in fields}

    def search(self, vector: Sequence[float] | None, k: int, mode: str = "dense", query: str = "") -> list[dict[str, Any]]:
        """The k best chunks: by cosine (dense), by BM25 on `query`'s terms (bm25: none, no hits), or a dense and a
        sparse list (max(4k, 20) candidates each) fused by reciprocal rank (hybrid)."""
        from qdrant_client import models as m

        indices, values = query_vector(query) if mode != "dense" else ([], [])
        terms = m.SparseVector(indices=indices, values=values)
        common = {"limit": k, "with_payload": HIT_FIELDS}
        if mode == "dense":
            request = {"query": list(map(float, vector)), "using": DENSE, **common}
        elif mode == "bm25":
            if not indices:
                return []
            request = {"query": terms, "using": SPARSE, **common}
        else:
            wide = max(4 * k, 20)
            prefetch = [m.Prefetch(query=list(map(float, vector)), using=DENSE, limit=wide)]
            if indices:
                prefetch.append(m.Prefetch(query=terms, using=SPARSE, limit=wide))
            request = {"prefetch": prefetch, "query": m.RrfQuery(rrf=m.Rrf(k=RRF_K)), **common}
        points = self.call("search", "query_points", self.collection, **request).points
        return [hit(p.payload or {}, p.score) for p in points]

    def sources_like(self, source: str, limit: int) -> list[str]:
        """Up to `limit` distinct sources equal to `source` or ending in "/" + it, from the distinct sources
        (a facet of the first FACET_LIMIT; the exact name is looked up by itself)."""
        from qdrant_client import models as m

        exact = m.Filter(must=[m.FieldCondition(key="source", match=m.MatchValue(value=source))])
        found = {source} if self.call("look up a source", "count", self.collection, count_filter=exact,
                                      exact=False).count else set()
        hits = self.call("list the sources", "facet", self.collection, key="source", limit=FACET_LIMIT).hits
        found.update(str(h.value) for h in hits if str(h.value).endswith("/" + source))
        return sorted(found)[:limit]


def _reason(exc: BaseException) -> str:
    """The server's own error message when it sent one (Qdrant: {"status": {"error": ...}}), else the exception's."""
    try:
        error = exc.structured()["status"]["error"]          # type: ignore[attr-defined]
        return one_line(Exception(f"{error} (HTTP {exc.status_code})"))     # type: ignore[attr-defined]
    except Exception:
        return one_line(exc)
