"""Which store a URI names, without importing any store's client:

    ./ingest.db, /abs/path              Milvus Lite (a local file or folder)
    http(s)://host:19530                a Milvus server (tcp://, grpc://, unix:// too)
    postgresql://user:pass@host/db      PostgreSQL + pgvector (libpq URIs: ?host=/socket/dir, PG* variables)
    qdrant://host:6333, qdrants://...   a Qdrant server (qdrants: TLS)
    qdrant:///absolute/dir              Qdrant's local mode (a folder)
    null://                             the null store: takes rows and discards them (measuring a machine)
    lancedb:///absolute/dir, lancedb://dir  LanceDB (a folder; relative to the working directory)

Any other scheme is refused in one line naming these (`store_class`).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ingest.store.base import Endpoint, StoreBase

KINDS = ("milvus-lite", "milvus", "postgresql", "qdrant", "qdrant-local", "lancedb", "null")
MILVUS_SCHEMES = ("http", "https", "tcp", "grpc", "unix")     # what pymilvus connects to
SCHEMES = ("postgresql", "postgres", "qdrant", "qdrants", "lancedb", "null", *MILVUS_SCHEMES)


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
    if scheme == "lancedb":
        return "lancedb"
    if scheme == "null":
        return "null"
    return "milvus" if scheme in MILVUS_SCHEMES else "unknown"


def local_path(uri: str) -> Path | None:
    """The file or folder of an embedded store (Milvus Lite, Qdrant local), resolved; None for a server."""
    k = kind(uri)
    if k == "milvus-lite":
        return Path(uri).resolve()
    if k == "qdrant-local":
        return Path(uri.partition("://")[2]).resolve()
    if k == "lancedb":
        return Path(uri.partition("://")[2] or ".").resolve()
    return None


def is_local(uri: str) -> bool:
    """An embedded store: one machine, one run at a time (a flock), its manifest in SQLite beside it."""
    return local_path(uri) is not None


def store_class(uri: str) -> type[StoreBase]:
    """The class of the store `uri` names; StoreError (one line) if its client package is not installed, or if
    no store knows its scheme."""
    k = kind(uri)
    if k == "unknown":
        from ingest.store.errors import StoreError, redact

        raise StoreError(f"store {redact(uri)} has a scheme no store knows; use a path (Milvus Lite) or one of "
                         + ", ".join(f"{s}://" for s in SCHEMES))
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
        if k == "lancedb":
            from importlib.util import find_spec

            if find_spec("lancedb") is None:          # the module imports it only when a call needs it
                raise ImportError(name="lancedb")
            from ingest.store.lancedb import LanceStore
            return LanceStore
    except ImportError as exc:
        from ingest.store.errors import StoreError, redact

        extra = {"postgresql": "postgres", "lancedb": "lancedb"}.get(k, "qdrant")
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
