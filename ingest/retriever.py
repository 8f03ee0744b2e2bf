"""LangChain retriever over a collection `ingest run` made: the same dense, BM25 or hybrid search as
`ingest search`, hits as Documents.

    from ingest import IngestRetriever
    docs = IngestRetriever(store="./ingest.db", k=5).invoke("what did revenue do in 2019?")

Each call opens the store for the search only (a Milvus Lite file then stays free for `ingest run`);
the query model is loaded once and kept.
"""
from __future__ import annotations

import sys
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
    _encoder: QueryEncoder | None = PrivateAttr(default=None)
    _noted: bool = PrivateAttr(default=False)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        with Searcher(self.store, self.collection, self.model, self._encoder) as searcher:
            self._encoder = searcher.encoder
            mode, note = searcher.mode(self.mode)
            if note and not self._noted:
                print(note, file=sys.stderr)
                self._noted = True
            hits = searcher.search([query], self.k, mode)[0]
        return [Document(page_content=h["text"], metadata=_metadata(h)) for h in hits]


def _metadata(hit: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in hit.items() if key != "text"}
