"""Every engine's run: `Run.execute` starts it (config, plugins, collection), scans lazily, hands the scan to
the engine's `ingest`, and ends it the same way whatever the engine: the files not written, prune, the
report (JSON and HTML), the last-run record, the exit code. The engines (`LocalRun` in
ingest/engines/local.py, `RayRun` in ray_driver.py) replace `ingest`, `close`, `engine_totals`, `rates`
and `on_stop`, and end each file once through `settle`.

NOTE (stop signals): SIGINT (Ctrl-C) and SIGTERM (systemctl/docker/kubernetes stop; to the supervisor
alone or to the whole group, whose other processes leave stopping to us: workers/spawn.py) are handled
from the first line of `execute` (ingest/engines/stop.py). While the run starts (config checks, model,
collection, ONNX export, scan) the handler raises Interrupted, which ends whatever step is running; the
report says so. Once ingesting, the first signal sets `stopping` and calls the engine's `on_stop`: the
engine stops intake, drops what is not yet encoded and lets the writer store what is (ingest/engines/local.py
NOTE; the Ray engine stops intake and Ray and records the files already acknowledged); then the report is
written and the exit code is 128 + the signal (130, 143), which the report names. A second signal, or
STOP_GRACE_S after the first, quits (`_quit`, in a thread of its own): the report is written from the
spool, every file not settled yet "interrupted" and `stopped_by` saying why, the last run is recorded (a
few seconds at most), the fetch folder removed, and the process ends with that code (workers follow via
their watchdogs; the rerun redoes what was not recorded). `_reporting` keeps the two apart: a file
settles, or the report is written, under it, and whichever writes the report first is the only one.
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from ingest import load, remote
from ingest.backends import BackendError
from ingest.config import ConfigError, chunk_spec, loader_options, ocr_options
from ingest.engines.stop import Interrupted, StopSignals
from ingest.files import INTERRUPTED, FileRef, Finished, Outcome
from ingest.model_ref import ModelNotFound
from ingest.progress import Progress
from ingest.reuse import Reuse
from ingest.report import Tally, default_report_path, summary, unwritable, write_unstarted
from ingest.scan import Scan, common_root, scan, under
from ingest.status import LastRun
from ingest.timeline import store_bound
from ingest.store import StoreError, kind, redact
from ingest.store.collection import open_collection
from ingest.workers.limits import keep_heap, tree_cpu_s

if TYPE_CHECKING:
    from ingest.engines.warm import Pipeline


class RunError(RuntimeError):
    """The run cannot go on (encoder failed); the message is one line."""


EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2      # EXIT_ERROR: the run could not start or an error stopped it
START_ERRORS = (ConfigError, StoreError, ModelNotFound, BackendError, OSError)    # what can keep a run from starting
QUIT_WAIT_S = 5.0       # quitting: how long to wait for a report being written, and for the last-run record


class Run:
    """A run of `ingest run PATH...` with some engine (module docstring)."""

    tree_cpu = True         # the engine's processes are all this process's descendants: the report gives their CPU

    def __init__(self, cfg: dict[str, Any], paths: Path | str | Sequence[Path], *, quiet: bool = False,
                 prune: bool = False, reembed: bool = False, report_path: Path | None = None,
                 pipeline: Pipeline | None = None):
        self.cfg, (self.root, self.named) = cfg, (paths, None) if remote.is_url(paths) else common_root(paths)
        self.last, self.totals = LastRun(), None     # ingest status's last run; the report's totals (--json)
        self.quiet, self.prune, self.reembed = quiet, prune, reembed
        self.pipeline = pipeline                # watch's warm pipeline (warm.py): its collection and processes
        self.report_path = report_path or default_report_path(cfg["store"]["uri"])
        self.stopping = threading.Event()
        self.signals = StopSignals(self.stopping, self.on_stop, self._quit)
        self.col = self.tally = self._files = None
        self._open: dict[int, FileRef] = {}     # dispatched, not yet settled (bounded by what is in flight)
        self._fatal: StoreError | RunError | None = None     # what stopped the run, if anything did
        self._reporting = threading.Lock()      # held to settle a file or write the report (NOTE: stop signals)
        self._reported = False                  # the report is written, or being written
        self._fetched: str | None = None        # a URL's fetch folder

    def execute(self) -> int:
        """Ingest the folder: the exit code (EXIT_OK, EXIT_FAILED, or 128 + the stop signal); a StoreError or
        RunError that stopped the run is raised after the report is written."""
        started = self.started = time.perf_counter()
        keep_heap()              # the supervisor pickles a writer batch (1.4 MB) a few hundred rows: no fresh mmaps
        self._cpu_at_start = tree_cpu_s() if self.tree_cpu else None
        with self.signals, remote.fetch_dir(self.root) as self._fetched:     # a URL's objects go there (ingest/remote.py)
            try:
                return self._execute(started)
            except Interrupted:
                return self._stopped_at_start(started)

    def _execute(self, started: float) -> int:
        cfg = self.cfg
        if (why := unwritable(self.report_path)) is not None:
            raise RunError(why)                 # one line, exit 2, before anything is opened or written
        try:
            self.check()
            load.import_plugins(tuple(cfg["loaders"]["plugins"]))
            self.col = col = self.pipeline.collection(self.reembed) if self.pipeline else \
                Reuse.attach(open_collection(cfg, self.reembed), cfg, self.reembed)
        except START_ERRORS as exc:             # the report says why, then the one line (exit 2)
            error = f"the run cannot start: {exc}" if isinstance(exc, OSError) else str(exc)
            unwritten = self._report_unstarted(started, error, EXIT_ERROR)
            if isinstance(exc, OSError) or unwritten:
                raise RunError(error + unwritten) from None
            raise
        self.loader_options, self.ocr_options, self.spec = loader_options(cfg), ocr_options(cfg), chunk_spec(cfg, col.model)
        if col.reuse is not None:               # the loaders make each chunk's reuse key (ingest/chunk.py)
            self.spec = replace(self.spec, key_secret=col.reuse.secret)
        if cfg["limits"]["worker_memory_mb"]:
            # glibc reserves 64 MB of address space per malloc arena, up to 8 per core, and RLIMIT_AS
            # counts reservations: without a cap, an OCR worker on 16 cores fails every page.
            os.environ.setdefault("MALLOC_ARENA_MAX", "4")
        for warning in col.warnings:          # a Lite store past its size (docs/scale.md): said at once, and reported
            print(f"warning: {warning}", file=sys.stderr)
        self.tally, self.progress = Tally(self.report_path, under(col.known, self.named)), Progress(self.quiet)
        walk = remote.scan_url if remote.is_url(self.root) else lambda root, follow: scan(root, follow, self.named)
        files = self._files = Scan(walk(self.root, cfg["run"]["follow_symlinks"]), self.progress.found)
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
            if not (self.stopping.is_set() or fatal):
                col.store.finish()            # PostgreSQL's HNSW, LanceDB's IVF-Flat: built once, after a bulk first load
        except StoreError as exc:             # lease lost or store gone while pruning: the report says so
            pruned, fatal = 0, exc
        code = (EXIT_ERROR if fatal is not None else self.signals.exit_code if self.signals.exit_code is not None
                else EXIT_FAILED if self.tally.by_status["failed"] else EXIT_OK)
        with self._reporting:                 # blocks for good if _quit writes it (it ends the process)
            self._reported = True
            totals = self._totals(str(fatal) if fatal else None, code, pruned, self.engine_totals())
            try:
                self.tally.write(totals)
            except OSError as exc:            # a report folder gone or made read-only since the start, a full disk
                lost = (f"the report could not be written to {self.report_path} ({exc.strerror or exc}); the files' "
                        f"lines {'that could be written ' if self.tally.spool_error else ''}are in {self.tally.spool}")
                if fatal is not None:         # what stopped the run is the last line; this one before it
                    print(f"warning: {lost}", file=sys.stderr)
                fatal = fatal or RunError(lost)
                totals.update(exit_code=EXIT_ERROR, stopped_by=totals["stopped_by"] or str(fatal))
            self.totals = totals
            self.last.record(col, self.report_path, totals, fatal)      # after the report: store first, then record
        if self.pipeline is None or self.pipeline.col is not col:    # watch's warm pipeline keeps its own open
            col.close(release=not isinstance(fatal, StoreError))
        if not self.quiet:
            print(summary(totals), file=sys.stderr)
            print(f"report: {self.report_path}", file=sys.stderr)
            if totals.get("store_bound"):         # the store held the run back: the last line says so
                print(totals["store_bound"]["line"], file=sys.stderr)
        if fatal is not None:
            raise fatal                       # the CLI's one line, exit EXIT_ERROR (the report says so)
        return code

    # -- what an engine replaces ------------------------------------------------------
    def check(self) -> None:
        """Refuse settings this engine cannot run with, before anything starts (ConfigError)."""

    def ingest(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> None:
        """Every file of the lazy scan through the engine; each file ends through `settle`."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop every process of the engine (also after an error)."""

    def engine_totals(self) -> dict[str, Any]:
        """The engine's own totals for the report."""
        return {}

    def rates(self) -> dict[str, float]:
        """Chunks per second by stage, for the report."""
        return self.tally.rates(None, None)

    def on_stop(self) -> None:
        """A stop signal came while ingesting (`stopping` is set): the engine's hook, run in the signal handler."""

    def _totals(self, stopped_by: str | None, code: int, pruned: int, engine: dict[str, Any]) -> dict[str, Any]:
        """The report's totals of a run that ingested (or began to)."""
        files, col, tally = self._files, self.col, self.tally
        # not_started: files the scan found that never ended; None when the scan did not finish (a stop
        # before the end of the folder: what it holds beyond is unknown), which scan_finished says.
        cpu_s = tree_cpu_s() - self._cpu_at_start if self._cpu_at_start is not None else None
        totals = tally.totals(time.perf_counter() - self.started, self.rates(),
                              {"not_started": files.found - tally.files if files.finished else None,
                               "scan_finished": files.finished, "pruned": pruned,
                               "interrupted": self.stopping.is_set(), "signal": self.signals.name,
                               "stopped_by": stopped_by, "exit_code": code, **engine,
                               "store": col.store.uri, "collection": col.store.collection, "model": col.model.name,
                               "backend": col.backend, "warnings": col.warnings}, cpu_s)
        totals["store_bound"] = store_bound(totals, col.store.caps.name, kind(col.store.uri))   # None: it was not
        return totals

    # -- stopping before ingesting ----------------------------------------------------
    def _report_unstarted(self, started: float, stopped_by: str, code: int, **totals: Any) -> str:
        """Write the report of a run that stopped before ingesting (report.write_unstarted): "" once
        written, else why not."""
        cfg, col = self.cfg, self.col
        return write_unstarted(self.report_path, stopped_by, code, time.perf_counter() - started, {
            **totals, "store": redact(cfg["store"]["uri"]), "collection": cfg["store"]["collection"],
            "model": col.model.name if col is not None else cfg["model"]["name"],
            "backend": col.backend if col is not None else None})

    def _stopped_at_start(self, started: float) -> int:
        """A stop signal came before ingesting began: the report says so; the exit code."""
        col, name, code = self.col, self.signals.name, self.signals.exit_code
        why = f"{name} while the run was starting"
        with self._reporting:                 # blocks for good if _quit writes it (it ends the process)
            self._reported = True
            self._report_unstarted(started, why, code, interrupted=True, signal=name)
            if col is not None:
                self.last.record(col, self.report_path, {"seconds": time.perf_counter() - started,
                                                         "exit_code": code, "signal": name, "stopped_by": why})
        if col is not None and (self.pipeline is None or self.pipeline.col is not col):
            col.close()
        if not self.quiet:
            print(f"\ningest: {name} while starting; nothing was ingested", file=sys.stderr)
            print(f"report: {self.report_path}", file=sys.stderr)
        return code

    # -- every engine: the scan and the files as they end ---------------------------
    def settle(self, file: Finished) -> None:
        """`file` ends: every engine calls this once per file (the local one in file order). Its report line goes
        to the spool, the counts and the bar move on, its source is seen (prune), an unlisted folder noted (Tally).
        While `_quit` writes the report, this waits for the process to end."""
        with self._reporting:
            self._open.pop(file.ref.seq, None)
            self.tally.add(file)
            self.last.add(file)
        self.progress.settled()

    def _quit(self, why: str) -> None:
        """The stop outlasted its grace, or a second signal came (NOTE: stop signals; a thread of its own, the
        process ends after it): the report from the spool, the files not settled "interrupted", `stopped_by`
        why; the last run recorded; the fetch folder removed."""
        try:
            if not self._reporting.acquire(timeout=QUIT_WAIT_S):
                print(f"ingest: no report written to {self.report_path}: it was still being written",
                      file=sys.stderr, flush=True)
                return
            if self._reported:                # written, or being written by the run itself: it ends as it is
                return
            self._reported = True
            code = self.signals.exit_code
            if self._files is None:           # still starting
                self._report_unstarted(self.started, why, code, interrupted=True, signal=self.signals.name)
                totals = {"seconds": time.perf_counter() - self.started, "exit_code": code,
                          "signal": self.signals.name, "stopped_by": why}
            else:
                for seq in sorted(self._open):
                    file = Finished(self._open[seq], Outcome("failed", INTERRUPTED))
                    self.tally.add(file)
                    self.last.add(file)
                try:                          # the engine's own totals, read while its threads run on
                    engine = self.engine_totals()
                except Exception:
                    engine = {}
                totals = self._totals(why, code, 0, engine)
                self.tally.write(totals)
            if self.col is not None:          # store first, then record: bounded, the process quits
                record = threading.Thread(target=self.last.record, args=(self.col, self.report_path, totals),
                                          daemon=True)
                record.start()
                record.join(QUIT_WAIT_S)
            if not self.quiet:
                print(f"report: {self.report_path}", file=sys.stderr, flush=True)
        finally:
            if self._fetched is not None:
                shutil.rmtree(self._fetched, ignore_errors=True)

    def _prune(self) -> int:
        """--prune: remove the recorded files the scan saw gone (under the PATHs; not under a folder it could not list)."""
        if self.prune:
            return len(self.col.prune(self.tally.unseen, self.tally.unlisted))
        if (gone := self.col.gone(self.tally.unseen, self.tally.unlisted)) and not self.quiet:
            print(f"{len(gone)} file(s) in the store no longer exist in the folder; --prune removes them",
                  file=sys.stderr)
        return 0
