"""`ingest search`: dense (the query embedded with the collection's own model and backend, COSINE),
BM25 (Milvus' full-text search on each chunk's context line and text) or hybrid (both lists fused by
reciprocal rank). The words of a bm25 or hybrid query have their CJK runs rewritten as bigrams, as each
chunk's search_text has (ingest/store/cjk.py NOTE).

ONNX and OpenVINO collections embed the query in this process with their own export and runtime:
no torch, no sentence-transformers, so a search answers in about a second. A torch collection uses the ONNX
fp32 export when its guard passed (cosine >= 0.9999 to torch on the probe texts; exported once,
on the first search), else torch itself. A BM25 search embeds nothing. Collections without BM25 (made
before schema 2, or on a Milvus without BM25 functions) answer every mode with dense hits and a note.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import numpy as np

from ingest.backends import BackendError, model_file
from ingest.doc_card import Card
from ingest.doc_rank import CANDIDATES, rerank
from ingest.model_ref import ModelRef, resolve_model
from ingest.store import MODES, StoreError, local_path
from ingest.store.base import SCHEMA_VERSION, Endpoint
from ingest.store.cjk import bigrams
from ingest.store.lite_host import serving
from ingest.store.factory import open_store, store_at
from ingest.store.uri import kind
from ingest.store.lite_folder import foreign_folder
from ingest.store.manifest import CARD_META, manifest_path, read_cards

DEFAULT_MODE = "dense"      # measured best on the retrieval dev set (docs/retrieval.md)
QUERY_BATCH = 64          # queries embedded per batch (eval)
TAIL_ROWS = 1000          # rows read to find a source by its tail (`Searcher.missing`)


class QueryEncoder:
    """Embeds queries as `backend` embeds chunks (normalized float32 rows); the model is resolved and
    loaded on first use and kept, so many queries cost one load (and a BM25 search none)."""

    def __init__(self, model: str | ModelRef, backend: str):
        self.model, self.backend = model, backend
        self._embed = None

    def embed(self, queries: Sequence[str]) -> np.ndarray:
        if self._embed is None:
            self._embed = self._load()
        parts = [self._embed(list(queries[i:i + QUERY_BATCH])) for i in range(0, len(queries), QUERY_BATCH)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def _load(self):
        ref = self.model if isinstance(self.model, ModelRef) else resolve_model(self.model)
        path = model_file(ref, self.backend) if self.backend != "torch" else _fp32_if_exact(ref)
        if path:
            from ingest.workers.encode.onnx_model import OnnxModel, one_row_for, runtime_for, tokenize

            model = OnnxModel(path, threads=os.cpu_count() or 1, runtime=runtime_for(self.backend),
                              one_row=one_row_for(self.backend))
            return lambda texts: model.embed(*tokenize(ref.tokenizer_file, ref.max_seq_length, texts), normalize=True)
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        st = SentenceTransformer(ref.path, device="cpu")
        return lambda texts: st.encode(texts, normalize_embeddings=True)


def embed_query(ref: ModelRef, backend: str, query: str) -> np.ndarray:
    """The normalized embedding of `query` as `backend` makes it (float32, dim)."""
    return QueryEncoder(ref, backend).embed([query])[0]


class Searcher:
    """An open collection to search (a context manager): checked to exist and be ingest's. A Milvus Lite
    path that does not exist is a StoreError (one line), and nothing is created. A collection ingest opened
    but wrote no row into yet (a run creates it in Milvus with its first rows: its manifest alone exists) is
    `empty`: every search answers no hits, and `mode` says why."""

    def __init__(self, uri: str, collection: str, model: str | None = None, encoder: QueryEncoder | None = None,
                 timeout_s: float = 60.0):
        if (path := local_path(uri)) is not None and not path.exists():
            raise StoreError(f"no store at {uri}; ingest a folder into it first: ingest run FOLDER --store {uri}")
        if foreign := foreign_folder(uri):
            raise StoreError(foreign)
        self.store = open_store(uri, collection, timeout_s)          # every store call within [store] timeout_s
        self._cards: dict[str, Card] = {}
        try:
            self._lock_or_share(uri, collection)
            recorded = self.store.recorded()
            if recorded is None and self.store.exists():
                raise StoreError(f"collection {collection!r} in {uri} was not made by ingest; choose another --collection")
            self.empty = recorded is None
            if self.empty and not self.store.has_manifest():
                raise StoreError(f"no collection {collection!r} in {uri}; ingest a folder into it first: "
                                 f"ingest run FOLDER --store {uri} --collection {collection}")
            self.backend = recorded[2] if recorded else ""
            self.schema, self.bm25 = self.store.schema() if recorded else (SCHEMA_VERSION, True)
            self.encoder = encoder or QueryEncoder(model or (recorded[0] if recorded else "default"), self.backend)
        except BaseException:
            self.store.close()
            raise

    def _lock_or_share(self, uri: str, collection: str) -> None:
        """Own an embedded store for this search; a Milvus Lite store that a run or `ingest watch` holds is
        read through its Lite host instead (ingest/store/lite_host.py NOTE), else its StoreError stands."""
        if self.store.caps.shared_reads:      # LanceDB: readers see the last commit, beside a run
            return
        try:
            self.store.lock()
        except StoreError:
            address = serving(local_path(uri)) if kind(uri) == "milvus-lite" else None
            if address is None:
                raise
            self.store.close()
            self.store = store_at(Endpoint(self.store.uri, address, collection, self.store.timeout_s))

    def mode(self, asked: str) -> tuple[str, str]:
        """(the mode this collection can answer `asked` with, a one-line note when it differs, else "")."""
        if asked not in MODES:
            raise StoreError(f"unknown search mode {asked!r}; use one of {', '.join(MODES)}")
        if self.empty:
            return asked, (f"note: collection {self.store.collection!r} in {self.store.uri} is empty: no file has "
                           "been ingested into it yet (ingest status shows its last run)")
        mode, note = asked, ""
        if asked != "dense" and not self.bm25:
            why = "was made by an older ingest (rerun `ingest run` with --reembed to add BM25)" if self.schema < 2 \
                else "is on a Milvus without BM25 full-text search"
            mode, note = "dense", f"note: collection {self.store.collection!r} {why}: {asked} search answered by dense search"
        if mode != "bm25" and self.backend in ("null", "stub"):
            raise StoreError(f"collection {self.store.collection!r} in {self.store.uri} holds constant vectors of the "
                             f"{self.backend} backend (a measurement): nothing to search densely; use --mode bm25 where the "
                             "collection has BM25, or rerun with --reembed and a real backend")
        return mode, note

    def search(self, queries: Sequence[str], k: int, mode: str, doc_rank: bool = True,
               cards: bool = True, terms: bool = True, statements: bool = True) -> list[list[dict[str, Any]]]:
        """The k best hits of each query, in `mode` (one the collection answers: see `mode`); the
        queries are embedded together, in batches. Dense hits are ranked towards the documents a query
        names (ingest/doc_rank.py) unless `doc_rank` is False: by their cards and file names, or by their
        file names alone when `cards` is False (issue 33's ranking, for measurements), and within them by the
        query's rare words (ingest/term_match.py) unless `terms` is False, and towards the tables of the
        financial statements it names (ingest/statement_match.py) unless `statements` is False."""
        if self.empty:
            return [[] for _ in queries]
        vectors = self.encoder.embed(queries) if mode != "bm25" else [None] * len(queries)
        if mode != "dense" or not doc_rank:      # the words as search_text holds them (ingest/store/cjk.py NOTE)
            return [self.store.search(None if v is None else v.tolist(), k, mode, bigrams(q))
                    for q, v in zip(queries, vectors)]
        wide = max(k, CANDIDATES)
        found = [self.store.search(v.tolist(), wide, mode, q) for q, v in zip(queries, vectors)]
        known = self.cards({h["source"] for hits in found for h in hits}) if cards else {}
        return [rerank(q, hits, k, known, terms, statements) for q, hits in zip(queries, found)]

    def cards(self, sources: set[str]) -> dict[str, Card]:
        """The cards of `sources` (ingest/doc_card.py) from the collection's manifest, read once each: an
        embedded store's SQLite manifest (one read-only query), a server's meta values; {} where none."""
        todo = sources - self._cards.keys()
        if todo:
            if local_path(self.store.uri) is not None:
                got = read_cards(manifest_path(self.store.uri, self.store.collection), sorted(todo))
            else:
                summary = self.store.summary()
                got = {k[len(CARD_META):]: v for k, v in (summary.meta if summary else {}).items()
                       if k.startswith(CARD_META)}
            self._cards.update({s: Card.from_json(got.get(s)) for s in (todo | got.keys())})
        return {s: self._cards[s] for s in sources if s in self._cards}

    def missing(self, sources: Iterable[str]) -> list[str]:
        """Those of `sources` no chunk of the collection comes from (`same_doc`), one query each. The store may
        find a few sources too many (`sources_like`): they are checked here, TAIL_ROWS at most."""
        wanted = sorted(set(sources))
        if self.empty or not wanted:
            return wanted
        return [source for source in wanted
                if not any(same_doc(found, source) for found in self.store.sources_like(source, TAIL_ROWS))]

    def forget_cards(self) -> None:
        """Drop the cards read so far (the manifest changed: `ingest serve --watch` after a sync)."""
        self._cards = {}

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def search(uri: str, collection: str, query: str, k: int, model: str | None = None,
           mode: str = DEFAULT_MODE, doc_rank: bool = True) -> list[dict[str, Any]]:
    """The k best chunks for `query` (see `Store.search` for a hit's fields); a mode the collection
    cannot answer falls back to dense silently (use `Searcher.mode` for the note)."""
    with Searcher(uri, collection, model) as s:
        return s.search([query], k, s.mode(mode)[0], doc_rank)[0]


def same_doc(hit_source: str, source: str) -> bool:
    """Whether a hit's source is the document `source` names: the same path, or one ending in "/" and it."""
    return hit_source == source or hit_source.endswith("/" + source)


def _fp32_if_exact(ref: ModelRef) -> str:
    """The ONNX fp32 file standing in for torch if its guard passed, else "" (export failed: torch)."""
    try:
        return model_file(ref, "onnx")
    except BackendError:
        return ""
