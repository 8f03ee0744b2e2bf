"""LangChain retriever over a collection `ingest run` made: the same dense, BM25 or hybrid search as
`ingest search`, hits as Documents.

    from ingest import IngestRetriever
    docs = IngestRetriever(store="./ingest.db", k=5).invoke("what did revenue do in 2019?")

Each call opens the store for the search only (a Milvus Lite file then stays free for `ingest run`);
the query model is loaded once per process and shared by every retriever of the same model and backend.
`k` and `mode` given at call time (`invoke(query, k=1)`) override the retriever's own for that call.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import PrivateAttr

from ingest.search import DEFAULT_MODE, QueryEncoder, Searcher


class IngestRetriever(BaseRetriever):
    """Documents for a query: page_content is the chunk's text; metadata holds source, page, chunk,
    title, headings, element, bbox and score. `mode`: "dense", "bm25" or "hybrid"; a collection without
    BM25 answers with dense hits (and a note on stderr, once)."""

    store: str = "./ingest.db"
    collection: str = "documents"
    k: int = 4
    mode: str = DEFAULT_MODE
    model: str | None = None
    _noted: bool = PrivateAttr(default=False)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, mode: str | None = None) -> list[Document]:
        with Searcher(self.store, self.collection, self.model) as searcher:
            searcher.encoder = _shared(searcher.encoder)
            used, note = searcher.mode(mode or self.mode)
            if note and not self._noted:
                print(note, file=sys.stderr)
                self._noted = True
            hits = searcher.search([query], self.k if k is None else k, used)[0]
        return [Document(page_content=h["text"], metadata=_metadata(h)) for h in hits]


_ENCODERS: dict[tuple[str, str], QueryEncoder] = {}
_ENCODERS_LOCK = threading.Lock()


def _shared(encoder: QueryEncoder) -> QueryEncoder:
    """The process's one encoder of `encoder`'s model and backend (its model loads on first use)."""
    key = (str(getattr(encoder.model, "path", encoder.model)), encoder.backend)
    with _ENCODERS_LOCK:
        return _ENCODERS.setdefault(key, encoder)


def _metadata(hit: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in hit.items() if key != "text"}
