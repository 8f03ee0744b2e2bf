"""Issue 33, item 5: LangChain's own standard retriever tests (langchain-tests' RetrieversIntegrationTests)
against IngestRetriever, on every store: Milvus Lite, a Milvus server, PostgreSQL + pgvector, Qdrant's
local mode and LanceDB. Each store holds six short text files ingested by `ingest run` with the packaged model; every
retriever of the module shares one query model (IngestRetriever loads it once a process)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_tests.integration_tests import RetrieversIntegrationTests

from conftest import ingest
from ingest import IngestRetriever

TOPICS = ["lighthouse keepers trim the lamp wick at dusk", "the octopus hides in a coral reef",
          "quarterly revenue rose by twelve percent", "a recipe for sourdough bread with rye",
          "the river floods its banks every spring", "chess openings: the Sicilian defence"]
COLLECTION = "retriever_std"
_stores: dict[str, str] = {}


def _build(kind: str, request: pytest.FixtureRequest, tmp: Path) -> str:
    if kind == "milvus-lite":
        uri = str(tmp / "store.db")
    elif kind == "milvus":
        uri = request.getfixturevalue("milvus_uri")
    elif kind == "postgresql":
        uri = request.getfixturevalue("pg_server").database("retriever")
    elif kind == "lancedb":
        uri = f"lancedb://{tmp / 'lance'}"
    else:
        uri = f"qdrant://{tmp / 'qdrant'}"
    docs = tmp / "docs"
    docs.mkdir()
    for i, topic in enumerate(TOPICS):
        (docs / f"note-{i}.txt").write_text(f"{topic}. " * 3)
    res = ingest("run", str(docs), "--store", uri, "--collection", COLLECTION, "--report", str(tmp / "report.json"),
                 "--quiet", cwd=tmp)
    assert res.rc == 0, res.stderr
    return uri


@pytest.fixture(scope="class", autouse=True)
def _store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    kind = getattr(request.cls, "store_kind", "milvus-lite")
    if kind not in _stores:
        _stores[kind] = _build(kind, request, tmp_path_factory.mktemp(kind))


class _Ingest(RetrieversIntegrationTests):
    store_kind = "milvus-lite"

    @property
    def retriever_constructor(self) -> type[IngestRetriever]:
        return IngestRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"store": _stores[self.store_kind], "collection": COLLECTION, "k": 4}

    @property
    def retriever_query_example(self) -> str:
        return "who trims the lighthouse lamp?"


class TestMilvusLite(_Ingest):
    store_kind = "milvus-lite"


class TestMilvusServer(_Ingest):
    store_kind = "milvus"


class TestPostgres(_Ingest):
    store_kind = "postgresql"


class TestQdrantLocal(_Ingest):
    store_kind = "qdrant-local"


class TestLanceDB(_Ingest):
    store_kind = "lancedb"


def test_call_time_k_and_mode_and_first_hit() -> None:
    """`k` and `mode` given to invoke() win for that call only; the right note comes first in every mode
    (BM25 answers only the notes holding a word of the query)."""
    retriever = IngestRetriever(store=_stores["milvus-lite"], collection=COLLECTION, k=4)
    for mode in ("dense", "bm25", "hybrid"):
        docs = retriever.invoke("lighthouse lamp wick", k=2, mode=mode)      # bm25: only notes with a word
        assert len(docs) == (1 if mode == "bm25" else 2) and docs[0].metadata["source"] == "note-0.txt", (mode, docs)
    assert len(retriever.invoke("octopus")) == 4 and retriever.k == 4 and retriever.mode == "dense"
