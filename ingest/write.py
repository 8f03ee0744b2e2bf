"""The write step: one writer, rows in file order, then chunk order; store first, then manifest.

NOTE (write protocol): rows of finished files are upserted in batches of
[store] batch_size, then the store is flushed, then stale rows of changed files are deleted
(`file_hash != new`, so a changed file is never missing from the store), and only then are
the files' manifest entries committed in one SQLite transaction. A crash at any point
leaves either the old entry (the file is redone next run; upserts are idempotent because
ids are deterministic) or the new one with every row already durable.
"""
from __future__ import annotations

import hashlib
import threading
import time
from typing import Callable

import numpy as np

from ingest.manifest import Entry, Manifest
from ingest.files import Finished
from ingest.store import Store

FLUSH_EVERY_S = 2.0


def chunk_id(source: str, index: int, text: str) -> str:
    """Deterministic primary key: re-runs upsert the same ids, never duplicates."""
    return hashlib.blake2b(f"{source}\x00{index}\x00{text}".encode(), digest_size=16).hexdigest()


class Writer:
    def __init__(self, store: Store, manifest: Manifest, model: str, settings: str, batch_rows: int,
                 batch_files: int, on_written: Callable[[Finished], None]):
        self.store, self.manifest = store, manifest
        self.model, self.settings, self.batch_rows = model, settings, batch_rows
        self.batch_files = batch_files       # half the dispatcher's window: files must not wait on rows
        self.on_written = on_written
        self.rows: list[dict] = []
        self.files: list[Finished] = []
        self.last_flush = time.monotonic()
        self.seconds = 0.0
        self.rows_written = 0
        self._collection_ready = False
        self._lock = threading.RLock()       # add() runs in the writer thread, flush_if_due() in the main loop

    def add(self, file: Finished, start: int, texts: list[tuple[int | None, str]], vectors: np.ndarray,
            last: bool) -> None:
        """Queue rows for chunks [start, start+len) of `file`; `last` marks the file's final part."""
        with self._lock:
            self._add(file, start, texts, vectors, last)

    def _add(self, file: Finished, start: int, texts: list[tuple[int | None, str]], vectors: np.ndarray,
             last: bool) -> None:
        ref = file.ref
        for i, ((page, text), vec) in enumerate(zip(texts, vectors), start):
            self.rows.append({"id": chunk_id(ref.source, i, text), "vector": vec.tolist(), "text": text,
                              "source": ref.source, "page": page or 0, "chunk": i, "format": ref.fmt,
                              "file_hash": ref.file_hash})
        if vectors.shape[0] and not self._collection_ready:
            self.store.ensure_collection(self.model, int(vectors.shape[1]))
            self._collection_ready = True
        if last:
            self.files.append(file)
        if (len(self.rows) >= self.batch_rows or len(self.files) >= self.batch_files
                or time.monotonic() - self.last_flush > FLUSH_EVERY_S):
            self.flush()

    def flush_if_due(self) -> None:
        """Flush what waits if the last flush is FLUSH_EVERY_S old: files must not wait for a next add()."""
        with self._lock:
            if (self.rows or self.files) and time.monotonic() - self.last_flush > FLUSH_EVERY_S:
                self.flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        start = time.perf_counter()
        if self.rows:
            for i in range(0, len(self.rows), self.batch_rows):
                self.store.upsert(self.rows[i:i + self.batch_rows])
            self.store.flush()
        done = self.files
        for f in done:
            if f.outcome.status == "ingested" and f.old_hash and f.old_hash != f.ref.file_hash:
                self.store.delete_stale(f.ref.source, f.ref.file_hash)
        entries = [Entry(f.ref.source, f.ref.size, f.ref.mtime_ns, f.ref.file_hash, "ingested", f.outcome.chunks,
                         f.ref.fmt, self.settings) for f in done if f.record]
        if entries:
            self.manifest.record(entries)
        self.rows_written += len(self.rows)
        self.rows, self.files = [], []
        self.last_flush = time.monotonic()
        self.seconds += time.perf_counter() - start
        for f in done:
            self.on_written(f)
