"""`LocalRun`, the local engine of `ingest run`: the dispatcher. Each file walks through the steps, one
module each:

    scan -> sniff -> load (loader pools; chunk in the worker) -> OCR fan-out, big files' ranges -> reorder -> encode -> write

NOTE (flow and shutdown protocol):
- The main thread pulls the lazy scan as it dispatches files (each ends in `settle`; an unchanged
  file with no unsettled file before it settles at once, without the pipeline; small text files go
  several to a loader task, sent when full or before the thread waits: ingest/load_batch.py NOTE)
  while fewer than [run] max_files_in_flight are loading and fewer than max_chunks_in_flight chunks (each file counts at
  least 1) wait between loading and the writer's Accepted (it holds all their rows; it records
  them at its next flush, then posts Written). Pools return Futures whose done-callbacks post small frozen
  events on one queue that only this thread reads; every get has a timeout, after which it
  checks the encode thread and the writer's flush timer. Per-file load state belongs to
  this thread alone.
- Finished files pass a bounded Reorder keyed by file number and enter the encode feed in
  file order; the encode pool returns groups in input order, so the writer stores rows in
  file order, then chunk order, and posts Written. Files that fail, skip or are unchanged
  travel the same path with no chunks, so the report and manifest see files in order too.
- A big file loaded by range (ingest/load.py NOTE) comes in parts: those of the file next in
  order are fed as they are ready, a later file's wait (inflight.Ranged) until it is next, and
  its last part passes the Reorder. Parts count in max_chunks_in_flight until the writer holds
  them (PartWritten; Accepted for the last); ranges load while it has room, but the file next in
  order always may have one loading, so it never waits on files behind it.
- Stop signals: ingest/engines/run.py NOTE; here the first signal (`on_stop`, from the handler, which
  may put to the SimpleQueue) stops intake, kills loader workers and marks files not yet finished as
  failed "interrupted"; the encode pool finishes at most the batch a worker is running and drops
  the windows it read ahead, whose files fail "interrupted" too (ingest/encode.py NOTE); the writer
  stores and records what it holds. So a stop takes at most one batch plus the writer's last commit.
"""
from __future__ import annotations

import queue
import sys
import threading
from typing import Any, Iterator

from ingest import load, ocr, remote
from ingest.encode import EncodeStage
from ingest.engines.events import (Accepted, EncodeFailed, Event, LoadDone, Loads, OcrPageDone, PartWritten, Stop,
                                   Written)
from ingest.engines.inflight import InFlight, Ranged, files_in_flight
from ingest.engines.run import Run, RunError
from ingest.engines.warm import loader_pools
from ingest.files import INTERRUPTED, FileRef, Finished, Outcome, Times, evolve
from ingest.load_batch import Batches, batchable
from ingest.loaders import pool_for
from ingest.sniff import Misnamed, content_format, unchanged
from ingest.store import StoreError
from ingest.store.errors import DiskFull
from ingest.timeline import Timeline, slots
from ingest.workers.failure import Failure
from ingest.workers.pool import Pools
from ingest.workers.reorder import Reorder
from ingest.write import Writer


class LocalRun(Run):
    """The run on this machine's processes: loader pools, the encode pool, writer processes (NOTE)."""

    def __init__(self, cfg: dict[str, Any], *args: Any, **kwargs: Any):
        super().__init__(cfg, *args, **kwargs)
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._pending: dict[int, load.Job | load.Pages] = {}     # dispatched, not yet finished
        self._in_flight = InFlight(files_in_flight(cfg))
        self._ranged = Ranged(self._in_flight, lambda fmt: cfg["loaders"][pool_for(fmt)]["workers"], self._load_range)
        self._reorder: Reorder[Finished] = Reorder(InFlight.most_files(
            self._in_flight.max_loading, EncodeStage.most_chunks_ahead(cfg["run"]["max_chunks_in_flight"])))
        self._total: int | None = None      # files pulled from the scan, once it is exhausted
        self.pools: Pools | None = None
        self._batches: Batches | None = None  # small files waiting to go to a loader several to a task
        self._replaced = 0                  # pools replaced before this run (a warm pipeline's)
        self._reads = 0                     # the collection's reuse reads before this run (a warm pipeline's)
        self.stage: EncodeStage | None = None
        self.writer: Writer | None = None

    def ingest(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> None:
        """Every file of the scan (lazy: pulled as files are dispatched) through the pipeline; each file
        ends through `settle`, in file order. Watch's syncs use its warm pipeline's processes (warm.py)."""
        cfg, col, self.timeline, pipe = self.cfg, self.col, Timeline(self.started), self.pipeline
        self.pools = pipe.loader_pools() if pipe else loader_pools(cfg)
        self._replaced = self.pools.replaced
        self._batches = Batches(self.pools, self.loader_options, self.spec,
                                lambda done: self.events.put(Loads(tuple(LoadDone(*d) for d in done))))
        self._reads = col.reuse.reads if col.reuse is not None else 0
        self.writer = (pipe.writer if pipe else Writer)(
            col.store, col.manifest, col.model.name, col.settings, cfg["store"]["batch_size"],
            lambda files: self.events.put(Accepted(tuple((f.ref.seq, f.chunk_count if f.outcome.status == "ingested"
                                                          else 0) for f in files))),
            lambda files: self.events.put(Written(files)), col.backend, writers=cfg["store"]["writers"], timeline=self.timeline)
        self.stage = (pipe.encode_stage if pipe else EncodeStage)(
            col.model, {**cfg["model"], "backend": col.backend}, self.writer, lambda e: self.events.put(EncodeFailed(e)),
            self.stopping, lambda f: self.events.put(PartWritten(f.ref.seq, f.chunk_count)), self.timeline,
            reuse=col.reuse)
        thread = threading.Thread(target=self.stage.run, name="ingest-encode", daemon=True)
        thread.start()
        self._loop(files, thread)

    def close(self) -> None:
        """Stop every process of the engine (also after an error); a warm pipeline's stay up (watch stops them)."""
        if self.pools is not None and self.pipeline is None:
            self.pools.stop()
        if self.stage is not None:
            self.stage.close()
        if self.writer is not None:
            self.writer.close(abandon=isinstance(self._fatal, (DiskFull, RunError)))
        if self._fatal is not None:           # the files recorded before the run stopped are written (issue 40)
            while True:
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    break
                if isinstance(event, Written):
                    for file in event.files:
                        self.settle(file)

    def engine_totals(self) -> dict[str, Any]:
        w = self.writer
        return {"pools_replaced": self.pools.replaced - self._replaced, "first_row_s": w.first_row_s(self.started) if w else None,
                "reuse_reads": (self.col.reuse.reads if self.col.reuse is not None else 0) - self._reads,
                "timeline": self.timeline.report(slots(self.cfg["loaders"], self.tally.by_format, self.stage.workers,
                                                       w.processes))}

    def rates(self) -> dict[str, float]:
        return self.tally.rates(self.stage, self.writer)

    def on_stop(self) -> None:
        self.events.put(Stop())

    def _loop(self, files: Iterator[tuple[FileRef, Outcome | None]], encode_thread: threading.Thread) -> None:
        max_chunks = self.cfg["run"]["max_chunks_in_flight"]
        in_flight = self._in_flight
        pulled, exhausted = 0, False
        while True:
            while (not exhausted and not self.stopping.is_set()
                   and in_flight.may_dispatch(self.stage.chunks_ahead(max_chunks))):
                item = next(files, None)
                if item is None:
                    exhausted, self._total = True, pulled
                    if self._reorder.next == pulled:
                        self.stage.feed.put(None)          # end of input for the encoder
                    break
                pulled += 1
                ref, problem = item
                same = None if problem or self._open or self._reorder.next != ref.seq else \
                    unchanged(ref, self.col.known.get(ref.source), self.col.settings)
                if same is not None:            # unchanged, nothing before it unsettled: it ends here, in order
                    self._reorder.put(ref.seq, same)
                    self.settle(same)
                    continue
                in_flight.dispatch()
                self._open[ref.seq] = ref
                self._dispatch(ref, problem)
            if in_flight.empty and not self._open and (exhausted or self.stopping.is_set()):
                break
            if self.events.empty():
                self._batches.flush()           # nothing to do but wait: send what was gathered (load_batch NOTE)
            if (event := self._next_event(encode_thread)) is None:
                try:
                    self.col.check_lease()          # another run took the collection over?
                    self.writer.flush_if_due()
                except StoreError as exc:
                    self._fatal = exc
                    break
                continue
            if isinstance(event, Accepted):
                for seq, chunks in event.files:
                    in_flight.accepted(seq)
                self.progress.embedded(sum(chunks for _, chunks in event.files))
            elif isinstance(event, Written):
                for file in event.files:
                    self.settle(file)
            elif isinstance(event, EncodeFailed):
                self._fatal = self._fatal_error(event.error)
                break
            elif isinstance(event, Stop):
                self._interrupt()
            elif isinstance(event, LoadDone):
                self.timeline.worked(event.times)
                self._loaded(event)
            elif isinstance(event, Loads):          # one worker loaded them one after another: their time at once
                self.timeline.worked(sum((d.times for d in event.done), Times()))
                for done in event.done:
                    self._loaded(done)
            else:
                self._part_done(event)
        encode_thread.join(timeout=30 if self._fatal is None else 1)
        while self._fatal is None and not self.events.empty():    # an error after the last file settled: the
            if isinstance(event := self.events.get_nowait(), EncodeFailed):     # last commit's (a full disk)
                self._fatal = self._fatal_error(event.error)

    def _next_event(self, encode_thread: threading.Thread) -> Any:
        """The next event, or None after 0.5 s without one. RuntimeError if the encode thread ended with nothing
        left to say (an error it hit is its last event, which may arrive after the get timed out)."""
        try:
            return self.events.get(timeout=0.5)
        except queue.Empty:
            if encode_thread.is_alive():
                return None
        try:
            return self.events.get_nowait()
        except queue.Empty:
            raise RuntimeError("the encode thread stopped unexpectedly") from None

    # -- per-file steps ---------------------------------------------------------------
    def _dispatch(self, ref: FileRef, problem: Outcome | None) -> None:
        job = load.plan(ref, problem, self.col.known.get(ref.source), self.col.settings,
                        self.cfg["limits"]["max_file_mb"], defer=batchable)     # ingest/sniff.py NOTE: deferred sniff
        if isinstance(job, Finished):
            return self._complete(job)
        self._send(job)

    def _send(self, job: load.Job) -> None:
        """A planned file to its loader pool (small text files several to a task)."""
        ref = job.ref
        self._pending[ref.seq] = job
        if job.old_hash and self.col.reuse is not None:
            self.col.reuse.expect(ref.source)         # its previous rows are read with others' (ingest/reuse.py)
        self.stage.start_pool()
        if batchable(job.ref):
            return self._batches.add(job.ref, job.known_hash)
        self._batches.flush(pool_for(job.ref.fmt))     # its pool takes tasks in file order (load_batch NOTE)
        future = load.submit(self.pools, job.ref, self.loader_options, self.spec, job.known_hash)
        future.add_done_callback(lambda f: self.events.put(LoadDone(ref.seq, f.result())))

    def _loaded(self, event: LoadDone) -> None:
        """A load task's result (its time is on the timeline already)."""
        state = self._pending.get(event.seq)
        if event.part:                                      # a range of a big file
            if isinstance(state, load.Pages):
                state.add_part(event.part, event.result)
                self._part_loaded(state, event.part, event.result)
            return
        if not isinstance(state, load.Job):                 # interrupted meanwhile
            return
        if isinstance(event.result, Misnamed):              # its loader sniffed another format: to that one's pool
            ref = content_format(state.ref, event.result.fmt, self.cfg["limits"]["max_file_mb"])
            return self._complete(ref) if isinstance(ref, Finished) else self._send(evolve(state, ref=ref))
        state = load.after_load(state.ref, event.result, state.old_hash, state.known_chunks)
        if isinstance(state, Finished):
            return self._complete(state)
        self._pending[event.seq] = state
        if state.todo:
            self._ranged.files[event.seq] = state
        self._part_loaded(state, 0, event.result)

    def _part_loaded(self, pages: load.Pages, part: int, result: load.Loaded | Failure) -> None:
        """A part of a file is loaded: OCR its pages, hand on its parts that are ready, in order."""
        seq = pages.ref.seq
        if isinstance(result, load.Loaded) and result.ocr_pages:
            for page, future in ocr.fan_out(self.pools, pages.ref.path, result.ocr_pages, self.ocr_options, self.spec,
                                            pages.doc, self.cfg["loaders"]["ocr"]["timeout_s"]):
                future.add_done_callback(lambda f, p=page: self.events.put(OcrPageDone(seq, part, p, f.result())))
        self._hand_on(pages)

    def _part_done(self, event: OcrPageDone | PartWritten) -> None:
        """An OCR page of a loaded file is back, or the writer holds a part of a big file."""
        if isinstance(event, PartWritten):
            self._in_flight.written(event.seq, event.chunks)
            self.progress.embedded(event.chunks)
            return self._ranged.load(self.stage.chunks_ahead(self.cfg["run"]["max_chunks_in_flight"]), self._reorder.next)
        self.timeline.worked(event.result.times)
        pages = self._pending.get(event.seq)
        if isinstance(pages, load.Pages):
            pages.add_ocr(event.part, event.page, event.result)
            self._hand_on(pages)

    def _hand_on(self, pages: load.Pages) -> None:
        if (last := self._ranged.hand_on(pages, self._reorder.next, self.stage.feed.put)) is not None:
            self._complete(last)
        if self._ranged.files:
            self._ranged.load(self.stage.chunks_ahead(self.cfg["run"]["max_chunks_in_flight"]), self._reorder.next)

    def _load_range(self, pages: load.Pages) -> None:
        seq = pages.ref.seq
        part, future = load.submit_range(self.pools, pages, self.loader_options, self.spec)
        future.add_done_callback(lambda f: self.events.put(LoadDone(seq, f.result(), part)))

    def _complete(self, file: Finished) -> None:
        """Hand a finished file (a big file's last part) to the reorder buffer; feed the encoder every file
        that is next in order, after its parts that waited."""
        seq = file.ref.seq
        self._pending.pop(seq, None)
        remote.discard(file.ref.path)                  # its local copy, if it was fetched (ingest/remote.py NOTE)
        self._in_flight.loaded(seq, file.chunk_count)
        for ready in self._reorder.put(seq, load.drop_if_skipped(file, self.col.known)):
            for part in self._ranged.released(ready.ref.seq):
                self.stage.feed.put(part)
            self.stage.feed.put(ready)
        for part in self._ranged.released(self._reorder.next):
            self.stage.feed.put(part)
        if self._reorder.next == self._total:
            self.stage.feed.put(None)                  # end of input for the encoder
        if self._ranged.files:
            self._ranged.load(self.stage.chunks_ahead(self.cfg["run"]["max_chunks_in_flight"]), self._reorder.next)
    # -- stopping ---------------------------------------------------------------------
    def _interrupt(self) -> None:
        if not self.quiet:
            print(f"\n{self.signals.name}: stopping: writing what is already encoded, the rest is interrupted "
                  "(a second signal quits at once)", file=sys.stderr)
        self._batches.clear()
        self.pools.stop()
        self._ranged.clear()
        for seq in sorted(self._pending):
            state = self._pending[seq]
            self._complete(state.fail(INTERRUPTED) if isinstance(state, load.Pages)
                           else Finished(state.ref, Outcome("failed", INTERRUPTED)))
        self.stage.feed.put(None)

    @staticmethod
    def _fatal_error(exc: BaseException) -> StoreError | RunError:
        """The one-line error that stops the run (the report is still written)."""
        if isinstance(exc, StoreError):
            return exc
        return RunError(f"encoding stopped the run: {' '.join(str(exc).split())[:300]}")
