"""Small files go to their loader pool several to a task: a task's round trip (pickling it, pebble's
threads, the result's message) costs the dispatcher about as much as a small file's chunks.

NOTE (batched loads): a text or Markdown file of at most BATCH_BYTES, read from a local disk, is
gathered with others of its pool (`Batches.add`) and sent once BATCH_FILES wait, or when the
dispatcher has nothing else to do (`flush`, called before it waits for an event), so a file never
waits for a batch to fill while a worker could load it. Other files go alone, as before, after the
batch their pool gathered is sent: a pool takes tasks in file order (a batch never waits behind
later files, such as a slow one that holds every worker). The worker
loads a batch's files one after another, exactly as it loads one (`load_file`), each sniffed first (the
dispatcher did not open them: ingest/sniff.py NOTE: deferred sniff), and answers one
value per file, in order: a file's own error is its own Failure. A batch that fails as a whole (its
worker died twice or hung: a Failure from the pool; a stopped pool's cancellation) is sent again file
by file, each in a task of its own with the pool's full timeout and its one retry after a crash, so
a crash or a hang is charged to the file that caused it and never to the others. A batch's time limit
is one file's ([loaders.X] timeout_s): its files are small, so a batch that needs longer holds a
hang. Results reach the dispatcher through `on_results([(seq, result), ...])`, a batch's at once (one wake-up of the
dispatcher for its files, not one a file), from pebble's result thread, as a single task's do.
"""
from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Callable

from ingest import remote
from ingest.chunk import ChunkSpec
from ingest.files import FileRef
from ingest.load import LoadTask, Loaded, load_file, submit
from ingest.sniff import Misnamed
from ingest.loaders import LoaderOptions, pool_for
from ingest.workers.failure import Failure
from ingest.workers.pool import Pools

BATCH_BYTES = 64 * 1024        # a text file this small loads in a few milliseconds
BATCH_FILES = 16               # files a task at most
BATCHED = tuple(os.environ.get("INGEST_BATCH_FORMATS", "txt,md").split(","))    # formats whose small files are
#                                batched (the variable: tests, which batch a plugin's format)


def load_files(tasks: tuple[LoadTask, ...]) -> tuple[Loaded | Failure | Misnamed, ...]:
    """In a loader worker: each file of the batch loaded as `load_file` loads one (its errors are values)."""
    return tuple(load_file(task) for task in tasks)


def batchable(ref: FileRef) -> bool:
    """A small text or Markdown file on a local disk."""
    return ref.fmt in BATCHED and ref.size <= BATCH_BYTES and not remote.is_url(ref.path)


class Batches:
    """The small files waiting to be sent, by pool (NOTE); owned by the dispatcher's thread."""

    def __init__(self, pools: Pools, options: LoaderOptions, spec: ChunkSpec,
                 on_results: Callable[[list[tuple[int, Loaded | Failure | Misnamed]]], None]):
        self.pools, self.options, self.spec, self.on_results = pools, options, spec, on_results
        self._waiting: dict[str, list[tuple[FileRef, str]]] = {}

    def add(self, ref: FileRef, known_hash: str) -> None:
        """Queue a batchable file; send its pool's batch once full."""
        pool = pool_for(ref.fmt)
        waiting = self._waiting.setdefault(pool, [])
        waiting.append((ref, known_hash))
        if len(waiting) >= BATCH_FILES:
            self._send(pool, self._waiting.pop(pool))

    def flush(self, pool: str | None = None) -> None:
        """Send every batch (of `pool` only, if given), full or not."""
        if pool is not None:
            if pool in self._waiting:
                self._send(pool, self._waiting.pop(pool))
            return
        while self._waiting:
            self._send(*self._waiting.popitem())

    def clear(self) -> None:
        """Forget the files not yet sent (the run stops: the dispatcher ends them as interrupted)."""
        self._waiting.clear()

    def _send(self, pool: str, files: list[tuple[FileRef, str]]) -> None:
        if len(files) == 1:
            self._alone(*files[0])
            return
        tasks = tuple(LoadTask(ref.path, ref.fmt, self.options, self.spec, known, ref.source, sniff=True)
                      for ref, known in files)
        future = self.pools.submit(pool, load_files, tasks)
        future.add_done_callback(lambda f: self._answered(files, f.result()))

    def _answered(self, files: list[tuple[FileRef, str]], result: tuple[Loaded | Failure, ...] | Failure) -> None:
        """In pebble's result thread: each file's result, or each file sent again alone (NOTE)."""
        if isinstance(result, Failure):
            for ref, known in files:
                self._alone(ref, known)
            return
        self.on_results([(ref.seq, one) for (ref, _), one in zip(files, result)])

    def _alone(self, ref: FileRef, known_hash: str) -> None:
        future: Future = submit(self.pools, ref, self.options, self.spec, known_hash, sniff=True)
        future.add_done_callback(lambda f: self.on_results([(ref.seq, f.result())]))
