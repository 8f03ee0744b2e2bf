"""The write step: rows in file order, then chunk order, upserted by writer processes; store first, then manifest.

NOTE (write protocol): `add` cuts the encoder's rows into batches of [store] batch_size and
submits each to the writer processes (`ingest.store.writers`: a pool of `writers` processes, one
for a Milvus Lite store, which the run serves from its own host process; a thread of the run for a
store no other process may open, Qdrant's local mode) and goes on; it
waits only when more than MAX_IN_FLIGHT batches per process are unanswered. A file whose
last part was added is `accepted`: the dispatcher may load another (its text now lives in
batches, bounded as above), and joins the open group. Every FLUSH_ROWS rows, FLUSH_FILES files
or FLUSH_EVERY_S (a flush seals a segment, and Milvus Lite then builds its index, so flushing
often costs more than writing) the group is sealed: the rest of its rows is submitted, and its
files go to the committer thread; each batch carries its group's number (a refused batch's
retries keep it). The committer takes every sealed file at once (a slow store makes fewer, larger
commits), waits until every batch of those groups and earlier ones is answered, then, without
the writer's lock (add goes on submitting the next group's batches meanwhile), flushes the
store if any of its files has rows in it, deletes stale rows of changed files (`file_hash !=
new`, so a changed file is never missing from the store; a few calls for all its files,
`Store.delete_stale`) and flushes the deletes, and only then
commits the files' manifest entries, and posts Written for them in file order (one committer,
groups in order). Rows of later groups may reach the store during a commit: they are other
files' (a source is one file of the run), their entries wait for a later commit, and a flush
only makes them durable sooner. Add waits when MAX_SEALED_FILES files wait for the committer,
so memory stays flat. A crash at any point (the whole run SIGKILLed included) leaves either
the old entry (the file is redone next run; upserts are idempotent because ids are
deterministic) or the new one with every row already acknowledged and durable. A writer
process that dies costs a resubmit of its batch to a fresh one (the same ids again). `flush`
(end of input) seals the rest and waits until the committer recorded everything; an error of
the committer (StoreError) is raised by the next add, flush_if_due or flush, and stops the run;
close() stops the committer after the commit under way (waiting up to twice the store's timeout).
Each file's write seconds (its outcome's times): its rows' share of the batches' busy time, charged by
rows as batches are answered, and its share of its commit's time, by chunks.

NOTE (failures): a failure belongs to one file. A batch the store refuses (Refused) is
retried file by file, and only the files whose own rows are refused fail; so does a file
whose own batch's writer died twice. A file whose chunks could not be encoded fails through
`fail()`. A failed file's queued rows are dropped; if some of its rows may be in the store
(acknowledged, or sent by a writer that died), every row of it but the version its manifest
entry names is removed after every batch was answered: the last good copy stays complete and
searchable, the entry stays, and the next run redoes the file (a file without an entry loses
all its rows). Ids include the version's hash, so a new version never overwrites an old one's
rows. A file that is skipped now but was ingested before (emptied, or a link now leading
outside the folder) loses its rows and entry. A store that does not answer (Unreachable:
server gone, timeout) raises StoreError and stops the run.

NOTE (cache): the vector cache's rows (ingest/reuse.py: what the encoder made, what the store gave)
are written by the writer processes, not by the supervisor (an SQLite row of 1.5 KB costs ~25 us
of CPU, more than the supervisor's whole share of a chunk), from the rows they store: `add` takes each
row's cache key (16 bytes; NO_KEY: not to be cached), the batch carries them, and the writer process,
once the store took the batch, puts the keyed rows into the cache (`upsert`'s `after`:
`ingest.vector_cache.put_written`, each process with its own connection; a store no other process may
open: the writer's thread). So a vector crosses to a writer process once, with its row, not a second
time for the cache. The cache is never needed: a put that fails is forgotten, and rows of a file that
fails, or of a run stopped before its batches were sent, are not cached.

NOTE (stops): a run stopped by a full disk or a failed encode (`close(abandon=True)`) removes, after the
committer and the writer processes stopped, the rows it sent of files it will not record (`Ledger.abandon`:
each keeps its entry's version, a new file none), in one commit, as a failed file's are. Best effort: a
store that cannot take it (the disk still full) keeps them, as a SIGKILLed run would, for the next run to
settle (a new file redone by the same ids, a changed one's stale versions deleted). A stop by an unreachable
store does not wait on it again; a signal's stop commits or fails every file it sent (NOTE: failures).

NOTE (fencing): `Ledger.commit` asks the manifest to fence (a server collection: re-read the lease
now) before it deletes a row or writes an entry; a lost lease raises LeaseLost (a StoreError)
and the run stops with nothing deleted or recorded.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Callable

import numpy as np

from ingest.files import Finished, evolve
from ingest.ledger import Ledger
from ingest.store.manifest import Manifest
from ingest.timeline import BusyClock, Timeline, shares
from ingest.vector_cache import VectorCache, put_written
from ingest.store import StoreBase, StoreError
from ingest.workers.failure import Failure
from ingest.store.rows import Rows
from ingest.store.writers import (Ack, After, Batch, Batcher, InlineWriter, Refused, Segment, Unreachable,
                                  WriterPool, answer_within, writer_processes)
from ingest.workers.limits import usable_cores

FLUSH_EVERY_S = 5.0
FLUSH_ROWS = 8192           # Milvus Lite here: 245 us/row flushing every 512 rows, 160 every 1,536 (bench/feed.py)
FLUSH_FILES = 1024          # files per sealed group (their manifest entries, their report lines)
MAX_IN_FLIGHT = 4           # unanswered batches per writer process before add() waits
MAX_SEALED_FILES = 4 * FLUSH_FILES      # files sealed and not yet committed before add() waits


class Writer:
    def __init__(self, store: StoreBase, manifest: Manifest, model: str, settings: str, batch_rows: int,
                 on_accepted: Callable[[tuple[Finished, ...]], None],
                 on_written: Callable[[tuple[Finished, ...]], None], backend: str, writers: int | str = 1,
                 timeline: Timeline | None = None):
        self.store = store
        self.model, self.batch_rows, self.backend = model, batch_rows, backend
        self.on_accepted, self.on_written = on_accepted, on_written
        self.processes = writer_processes(writers, store.caps, usable_cores())    # Milvus Lite: 1
        self.ledger = Ledger(store, manifest, settings)     # ledger.files: the open group
        self.last_flush = time.monotonic()
        timeline = timeline or Timeline()
        self._batches, self._commits = BusyClock(timeline, "write"), BusyClock(timeline, "write")   # busy time
        self._charged = 0.0                  # the batches' busy time already charged to files
        self._write_s: dict[str, float] = {}     # source -> its seconds so far, until its commit
        self.rows_written = 0
        self.first_row_at: float | None = None   # perf_counter of the store's first acknowledged rows
        self._rows_at_flush = 0
        self._batcher = Batcher(batch_rows)  # rows not yet in a batch
        self._in_flight: list[tuple[Batch, Future, int]] = []     # (batch, its Future, its group)
        self._resolved = self._taken = 0     # batches answered (their Futures' callbacks), and taken
        self._pool: WriterPool | None = None
        self._closed = False
        self._collection_ready = False
        self._lock = threading.RLock()       # add() runs in the encode thread, flush_if_due() in the main loop,
        self._changed = threading.Condition(self._lock)     # the commits in the committer thread
        self._group = 0                      # the open group's number: its batches carry it
        self._sealed: list[Finished] = []    # files of sealed groups, not yet taken by the committer
        self._sealed_group = -1              # the last sealed group
        self._committing = False
        self._committer: threading.Thread | None = None
        self._error: StoreError | None = None    # what stopped the committer: raised to the run
        self._after: After | None = None     # the vector cache's put, once `cache_into` (NOTE: cache)
        self._accepted: list[Finished] = []                             # accepted, not yet told of (notify)

    @property
    def seconds(self) -> float:
        """Busy seconds: batches in flight, and commits' own calls."""
        return self._batches.total + self._commits.total

    def add(self, file: Finished, start: int, texts: Rows, vectors: np.ndarray, last: bool,
            notify: bool = True, keys: bytes = b"") -> None:
        """Queue rows for chunks [start, start+len) of `file`; `last` marks the file's final part; `keys`: the
        rows' cache keys (NOTE: cache), or b"". The files accepted are told of (on_accepted) now, or with the
        next `notify()` (a group's files, at once)."""
        with self._lock:
            self._raise_error()
            ref = file.ref
            if ref.source not in self.ledger.failed and texts:
                if not self._collection_ready:
                    self.store.ensure_collection(self.model, int(vectors.shape[1]), self.backend)
                    self._collection_ready = True
                self._queue(Segment(ref.source, ref.fmt, ref.file_hash, start, texts, vectors, keys))
            self._take_answers(self.processes * MAX_IN_FLIGHT)
            if last:
                self.ledger.files.append(evolve(file, pages=()))      # its text is in batches now
                self._accepted.append(file)
            seal = self.ledger.files and (len(self.ledger.files) >= FLUSH_FILES or self.rows_written - self._rows_at_flush
                                          >= FLUSH_ROWS or time.monotonic() - self.last_flush > FLUSH_EVERY_S)
            if notify or seal:                      # told of before they are committed (Written)
                self._notify()
            if seal:
                self._wait_committer(lambda: len(self._sealed) < MAX_SEALED_FILES)     # memory stays flat
                self._seal()

    def cache_into(self, cache: VectorCache) -> None:
        """The rows given keys go into `cache` once stored, put there by the writer processes (NOTE: cache)."""
        self._after = (put_written, (str(cache.path), cache.max_mb, cache.dim))

    def fail(self, file: Finished, error: str) -> None:
        """`file` fails while being written (its chunks could not be encoded): drop its rows."""
        with self._lock:
            self._fail(file.ref.source, error)

    def flush_if_due(self) -> None:
        """Seal what waits if the last seal is FLUSH_EVERY_S old: files must not wait for a next add(). Never
        waits for the committer; raises what stopped it."""
        with self._lock:
            self._raise_error()
            if self.ledger.files and time.monotonic() - self.last_flush > FLUSH_EVERY_S \
                    and len(self._sealed) < MAX_SEALED_FILES:
                self._seal()

    def notify(self) -> None:
        """Tell of the files accepted and not yet told of (add's `notify`)."""
        with self._lock:
            self._notify()

    def _notify(self) -> None:
        if self._accepted:
            files, self._accepted = tuple(self._accepted), []
            self.on_accepted(files)

    def flush(self) -> None:
        """Write and record everything added (the end of input): wait until the committer recorded it; the
        writer processes stop (a later add starts new ones)."""
        with self._lock:
            self._raise_error()
            self._notify()
            if self.ledger.files:
                self._seal()
            self._wait_committer(lambda: not (self._sealed or self._committing))
            self._stop_pool()

    def close(self, abandon: bool = False) -> None:
        """Stop the writer processes and the committer for good (the run ends or stops); `abandon`: then remove
        the rows of files not recorded (NOTE: stops). Needs no lock: another thread may be waiting on them, and
        gets StoreError instead of a resubmit. A commit under way may end first (each of its calls within the
        store's timeout)."""
        self._closed = True
        with self._changed:
            self._changed.notify_all()
        self._stop_pool()
        if self._committer is not None and self._committer is not threading.current_thread():
            self._committer.join(timeout=2 * self.store.timeout_s + 5)
        if abandon and not (self._committer is not None and self._committer.is_alive()):
            try:
                self.ledger.abandon()
            except (StoreError, OSError):
                pass                                # kept for the next run to settle (NOTE: stops)

    def first_row_s(self, started: float) -> float | None:
        """Seconds from `started` (perf_counter) until the store first acknowledged rows (None: no rows)."""
        return None if self.first_row_at is None else round(self.first_row_at - started, 3)

    def _stop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _wait_committer(self, until: Callable[[], bool]) -> None:
        """Wait (the lock released meanwhile) until `until()`; raise what stopped the committer, or StoreError
        if the run stops first."""
        while not until():
            self._raise_error()
            if self._closed:
                raise StoreError(f"the run stopped before every file written to {self.store.uri} was recorded")
            self._changed.wait(0.5)
        self._raise_error()

    # -- batches --------------------------------------------------------------------
    def _queue(self, segment: Segment) -> None:
        """Queue a segment; submit every full batch."""
        for batch in self._batcher.add(segment):
            self._submit(batch, self._group)

    def _writers(self) -> WriterPool | InlineWriter:
        self._pool = self._pool or (WriterPool(self.store.endpoint(), self.processes) if self.store.caps.hosted
                                    else InlineWriter(self.store))
        return self._pool

    def _submit(self, batch: Batch, group: int) -> None:
        if self._closed:
            raise StoreError(f"the run stopped before {batch.rows} rows were written to {self.store.uri}")
        pool = self._writers()
        self._batches.start()
        future = pool.submit(batch, self._after)
        future.add_done_callback(self._resolve)
        self._in_flight.append((batch, future, group))

    def _resolve(self, _: Future) -> None:
        """A batch's Future resolved (pebble's thread, or the inline writer's)."""
        self._batches.end()
        self._resolved += 1

    def _take_answers(self, leave: int, up_to: int | None = None) -> None:
        """Take the answers of finished batches, waiting until at most `leave` are unanswered (of the groups
        up to `up_to`, if given). Every Future resolves within `answer_within` of its start: a longer
        silence is an unreachable store."""
        if up_to is None and self._resolved == self._taken and len(self._in_flight) <= leave:
            return                               # nothing answered since the last look, nothing to wait for
        patience = answer_within(self.store.timeout_s)
        deadline = time.monotonic() + patience
        while True:
            waiting, answered = [], []
            for item in self._in_flight:
                (answered if item[1].done() else waiting).append(item)
            self._in_flight = waiting
            self._taken += len(answered)
            for batch, future, group in answered:
                self._answer(batch, future.result(), group)     # may submit a refused batch's files again
            counted = [f for _, f, g in self._in_flight if up_to is None or g <= up_to]
            if len(counted) <= leave:
                return
            if answered:
                deadline = time.monotonic() + patience
            elif time.monotonic() > deadline:
                raise StoreError(f"store {self.store.uri} did not answer: {len(counted)} batches of rows "
                                 "unanswered by the writer processes; check the server, then rerun: the rerun resumes")
            if self._closed:
                raise StoreError(f"the run stopped before {len(counted)} batches of rows were answered")
            self._lock.release()                # others may add and take answers meanwhile
            try:
                wait(counted, timeout=0.5, return_when=FIRST_COMPLETED)
            finally:
                self._lock.acquire()

    def _answer(self, batch: Batch, answer: Ack | Refused | Unreachable | Failure, group: int) -> None:
        if isinstance(answer, Ack):
            if answer.rows and self.first_row_at is None:
                self.first_row_at = time.perf_counter()
            self.rows_written += answer.rows
            self.ledger.touched.update(batch.sources)
            busy = self._batches.now()
            for s, share in zip(batch.segments, shares(busy - self._charged, [len(s.chunks) for s in batch.segments])):
                self._write_s[s.source] = self._write_s.get(s.source, 0.0) + share   # busy since the last answer
            self._charged = busy
            return
        if isinstance(answer, Unreachable):
            raise StoreError(answer.error)
        if isinstance(answer, Failure):                  # the writer died twice or timed out: rows may be in
            self.ledger.touched.update(batch.sources)
        parts = batch.by_source()
        if len(parts) > 1:                               # retry file by file, in the same group (see NOTE)
            for part in parts:
                if part.segments[0].source not in self.ledger.failed:
                    self._submit(part, group)
            return
        source = parts[0].segments[0].source
        error = answer.error if isinstance(answer, Refused) else f"its rows could not be written: {answer.where}" \
            f"{f' (pid {answer.pid})' if answer.pid else ''}: {answer.error}"
        self._fail(source, error)

    def _fail(self, source: str, error: str) -> None:
        self.ledger.failed.setdefault(source, error)
        self._batcher.drop(source)

    # -- commits (the committer thread) -------------------------------------------------
    def _seal(self) -> None:
        """Close the open group: its rows all submitted, its files handed to the committer."""
        if (batch := self._batcher.rest()) is not None:
            self._submit(batch, self._group)
        self._sealed += self.ledger.files
        self.ledger.files = []
        self._sealed_group, self._group = self._group, self._group + 1
        self.last_flush = time.monotonic()
        self._rows_at_flush = self.rows_written
        if self._committer is None:
            self._committer = threading.Thread(target=self._commit_loop, name="ingest-commit", daemon=True)
            self._committer.start()
        self._changed.notify_all()

    def _commit_loop(self) -> None:
        """Thread target: commit every sealed group, in order, once its batches are all answered."""
        try:
            while True:
                with self._lock:
                    while not self._sealed and not self._closed:
                        self._changed.wait(0.5)
                    if self._closed:
                        return
                    files, self._sealed, group = self._sealed, [], self._sealed_group
                    self._committing = True
                    self._take_answers(0, up_to=group)   # lets add() go on while it waits
                started = time.perf_counter()
                self._commits.start()
                try:
                    if self._closed:
                        return
                    done = self.ledger.commit(files)    # without the lock: add() goes on
                finally:
                    self._commits.end()
                commit_s = shares(time.perf_counter() - started, [f.outcome.chunks for f in done])
                with self._lock:
                    rows_s = [self._write_s.pop(f.ref.source, 0.0) for f in done]
                self.on_written(tuple(evolve(f, outcome=f.outcome.plus(write=a + b))     # one event a commit
                                      for f, a, b in zip(done, commit_s, rows_s)))
                self.ledger.check_room()
                with self._lock:
                    self._committing = False            # flush() returns after the last Written
                    self._changed.notify_all()
        except Exception as exc:            # the run stops with it (raised by the next add, flush, flush_if_due)
            error = exc if isinstance(exc, StoreError) else StoreError(
                f"recording written files in {self.store.uri} failed: {' '.join(str(exc).split())[:300]}")
            with self._lock:
                self._error, self._committing = error, False
                self._changed.notify_all()
