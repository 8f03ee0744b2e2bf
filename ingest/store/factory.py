"""The store a URI names, made: the registry of the store classes by kind (ingest/store/uri.py parses the URI),
each store module imported only when a URI names it, and the client packages each one needs.

Only the steps and the face (the engines, the CLI, the API, search, status, the collection and the writer
processes) import this module; no store does (they parse URIs with `ingest.store.uri`), so the store family
has no import cycle (tests/test_layers.py). A store whose client package is not installed is one line naming
what to install (`check_client`), before anything is opened or created.
"""
from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

from ingest.store.errors import StoreError, redact
from ingest.store.uri import SCHEMES, kind

if TYPE_CHECKING:
    from ingest.store.base import Endpoint, StoreBase

_LANCE = (("lancedb", "pyarrow"), "pip install 'ingest[lancedb]'")
_QDRANT = (("qdrant_client",), "pip install 'ingest[qdrant]'")
# kind: (the top-level modules its client needs, what to install: an extra of ingest, or for Milvus the
# packages themselves, which are dependencies of ingest: pyproject.toml)
CLIENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "postgresql": (("psycopg", "pgvector"), "pip install 'ingest[postgres]'"), "qdrant": _QDRANT,
    "qdrant-local": _QDRANT, "lancedb": _LANCE, "milvus": (("pymilvus",), "pip install 'pymilvus>=2.5'"),
    "milvus-lite": (("pymilvus", "milvus_lite"), "pip install 'pymilvus>=2.5' milvus-lite")}
PACKAGES = {"qdrant_client": "qdrant-client", "milvus_lite": "milvus-lite"}      # a module's package, where it differs


def missing_client(uri: str) -> str | None:
    """One line if a package the store `uri` names needs is not installed (naming what to install), else None.
    Found or not without importing it (find_spec: the stores import their clients only when a call needs one)."""
    needs, install = CLIENTS.get(kind(uri), ((), ""))
    for module in needs:
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return (f"store {redact(uri)} needs the package {PACKAGES.get(module, module)}, which is not "
                    f"installed; {install}")
    return None


def check_client(uri: str) -> None:
    """StoreError (one line: what to install) if the store `uri` names cannot be used for want of its client."""
    if (missing := missing_client(uri)) is not None:
        raise StoreError(missing)


def store_class(uri: str) -> type[StoreBase]:
    """The class of the store `uri` names; StoreError (one line) if its client package is not installed, or if
    no store knows its scheme."""
    k = kind(uri)
    if k == "unknown":
        raise StoreError(f"store {redact(uri)} has a scheme no store knows; use a path (Milvus Lite) or one of "
                         + ", ".join(f"{s}://" for s in SCHEMES))
    check_client(uri)
    if k == "null":
        from ingest.store.null import NullStore
        return NullStore
    if k == "postgresql":
        from ingest.store.postgres import PostgresStore
        return PostgresStore
    if k in ("qdrant", "qdrant-local"):
        from ingest.store.qdrant import QdrantStore
        return QdrantStore
    if k == "lancedb":
        from ingest.store.lancedb import LanceStore
        return LanceStore
    from ingest.store.milvus import Store
    return Store


def open_store(uri: str, collection: str, timeout_s: float = 60.0) -> StoreBase:
    """The store `uri` names (nothing is connected until it is used)."""
    return store_class(uri)(uri, collection, timeout_s)


def store_at(endpoint: Endpoint) -> StoreBase:
    """The store another process described with `endpoint()`."""
    return store_class(endpoint.address).at(endpoint)
