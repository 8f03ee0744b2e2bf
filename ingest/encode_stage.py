"""The writer thread of `ingest run`: the encode feed -> EncodePool -> Writer.

Files arrive on `feed` in file order (None ends it). Files without chunks go straight to the
writer; the rest go through the encode pool, which returns groups in input order, so rows
are written in file order, then chunk order. The pool is started in the background when the
first file is sent to a loader, so its start-up overlaps loading, and never on a rerun that
has nothing to encode.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from itertools import chain
from typing import Any, Iterator

import numpy as np

from ingest.model_ref import ModelRef
from ingest.writer import Writer

GROUP_CHUNKS = 256          # a big file is encoded in parts, so memory stays flat
INTERRUPTED = "interrupted before it was written; rerun to ingest it"


class EncodeStage:
    def __init__(self, model: ModelRef, settings: dict[str, Any], writer: Writer, events: queue.Queue,
                 stopping: threading.Event):
        self.model, self.settings, self.writer = model, settings, writer
        self.events, self.stopping = events, stopping
        self.feed: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        self.stats: dict[str, float] = {}
        self._pool: Future | None = None

    def start_pool(self) -> None:
        """Start the EncodePool in the background (idempotent)."""
        if self._pool is not None:
            return
        self._pool = Future()
        m = self.settings

        def make() -> None:
            try:
                from ingest.api import EncodePool

                self._pool.set_result(EncodePool(
                    self.model, devices=m["devices"], batch_size=m["batch_size"],
                    dtype=None if m["dtype"] == "auto" else m["dtype"], tokenizer_workers=m["tokenizer_workers"],
                    timeout_s=m["timeout_s"], max_attempts=m["max_attempts"]))
            except BaseException as exc:
                self._pool.set_exception(exc)
        threading.Thread(target=make, name="ingest-encoder-start", daemon=True).start()

    def run(self) -> None:
        """Thread target. Any error reaches the supervisor as a ("writer_error", None, exc) event."""
        empty = np.zeros((0, 0), dtype=np.float32)
        try:
            groups = self._groups()
            for key, texts in groups:
                if texts:
                    pool = self._pool.result()
                    for (job, start, part, last), vectors in pool.encode_groups(chain([(key, texts)], groups)):
                        self.writer.add(job, start, part, vectors, last)
                    self.stats = dict(pool.stats)
                    break
                self.writer.add(*key[:3], empty, key[3])
            self.writer.flush()
        except BaseException as exc:
            self.events.put(("writer_error", None, exc))

    def close(self) -> None:
        self.closed.set()
        if self._pool is not None:
            try:
                self._pool.result().close()
            except BaseException:
                pass

    def _groups(self) -> Iterator[tuple[tuple, list[str]]]:
        """(key, texts) per part of each file, in file order; the get times out to notice a closed run."""
        while not self.closed.is_set():
            try:
                job = self.feed.get(timeout=0.5)
            except queue.Empty:
                continue
            if job is None:
                return
            if self.stopping.is_set() and job.status == "ingested":
                job.finish("failed", INTERRUPTED)
                job.record = False
            items = job.chunk_texts() if job.status == "ingested" else []
            if not items:
                yield (job, 0, [], True), []
            for start in range(0, len(items), GROUP_CHUNKS):
                part = items[start:start + GROUP_CHUNKS]
                yield (job, start, part, start + GROUP_CHUNKS >= len(items)), [t for _, t in part]
