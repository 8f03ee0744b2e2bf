"""The write step: one writer, rows in file order, then chunk order; store first, then manifest.

NOTE (write protocol): rows of finished files are upserted in batches of
[store] batch_size, then the store is flushed, then stale rows of changed files are deleted
(`file_hash != new`, so a changed file is never missing from the store) and the deletes
flushed, and only then are the files' manifest entries committed. A crash at any point
leaves either the old entry (the file is redone next run; upserts are idempotent because
ids are deterministic) or the new one with every row already durable.

NOTE (failures): a failure belongs to one file. A batch the store refuses (StoreRejected)
is retried file by file, and only the files whose own rows are refused fail; a file whose
chunks could not be encoded fails through `fail()`. A failed file's queued rows are
dropped; if some of its rows were already stored (a big file is written in parts), all
its rows and its manifest entry are removed, so the next run redoes it from scratch (so are
those of a file that is skipped now but was ingested before: emptied, or a link now leading
outside the folder). A
StoreError that is not a refusal (server gone, timeout) propagates and stops the run.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from ingest.files import Finished, Outcome
from ingest.manifest import Entry, Manifest
from ingest.store import Store, StoreRejected

FLUSH_EVERY_S = 2.0


def chunk_id(source: str, index: int, text: str) -> str:
    """Deterministic primary key: re-runs upsert the same ids, never duplicates."""
    return hashlib.blake2b(f"{source}\x00{index}\x00{text}".encode(), digest_size=16).hexdigest()


class Writer:
    def __init__(self, store: Store, manifest: Manifest, model: str, settings: str, batch_rows: int,
                 batch_files: int, on_written: Callable[[Finished], None], backend: str):
        self.store, self.manifest = store, manifest
        self.model, self.settings, self.batch_rows, self.backend = model, settings, batch_rows, backend
        self.batch_files = batch_files       # half the dispatcher's window: files must not wait on rows
        self.on_written = on_written
        self.rows: list[dict] = []
        self.files: list[Finished] = []
        self.last_flush = time.monotonic()
        self.seconds = 0.0
        self.rows_written = 0
        self._failed: dict[str, str] = {}    # source -> error, for files failed while being written
        self._partial: set[str] = set()      # sources with rows stored by an earlier flush, last part pending
        self._collection_ready = False
        self._lock = threading.RLock()       # add() runs in the writer thread, flush_if_due() in the main loop

    def add(self, file: Finished, start: int, texts: list[tuple[int | None, str]], vectors: np.ndarray,
            last: bool) -> None:
        """Queue rows for chunks [start, start+len) of `file`; `last` marks the file's final part."""
        with self._lock:
            ref = file.ref
            if ref.source not in self._failed:
                for i, ((page, text), vec) in enumerate(zip(texts, vectors), start):
                    self.rows.append({"id": chunk_id(ref.source, i, text), "vector": vec.tolist(), "text": text,
                                      "source": ref.source, "page": page or 0, "chunk": i, "format": ref.fmt,
                                      "file_hash": ref.file_hash})
                if vectors.shape[0] and not self._collection_ready:
                    self.store.ensure_collection(self.model, int(vectors.shape[1]), self.backend)
                    self._collection_ready = True
            if last:
                self.files.append(file)
            if (len(self.rows) >= self.batch_rows or len(self.files) >= self.batch_files
                    or time.monotonic() - self.last_flush > FLUSH_EVERY_S):
                self._flush()

    def fail(self, file: Finished, error: str) -> None:
        """`file` fails while being written (its chunks could not be encoded): drop its rows."""
        with self._lock:
            self._fail(file.ref.source, error)

    def flush_if_due(self) -> None:
        """Flush what waits if the last flush is FLUSH_EVERY_S old: files must not wait for a next add()."""
        with self._lock:
            if (self.rows or self.files) and time.monotonic() - self.last_flush > FLUSH_EVERY_S:
                self._flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _fail(self, source: str, error: str) -> None:
        self._failed.setdefault(source, error)
        self.rows = [r for r in self.rows if r["source"] != source]

    def _upsert(self) -> None:
        """Store the queued rows; a refused batch is retried file by file (see NOTE)."""
        for i in range(0, len(self.rows), self.batch_rows):
            batch = self.rows[i:i + self.batch_rows]
            try:
                self.store.upsert(batch)
                self._stored(batch)
            except StoreRejected:
                by_source: dict[str, list[dict]] = {}
                for row in batch:
                    by_source.setdefault(row["source"], []).append(row)
                for source, rows in by_source.items():
                    try:
                        self.store.upsert(rows)
                        self._stored(rows)
                    except StoreRejected as exc:
                        self._failed.setdefault(source, str(exc))

    def _stored(self, rows: list[dict]) -> None:
        self.rows_written += len(rows)
        self._partial.update(r["source"] for r in rows)

    def _flush(self) -> None:
        start = time.perf_counter()
        if self.rows:
            self._upsert()
            self.store.flush()
        failed_here = {f.ref.source for f in self.files if f.ref.source in self._failed}
        done = [self._settle(f) for f in self.files]
        removed = [f.ref.source for f in done
                   if f.drop or (f.ref.source in failed_here and f.ref.source in self._partial)]
        changed = [f for f in done if f.outcome.status == "ingested" and f.old_hash and f.old_hash != f.ref.file_hash]
        for f in changed:
            self.store.delete_stale(f.ref.source, f.ref.file_hash)
        for source in removed:
            self.store.delete_source(source)
        if changed or removed:
            self.store.flush()
        self._partial -= {f.ref.source for f in done}
        entries = [Entry(f.ref.source, f.ref.size, f.ref.mtime_ns, f.ref.file_hash, "ingested", f.outcome.chunks,
                         f.ref.fmt, self.settings) for f in done if f.record]
        if entries:
            self.manifest.record(entries)
        if removed:
            self.manifest.remove(removed)
        self.rows, self.files = [], []
        self.last_flush = time.monotonic()
        self.seconds += time.perf_counter() - start
        for f in done:
            self.on_written(f)

    def _settle(self, file: Finished) -> Finished:
        """The file as it ends: failed if it failed while being written."""
        error = self._failed.pop(file.ref.source, None)
        if error is None:
            return file
        outcome = Outcome("failed", error, ocr_pages=file.outcome.ocr_pages, warnings=file.outcome.warnings,
                          seconds=file.outcome.seconds)
        return replace(file, outcome=outcome, pages=(), record=False)
