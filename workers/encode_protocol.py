"""Messages of the encode pool, and the one error its callers catch.

NOTE (encode pool protocol and faults)
  Processes: the parent runs one coordinator thread (workers/encode_pool.py); a pebble pool
  of tokenizer processes (workers/tokenize.py) turns windows of texts into length-sorted,
  padded batches; one encode worker per device (workers/encode_worker.py) loads the model
  itself from the local path and runs its modules on those batches.
  Channels, per encode worker: parent -> worker is a Pipe fed by a parent-side sender
  thread (EncodeTask, or None to stop), so the coordinator never blocks on a full pipe;
  worker -> parent is a second Pipe (DevicesFound, WorkerReady, TaskStarted, TaskDone,
  TaskFailed, or a Failure when start-up fails). The parent holds no copy of the child's
  ends, so a dead worker reads as EOF/EPIPE, and the coordinator also waits on each
  worker's sentinel: no blocking call anywhere waits without a timeout or a liveness check.
  Time limits: a worker must send WorkerReady within START_TIMEOUT_S. A batch's timeout_s
  counts from the worker's TaskStarted (sent right before the batch is launched), not from
  when it was queued: a busy worker must send some message (TaskStarted, TaskDone,
  TaskFailed) every timeout_s, else it counts as hung.
  Faults: a worker that dies (any exit code or signal) or hangs is killed and replaced on
  the same device. Batches it held but had not started are requeued first in line,
  unchanged. The started ones (one on the CPU; on CUDA up to two run at once, and both are
  blamed) failed: a multi-chunk batch is retried whole once, then split in halves (halves
  split again on their next failure); a single chunk gets max_attempts attempts, then its
  run fails with EncodeError naming the chunk. An exception in the model is deterministic
  (no retry): the worker survives and reports TaskFailed with its traceback, the batch is
  split down to the single chunk that raises, and that fails the run (splitting also gets
  past CUDA out-of-memory; any other CUDA error makes the worker exit to be replaced).
  Tokenizer tasks (pebble: per-task timeout, dead processes replaced; a pebble pool broken
  by an idle process's death is replaced whole) get max_attempts too. A worker that cannot
  start (an exception, or max_attempts deaths before WorkerReady) breaks the pool: every
  run and every later call raise EncodeError. The caller's own input errors (its iterable
  raising, a text that is not a str) end the run with that exception.
  Every failure reaches the caller as a value (a Failure, then an EncodeError put on the
  run's result queue), never as an exception crossing a thread or process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .messages import Failure

if TYPE_CHECKING:
    import numpy as np


class EncodeError(RuntimeError):
    """Encoding failed. The message is one line: the chunk (index and a prefix of its text)
    and what happened; `failure` holds the details, `traceback` the worker's traceback."""

    def __init__(self, message: str, failure: Failure | None = None, chunk_index: int | None = None):
        super().__init__(message)
        self.failure = failure
        self.chunk_index = chunk_index
        if failure is not None and failure.traceback:
            self.add_note("worker traceback:\n" + failure.traceback.rstrip())

    @property
    def traceback(self) -> str | None:
        return self.failure.traceback if self.failure else None


@dataclass(frozen=True)
class WorkerSpec:
    """How to start one encode worker."""
    model_path: str
    device: str                 # "auto" (first worker only), "cpu", "cuda:N"
    dtype: str | None           # None: float16 on CUDA, float32 on CPU
    threads: int                # torch threads on CPU
    normalize: bool


@dataclass(frozen=True, eq=False)
class TokenBatch:
    """Rows of one window, sorted by length and padded to the longest of them."""
    positions: np.ndarray       # int32 row positions inside the window
    ids: np.ndarray             # int32 (rows, longest)
    lengths: np.ndarray         # int32 (rows,)


@dataclass(frozen=True, eq=False)
class TokenizedWindow:
    batches: tuple[TokenBatch, ...]
    seconds: float


@dataclass(frozen=True, eq=False)
class EncodeTask:
    batch_id: int
    ids: np.ndarray
    lengths: np.ndarray
    texts: tuple[str, ...] | None   # only while the INGEST_FAULT test hook is set


@dataclass(frozen=True)
class DevicesFound:
    """Sent by a worker started with device "auto", before it loads the model."""
    cuda_devices: int


@dataclass(frozen=True)
class WorkerReady:
    pid: int
    device: str
    dim: int
    max_seq_length: int


@dataclass(frozen=True)
class TaskStarted:
    batch_id: int


@dataclass(frozen=True, eq=False)
class TaskDone:
    batch_id: int
    embeddings: np.ndarray      # float32 (rows, dim), rows in the task's order
    seconds: float


@dataclass(frozen=True)
class TaskFailed:
    batch_id: int
    failure: Failure
