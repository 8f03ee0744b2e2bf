"""Which store a URI names, without importing any store's client:

    ./ingest.db, /abs/path              Milvus Lite (a local file or folder)
    http(s)://host:19530                a Milvus server (any other scheme:// too, as before)
    postgresql://user:pass@host/db      PostgreSQL + pgvector (libpq URIs: ?host=/socket/dir, PG* variables)
    qdrant://host:6333, qdrants://...   a Qdrant server (qdrants: TLS)
    qdrant:///absolute/dir              Qdrant's local mode (a folder)
    null://                             the null store: takes rows and discards them (measuring a machine)
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ingest.store.base import Endpoint, StoreBase

KINDS = ("milvus-lite", "milvus", "postgresql", "qdrant", "qdrant-local", "null")


def kind(uri: str) -> str:
    """One of KINDS."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return "milvus-lite"
    scheme = scheme.lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    if scheme in ("qdrant", "qdrants"):
        return "qdrant-local" if scheme == "qdrant" and rest.startswith("/") else "qdrant"
    if scheme == "null":
        return "null"
    return "milvus"


def local_path(uri: str) -> Path | None:
    """The file or folder of an embedded store (Milvus Lite, Qdrant local), resolved; None for a server."""
    k = kind(uri)
    if k == "milvus-lite":
        return Path(uri).resolve()
    if k == "qdrant-local":
        return Path(uri.partition("://")[2]).resolve()
    return None


def is_local(uri: str) -> bool:
    """An embedded store: one machine, one run at a time (a flock), its manifest in SQLite beside it."""
    return local_path(uri) is not None


def store_class(uri: str) -> type[StoreBase]:
    """The class of the store `uri` names; StoreError (one line) if its client package is not installed."""
    k = kind(uri)
    if k == "null":
        from ingest.store.null import NullStore
        return NullStore
    try:
        if k == "postgresql":
            from ingest.store.postgres import PostgresStore
            return PostgresStore
        if k in ("qdrant", "qdrant-local"):
            from ingest.store.qdrant import QdrantStore
            return QdrantStore
    except ImportError as exc:
        from ingest.store.base import StoreError, redact

        extra = "postgres" if k == "postgresql" else "qdrant"
        raise StoreError(f"store {redact(uri)} needs the package {exc.name or exc}, which is not installed; "
                         f"pip install 'ingest[{extra}]'") from None
    from ingest.store.milvus import Store
    return Store


def open_store(uri: str, collection: str, timeout_s: float = 60.0) -> StoreBase:
    """The store `uri` names (nothing is connected until it is used)."""
    return store_class(uri)(uri, collection, timeout_s)


def store_at(endpoint: Endpoint) -> StoreBase:
    """The store another process described with `endpoint()`."""
    return store_class(endpoint.address).at(endpoint)
