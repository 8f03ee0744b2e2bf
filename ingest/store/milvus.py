"""The vector store: one Milvus collection, reached through a lazily created MilvusClient.

A local path (./ingest.db) is Milvus Lite, which allows one process per file: `lock()` takes an exclusive flock on
`<db>.lock` so a second `ingest run` fails at once instead of corrupting the store, and `serve()` then moves the
Lite server into a host process of its own (`ingest.store.lite_host`) that the run's client and its writer
processes reach on a Unix socket only this user can open; without `serve()` (`ingest search`) Lite runs inside
this process, on such a socket too (never pymilvus' own Lite server, which listens on 127.0.0.1 TCP). A server URI
(http://host:19530) reaches Milvus standalone or a cluster unchanged. The client is created in the process that
uses it (checked by pid) and never carried across a fork; another process gets the store as an
`Endpoint` (`endpoint()`, `Store.at`).
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ingest.store.base import (MODES, ROWS_SOURCES, RRF_K, Capabilities, Endpoint, StoreBase, StoreError,
                               StoreRejected, flock, hit, one_line)
from ingest.store.errors import Disconnected, refused
from ingest.store.lite_host import LiteHost, LiteServer
from ingest.store.milvus_calls import MilvusCalls, is_local
from ingest.store.schema import Columns, collection_schema, upsert_request

PROPS_MODEL, PROPS_DIM, PROPS_BACKEND = "ingest.model", "ingest.dim", "ingest.backend"
PROPS_SCHEMA, PROPS_BM25 = "ingest.schema", "ingest.bm25"    # absent: schema 1 (before titles and BM25)
DELETE_SOURCES, DELETE_IDS = 1024, 8192    # delete_stale: sources read at a time, ids deleted at a time
READ_LIMIT = 16384          # rows of one query (a server's largest query window)
LITE = Capabilities("Milvus Lite", embedded=True, writers=1, modes=MODES, transactional=False)
SERVER = Capabilities("Milvus", embedded=False, writers=None, modes=MODES, transactional=False,
                      parallel=False)     # "auto": 1 (a `milvus-lite server` takes one writer; a number raises it)
__all__ = ["MODES", "Endpoint", "Store", "StoreError", "StoreRejected", "is_local", "one_line"]


# No keepalive pings on an idle connection, and one a minute during a call: Milvus Lite's gRPC server
# (the run's Lite host, `milvus-lite server`) keeps gRPC's default of one ping per 5 minutes without
# data and answers pymilvus' 10-second pings with GOAWAY "too_many_pings". Every call has its own
# timeout (`call`), which is what notices a dead server.
GRPC_OPTIONS = {"grpc.keepalive_permit_without_calls": False, "grpc.keepalive_time_ms": 60_000}


def quote(value: str) -> str:
    """A Milvus filter string literal (Milvus Lite has no filter_params templating). Tested safe for
    quotes, backslashes, newlines, tabs and emoji; other control characters are refused by Milvus'
    parser, and sources never hold them (the scan writes them as backslash escapes)."""
    return json.dumps(value, ensure_ascii=False)


class Store(MilvusCalls, StoreBase):
    """One Milvus collection (module docstring); its calls: `MilvusCalls` (NOTE: timeouts)."""

    SCHEMA_VERSION = 2      # recorded as ingest.schema; collections without it are schema 1

    def __init__(self, uri: str, collection: str, timeout_s: float = 60.0, address: str | None = None):
        super().__init__(uri, collection, timeout_s, address or (str(Path(uri).resolve()) if is_local(uri) else uri))
        self._client = None
        self._pid: int | None = None
        self._lock_file = None
        self._host: LiteHost | None = None
        self._lite: LiteServer | None = None      # Lite in this process's threads (no host)
        self._serve_later = False                 # serve(lazy=True): on first use
        self._opening = threading.RLock()         # the first use may come from two threads (ingest/reuse.py)

    @classmethod
    def at(cls, endpoint: Endpoint) -> Store:
        """The store another process described with `endpoint()`."""
        return cls(endpoint.uri, endpoint.collection, endpoint.timeout_s, endpoint.address)

    @property
    def caps(self) -> Capabilities:
        return LITE if is_local(self.uri) else SERVER

    @property
    def local_path(self) -> Path | None:
        return Path(self.uri).resolve() if is_local(self.uri) else None

    def endpoint(self) -> Endpoint:
        self._serve_if_due()
        return Endpoint(self.uri, self.address, self.collection, self.timeout_s)

    # -- connection -----------------------------------------------------------------
    @property
    def client(self):
        with self._opening:
            return self._connect()

    def _connect(self):
        self._serve_if_due()
        if self._client is None or self._pid != os.getpid():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from pymilvus import MilvusClient

            logging.getLogger("pymilvus").setLevel(logging.CRITICAL)    # errors reach the user as StoreError

            self._client, self._lite = None, None      # a forked child's copies are its parent's
            try:
                target = self.address
                if is_local(target) and not target.startswith("unix:"):      # a .db path: serve it here
                    self._lite = LiteServer(target)
                    target = self._lite.address
                self._client = MilvusClient(target, timeout=self.timeout_s, grpc_options=GRPC_OPTIONS)
            except Exception as exc:
                if self._lite is not None:
                    self._lite.close()
                    self._lite = None
                message = (f"cannot open store {self.uri} (server unreachable): {one_line(exc)}; check that the "
                           "server is running and reachable, then rerun")
                if is_local(target):
                    raise StoreError(message) from None
                raise Disconnected(message, "server unreachable") from None      # a restart may end
            self._pid = os.getpid()
        return self._client

    def lock(self) -> None:
        """Own a Milvus Lite store exclusively for this process (no-op for server URIs)."""
        if is_local(self.uri) and self._lock_file is None:
            self._lock_file = flock(self.local_path, self.uri, "Milvus Lite allows one process per file")

    def serve(self, lazy: bool = False) -> None:
        """Serve a Milvus Lite store (locked by this process) from a host process of its own, and
        connect to it: its server's threads leave this process's GIL. A no-op for a server URI.
        `lazy`: only once it is used (a client or an endpoint is asked for): a run that writes nothing
        never starts the host, nor makes Lite load the collection."""
        if not is_local(self.uri) or self._host is not None:
            return
        if lazy:
            self._serve_later = True
            return
        self._serve_later = False
        assert self._lock_file is not None, "lock() the store before serving it"
        self._drop_client()
        try:
            self._host = LiteHost(str(Path(self.uri).resolve()))
        except RuntimeError as exc:
            raise StoreError(f"cannot open store {self.uri}: {exc}") from None
        self.address = self._host.address

    def _serve_if_due(self) -> None:
        with self._opening:
            if self._serve_later and self._pid in (None, os.getpid()):
                self.serve()

    @property
    def serving(self) -> bool:
        """A Lite host serves the store for this process."""
        return self._host is not None

    def stop_serving(self) -> None:
        """Close the client and stop the Lite host (if any), keeping the flock: the .db is quiet and still ours."""
        self._serve_later = False
        self._drop_client()
        if self._host is not None:
            self._host.stop()
            self._host = None
            self.address = str(Path(self.uri).resolve())

    def _drop_client(self) -> None:
        if self._pid == os.getpid():
            if self._client is not None:
                try:
                    self._client.close()
                except Exception:
                    pass
            if self._lite is not None:
                self._lite.close()
        self._client, self._lite = None, None

    def close(self) -> None:
        """Close the client, stop the Lite host (if any), then give the flock back."""
        self.stop_serving()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def own(self):
        """A server collection: its lease and its manifest in the companion collection (`server_manifest`)."""
        from ingest.store.server_manifest import Lease, ServerManifest

        lease = Lease.acquire(self)
        return ServerManifest(self, lease), lease

    def holder(self) -> str | None:
        from ingest.store.server_manifest import companion_name, read_lease

        if not self.call("look up the manifest collection", "has_collection", companion_name(self.collection)):
            return None
        h = read_lease(self)
        return h.describe() if h is not None and not h.stale(time.time()) else None

    def has_manifest(self) -> bool:
        from ingest.store.server_manifest import companion_name

        if self.caps.embedded:
            return super().has_manifest()
        return bool(self.call("look up the manifest collection", "has_collection", companion_name(self.collection)))

    def summary(self):
        from ingest.store.server_manifest import read_summary

        return read_summary(self)

    # -- collection -----------------------------------------------------------------
    def exists(self) -> bool:
        return self.call("look up the collection", "has_collection", self.collection)

    def recorded_model(self) -> tuple[str, int] | None:
        """(model, dim) of a collection ingest made; None if missing or not ingest's."""
        recorded = self.recorded()
        return None if recorded is None else recorded[:2]

    def recorded(self) -> tuple[str, int, str] | None:
        """(model, dim, backend) of a collection ingest made (backend "torch" when not recorded:
        collections made before backends existed); None if missing or not ingest's."""
        props = self._properties()
        if props is None or PROPS_MODEL not in props:
            return None
        return props[PROPS_MODEL], int(props.get(PROPS_DIM, 0)), props.get(PROPS_BACKEND, "torch")

    def schema(self) -> tuple[int, bool]:
        """(schema version, has BM25) of an existing collection: (1, False) for one made before
        schema 2 (no title, headings, element, bbox or BM25 fields)."""
        props = self._properties() or {}
        version = int(props.get(PROPS_SCHEMA, 1))
        return version, version >= 2 and props.get(PROPS_BM25, "1") == "1"

    def _properties(self) -> dict[str, str] | None:
        if not self.exists():
            return None
        return self.call("describe the collection", "describe_collection", self.collection).get("properties") or {}

    def upgrade_message(self) -> str:
        """The one line refusing to write to a schema-1 collection."""
        return (f"collection {self.collection!r} in {self.uri} was made by an older ingest (schema 1); rerun with "
                "--reembed to upgrade it to the new schema (titles, sections, BM25): nothing was changed")

    def ensure_collection(self, model: str, dim: int, backend: str) -> None:
        """Create the collection on first use; refuse one built with another model, dimension or backend."""
        recorded = self.recorded()
        if recorded is not None or self.exists():
            self.refuse_other(recorded, model, dim, backend)
            if self.schema()[0] < self.SCHEMA_VERSION:
                raise StoreError(self.upgrade_message())
            self.call("load the collection", "load_collection", self.collection)
            return
        props = {PROPS_MODEL: model, PROPS_DIM: str(dim), PROPS_BACKEND: backend, PROPS_SCHEMA: str(self.SCHEMA_VERSION)}
        try:
            self._create(dim, bm25=True, properties={**props, PROPS_BM25: "1"})
        except StoreRejected as exc:        # a Milvus without BM25 functions (before 2.5): dense search only
            logging.getLogger(__name__).warning("store %s has no BM25 full-text search (%s): dense search only",
                                                self.uri, exc)
            self.drop()
            self._create(dim, bm25=False, properties={**props, PROPS_BM25: "0"})
        self.call("load the collection", "load_collection", self.collection)

    def _create(self, dim: int, bm25: bool, properties: dict[str, str]) -> None:
        """Create the schema-2 collection (`collection_schema`). A server that accepts the schema but drops
        the BM25 function (older than its protocol) is a refusal too."""
        schema, index = collection_schema(dim, is_local(self.uri), bm25)
        self.call("create the collection", "create_collection", self.collection, schema=schema, index_params=index,
                  properties=properties)
        if bm25 and not self.call("describe the collection", "describe_collection", self.collection).get("functions"):
            raise StoreRejected("the server kept no BM25 function")

    def drop(self) -> None:
        """Drop ingest's collection (a collection ingest did not make is refused: never touched)."""
        if self.exists():
            if self.recorded() is None:
                raise StoreError(f"collection {self.collection!r} in {self.uri} was not made by ingest; "
                                 "choose another --collection")
            self.call("drop the collection", "drop_collection", self.collection)

    # -- rows -----------------------------------------------------------------------
    def upsert_columns(self, columns: Columns) -> None:
        """Upsert rows with one UpsertRequest built column by column (the vectors as their raw bytes),
        skipping pymilvus' per-row conversion and checks; the server still checks every value. A value
        a field cannot hold, or a non-zero status, is StoreRejected; the call has `call`'s timeout and
        verdict."""
        rows = len(columns.ids)
        if not rows:
            return
        what = f"store {rows} rows"
        try:
            request = upsert_request(self.collection, columns)
        except (TypeError, ValueError) as exc:        # e.g. a plugin's page number beyond INT64
            raise StoreRejected(f"the store refused to {what}: {one_line(exc)}") from None
        def send() -> Any:
            client = self.client
            metadata = client._generate_call_context().to_grpc_metadata()    # the database name, as pymilvus sends it
            return client._get_connection()._stub.Upsert(request, timeout=self.timeout_s, metadata=metadata)
        status = self._retry(lambda: self._guard(what, send)).status
        if status.code or status.error_code:
            raise refused(what, " ".join(status.reason.split())[:300], self.local_path)

    def delete_stale(self, keep: Mapping[str, str]) -> None:
        """Remove every row of each source of `keep` but those of the version it maps to ("": all): old versions,
        one abandoned part-way (the last good copy kept), files gone. A few calls, not one filtered delete a file
        (each scans the whole collection): DELETE_SOURCES sources' rows read at once (Strong: just written too),
        the others deleted by id; a read that fills READ_LIMIT may be partial: redone on half the sources."""
        todo, n = sorted(keep), DELETE_SOURCES
        if todo:
            self.call("load the collection", "load_collection", self.collection)
        while todo:
            names = ", ".join(map(quote, todo[:n]))
            rows = self.call("read old rows", "query", self.collection, filter=f"source in [{names}]",
                             output_fields=["source", "file_hash"], limit=READ_LIMIT, consistency_level="Strong")
            if len(rows) >= READ_LIMIT and min(n, len(todo)) > 1:
                n = min(n, len(todo)) // 2
                continue
            if len(rows) >= READ_LIMIT:
                self.call("delete old rows", "delete", self.collection,
                          filter=f"source == {quote(todo[0])} and file_hash != {quote(keep[todo[0]])}")
            stale = [r["id"] for r in rows if r["file_hash"] != keep[r["source"]]]
            for i in range(0, len(stale), DELETE_IDS):
                self.call("delete old rows", "delete", self.collection, ids=stale[i:i + DELETE_IDS])
            todo = todo[n:]

    def flush(self) -> None:
        self.call("flush", "flush", self.collection)

    def rows(self, fields: Sequence[str], sources: Sequence[str] | None = None) -> list[dict[str, Any]]:
        self.call("load the collection", "load_collection", self.collection)
        todo = [None] if sources is None else sorted(set(sources))
        out: list[dict[str, Any]] = []
        for i in range(0, len(todo), ROWS_SOURCES):
            where = 'id != ""' if sources is None else f"source in [{', '.join(map(quote, todo[i:i + ROWS_SOURCES]))}]"
            it = self.call("read rows", "query_iterator", self.collection, filter=where, output_fields=list(fields),
                           batch_size=1000)
            while batch := it.next():
                out.extend({f: r[f] for f in fields} for r in batch)
            it.close()
        return out

    def sources_like(self, source: str, limit: int) -> list[str]:
        """Its LIKE pattern has a one-character wildcard for each backslash, % or _ of the name (Milvus Lite and
        a server escape differently), so it may find a few rows too many."""
        self.call("load the collection", "load_collection", self.collection)
        pattern = "%/" + re.sub(r"[\\%_]", "_", source)
        rows = self.call("look up a source", "query", self.collection, output_fields=["source"], limit=limit,
                         filter=f"source == {quote(source)} or source like {quote(pattern)}")
        return sorted({r["source"] for r in rows})

    def search(self, vector: Sequence[float] | None, k: int, mode: str = "dense", query: str = "") -> list[dict[str, Any]]:
        """The k best chunks: by cosine to `vector` (dense), by BM25 on `query`'s words (bm25), or both
        lists (max(4k, 20) candidates each) fused by reciprocal rank (hybrid, Milvus' RRFRanker). The
        caller checks that the collection has BM25 (`schema`). Each hit: score, source, page (None when
        the format has none), chunk, text, title, headings, element, bbox ([x0, y0, x1, y1] or None)."""
        from pymilvus import AnnSearchRequest, RRFRanker

        self.call("load the collection", "load_collection", self.collection)
        new = self.schema()[0] >= 2
        fields = ["text", "source", "page", "chunk", "format"] + (["title", "headings", "element", "bbox"] if new else [])
        if mode == "dense":
            hits = self.call("search", "search", self.collection, [list(vector)], anns_field="vector", limit=k,
                             output_fields=fields)[0]
        elif mode == "bm25":
            hits = self.call("search", "search", self.collection, [query], anns_field="sparse", limit=k,
                             search_params={"metric_type": "BM25"}, output_fields=fields)[0]
        else:
            wide = max(4 * k, 20)
            requests = [AnnSearchRequest([list(vector)], "vector", {"metric_type": "COSINE"}, limit=wide),
                        AnnSearchRequest([query], "sparse", {"metric_type": "BM25"}, limit=wide)]
            hits = self.call("search", "hybrid_search", self.collection, requests, RRFRanker(RRF_K), limit=k,
                             output_fields=fields)[0]
        return [hit(h["entity"], abs(h["distance"]) if mode == "bm25" else h["distance"]) for h in hits]

