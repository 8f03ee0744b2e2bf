"""The embeddings batcher of `ingest serve`: the texts of concurrent /v1/embeddings requests, tokenized in each
request's thread, encoded together through one EncodePool (the collection's model and backend).

NOTE (batching, timeouts, shutdown):
- Tokens: a request's texts are tokenized in its own thread with the model's tokenizer, configured as the
  pool's tokenizer processes are (ingest.workers.encode.load_tokenizer: special tokens, truncation at
  max_seq_length), and handed to the pool as `Pretokenized`, so nothing is tokenized twice. A text longer
  than the model takes is refused there (`TooLong`): what the pool encodes is never cut short.
- Batches: `submit` queues a `Job` (its ids, a Future). The batcher thread takes the first job once one of
  IN_FLIGHT senders is free, then more for at most `wait_s` after that, until the batch holds `batch_tokens`
  tokens; the batch is one `encode_groups` call (a group a job: each job's rows come back in order) on a
  sender thread. While every sender is busy the queue fills, so load makes batches bigger, as
  text-embeddings-inference's dynamic batching does.
- Timeouts: every wait has one: the batcher's queue and sender waits (POLL_S, then it looks at `closing`),
  the pool's own per-batch `timeout_s` (a hung worker is replaced, its batch redone: workers/encode NOTE),
  and the request's wait for its Future (the caller's, `Batcher.timeout_s`).
- Shutdown (`close`): no job is taken any more; the queued ones fail with `Closed`; the senders' batches
  finish within the pool's close (the pool is the caller's); the thread is joined for JOIN_S.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ingest.encode_pool import EncodePool
from ingest.workers.encode import Pretokenized, load_tokenizer

BATCH_TOKENS = 16384     # tokens a batch sent to the pool holds at most (one job may be larger: it goes alone)
WAIT_S = 0.005           # after a batch's first job, wait this long for more
IN_FLIGHT = 2            # batches in the pool at once (one encoding, one queued behind it, on a CPU worker)
POLL_S = 0.5
JOIN_S = 5.0


class TooLong(ValueError):
    """A text over the model's token limit (`index`: its place in the request)."""

    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(f"input[{index}] has more than {limit} tokens, the most the model takes: split it, "
                         f"or send shorter texts")
        self.index, self.tokens, self.limit = index, tokens, limit


class Closed(RuntimeError):
    """The server is stopping: the job was not encoded."""


@dataclass(frozen=True)
class Job:
    """One request's texts, tokenized, and the Future of their rows."""
    tokens: Pretokenized
    future: Future

    @property
    def size(self) -> int:
        return int(self.tokens.ids.size)


class Tokenizer:
    """The model's tokenizer as the encode pool's tokenizer processes use it (thread-safe: `tokenizers`)."""

    def __init__(self, tokenizer_file: str, max_length: int):
        self._tok, _ = load_tokenizer(tokenizer_file, max_length)
        self.max_length = max_length

    def __call__(self, texts: Sequence[str]) -> Pretokenized:
        """The texts' ids; TooLong for the first text over max_length tokens."""
        encodings = self._tok.encode_batch(list(texts))
        for i, enc in enumerate(encodings):
            if enc.overflowing:
                raise TooLong(i, len(enc.ids) + sum(len(o.ids) for o in enc.overflowing), self.max_length)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int32, count=len(encodings))
        ids = np.concatenate([np.asarray(e.ids, dtype=np.int32) for e in encodings]) if encodings \
            else np.zeros(0, np.int32)
        return Pretokenized(list(texts), ids, lengths)


class Batcher:
    """Batches jobs into `pool` (NOTE). `on_batch(texts, tokens)` is told each batch's size."""

    def __init__(self, pool: EncodePool, timeout_s: float, on_batch: Callable[[int, int], None] | None = None,
                 batch_tokens: int = BATCH_TOKENS, wait_s: float = WAIT_S, in_flight: int = IN_FLIGHT):
        self.pool, self.timeout_s = pool, timeout_s
        self._on_batch, self._batch_tokens, self._wait_s = on_batch, batch_tokens, wait_s
        self._queue: queue.Queue[Job] = queue.Queue()
        self._slots = threading.Semaphore(in_flight)
        self._senders = ThreadPoolExecutor(in_flight, thread_name_prefix="ingest-serve-embed")
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ingest-serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, tokens: Pretokenized) -> Future:
        """The Future of `tokens`' rows (float32, (len, dim)); Closed once the batcher is closing."""
        job = Job(tokens, Future())
        if self._closing.is_set():
            raise Closed("the server is stopping")
        self._queue.put(job)
        return job.future

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                first = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            while not self._slots.acquire(timeout=POLL_S):
                if self._closing.is_set():
                    _settle(first.future, Closed("the server is stopping"))
                    return
            jobs, tokens = [first], first.size
            deadline = time.monotonic() + self._wait_s
            while tokens < self._batch_tokens:
                try:
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                jobs.append(job)
                tokens += job.size
            try:
                self._senders.submit(self._send, jobs, tokens)
            except RuntimeError:                      # the senders are shut down: closing
                self._slots.release()
                for job in jobs:
                    _settle(job.future, Closed("the server is stopping"))
                return

    def _send(self, jobs: list[Job], tokens: int) -> None:
        try:
            if self._on_batch is not None:
                self._on_batch(sum(len(j.tokens) for j in jobs), tokens)
            for job, rows in self.pool.encode_groups([(job, job.tokens) for job in jobs]):
                _settle(job.future, rows)
        except BaseException as exc:                  # the pool's EncodeError, or closed: every job left gets it
            for job in jobs:
                _settle(job.future, exc)
        finally:
            self._slots.release()

    def close(self) -> None:
        """Stop taking jobs; fail those queued (NOTE: shutdown). The pool is the caller's to close."""
        self._closing.set()
        self._thread.join(JOIN_S)
        self._senders.shutdown(wait=False)
        while True:
            try:
                _settle(self._queue.get_nowait().future, Closed("the server is stopping"))
            except queue.Empty:
                return


def _settle(future: Future, outcome: object) -> None:
    """Give `future` its rows or its exception, unless it is done already (its request gave up waiting)."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass
