"""`ingest run`: scan -> loader pools -> (OCR pool) -> reorder -> encode pool -> single writer.

NOTE (flow and shutdown protocol):
- The main thread scans the folder, dispatches files to the loader pool of their format
  (at most [run] max_files_in_flight files between dispatch and write), and handles
  results as events from one queue (every get has a timeout and checks the writer thread).
- Finished files pass a reorder buffer keyed by file number and enter the encode feed in
  file order; the encode pool returns groups in input order, so the writer thread stores
  rows in file order, then chunk order. Files that fail, skip or are unchanged travel the
  same path with no chunks, so the report and manifest see files in order too.
- First Ctrl-C (or SIGTERM): stop intake, kill loader workers, mark files not yet encoded
  as failed "interrupted", let the writer store what the encoder already has, write the
  report, exit 130. A second Ctrl-C exits at once (workers follow via their watchdogs).
"""
from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from importlib import import_module
from pathlib import Path
from typing import Any

from ingest.chunking import ChunkSpec
from ingest.config import FORMAT_POOLS
from ingest.encode_stage import INTERRUPTED, EncodeStage
from ingest.manifest import Entry, Manifest, manifest_path
from ingest.model_ref import resolve_model
from ingest.progress import Progress
from ingest.report import build_report, default_report_path, summary, write_report
from ingest.scan import FileJob, scan
from ingest.store import Store, StoreError
from ingest.writer import Writer
from ingest.loaders import LoaderError, Unsupported, format_for_extension, pool_for
from ingest.loaders.sniff import detect_format
from ingest.workers.load_tasks import load_file, ocr_page
from ingest.workers.loader_pools import LoaderPools
from ingest.workers.messages import Failure, LoadTask, OcrTask

class RunError(RuntimeError):
    """The run cannot go on (encoder failed); the message is one line."""


EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


class Run:
    def __init__(self, cfg: dict[str, Any], root: Path, *, quiet: bool = False, prune: bool = False,
                 reembed: bool = False, report_path: Path | None = None):
        self.cfg, self.root = cfg, root.resolve()
        self.quiet, self.prune, self.reembed = quiet, prune, reembed
        self.report_path = report_path or default_report_path(cfg["store"]["uri"])
        self.events: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self._pending: dict[int, FileJob] = {}       # dispatched, not yet complete
        self._ready: dict[int, FileJob] = {}         # reorder buffer: complete, waiting for earlier files
        self._next_seq = 0

    # -- setup ------------------------------------------------------------------------
    def _open(self) -> None:
        cfg = self.cfg
        self.model = resolve_model(cfg["model"]["name"])
        ch = cfg["chunking"]
        self.spec = ChunkSpec(self.model.tokenizer_file, self.model.max_seq_length,
                              ch["chunk_tokens"], ch["overlap_tokens"])
        self.settings = json.dumps({"model": self.model.name, "chunk_tokens": ch["chunk_tokens"],
                                    "overlap_tokens": ch["overlap_tokens"],
                                    "max_seq_length": self.model.max_seq_length}, sort_keys=True)
        self.store = Store(cfg["store"]["uri"], cfg["store"]["collection"])
        self.store.lock()
        self.manifest = Manifest(manifest_path(cfg["store"]["uri"], cfg["store"]["collection"]))
        recorded_settings = self.manifest.get_meta("settings")
        recorded_model = self.store.recorded_model()
        if self.reembed:
            self.store.drop()
            self.manifest.clear()
        elif recorded_model and recorded_model[0] != self.model.name:
            raise StoreError(f"collection {self.store.collection!r} holds {recorded_model[0]} vectors, not "
                             f"{self.model.name}; rerun with --reembed to re-embed everything, or use another --collection")
        elif recorded_settings and recorded_settings != self.settings:
            raise StoreError(f"model or chunking settings changed since the last run ({recorded_settings} -> "
                             f"{self.settings}); rerun with --reembed to re-embed everything")
        self.manifest.set_meta("settings", self.settings)
        self.known: dict[str, Entry] = self.manifest.all()
        loaders = cfg["loaders"]
        # A loader's options: its own table, plus [limits] and [loaders.legacy]; OCR also needs
        # the PDF passwords (it reopens encrypted scans).
        self.options = {p: {**loaders[p], "limits": cfg["limits"], "legacy": loaders["legacy"]} for p in FORMAT_POOLS}
        self.options["ocr"]["passwords"] = loaders["pdf"]["passwords"]
        self.pools = LoaderPools({p: loaders[p]["workers"] for p in FORMAT_POOLS},
                                 {p: loaders[p]["timeout_s"] for p in FORMAT_POOLS}, tuple(loaders["plugins"]))

    # -- run --------------------------------------------------------------------------
    def execute(self) -> int:
        started = time.perf_counter()
        self._open()
        for name in self.cfg["loaders"]["plugins"]:
            import_module(name)
        jobs = list(scan(self.root, self.cfg["run"]["follow_symlinks"]))
        self.progress = Progress(len(jobs), self.quiet)
        writer = Writer(self.store, self.manifest, self.model.name, self.settings,
                        self.cfg["store"]["batch_size"], max(1, self.cfg["run"]["max_files_in_flight"] // 2),
                        lambda job: self.events.put(("written", job)))
        self.writer = writer
        self.stage = EncodeStage(self.model, self.cfg["model"], writer, self.events, self.stopping)
        thread = threading.Thread(target=self.stage.run, name="ingest-writer", daemon=True)
        thread.start()
        old_int, old_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            signal.signal(signal.SIGINT, self._on_signal)
            signal.signal(signal.SIGTERM, self._on_signal)
        try:
            written = self._loop(jobs, thread)
        finally:
            if in_main:
                signal.signal(signal.SIGINT, old_int)
                signal.signal(signal.SIGTERM, old_term)
            self.pools.stop()
            self.stage.close()
            self.progress.close()
        pruned = self._prune({j.source for j in jobs}) if not self.stopping.is_set() else 0
        report = build_report(written, time.perf_counter() - started, self._rates(written),
                              {"not_started": len(jobs) - len(written), "pruned": pruned,
                               "interrupted": self.stopping.is_set(), "store": self.store.uri,
                               "collection": self.store.collection, "model": self.model.name})
        write_report(report, self.report_path)
        self.store.close()
        self.manifest.close()
        if not self.quiet:
            print(summary(report), file=sys.stderr)
            print(f"report: {self.report_path}", file=sys.stderr)
        if self.stopping.is_set():
            return EXIT_INTERRUPTED
        return EXIT_FAILED if any(j.status == "failed" for j in written) else EXIT_OK

    def _loop(self, jobs: list[FileJob], writer_thread: threading.Thread) -> list[FileJob]:
        window = self.cfg["run"]["max_files_in_flight"]
        todo = iter(jobs)
        self._total = len(jobs)
        if not jobs:
            self.stage.feed.put(None)
        written: list[FileJob] = []
        in_flight, exhausted = 0, False
        while True:
            while not exhausted and not self.stopping.is_set() and in_flight < window:
                job = next(todo, None)
                if job is None:
                    exhausted = True
                    break
                in_flight += 1
                self._start(job)
            if in_flight == 0 and (exhausted or self.stopping.is_set()):
                break
            try:
                kind, job, *payload = self.events.get(timeout=0.5)
            except queue.Empty:
                if not writer_thread.is_alive():
                    raise RuntimeError("the writer thread stopped unexpectedly")
                self.writer.flush_if_due()
                continue
            if kind == "written":
                in_flight -= 1
                job.pages = []                    # the text is stored: keep only the counts
                written.append(job)
                self.progress.written(job.chunks if job.status == "ingested" else 0)
            elif kind == "writer_error":
                exc = payload[0]
                if isinstance(exc, StoreError):
                    raise exc
                raise RunError(f"encoding stopped the run: {' '.join(str(exc).split())[:300]}; "
                               "see the message for the chunk or file") from exc
            elif kind == "stop":
                self._interrupt()
            elif job.status == "pending":       # results for interrupted files are ignored
                self._on_result(job, kind, payload[0])
        writer_thread.join(timeout=30)
        return written

    def _on_signal(self, signum, frame) -> None:
        if self.stopping.is_set():
            os._exit(EXIT_INTERRUPTED)
        self.stopping.set()
        self.events.put(("stop", None))

    def _interrupt(self) -> None:
        if not self.quiet:
            print("\ninterrupted: writing what is already encoded (Ctrl-C again to quit at once)", file=sys.stderr)
        self.pools.stop()
        for job in sorted(self._pending.values(), key=lambda j: j.seq):
            job.finish("failed", INTERRUPTED)
            self._complete(job)
        self.stage.feed.put(None)

    # -- per-file steps ---------------------------------------------------------------
    def _unchanged_by_stat(self, job: FileJob) -> bool:
        e = self.known.get(job.source)
        return bool(e and e.status == "ingested" and e.settings == self.settings
                    and (e.size, e.mtime_ns) == (job.size, job.mtime_ns))

    def _start(self, job: FileJob) -> None:
        if job.status != "pending":             # found broken or skipped by the scan
            return self._complete(job)
        suffix = Path(job.path).suffix.lower()
        job.fmt = format_for_extension(suffix) or suffix.lstrip(".") or "unknown"
        try:
            job.fmt = detect_format(Path(job.path))
        except Unsupported as exc:
            return self._complete(job, "skipped", str(exc))
        except LoaderError as exc:
            return self._complete(job, "failed", str(exc))
        limit_mb = self.cfg["limits"]["max_file_mb"]
        if job.size > limit_mb * 1e6:
            return self._complete(job, "failed", f"file is {job.size / 1e6:.0f} MB, over [limits] max_file_mb = "
                                                 f"{limit_mb:g}; raise the limit to ingest it")
        entry = self.known.get(job.source)
        if self._unchanged_by_stat(job):
            job.chunks, job.file_hash = entry.chunks, entry.file_hash
            return self._complete(job, "unchanged")
        same_settings = entry is not None and entry.settings == self.settings and entry.status == "ingested"
        job.old_hash = entry.file_hash if entry else None
        pool = pool_for(job.fmt)
        extra = self.cfg["loaders"]["legacy"]["convert_timeout_s"] if job.fmt in ("doc", "ppt") else 0.0
        task = LoadTask(job.seq, job.path, job.fmt, self.options[pool], self.spec,
                        known_hash=entry.file_hash if same_settings else "")
        self._pending[job.seq] = job
        self.stage.start_pool()
        self.pools.submit(pool, load_file, task, lambda r: self.events.put(("loaded", job, r)), extra)

    def _on_result(self, job: FileJob, kind: str, result: Any) -> None:
        job.seconds += getattr(result if kind == "loaded" else result[1], "seconds", 0.0)
        if kind == "loaded":
            if isinstance(result, Failure):
                return self._complete(job, "skipped" if result.skip else "failed", _failure_text(result))
            job.file_hash = result.file_hash
            if result.unchanged:
                job.chunks, job.record = self.known[job.source].chunks, True
                return self._complete(job, "unchanged")
            job.pages = list(result.pages)
            job.pending_ocr = set(result.ocr_pages)
            job.ocr_pages = len(result.ocr_pages)
            for page in result.ocr_pages:
                task = OcrTask(job.seq, job.path, page, self.options["ocr"], self.spec)
                self.pools.submit("ocr", ocr_page, task, lambda r, p=page: self.events.put(("ocr", job, (p, r))))
        else:
            page, result = result
            if isinstance(result, Failure):
                job.warnings.append(f"page {page}: OCR failed: {_failure_text(result)}")
            else:
                job.pages.append(result.page)
            job.pending_ocr.discard(page)
        if not job.pending_ocr:
            self._finish_loaded(job)

    def _finish_loaded(self, job: FileJob) -> None:
        job.chunks = sum(len(p.chunks) for p in job.pages)
        if job.chunks == 0 and job.warnings:
            return self._complete(job, "failed", job.warnings[0])
        if job.chunks == 0:
            job.warnings.append("no text found")
        job.record = True
        self._complete(job, "ingested")

    def _complete(self, job: FileJob, status: str | None = None, error: str | None = None) -> None:
        """Hand a finished file to the reorder buffer; release every file that is next in order."""
        if status is not None:
            job.finish(status, error)
        self._pending.pop(job.seq, None)
        self._ready[job.seq] = job
        while self._next_seq in self._ready:
            self.stage.feed.put(self._ready.pop(self._next_seq))
            self._next_seq += 1
        if self._next_seq == self._total:
            self.stage.feed.put(None)                  # end of input for the encoder

    # -- end of run -------------------------------------------------------------------
    def _prune(self, present: set[str]) -> int:
        gone = [s for s in self.known if s not in present]
        if gone and self.prune:
            for source in gone:
                self.store.delete_source(source)
            self.store.flush()
            self.manifest.remove(gone)
        elif gone and not self.quiet:
            print(f"{len(gone)} file(s) in the store no longer exist in the folder; --prune removes them",
                  file=sys.stderr)
        return len(gone) if self.prune else 0

    def _rates(self, jobs: list[FileJob]) -> dict[str, float]:
        chunks = sum(j.chunks for j in jobs if j.status == "ingested")
        load_s = sum(j.seconds for j in jobs if j.status == "ingested")
        rates = {}
        if chunks and load_s:
            rates["load"] = chunks / load_s
        for stage in ("tokenize", "encode"):
            secs = self.stage.stats.get(f"{stage}_s")
            if chunks and secs:
                rates[stage] = chunks / secs
        if chunks and self.writer.seconds:
            rates["write"] = self.writer.rows_written / self.writer.seconds
        return rates


def _failure_text(f: Failure) -> str:
    if f.exitcode is not None and f.pid is not None:
        return f"{f.error} (pid {f.pid}); retried once in a fresh worker"
    return f.error
