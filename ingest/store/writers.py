"""The writer processes: batches of rows -> one column-wise upsert each, off the supervisor's GIL.

A `Batch` is a few `Segment`s (consecutive chunks of one file, their vectors as one float32
array): the supervisor only slices what the encoder gave it. The writer process makes the
ids, the columns and the protobuf request (`Store.upsert_columns`) and answers with a value:
`Ack`, `Refused` (the store refused these rows: the writer retries them file by file) or
`Unreachable` (the run stops). Each process opens its own client to the store's `Endpoint` on
its first batch (never carried across a fork); the pool (`ingest.workers.pool`, spawn) adds the
timeout, one resubmit of a batch whose process died, and Failure values.
"""
from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable

import numpy as np

from ingest.store.base import Capabilities, Endpoint, StoreBase, StoreError, StoreRejected
from ingest.store.rows import Row, Rows, search_text
from ingest.store.schema import Columns
from ingest.store.factory import store_at
from ingest.workers.pool import Pools

POOL = "writer"
CORES_PER_WRITER = 4        # "auto" [store] writers: one process per 4 cores, 1 to MOST_WRITERS (bench/stores.py)
MOST_WRITERS = 8
After = tuple[Callable[[Any, bytes, np.ndarray], Any], Any]     # upsert's work after the write: (fn, arg)


def chunk_id(source: str, file_hash: str, index: int, text: str) -> str:
    """Deterministic primary key: re-runs upsert the same ids, never duplicates; a new version of a file
    never overwrites a row of the old one (which stays whole until the new one is complete)."""
    return hashlib.blake2b(f"{source}\x00{file_hash}\x00{index}\x00{text}".encode(), digest_size=16).hexdigest()


NO_KEY = bytes(16)          # a row without a key (Segment.keys)


@dataclass(frozen=True, eq=False)
class Segment:
    """Chunks [start, start + len(chunks)) of one file, with their vectors (float32, one row each) and, when a
    step gave them keys for its work after the write (`upsert`'s `after`), 16 bytes a row (NO_KEY: none)."""
    source: str
    fmt: str
    file_hash: str
    start: int
    chunks: Rows
    vectors: np.ndarray
    keys: bytes = b""

    def __reduce__(self) -> tuple:
        """Pickled by its rows' columns (their repeated strings once each), and the vectors as bytes (an
        ndarray's own pickling costs ~13 us, as much as 16 rows): the supervisor sends every row to a writer
        process."""
        v = self.vectors
        return _segment, (self.source, self.fmt, self.file_hash, self.start, self.chunks.columns,
                          (v.tobytes(), v.shape, v.dtype.str), self.keys)

    def cut(self, n: int) -> tuple[Segment, Segment]:
        """The first n chunks, and the rest."""
        k = self.keys
        head = Segment(self.source, self.fmt, self.file_hash, self.start, self.chunks[:n], self.vectors[:n],
                       k[:16 * n])
        tail = Segment(self.source, self.fmt, self.file_hash, self.start + n, self.chunks[n:], self.vectors[n:],
                       k[16 * n:])
        return head, tail


def _batch(heads: tuple[tuple[str, str, str, int, int], ...], columns: tuple[list, ...], vectors: bytes, dtype: str,
           tail: tuple[int, ...], keys: bytes = b"") -> Batch:
    """A Batch from its pickled columns, vectors and keys (Batch.__reduce__)."""
    rows, array = Rows(columns), np.frombuffer(vectors, dtype=dtype).reshape(-1, *tail)
    segments, at = [], 0
    for source, fmt, file_hash, start, n in heads:
        segments.append(Segment(source, fmt, file_hash, start, rows[at:at + n], array[at:at + n],
                                keys[16 * at:16 * (at + n)]))
        at += n
    return Batch(tuple(segments))


def _segment(source: str, fmt: str, file_hash: str, start: int, columns: tuple[tuple, ...],
             vectors: tuple[bytes, tuple[int, ...], str], keys: bytes = b"") -> Segment:
    """A Segment from its pickled columns and vectors (Segment.__reduce__)."""
    data, shape, dtype = vectors
    return Segment(source, fmt, file_hash, start, Rows(columns),
                   np.frombuffer(data, dtype=dtype).reshape(shape), keys)


@dataclass(frozen=True, eq=False)
class Batch:
    segments: tuple[Segment, ...]

    def __reduce__(self) -> tuple:
        """Pickled as one set of columns for all its segments (each one's source, format, hash, start and row
        count beside them) and one bytes of vectors: a batch holds ~32 small files' segments, and pickled one
        by one they cost the supervisor's sending thread a list a column, a bytes and a tuple each, a file."""
        segs = self.segments
        kinds = {(s.vectors.dtype.str, s.vectors.shape[1:]) for s in segs}
        dtype, tail = next(iter(kinds)) if len(kinds) == 1 else ("", ())
        if not tail or not all(tail) or not all(len(s.chunks) for s in segs):
            return Batch, (segs,)                  # mixed or empty vectors: segment by segment
        heads = tuple((s.source, s.fmt, s.file_hash, s.start, len(s.chunks)) for s in segs)
        columns = tuple(list(chain.from_iterable(s.chunks.columns[k] for s in segs)) for k in range(len(Row._fields)))
        vectors = b"".join(np.ascontiguousarray(s.vectors).data for s in segs)
        return _batch, (heads, columns, vectors, dtype, tail, self.keys())

    @property
    def rows(self) -> int:
        return sum(len(s.chunks) for s in self.segments)

    def keys(self) -> bytes:
        """Its rows' keys, 16 bytes a row (NO_KEY for a segment's rows without); b"" where none has a key."""
        segs = self.segments
        if not any(s.keys for s in segs):
            return b""
        return b"".join(s.keys or NO_KEY * len(s.chunks) for s in segs)

    @property
    def sources(self) -> set[str]:
        return {s.source for s in self.segments}

    def by_source(self) -> list[Batch]:
        """One batch per file, for a retry that charges a refusal to the file it belongs to."""
        out: dict[str, list[Segment]] = {}
        for s in self.segments:
            out.setdefault(s.source, []).append(s)
        return [Batch(tuple(segments)) for segments in out.values()]

    def columns(self) -> Columns:
        ids, texts, sources, pages, chunks, formats, hashes = [], [], [], [], [], [], []
        titles, headings, elements, bboxes, search = [], [], [], [], []
        for s in self.segments:
            n = len(s.chunks)
            for i, row in enumerate(s.chunks, s.start):
                ids.append(chunk_id(s.source, s.file_hash, i, row.text))
                texts.append(row.text)
                pages.append(row.page or 0)
                titles.append(row.title)
                headings.append(row.headings)
                elements.append(row.element)
                bboxes.append(row.bbox)
                search.append(search_text(row))
            chunks.extend(range(s.start, s.start + n))
            sources.extend([s.source] * n)
            formats.extend([s.fmt] * n)
            hashes.extend([s.file_hash] * n)
        vectors = np.concatenate([s.vectors for s in self.segments]) if len(self.segments) > 1 \
            else self.segments[0].vectors
        return Columns(ids, vectors, texts, sources, pages, chunks, formats, hashes, titles, headings, elements,
                       bboxes, search)


class Batcher:
    """Segments in, batches of exactly `rows` rows out; what is left waits for more, or for `rest()`."""

    def __init__(self, rows: int):
        self.rows = rows
        self.queued: list[Segment] = []
        self.queued_rows = 0

    def add(self, segment: Segment) -> list[Batch]:
        """Queue `segment`: the batches it fills."""
        full = []
        while self.queued_rows + len(segment.chunks) >= self.rows:
            head, segment = segment.cut(self.rows - self.queued_rows)
            full.append(Batch(tuple(self.queued + [head])))
            self.queued, self.queued_rows = [], 0
        if segment.chunks:
            self.queued.append(segment)
            self.queued_rows += len(segment.chunks)
        return full

    def rest(self) -> Batch | None:
        """The queued rows as one last batch (None if none), and the queue emptied."""
        batch = Batch(tuple(self.queued)) if self.queued else None
        self.queued, self.queued_rows = [], 0
        return batch

    def drop(self, source: str) -> None:
        """Forget the queued rows of `source` (its file failed)."""
        self.queued = [s for s in self.queued if s.source != source]
        self.queued_rows = sum(len(s.chunks) for s in self.queued)


@dataclass(frozen=True)
class Ack:
    rows: int


@dataclass(frozen=True)
class Refused:
    error: str          # one line: the store refused these rows


@dataclass(frozen=True)
class Unreachable:
    error: str          # one line: the store did not answer (the run stops)


_endpoint: Endpoint | None = None
_store: StoreBase | None = None


def _init(endpoint: Endpoint) -> None:
    global _endpoint
    _endpoint = endpoint


def write(task: tuple[Batch, After | None]) -> Ack | Refused | Unreachable:
    """In a writer process: upsert the batch's rows, then its `after` work on them (`upsert`)."""
    global _store
    if _store is None:
        _store = store_at(_endpoint)
    return upsert(_store, *task)


def upsert(store: StoreBase, batch: Batch, after: After | None = None) -> Ack | Refused | Unreachable:
    """Upsert the batch's rows: the store's answer as a value. Once stored, `after` = (fn, arg): fn(arg, the
    rows' keys, their vectors) where a row has a key (a step's side work on the rows written, such as the
    vector cache; it must not raise, and its answer is not waited for beyond this call)."""
    try:
        store.upsert_columns(batch.columns())
    except StoreRejected as exc:
        return Refused(str(exc))
    except StoreError as exc:
        return Unreachable(str(exc))
    if after is not None and (keys := batch.keys()):
        segs = batch.segments
        after[0](after[1], keys, np.concatenate([s.vectors for s in segs]) if len(segs) > 1 else segs[0].vectors)
    return Ack(batch.rows)


def task_timeout(store_timeout_s: float) -> float:
    """A batch's time limit in its writer process: connect, upsert, and a ping after a failure, each within
    the store's timeout, and the process's start."""
    return 3 * store_timeout_s + 30


def answer_within(store_timeout_s: float) -> float:
    """Seconds within which a batch's Future resolves: its time limit twice (a resubmit after its process
    died), each with pebble's 3 s from SIGTERM to SIGKILL."""
    return 2 * (task_timeout(store_timeout_s) + 5)


def writer_processes(setting: int | str, caps: Capabilities, cores: int) -> int:
    """[store] writers for a store: its own limit where it has one (Milvus Lite, Qdrant's local mode: 1), else
    the number set, else ("auto") one per CORES_PER_WRITER cores, 1 to MOST_WRITERS, for a store that takes
    several (`Capabilities.parallel`; else 1)."""
    if caps.writers:
        return caps.writers
    if setting != "auto":
        return max(1, int(setting))
    return max(1, min(MOST_WRITERS, cores // CORES_PER_WRITER)) if caps.parallel else 1


class WriterPool:
    """`processes` writer processes for the store at `endpoint`, started on the first batch. They are
    shielded: a SIGINT or SIGTERM to the whole group leaves them to the run, which still writes what is
    encoded (workers/spawn.py NOTE)."""

    def __init__(self, endpoint: Endpoint, processes: int):
        self._pools = Pools({POOL: processes}, {POOL: task_timeout(endpoint.timeout_s)}, _init, (endpoint,),
                            shielded=True)

    def submit(self, batch: Batch, after: After | None = None) -> Future:
        """A Future of Ack, Refused, Unreachable, or a Failure (timeout; the process died twice); `after`:
        `upsert`'s."""
        return self._pools.submit(POOL, write, (batch, after))

    def stop(self) -> None:
        self._pools.stop()


class InlineWriter:
    """WriterPool's face for a store that no other process may open (`Capabilities.hosted` false: Qdrant's
    local mode): one thread of the run upserts the batches, in order, with the run's own client. Each call
    has the store's timeout; a batch cannot be resubmitted elsewhere."""

    def __init__(self, store: StoreBase):
        self._store = store
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ingest-write")

    def submit(self, batch: Batch, after: After | None = None) -> Future:
        """A Future of Ack, Refused or Unreachable."""
        return self._thread.submit(upsert, self._store, batch, after)

    def stop(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
