"""ingest: folders of documents -> chunks -> embeddings -> Milvus.

Public API (imported lazily so `import ingest` stays fast):
    encode_multi_process, EncodePool, IngestEmbeddings
"""
from __future__ import annotations

from typing import Any

__all__ = ["encode_multi_process", "EncodePool", "IngestEmbeddings", "EncodeError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ingest import api

        return getattr(api, name)
    raise AttributeError(f"module 'ingest' has no attribute {name!r}")
