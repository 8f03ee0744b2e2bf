"""`ingest run`: the dispatcher. Each file walks through the steps, one module each:

    scan -> sniff -> load (loader pools; chunk in the worker) -> OCR fan-out, big files' ranges -> reorder -> encode -> write

NOTE (flow and shutdown protocol):
- The main thread scans the folder and dispatches files while fewer than [run]
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
from pathlib import Path
from typing import Any

from ingest import load, ocr
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
from ingest.report import build_report, default_report_path, summary, write_report, write_unstarted
from ingest.scan import scan, unlisted
from ingest.engines.stop import Interrupted, StopSignals
from ingest.store import StoreError
from ingest.workers.failure import Failure
from ingest.workers.pool import Pools
from ingest.workers.reorder import Reorder
from ingest.write import Writer


class RunError(RuntimeError):
    """The run cannot go on (encoder failed); the message is one line."""


EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2      # EXIT_ERROR: the run could not start or an error stopped it
START_ERRORS = (ConfigError, StoreError, ModelNotFound, BackendError, OSError)    # what can keep a run from starting


class Run:
    def __init__(self, cfg: dict[str, Any], root: Path, *, quiet: bool = False, prune: bool = False,
                 reembed: bool = False, report_path: Path | None = None):
        self.cfg, self.root = cfg, root.resolve()
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
        self._total = 0
        self._fatal: StoreError | RunError | None = None     # what stopped the run, if anything did
        self.pools: Pools | None = None
        self.stage: EncodeStage | None = None
        self.writer: Writer | None = None

    def execute(self) -> int:
        """Ingest the folder: the exit code (EXIT_OK, EXIT_FAILED, or 128 + the stop signal); a StoreError or
        RunError that stopped the run is raised after the report is written."""
        started = time.perf_counter()
        with self.signals:
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
        files = list(scan(self.root, cfg["run"]["follow_symlinks"]))
        self.progress = Progress(len(files), self.quiet)
        self.signals.ingesting()
        try:
            written = self.ingest(files)
        finally:
            self.close()
            self.progress.close()
        fatal = self._fatal
        if fatal is not None:                 # every file not written fails with the run's error
            done = {f.ref.seq for f in written}
            written += [Finished(ref, Outcome("failed", f"not written: {fatal}")) for ref, _ in files
                        if ref.seq not in done]
        try:
            pruned = self._prune(files) if not (self.stopping.is_set() or fatal) else 0
        except StoreError as exc:             # lease lost or store gone while pruning: the report says so
            pruned, fatal = 0, exc
        code = (EXIT_ERROR if fatal is not None else self.signals.exit_code if self.signals.exit_code is not None
                else EXIT_FAILED if any(f.outcome.status == "failed" for f in written) else EXIT_OK)
        report = build_report(written, time.perf_counter() - started, self.rates(written),
                              {"not_started": len(files) - len(written), "pruned": pruned,
                               "interrupted": self.stopping.is_set(), "signal": self.signals.name,
                               "stopped_by": str(fatal) if fatal else None, "exit_code": code,
                               **self.engine_totals(),
                               "store": col.store.uri, "collection": col.store.collection, "model": col.model.name,
                               "backend": col.backend})
        write_report(report, self.report_path)
        col.close(release=not isinstance(fatal, StoreError))
        if not self.quiet:
            print(summary(report), file=sys.stderr)
            print(f"report: {self.report_path}", file=sys.stderr)
        if fatal is not None:
            raise fatal                       # the CLI's one line, exit EXIT_ERROR (the report says so)
        return code

    # -- the local engine: what another engine replaces -------------------------------
    def check(self) -> None:
        """Refuse settings this engine cannot run with, before anything starts (ConfigError)."""

    def ingest(self, files: list[tuple[FileRef, Outcome | None]]) -> list[Finished]:
        """Every file of the scan through the pipeline: the files written (settled), in file order."""
        cfg, col = self.cfg, self.col
        plugins = tuple(cfg["loaders"]["plugins"])
        self.pools = Pools({p: cfg["loaders"][p]["workers"] for p in FORMAT_POOLS},
                           {p: cfg["loaders"][p]["timeout_s"] for p in FORMAT_POOLS},
                           load.init_loader_process, (plugins, cfg["limits"]["worker_memory_mb"]))
        self.writer = Writer(col.store, col.manifest, col.model.name, col.settings, cfg["store"]["batch_size"],
                             lambda f: self.events.put(Accepted(f.ref.seq, f.chunk_count if f.outcome.status == "ingested" else 0)), lambda f: self.events.put(Written(f)),
                             col.backend, writers=cfg["store"]["writers"])
        self.stage = EncodeStage(col.model, {**cfg["model"], "backend": col.backend}, self.writer,
                                 lambda e: self.events.put(EncodeFailed(e)), self.stopping,
                                 lambda f: self.events.put(PartWritten(f.ref.seq, f.chunk_count)))
        thread = threading.Thread(target=self.stage.run, name="ingest-encode", daemon=True)
        thread.start()
        return self._loop(files, thread)

    def close(self) -> None:
        """Stop every process of the engine (also after an error)."""
        if self.pools is not None:
            self.pools.stop()
        if self.stage is not None:
            self.stage.close()
        if self.writer is not None:
            self.writer.close()

    def engine_totals(self) -> dict[str, Any]:
        return {"pools_replaced": self.pools.replaced}

    def _loop(self, files: list[tuple[FileRef, Outcome | None]], encode_thread: threading.Thread) -> list[Finished]:
        max_chunks = self.cfg["run"]["max_chunks_in_flight"]
        in_flight = self._in_flight
        todo = iter(files)
        self._total = len(files)
        if not files:
            self.stage.feed.put(None)
        written: list[Finished] = []
        dispatched, exhausted = 0, False
        while True:
            while (not exhausted and not self.stopping.is_set()
                   and in_flight.may_dispatch(self.stage.chunks_ahead(max_chunks))):
                item = next(todo, None)
                if item is None:
                    exhausted = True
                    break
                in_flight.dispatch()
                dispatched += 1
                self._dispatch(*item)
            if in_flight.empty and len(written) == dispatched and (exhausted or self.stopping.is_set()):
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
                self.progress.written(event.chunks)
            elif isinstance(event, Written):
                written.append(event.file)
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
        return written

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
                                            pages.doc):
                future.add_done_callback(lambda f, p=page: self.events.put(OcrPageDone(seq, part, p, f.result())))
        self._hand_on(pages)

    def _part_done(self, event: OcrPageDone | PartWritten) -> None:
        """An OCR page of a loaded file is back, or the writer holds a part of a big file."""
        if isinstance(event, PartWritten):
            self._in_flight.written(event.seq, event.chunks)
            self.progress.written(event.chunks)
            return self._ranged.load(self.stage.chunks_ahead(self.cfg["run"]["max_chunks_in_flight"]), self._reorder.next)
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
        self._report_unstarted(started, f"{name} while the run was starting", code, interrupted=True, signal=name)
        if col is not None:
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

    # -- end of run -------------------------------------------------------------------
    def _prune(self, files: list[tuple[FileRef, Outcome | None]]) -> int:
        """--prune: remove the recorded files the scan saw gone (never under a folder it could not list)."""
        present, folders = {ref.source for ref, _ in files}, unlisted(files)
        if self.prune:
            return len(self.col.prune(present, folders))
        gone = self.col.gone(present, folders)
        if gone and not self.quiet:
            print(f"{len(gone)} file(s) in the store no longer exist in the folder; --prune removes them",
                  file=sys.stderr)
        return 0

    def rates(self, files: list[Finished]) -> dict[str, float]:
        ingested = [f.outcome for f in files if f.outcome.status == "ingested"]
        chunks, load_s = sum(o.chunks for o in ingested), sum(o.seconds for o in ingested)
        rates = {}
        if chunks and load_s:
            rates["load"] = chunks / load_s
        for stage in ("tokenize", "encode"):
            secs = self.stage.stats.get(f"{stage}_s") if self.stage is not None else None
            if chunks and secs:
                rates[stage] = chunks / secs
        if chunks and self.writer is not None and self.writer.seconds:
            rates["write"] = self.writer.rows_written / self.writer.seconds
        return rates
