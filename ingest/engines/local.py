"""`ingest run`: the dispatcher. Each file walks through the steps, one module each:

    scan -> sniff -> load (loader pools; chunk in the worker) -> OCR fan-out, big files' ranges -> reorder -> encode -> write

NOTE (flow and shutdown protocol):
- The main thread pulls the lazy scan as it dispatches files (each ends in `settle`; an unchanged
  file with no unsettled file before it settles at once, without the pipeline) while fewer than [run]
  max_files_in_flight are loading and fewer than max_chunks_in_flight chunks (each file counts at
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
- Stop signals (SIGINT: Ctrl-C; SIGTERM: systemctl/docker/kubernetes stop; to the supervisor
  alone or to the whole group, whose other processes leave stopping to us: workers/spawn.py)
  are handled from the first line of `execute`. While the run starts (config checks, model,
  collection, ONNX export, scan) the handler raises Interrupted, which ends whatever step is
  running; the report says so. Once ingesting, the first signal stops intake, kills loader
  workers, marks files not yet finished as failed "interrupted", lets the writer store what the
  encoder already has (files still waiting for an encoder that is not up yet are not waited
  for: ingest/encode.py), writes the report and exits 128 + the signal (130, 143); the report
  names the signal. A second signal, or STOP_GRACE_S after the first, quits at once with
  that code (no report; workers follow via their watchdogs; the rerun redoes what was not
  recorded). The handler is ingest/engines/stop.py's; events go on a SimpleQueue, which it may put to.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time
from itertools import chain
from pathlib import Path
from typing import Any, Iterator, Sequence

from ingest import load, ocr, remote
from ingest.store.collection import open_collection
from ingest.backends import BackendError
from ingest.config import FORMAT_POOLS, ConfigError, chunk_spec, loader_options, ocr_options
from ingest.encode import EncodeStage
from ingest.files import INTERRUPTED, FileRef, Finished, Outcome
from ingest.loaders import pool_for
from ingest.engines.events import Accepted, EncodeFailed, Event, LoadDone, OcrPageDone, PartWritten, Stop, Written
from ingest.engines.inflight import InFlight, Ranged
from ingest.model_ref import ModelNotFound
from ingest.progress import Progress
from ingest.report import Tally, default_report_path, summary, write_unstarted
from ingest.scan import Scan, common_root, scan, under
from ingest.sniff import unchanged
from ingest.status import LastRun
from ingest.engines.stop import Interrupted, StopSignals
from ingest.store import StoreError
from ingest.timeline import Timeline, slots
from ingest.workers.failure import Failure
from ingest.workers.pool import Pools
from ingest.workers.reorder import Reorder
from ingest.write import Writer


class RunError(RuntimeError):
    """The run cannot go on (encoder failed); the message is one line."""


EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2      # EXIT_ERROR: the run could not start or an error stopped it
START_ERRORS = (ConfigError, StoreError, ModelNotFound, BackendError, OSError)    # what can keep a run from starting


class Run:
    def __init__(self, cfg: dict[str, Any], paths: Path | str | Sequence[Path], *, quiet: bool = False,
                 prune: bool = False, reembed: bool = False, report_path: Path | None = None):
        self.cfg, (self.root, self.named) = cfg, (paths, None) if remote.is_url(paths) else common_root(paths)
        self.last, self.totals = LastRun(), None     # ingest status's last run; the report's totals (--json)
        self.quiet, self.prune, self.reembed = quiet, prune, reembed
        self.report_path = report_path or default_report_path(cfg["store"]["uri"])
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.signals = StopSignals(self.stopping, lambda: self.events.put(Stop()))
        self.col = None
        self._pending: dict[int, load.Job | load.Pages] = {}     # dispatched, not yet finished
        self._in_flight = InFlight(cfg["run"]["max_files_in_flight"])
        self._ranged = Ranged(self._in_flight, lambda fmt: cfg["loaders"][pool_for(fmt)]["workers"], self._load_range)
        self._reorder: Reorder[Finished] = Reorder(InFlight.most_files(
            cfg["run"]["max_files_in_flight"], EncodeStage.most_chunks_ahead(cfg["run"]["max_chunks_in_flight"])))
        self._total: int | None = None      # files pulled from the scan, once it is exhausted
        self._open: dict[int, FileRef] = {}     # dispatched, not yet settled (bounded by what is in flight)
        self._fatal: StoreError | RunError | None = None     # what stopped the run, if anything did
        self.pools: Pools | None = None
        self.stage: EncodeStage | None = None
        self.writer: Writer | None = None

    def execute(self) -> int:
        """Ingest the folder: the exit code (EXIT_OK, EXIT_FAILED, or 128 + the stop signal); a StoreError or
        RunError that stopped the run is raised after the report is written."""
        started = self.started = time.perf_counter()
        with self.signals, remote.fetch_dir(self.root):        # a URL's objects are fetched there (ingest/remote.py)
            try:
                return self._execute(started)
            except Interrupted:
                return self._stopped_at_start(started)

    def _execute(self, started: float) -> int:
        cfg = self.cfg
        try:
            self.check()
            load.import_plugins(tuple(cfg["loaders"]["plugins"]))
            self.col = col = open_collection(cfg, self.reembed)
        except START_ERRORS as exc:             # the report says why, then the one line (exit 2)
            error = f"the run cannot start: {exc}" if isinstance(exc, OSError) else str(exc)
            unwritten = self._report_unstarted(started, error, EXIT_ERROR)
            if isinstance(exc, OSError) or unwritten:
                raise RunError(error + unwritten) from None
            raise
        self.loader_options, self.ocr_options, self.spec = loader_options(cfg), ocr_options(cfg), chunk_spec(cfg, col.model)
        if cfg["limits"]["worker_memory_mb"]:
            # glibc reserves 64 MB of address space per malloc arena, up to 8 per core, and RLIMIT_AS
            # counts reservations: without a cap, an OCR worker on 16 cores fails every page.
            os.environ.setdefault("MALLOC_ARENA_MAX", "4")
        for warning in col.warnings:          # a Lite store past its size (docs/scale.md): said at once, and reported
            print(f"warning: {warning}", file=sys.stderr)
        self.tally, self.progress = Tally(self.report_path, under(col.known, self.named)), Progress(self.quiet)
        walk = remote.scan_url if remote.is_url(self.root) else lambda root, follow: scan(root, follow, self.named)
        files = Scan(walk(self.root, cfg["run"]["follow_symlinks"]), self.progress.found)
        self.signals.ingesting()
        try:
            self.ingest(files)
        finally:
            self.close()
            self.progress.close()
        fatal = self._fatal
        if fatal is not None:                 # every file not written fails with the run's error (the scan's rest too)
            for ref in chain([self._open[seq] for seq in sorted(self._open)], (ref for ref, _ in files)):
                self.settle(Finished(ref, Outcome("failed", f"not written: {fatal}")))
        try:
            pruned = self._prune() if not (self.stopping.is_set() or fatal) else 0
        except StoreError as exc:             # lease lost or store gone while pruning: the report says so
            pruned, fatal = 0, exc
        tally = self.tally
        code = (EXIT_ERROR if fatal is not None else self.signals.exit_code if self.signals.exit_code is not None
                else EXIT_FAILED if tally.by_status["failed"] else EXIT_OK)
        # not_started: files the scan found that never ended; None when the scan did not finish (a stop
        # before the end of the folder: what it holds beyond is unknown), which scan_finished says.
        totals = tally.totals(time.perf_counter() - started, tally.rates(self.stage, self.writer),
                              {"not_started": files.found - tally.files if files.finished else None,
                               "scan_finished": files.finished, "pruned": pruned,
                               "interrupted": self.stopping.is_set(), "signal": self.signals.name,
                               "stopped_by": str(fatal) if fatal else None, "exit_code": code,
                               **self.engine_totals(),
                               "store": col.store.uri, "collection": col.store.collection, "model": col.model.name,
                               "backend": col.backend, "warnings": col.warnings})
        tally.write(totals)
        self.totals = totals
        self.last.record(col, self.report_path, totals, fatal)      # after the report: store first, then record
        col.close(release=not isinstance(fatal, StoreError))
        if not self.quiet:
            print(summary(totals), file=sys.stderr)
            print(f"report: {self.report_path}", file=sys.stderr)
        if fatal is not None:
            raise fatal                       # the CLI's one line, exit EXIT_ERROR (the report says so)
        return code

    # -- the local engine: what another engine replaces -------------------------------
    def check(self) -> None:
        """Refuse settings this engine cannot run with, before anything starts (ConfigError)."""

    def ingest(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> None:
        """Every file of the scan (lazy: pulled as files are dispatched) through the pipeline; each file
        ends through `settle`, in file order."""
        cfg, col, self.timeline = self.cfg, self.col, Timeline(self.started)
        plugins = tuple(cfg["loaders"]["plugins"])
        self.pools = Pools({p: cfg["loaders"][p]["workers"] for p in FORMAT_POOLS},
                           {p: cfg["loaders"][p]["timeout_s"] for p in FORMAT_POOLS},
                           load.init_loader_process, (plugins, cfg["limits"]["worker_memory_mb"]))
        self.writer = Writer(col.store, col.manifest, col.model.name, col.settings, cfg["store"]["batch_size"],
                             lambda f: self.events.put(Accepted(f.ref.seq, f.chunk_count if f.outcome.status == "ingested" else 0)), lambda f: self.events.put(Written(f)),
                             col.backend, writers=cfg["store"]["writers"], timeline=self.timeline)
        self.stage = EncodeStage(col.model, {**cfg["model"], "backend": col.backend}, self.writer,
                                 lambda e: self.events.put(EncodeFailed(e)), self.stopping,
                                 lambda f: self.events.put(PartWritten(f.ref.seq, f.chunk_count)), self.timeline)
        thread = threading.Thread(target=self.stage.run, name="ingest-encode", daemon=True)
        thread.start()
        self._loop(files, thread)

    def close(self) -> None:
        """Stop every process of the engine (also after an error)."""
        if self.pools is not None:
            self.pools.stop()
        if self.stage is not None:
            self.stage.close()
        if self.writer is not None:
            self.writer.close()

    def engine_totals(self) -> dict[str, Any]:
        w = self.writer
        return {"pools_replaced": self.pools.replaced, "first_row_s": w.first_row_s(self.started) if w else None,
                "timeline": self.timeline.report(slots(self.cfg["loaders"], self.tally.by_format, self.stage.workers,
                                                       w.processes))}

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
            try:
                event = self.events.get(timeout=0.5)
            except queue.Empty:
                if not encode_thread.is_alive():
                    raise RuntimeError("the encode thread stopped unexpectedly")
                try:
                    self.col.check_lease()          # another run took the collection over?
                    self.writer.flush_if_due()
                except StoreError as exc:
                    self._fatal = exc
                    break
                continue
            if isinstance(event, Accepted):
                in_flight.accepted(event.seq)
                self.progress.embedded(event.chunks)
            elif isinstance(event, Written):
                self.settle(event.file)
            elif isinstance(event, EncodeFailed):
                self._fatal = self._fatal_error(event.error)
                break
            elif isinstance(event, Stop):
                self._interrupt()
            elif isinstance(event, LoadDone):
                self._loaded(event)
            else:
                self._part_done(event)
        encode_thread.join(timeout=30 if self._fatal is None else 1)

    # -- per-file steps ---------------------------------------------------------------
    def _dispatch(self, ref: FileRef, problem: Outcome | None) -> None:
        job = load.plan(ref, problem, self.col.known.get(ref.source), self.col.settings,
                        self.cfg["limits"]["max_file_mb"])
        if isinstance(job, Finished):
            return self._complete(job)
        self._pending[ref.seq] = job
        self.stage.start_pool()
        future = load.submit(self.pools, job.ref, self.loader_options, self.spec, job.known_hash)
        future.add_done_callback(lambda f: self.events.put(LoadDone(ref.seq, f.result())))

    def _loaded(self, event: LoadDone) -> None:
        self.timeline.worked(event.times)
        state = self._pending.get(event.seq)
        if event.part:                                      # a range of a big file
            if isinstance(state, load.Pages):
                state.add_part(event.part, event.result)
                self._part_loaded(state, event.part, event.result)
            return
        if not isinstance(state, load.Job):                 # interrupted meanwhile
            return
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
        if isinstance(result, load.Loaded):
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
    def _report_unstarted(self, started: float, stopped_by: str, code: int, **totals: Any) -> str:
        """Write the report of a run that stopped before ingesting (report.write_unstarted): "" once
        written, else why not."""
        cfg, col = self.cfg, self.col
        return write_unstarted(self.report_path, stopped_by, code, time.perf_counter() - started, {
            **totals, "store": cfg["store"]["uri"], "collection": cfg["store"]["collection"],
            "model": col.model.name if col is not None else cfg["model"]["name"],
            "backend": col.backend if col is not None else None})

    def _stopped_at_start(self, started: float) -> int:
        """A stop signal came before ingesting began: the report says so; the exit code."""
        col, name, code = self.col, self.signals.name, self.signals.exit_code
        why = f"{name} while the run was starting"
        self._report_unstarted(started, why, code, interrupted=True, signal=name)
        if col is not None:
            self.last.record(col, self.report_path, {"seconds": time.perf_counter() - started, "exit_code": code,
                                                     "signal": name, "stopped_by": why})
            col.close()
        if not self.quiet:
            print(f"\ningest: {name} while starting; nothing was ingested", file=sys.stderr)
            print(f"report: {self.report_path}", file=sys.stderr)
        return code

    def _interrupt(self) -> None:
        if not self.quiet:
            print(f"\n{self.signals.name}: writing what is already encoded (a second signal quits at once)",
                  file=sys.stderr)
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

    # -- every engine: the scan and the files as they end ---------------------------
    def settle(self, file: Finished) -> None:
        """`file` ends: every engine calls this once per file (the local one in file order). Its report line goes
        to the spool, the counts and the bar move on, its source is seen (prune), an unlisted folder noted (Tally)."""
        self._open.pop(file.ref.seq, None)
        self.tally.add(file)
        self.last.add(file)
        self.progress.settled()

    def _prune(self) -> int:
        """--prune: remove the recorded files the scan saw gone (under the PATHs; not under a folder it could not list)."""
        if self.prune:
            return len(self.col.prune(self.tally.unseen, self.tally.unlisted))
        if (gone := self.col.gone(self.tally.unseen, self.tally.unlisted)) and not self.quiet:
            print(f"{len(gone)} file(s) in the store no longer exist in the folder; --prune removes them",
                  file=sys.stderr)
        return 0
