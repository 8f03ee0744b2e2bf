"""The encode pool: one encode worker process per device, a pebble pool of tokenizer
processes, and a coordinator thread in the parent that feeds them, handles their faults and
streams results back in input order. Callers use EncodeEngine; the modules behind it:
_coordinator (the thread), _process and _worker (an encode worker's two sides), torch_model (the
model it runs), _tokenize (tokenizer processes) and word_cache (their word cache, and the chunker's),
_stream (one call's run), _batches (windows and batches), _shapes (the batch plan and its shapes), _messages.

NOTE (threads in the parent): the coordinator thread owns every worker handle, window and
batch. Other threads reach it only through thread-safe queues (its event queue, each run's
inbox) and wake it through a self-pipe; it sleeps in multiprocessing.connection.wait on the
workers' result pipes, their sentinels and that pipe, never longer than the nearest
deadline, and reads result pipes without blocking. The self-pipe is closed by the coordinator
thread as it ends, and a wake-up after that is a no-op (_pipes: descriptors). Each run reads its
input in a feeder thread; the caller's thread takes its results.

NOTE (devices): the parent never imports torch. "auto" starts one worker with device "auto";
it imports torch, reports how many CUDA devices it sees (DevicesFound) before loading the
model and takes cuda:0 (or the CPU, with all cores); the coordinator then starts one worker
for each further CUDA device. The ONNX backends (onnx, onnx-int8, openvino) run on the CPU:
"auto" is one CPU worker, which imports its runtime, never torch.

NOTE (protocol and faults)
  Channels, per encode worker: parent -> worker is a Pipe fed by a parent-side sender
  thread (EncodeTask, or None to stop), so the coordinator never blocks on a full pipe;
  worker -> parent is a second Pipe (DevicesFound, WorkerReady, TaskStarted, TaskDone,
  TaskFailed, or a Failure when start-up fails); a batch's ids and vectors cross in the
  worker's shared area, a slot a batch, and only their messages in the pipes (_area NOTE).
  The parent holds no copy of the child's ends, so a dead worker reads as EOF/EPIPE, and
  the coordinator also waits on each worker's sentinel: no blocking call anywhere waits
  without a timeout or a liveness check.
  Time limits: a worker must send WorkerReady within START_TIMEOUT_S. A batch's timeout_s
  counts from the worker's TaskStarted (sent right before the batch is launched), not from
  when it was queued: a busy worker must send some message (TaskStarted, TaskDone,
  TaskFailed) every timeout_s, else it counts as hung.
  Faults: a worker that dies (any exit code or signal) or hangs is killed and replaced on
  the same device. Batches it held but had not started are requeued first in line,
  unchanged. The started ones (one on the CPU; on CUDA up to two run at once, and both are
  blamed) failed: a multi-chunk batch is retried whole once, then split in halves (halves
  split again on their next failure); a single chunk gets max_attempts attempts. An
  exception in the model is deterministic (no retry): the worker survives and reports
  TaskFailed with its traceback, and the batch is split down to the single chunk that
  raises (splitting also gets past CUDA out-of-memory; any other CUDA error makes the
  worker exit to be replaced). A chunk given up fails its run with EncodeError naming it,
  or, when the caller passed on_failed, gets a NaN row and is reported there while the run
  goes on (a document pipeline fails that chunk's file, not the whole run).
  Tokenizer tasks (pebble: per-task timeout, dead processes replaced; a pebble pool broken
  by an idle process's death is replaced whole) get max_attempts too when their process died
  or timed out; an exception is deterministic and not retried. A text the tokenizer rejects
  fails alone, at once: the task finds it and tokenizes the rest (_tokenize). A worker that cannot
  start (an exception, or max_attempts deaths before WorkerReady) breaks the pool: every
  run and every later call raise EncodeError. The caller's own input errors (its iterable
  raising, a text that is not a str) end the run with that exception.
  Every failure reaches the caller as a value (a Failure, then an EncodeError put on the
  run's result queue), never as an exception crossing a thread or process.
"""
from __future__ import annotations

import atexit
import threading
import time
from typing import Any, Iterable, Iterator

import numpy as np

from ._coordinator import Coordinator
from ._messages import BatchPlan, EncodeError, Pretokenized, WorkerSpec
from ._process import plan_devices
from ._shapes import GPU_BATCH, GPU_TOKENS, SHAPES
from ._stream import EncodeRun
from ._tokenize import load_tokenizer

__all__ = ["BatchPlan", "EncodeEngine", "EncodeError", "GPU_BATCH", "GPU_TOKENS", "Pretokenized", "SHAPES", "WorkerSpec", "load_tokenizer",
           "plan_devices"]

# Texts per window (the span sorted by length): 8 batches, at least 512 (longer spans pad less on
# mixed lengths), at most 4,096 (bounds memory with many windows in flight on a GPU host).
WINDOW_BATCHES, WINDOW_MIN, WINDOW_MAX = 8, 512, 4096


def _window_for(plan: BatchPlan) -> int:
    """Texts sorted by length and batched together: WINDOW_BATCHES batches, within the bounds."""
    return min(max(plan.batch_size * WINDOW_BATCHES, WINDOW_MIN), WINDOW_MAX)


class EncodeEngine:
    """The encode pool as its callers see it; every method runs in the caller's thread. Starts
    the workers at once; close() (also run at interpreter exit) stops every process."""

    def __init__(self, specs: list[WorkerSpec], tokenizer_file: str, *, batch_size: int | None,
                 max_batch_tokens: int | None, tokenizer_workers: int | None, timeout_s: float, max_attempts: int,
                 lazy_tokenizers: bool = False):
        self._closed = False
        self._close_lock = threading.Lock()
        self._coordinator = Coordinator(specs, tokenizer_file, batch_size=batch_size,
                                        max_batch_tokens=max_batch_tokens, tokenizer_workers=tokenizer_workers,
                                        timeout_s=timeout_s, max_attempts=max_attempts,
                                        lazy_tokenizers=lazy_tokenizers)
        atexit.register(self.close)

    def encode_groups(self, groups: Iterable[tuple[Any, Any]], on_rows=None, on_failed=None,
                      stop: threading.Event | None = None) -> Iterator[tuple[Any, np.ndarray | None]]:
        """(key, rows) per group in input order. With `on_failed(first, count, error)`, chunks that
        cannot be encoded after every retry get NaN rows and are reported there (from the
        coordinator's thread) instead of ending the call with EncodeError. Once `stop` is set, at most
        the batch a worker is running finishes, and every group not fully encoded by then comes
        back with rows None (_stream NOTE: stop)."""
        dim = self.dim                         # the first worker is ready: the batch plan is known
        c = self._coordinator
        max_windows = 2 + 2 * (c.tokenizer_workers + len(c.workers))
        run = EncodeRun(groups, _window_for(c.plan), max_windows, c.wake, on_failed, stop)
        self._coordinator.submit(run)
        yield from run.results(dim, self._check_alive, on_rows)

    @property
    def dim(self) -> int:
        self._wait(self._coordinator.first_ready)
        return self._coordinator.dim

    def wait_ready(self) -> None:
        """Block until every current worker (replacements included) has started; raises
        EncodeError if one cannot."""
        self._wait(self._coordinator.all_ready)
        while not all(w.ready for w in self._coordinator.workers):
            self._check_alive()
            time.sleep(0.05)

    @property
    def window_size(self) -> int | None:
        """Texts sorted by length and batched together; None until the first worker is up (its
        device sizes the batches). Never blocks."""
        plan = self._coordinator.plan
        return None if plan is None else _window_for(plan)

    @property
    def startup_seconds(self) -> list[float]:
        self.wait_ready()
        return [w.startup_seconds for w in self._coordinator.workers]

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._coordinator.workers]

    @property
    def batch_plan(self) -> BatchPlan:
        """Rows and padded tokens per batch (waits for the first worker: its device decides the defaults)."""
        self._wait(self._coordinator.first_ready)
        return self._coordinator.plan

    @property
    def stats(self) -> dict[str, Any]:
        """chunks and batches done, busy seconds tokenizing and encoding (summed over processes),
        retries, splits, worker and tokenizer-pool restarts."""
        return self._coordinator.stats()

    def _wait(self, event: threading.Event) -> None:
        while not event.wait(0.25):
            self._check_alive()
        self._check_alive()

    def _check_alive(self) -> None:
        if self._coordinator.broken is not None:
            raise self._coordinator.broken
        if self._closed or not self._coordinator.is_alive():
            raise EncodeError("encode pool is closed")

    def close(self) -> None:
        """Stop the workers (finishing batches already sent, up to a few seconds) and the tokenizers."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self._coordinator.shutdown()
