"""What `ingest serve` keeps warm: one open Searcher (the search face of `ingest search`), its query model
loaded once, and the embeddings pool of the collection's model and backend.

NOTE (the store, its absence, and --watch):
- The Searcher is opened on the first request that needs it (and at start, to load the models early) and kept.
  A store error while opening or searching answers 503 with its one line and drops the Searcher; the next
  request opens it again, so a store that went away is answered again once it is back (a server store's
  own calls retry within [store] timeout_s first: the reconnect protocol, ingest/store/errors.py NOTE).
- Without --watch, an embedded store is held as `ingest search` holds it (Milvus Lite: its flock, or, when a
  run or `ingest watch` holds it, read through that process's Lite host).
- With --watch, watch's pipeline owns the store; the Searcher must never take a Milvus Lite flock before it
  (the sync would wait for it forever), so it opens only once watch's Lite host serves the store (before:
  503, "watch is opening the store") and then reads through that host while syncs write. A sync's end
  drops the cards read so far (`synced`): changed files' cards are read anew.
- One search at a time (the query model has one inference request): `lock` is waited for at most
  BUSY_S, then 503. The embeddings pool is started once, with the model the collection records; a
  collection re-embedded with another model since gets a new pool on the next open.
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Any

from ingest.api import EncodePool
from ingest.model_ref import resolve_model
from ingest.search import DEFAULT_MODE, QueryEncoder, Searcher
from ingest.serve_batch import Batcher, Tokenizer
from ingest.serve_metrics import Metrics
from ingest.status import collect
from ingest.store import StoreError, kind, local_path, redact
from ingest.store.lite_host import serving

BUSY_S = 30.0       # a search waits this long for the one before it, then 503
_RERUN = re.compile(r"then rerun(?:: the rerun resumes)?")


class Unavailable(Exception):
    """The store or the model cannot answer now (503); the message is one line, no password in it."""


@dataclass(frozen=True)
class Embedder:
    """The embeddings endpoint's model: its names, dimension, tokenizer and batcher."""
    name: str
    aliases: frozenset[str]
    dim: int
    tokenize: Tokenizer
    batcher: Batcher


class State:
    """The server's warm face (NOTE); every method is safe from any thread."""

    def __init__(self, cfg: dict[str, Any], model: str | None, watching: bool, metrics: Metrics):
        self.cfg, self.model, self.watching, self.metrics = cfg, model, watching, metrics
        self.uri, self.collection = cfg["store"]["uri"], cfg["store"]["collection"]
        self.timeout_s = float(cfg["store"]["timeout_s"])     # every store call within it (a stalled store: 503)
        self._secret = _password(self.uri)
        self.lock = threading.Lock()
        self._searcher: Searcher | None = None
        self._encoder: QueryEncoder | None = None
        self._embedder: Embedder | None = None
        self._pool: EncodePool | None = None
        self._embed_lock = threading.Lock()

    def scrub(self, text: str) -> str:
        """`text` with the store's password (and any URI's) replaced by ***, and a run's advice ("then rerun: the
        rerun resumes", the store layer's wording) as a client's: try again."""
        text = _RERUN.sub("then try again", redact(text))
        return text.replace(self._secret, "***") if self._secret else text

    def warm(self) -> None:
        """Open the store and load both models now (start); what cannot be opened yet is left to requests."""
        try:
            self.embedder()
        except Unavailable:
            pass

    def search(self, query: str, k: int, mode: str | None) -> dict[str, Any]:
        """{"hits": `ingest search --json`'s hits, "mode": the mode used, "note" when it differs}; Unavailable."""
        if not self.lock.acquire(timeout=BUSY_S):
            raise Unavailable(f"the server is busy: a search did not start within {BUSY_S:g} s; try again")
        try:
            searcher = self._open()
            try:
                used, note = searcher.mode(mode or DEFAULT_MODE)
            except StoreError as exc:
                raise Unavailable(self.scrub(str(exc))) from None
            try:
                hits = searcher.search([query], k, used)[0]
            except StoreError as exc:
                self._drop()
                raise Unavailable(self.scrub(str(exc))) from None
        finally:
            self.lock.release()
        return {"hits": hits, "mode": used, **({"note": self.scrub(note)} if note else {})}

    def ready_embedder(self) -> Embedder | None:
        """The embedder, when it is up for the open searcher's model: no wait, no store call (a request's fast
        path; None: ask `embedder` in a worker thread)."""
        searcher, embedder = self._searcher, self._embedder
        if searcher is None or embedder is None or embedder.name != str(searcher.encoder.model):
            return None
        return embedder

    def embedder(self) -> Embedder:
        """The embeddings model of the collection, its pool started once (NOTE); Unavailable."""
        if not self.lock.acquire(timeout=BUSY_S):
            raise Unavailable(f"the server is busy: the store did not open within {BUSY_S:g} s; try again")
        try:
            searcher = self._open()
            name, backend = searcher.encoder.model, searcher.backend
        finally:
            self.lock.release()
        if searcher.empty:
            raise Unavailable(f"collection {self.collection!r} is empty: no model is recorded yet; ingest a folder "
                              "into it first")
        if backend in ("null", "stub"):
            raise Unavailable(f"collection {self.collection!r} was made with the {backend} backend (constant vectors, "
                              "a measurement): no model to embed with")
        with self._embed_lock:
            if self._embedder is None or self._embedder.name != str(name):
                self._embedder = self._start_embedder(str(name), backend)
            return self._embedder

    def _start_embedder(self, name: str, backend: str) -> Embedder:
        if self._embedder is not None:
            self._close_embedder()
        ref = resolve_model(name)
        m = self.cfg["model"]
        self._pool = EncodePool(ref, devices=m["devices"], backend=backend, normalize_embeddings=True,
                                pretokenized=True, timeout_s=m["timeout_s"], max_attempts=m["max_attempts"],
                                dtype=None if m["dtype"] == "auto" else m["dtype"])
        aliases = frozenset({name, ref.name, name.rsplit("/", 1)[-1], os.path.basename(ref.path.rstrip("/"))})
        return Embedder(name, aliases, ref.dim, Tokenizer(ref.tokenizer_file, ref.max_seq_length),
                        Batcher(self._pool, m["timeout_s"] + 30, self.metrics.batch))

    def _open(self) -> Searcher:
        """The open Searcher, opened now if need be (caller holds `lock`); Unavailable with why not."""
        if self._searcher is not None:
            return self._searcher
        if self.watching and kind(self.uri) == "milvus-lite" and serving(local_path(self.uri)) is None:
            raise Unavailable("watch is opening the store (its first sync is starting); try again in a moment")
        try:
            searcher = Searcher(self.uri, self.collection, self.model, timeout_s=self.timeout_s)
        except StoreError as exc:
            raise Unavailable(self.scrub(str(exc))) from None
        enc = self._encoder
        if enc is not None and (str(enc.model), enc.backend) == (str(searcher.encoder.model), searcher.encoder.backend):
            searcher.encoder = enc
        elif not searcher.empty and searcher.backend not in ("null", "stub"):
            searcher.encoder.embed(["warm"])              # the query model loads now, once
            self._encoder = searcher.encoder
        self._searcher = searcher
        return searcher

    def _drop(self) -> None:
        searcher, self._searcher = self._searcher, None
        if searcher is not None:
            try:
                searcher.close()
            except Exception:                              # a store gone: its client may fail to close
                pass

    def status(self) -> dict[str, Any]:
        """What `ingest status --json` prints; Unavailable (store absent, unreachable)."""
        try:
            return collect(self.cfg, cards=True)
        except StoreError as exc:
            raise Unavailable(self.scrub(str(exc))) from None

    def health(self) -> dict[str, Any]:
        """Never blocks: whether search and embeddings are ready."""
        embedder = self._embedder
        return {"status": "ok", "search": "ready" if self._searcher is not None else "not open",
                "embeddings": "ready" if embedder is not None else "not started", "watching": self.watching}

    def synced(self, totals: dict[str, Any]) -> None:
        """A --watch sync ended (its report's totals): count it; the cards read so far are dropped (NOTE)."""
        self.metrics.synced(totals)
        with self.lock:
            if self._searcher is not None:
                self._searcher.forget_cards()

    def close(self) -> None:
        """Stop the batcher and the pool, close the store (the server has stopped taking requests)."""
        self._close_embedder()
        if self.lock.acquire(timeout=BUSY_S):
            try:
                self._drop()
            finally:
                self.lock.release()

    def _close_embedder(self) -> None:
        if self._embedder is not None:
            self._embedder.batcher.close()
        if self._pool is not None:
            self._pool.close()
        self._embedder, self._pool = None, None


def _password(uri: str) -> str:
    """The password in `uri` (user:password@), or ""."""
    from urllib.parse import urlsplit

    try:
        return urlsplit(uri).password or ""
    except ValueError:
        return ""
