"""ingest: folders of documents -> chunks -> embeddings -> Milvus.

Public API (imported lazily so `import ingest` stays fast):
    encode_multi_process, EncodePool, IngestEmbeddings, IngestRetriever (LangChain retriever over a collection)
"""
from __future__ import annotations

from typing import Any

__all__ = ["encode_multi_process", "EncodePool", "IngestEmbeddings", "EncodeError", "IngestRetriever"]


def __getattr__(name: str) -> Any:
    if name == "IngestRetriever":
        from ingest.retriever import IngestRetriever

        return IngestRetriever
    if name in __all__:
        from ingest import api

        return getattr(api, name)
    raise AttributeError(f"module 'ingest' has no attribute {name!r}")
