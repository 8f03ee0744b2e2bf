"""The store family: everything that talks to a vector store or keeps what it holds.

`base` (the interface every store implements: `StoreBase`, `Capabilities`, errors), `uri` (which store a
URI names: `kind`, `local_path`; it imports no store), `factory` (the store a URI names, made: `open_store`,
`store_at`; only the steps and the face import it), one module per store (`milvus`, `postgres`, `qdrant`,
`lancedb`, `null`), `schema` (the fields and the rows to upsert), `collection` (store and manifest opened and owned
together), `manifest` (the SQLite manifest of an embedded store), `server_manifest` (a Milvus server's) and `lease`,
`writers` (the writer processes), `lite_host` (the process that serves a Milvus Lite file). The steps import
the interface and the errors from here, `open_store` from `factory`; `Store` is the Milvus store.
"""
from ingest.store.base import (MODES, Capabilities, Endpoint, LeaseLost, StoreBase, StoreError, StoreRejected,
                               one_line, redact)
from ingest.store.milvus import Store
from ingest.store.schema import FORMAT_MAX, SOURCE_MAX, TEXT_MAX
from ingest.store.uri import is_local, kind, local_path

__all__ = ["FORMAT_MAX", "MODES", "SOURCE_MAX", "TEXT_MAX", "Capabilities", "Endpoint", "LeaseLost", "Store",
           "StoreBase", "StoreError", "StoreRejected", "is_local", "kind", "local_path", "one_line", "redact"]
