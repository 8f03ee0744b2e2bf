"""Which store a URI names, without importing any store's client:

    ./ingest.db, /abs/path              Milvus Lite (a local file or folder)
    http(s)://host:19530                a Milvus server (tcp://, grpc://, unix:// too)
    postgresql://user:pass@host/db      PostgreSQL + pgvector (libpq URIs: ?host=/socket/dir, PG* variables)
    qdrant://host:6333, qdrants://...   a Qdrant server (qdrants: TLS)
    qdrant:///absolute/dir              Qdrant's local mode (a folder)
    null://                             the null store: takes rows and discards them (measuring a machine)
    lancedb:///absolute/dir, lancedb://dir  LanceDB (a folder; relative to the working directory)

These helpers import no store: every store module parses URIs with them. Which class a URI names, and the
store made from it (`open_store`, `store_at`), is ingest/store/factory.py's, which imports the stores; any
other scheme is refused there in one line naming these.
"""
from __future__ import annotations

from pathlib import Path

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
