"""The store family: everything that talks to Milvus or keeps what it holds.

`milvus` (the one module that calls Milvus: `Store`, its errors, search), `schema` (the fields and the
upsert request), `collection` (store and manifest opened and owned together), `manifest` and
`server_manifest` (what the store holds, file by file), `writers` (the writer processes),
`lite_host` (the process that serves a Milvus Lite file). The steps import `Store` and its
errors from here.
"""
from ingest.store.milvus import MODES, Endpoint, Store, StoreError, StoreRejected, is_local, one_line
from ingest.store.schema import FORMAT_MAX, SOURCE_MAX, TEXT_MAX

__all__ = ["FORMAT_MAX", "MODES", "SOURCE_MAX", "TEXT_MAX", "Endpoint", "Store", "StoreError", "StoreRejected",
           "is_local", "one_line"]
