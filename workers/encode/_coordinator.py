"""The encode pool's coordinator thread: it owns every worker handle, window and batch, polls
the workers, handles their faults, feeds the tokenizer pool and dispatches batches.
Threads, devices and the fault policy: NOTEs in workers/encode/__init__.py.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import Counter, deque
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ..failure import Failure
from ..limits import usable_cores
from ._area import IN_FLIGHT
from ._batches import Batch, Window, describe
from ._messages import (BatchPlan, DevicesFound, EncodeError, TaskDone, TaskFailed, TaskStarted,
                        WorkerReady, WorkerSpec)
from ._pipes import Poller, WakePipe
from ._process import EncodeProcess
from ._stream import EncodeRun
from ._shapes import bucket_by_length, make_plan
from ._tokenize import TokenizerPool, load_tokenizer
from ._worker import fault_hook_active

START_TIMEOUT_S = 600.0          # loading a model may take minutes on a cold disk


class Coordinator:
    """Starts the workers and its thread at once, runs until `shutdown`. Other threads only call
    `submit`, `wake`, `is_alive`, `stats` and `shutdown`, and read `first_ready`, `all_ready`,
    `broken`, `dim` and `workers`."""

    def __init__(self, specs: list[WorkerSpec], tokenizer_file: str, *, batch_size: int | None,
                 max_batch_tokens: int | None, tokenizer_workers: int | None, timeout_s: float, max_attempts: int,
                 lazy_tokenizers: bool = False):
        self._batch_size, self._max_batch_tokens = batch_size, max_batch_tokens
        self.plan: BatchPlan | None = None                   # set with the first WorkerReady (the device)
        self.tokenizer_workers = tokenizer_workers or 1      # None: set with the first WorkerReady
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self._tokenizer_file = tokenizer_file
        self._auto_tokenizers = tokenizer_workers is None
        self._tokenizers: TokenizerPool | None = None        # started with the first WorkerReady, or when lazy
        self._lazy_tokenizers = lazy_tokenizers              # with the first window of raw texts
        self._pad_id = 0
        self._with_texts = fault_hook_active()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = WakePipe()                              # closed by the coordinator thread as it ends
        self._poller = Poller()
        self._runs: list[EncodeRun] = []
        self._ready: deque[Batch] = deque()
        self._next_id = 0
        self._stats: dict[str, Any] = {"chunks": 0, "batches": 0, "tokenize_s": 0.0, "encode_s": 0.0,
                                       "retries": 0, "splits": 0, "worker_restarts": 0}
        self._shapes: set[tuple[int, int]] = set()         # (rows, width) of every batch sent
        self._start_failures: dict[int, int] = {}
        self.broken: EncodeError | None = None
        self.dim: int | None = None
        self.first_ready = threading.Event()
        self.all_ready = threading.Event()
        self._devices_known = "auto" not in [s.device for s in specs]
        self._closing = False
        self.workers = [EncodeProcess(slot, spec) for slot, spec in enumerate(specs)]
        self._thread = threading.Thread(target=self._coordinate, name="ingest-encode-coordinator", daemon=True)
        self._thread.start()

    # -- any thread ------------------------------------------------------------------
    def submit(self, run: EncodeRun) -> None:
        self._events.put(run)
        self.wake()

    def wake(self) -> None:
        self._wake.wake()                      # a no-op once closed (_pipes NOTE)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> dict[str, Any]:
        restarts = self._tokenizers.restarts if self._tokenizers is not None else 0
        return {**self._stats, "tokenizer_restarts": restarts, "shapes": len(self._shapes)}

    def shutdown(self) -> None:
        """Stop the thread, fail the runs left, stop the workers (finishing batches already sent,
        up to a few seconds) and the tokenizers. Call once."""
        self._closing = True
        self.wake()
        if self._thread is not threading.current_thread():
            self._thread.join(10)
        for run in self._runs:
            run.fail(EncodeError("encode pool closed"))
        for w in self.workers:
            w.stop()
        deadline = time.monotonic() + 3
        for w in self.workers:                  # one still starting (loading its model) reads no stop
            w.finish(deadline - time.monotonic() if w.ready else 0)
        if self._tokenizers is not None:
            self._tokenizers.stop()

    # -- coordinator thread ----------------------------------------------------------
    def _coordinate(self) -> None:
        try:
            while not self._closing and self.broken is None:
                self._wake.drain()
                self._take_events()
                for w in list(self.workers):
                    self._poll(w)
                self._check_deadlines()
                self._cut_short()
                self._runs = [r for r in self._runs if not (r.stopped or r.finished or r.drained)]
                self._cut_windows()
                self._dispatch()
                self._sleep()
        except BaseException as exc:           # a bug here must not leave callers waiting
            self._break(EncodeError(f"encode pool coordinator failed: {type(exc).__name__}: {exc}",
                                    Failure("encode pool coordinator", str(exc), traceback=traceback.format_exc())))
        finally:
            self._wake.close()                 # no thread waits on it any more

    def _take_events(self) -> None:
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, EncodeRun):
                self._runs.append(event)
            else:
                self._on_tokenized(*event)

    def _poll(self, w: EncodeProcess) -> None:
        alive = w.process.is_alive()           # checked first: what it sent before dying is read below
        try:
            for message in w.results.messages():     # never blocks on half a message (_pipes NOTE)
                self._on_message(w, message)
        except (EOFError, OSError):
            alive = False
        if not alive:
            w.process.join(1)
            self._lost(w, Failure.describe_exit(w.process.exitcode).removeprefix("worker "))

    def _on_message(self, w: EncodeProcess, msg: Any) -> None:
        now = time.monotonic()
        if isinstance(msg, TaskStarted):
            w.running.add(msg.batch_id)
            w.last_progress = now
        elif isinstance(msg, TaskDone):
            batch = self._finish_task(w, msg.batch_id, now)
            embeddings = w.answered(msg.batch_id, msg.embeddings, len(batch) if batch is not None else 0)
            if batch is not None:       # copied into its window now, before its slot is given again
                self._store(batch, embeddings, msg.seconds)
        elif isinstance(msg, TaskFailed):
            w.answered(msg.batch_id, None, 0)
            batch = self._finish_task(w, msg.batch_id, now)
            if batch is not None:
                self._failed(batch, msg.failure, crashed=False)
        elif isinstance(msg, DevicesFound):
            self._on_devices(w, msg.cuda_devices)
        elif isinstance(msg, WorkerReady):
            self._on_ready(w, msg, now)
        elif isinstance(msg, Failure):         # start-up failed: deterministic, so the pool is broken
            self._break(EncodeError(f"{msg.where} (pid {msg.pid}) {msg.error}", msg))

    def _finish_task(self, w: EncodeProcess, batch_id: int, now: float) -> Batch | None:
        w.running.discard(batch_id)
        w.last_progress = now
        batch = w.in_flight.pop(batch_id, None)
        return None if batch is None or batch.window.run.stopped or batch.window.run.drained else batch

    def _on_devices(self, w: EncodeProcess, cuda_devices: int) -> None:
        w.spec = replace(w.spec, device="cuda:0" if cuda_devices else "cpu")
        for index in range(1, cuda_devices):
            self.workers.append(EncodeProcess(len(self.workers), replace(w.spec, device=f"cuda:{index}")))
        self._devices_known = True

    def _on_ready(self, w: EncodeProcess, msg: WorkerReady, now: float) -> None:
        w.on_ready(msg)
        w.startup_seconds, w.last_progress = now - w.launched, now
        self._start_failures.pop(w.slot, None)
        if self.plan is None:                  # the first worker: its device sizes the batches
            self.dim = msg.dim
            on_gpu = msg.device.startswith("cuda")
            self.plan = make_plan(msg.device, msg.max_seq_length, self._batch_size, self._max_batch_tokens,
                                  any(w.spec.compile for w in self.workers), w.spec.batch_shapes)
            if self._auto_tokenizers:          # raw texts on a GPU host: every core tokenizes
                self.tokenizer_workers = usable_cores() if on_gpu else 1
            self._pad_id = load_tokenizer(self._tokenizer_file, msg.max_seq_length)[1]
            if not self._lazy_tokenizers:
                self._start_tokenizers()
            self.first_ready.set()
        if self._devices_known and all(x.ready for x in self.workers):
            self.all_ready.set()

    def _store(self, batch: Batch, embeddings: np.ndarray, seconds: float) -> None:
        self._stats["chunks"] += len(batch)
        self._stats["batches"] += 1
        self._stats["encode_s"] += seconds
        batch.window.store(batch, embeddings)

    def _lost(self, w: EncodeProcess, reason: str) -> None:
        """Kill and replace a dead or hung worker; requeue what it held, blame what it ran."""
        w.kill()
        if self._closing:                       # shutting down: no replacement outlives shutdown()
            return
        failure = Failure(w.where, reason, pid=w.process.pid, exitcode=w.process.exitcode)
        if w.ready is None:
            self._start_failures[w.slot] = self._start_failures.get(w.slot, 0) + 1
            if self._start_failures[w.slot] >= self.max_attempts:
                self._break(EncodeError(f"{w.where} (pid {failure.pid}) did not start: {reason}", failure))
                return
        self.workers[w.slot] = EncodeProcess(w.slot, w.spec)
        self._stats["worker_restarts"] += 1
        for batch in reversed(w.in_flight.values()):
            if batch.id not in w.running and not batch.window.run.stopped:
                self._ready.appendleft(batch)
        for batch_id in w.running:              # one of them, on CUDA maybe both, brought it down
            batch = w.in_flight[batch_id]
            if not batch.window.run.stopped:
                self._failed(batch, failure, crashed=True)

    def _failed(self, batch: Batch, failure: Failure, crashed: bool) -> None:
        """Retry, split or give up on a batch (policy: NOTE in workers/encode/__init__.py)."""
        batch.attempts += 1
        if len(batch) > 1:
            if crashed and not batch.suspect and batch.attempts < min(2, self.max_attempts):
                self._stats["retries"] += 1
                self._ready.appendleft(batch)
                return
            self._stats["splits"] += 1
            batch.window.pending += 1              # one batch became two
            self._ready.extendleft(reversed(batch.halves(self._new_ids(2))))
            return
        if crashed and batch.attempts < self.max_attempts:
            self._stats["retries"] += 1
            self._ready.appendleft(batch)
            return
        index, prefix = batch.describe_first_chunk()
        tries = f" (attempt {batch.attempts} of {self.max_attempts})" if crashed else ""
        error = EncodeError(f"chunk {index} ({prefix}): {failure.where} (pid {failure.pid}) {failure.error}{tries}",
                            failure, index)
        if batch.window.run.give_up(index, 1, error):
            batch.window.store(batch, np.full((1, self.dim), np.nan, dtype=np.float32))

    def _new_ids(self, n: int) -> int:
        first, self._next_id = self._next_id, self._next_id + n
        return first

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for w in list(self.workers):
            if w.ready is None and now - w.launched > START_TIMEOUT_S:
                self._lost(w, f"did not start within {START_TIMEOUT_S:g} s")
            elif w.ready is not None and w.in_flight and now - w.last_progress > self.timeout_s:
                self._lost(w, f"timed out after {self.timeout_s:g} s")

    def _cut_short(self) -> None:
        """Runs whose stop is set: drop their batches not yet sent; they end once no batch of theirs is running
        that would complete its window (the others' rows could never be used: _stream NOTE: stop)."""
        for run in self._runs:
            if run.stop is None or not run.stop.is_set() or run.stopped:
                continue
            if not run.cut:
                run.cut_short()
                self._ready = deque(b for b in self._ready if b.window.run is not run)
            running = Counter(b.window for w in self.workers for b in map(w.in_flight.get, w.running)
                              if b is not None and b.window.run is run)
            if not any(window.pending == n for window, n in running.items()):
                run.drain()

    def _cut_windows(self) -> None:
        if self.plan is None:
            return
        now = time.monotonic()
        for run in self._runs:
            while not run.cut and (cut := run.next_window(now)) is not None:
                window = Window(run, *cut)
                if window.tokens is None:
                    self._tokenize(window)
                else:                          # made by the chunker: batched here, no tokenizer process
                    batches = bucket_by_length(*window.tokens, self._pad_id, self.plan)
                    window.tokens = None
                    self._ready.extend(window.cut(batches, self._new_ids(len(batches)), self.dim))

    def _start_tokenizers(self) -> None:
        on_gpu = any(w.ready and w.ready.device.startswith("cuda") for w in self.workers)
        threads = max(1, usable_cores() // self.tokenizer_workers) if on_gpu else 1
        self._tokenizers = TokenizerPool(self._tokenizer_file, self.plan.max_length, self.tokenizer_workers,
                                         threads, self.timeout_s)

    def _tokenize(self, window: Window) -> None:
        if self._tokenizers is None:
            self._start_tokenizers()
        self._tokenizers.submit(window.texts, self.plan, partial(self._post_tokenized, window))

    def _post_tokenized(self, window: Window, future) -> None:      # runs in a pebble thread
        self._events.put((window, future))
        self.wake()

    def _on_tokenized(self, window: Window, future) -> None:
        if window.run.stopped or window.run.cut:
            return
        try:
            tokenized = future.result()
        except Exception as exc:
            window.tokenize_attempts += 1
            if self._tokenizers.transient(exc) and window.tokenize_attempts < self.max_attempts:
                self._stats["retries"] += 1
                self._tokenize(window)
                return
            failure = self._tokenizers.failure(exc)
            error = EncodeError(f"chunks {window.first}-{window.first + len(window.texts) - 1} "
                                f"(first {describe(window.texts[0])}): tokenizer process {failure.error}",
                                failure, window.first)
            if window.run.give_up(window.first, len(window.texts), error):
                window.run.window_done(window.number, np.full((len(window.texts), self.dim), np.nan, np.float32))
            return
        self._stats["tokenize_s"] += tokenized.seconds
        batches = window.cut(tokenized.batches, self._new_ids(len(tokenized.batches)), self.dim)
        for position, reason in tokenized.rejected:      # deterministic: that text alone fails, no retry
            index = window.first + position
            error = EncodeError(f"chunk {index} ({describe(window.texts[position])}): the tokenizer rejected it: "
                                f"{reason}", Failure("tokenizer process", f"rejected the text: {reason}"), index)
            if not window.run.give_up(index, 1, error):
                return
            window.rows[position] = np.nan
        if not batches:
            window.run.window_done(window.number, window.rows)
        self._ready.extend(batches)

    def _dispatch(self) -> None:
        ready = [w for w in self.workers if w.ready is not None]
        while self._ready and ready:
            w = min(ready, key=lambda x: len(x.in_flight))
            if len(w.in_flight) >= IN_FLIGHT["cuda" if w.ready.device.startswith("cuda") else "cpu"]:
                return
            batch = self._ready.popleft()
            if batch.window.run.stopped or batch.window.run.cut:
                continue
            texts = tuple(batch.window.texts[p] for p in batch.positions) if self._with_texts else None
            self._shapes.add(batch.ids.shape)
            w.submit(batch, texts)

    def _sleep(self) -> None:
        now = time.monotonic()
        until = now + 0.5
        for w in self.workers:
            if w.ready is None:
                until = min(until, w.launched + START_TIMEOUT_S)
            elif w.in_flight:
                until = min(until, w.last_progress + self.timeout_s)
        if self.plan is not None:
            for run in self._runs:
                if not run.cut and (due := run.stall_deadline()) is not None:
                    until = min(until, due)
        handles = [w.results for w in self.workers] + [w.process.sentinel for w in self.workers]
        self._poller.wait(handles + [self._wake], max(0.0, until - now) + 0.001)

    def _break(self, error: EncodeError) -> None:
        """The pool cannot go on: fail every run, wake every waiter."""
        self.broken = error
        for run in self._runs:
            run.fail(error)
        self.first_ready.set()
        self.all_ready.set()
