"""The load step: one task per file in the loader pool of its format, and chunk tasks for big files.

In the worker (`load_file`), the file is hashed, its format's loader yields pages and the
chunker cuts their text; pages without a usable text layer are only listed, for the OCR
fan-out. Back in the dispatcher's thread, `Pages` gathers the file's text pages, its OCR
pages and its chunk tasks' segments as they return, and makes the `Finished` file once none
is pending. A worker task returns a result or a Failure value: exceptions never cross the
process boundary with a file's bytes in them.

NOTE (segments): a load task chunks the first SEGMENT_CHARS of a file's text; the rest comes
back raw, in segments of about SEGMENT_CHARS cut right before a paragraph break ("\n\n",
else "\n", else " "; `ingest.chunk.cut_points`), grouped into chunk tasks of about
SEGMENT_CHARS for the same format's pool (`fan_out`), so a big file's chunking spreads over
its pool's workers. Every page is cut so, wherever it is chunked: chunks never span two
segments, which only changes the overlap at a segment's edges, once every ~SEGMENT_CHARS
characters. `Pages` puts the parts in page order, then segment order; a failed chunk task
fails the file.
"""
from __future__ import annotations

import hashlib
import os
import time
import traceback
from dataclasses import dataclass, replace
from concurrent.futures import Future
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from ingest import remote
from ingest.chunk import MAX_CHUNK_BYTES, ChunkSpec, PageChunks, cut_points, section_chunks
from ingest.config import ConfigError
from ingest.files import FileRef, Finished, Outcome
from ingest.store.manifest import Entry
from ingest.sections import Doc, Outline, Section, document_title, page_sections
from ingest.sniff import sniff
from ingest.loaders import LoaderError, LoaderOptions, OcrOptions, Page, Unsupported, formats, loader_for, pool_for
from ingest.store import FORMAT_MAX
from ingest.workers.failure import Failure
from ingest.workers.limits import limit_memory
from ingest.workers.pool import Pools

if TYPE_CHECKING:
    from ingest.ocr import OcrDone

LEGACY_FORMATS = ("doc", "ppt")      # converted by LibreOffice first: their timeout adds the conversion's
SEGMENT_CHARS = 100_000              # characters of text a load task chunks, a segment holds, a chunk task gets


@dataclass(frozen=True)
class LoadTask:
    path: str
    fmt: str
    options: LoaderOptions
    spec: ChunkSpec
    known_hash: str = ""           # the manifest's hash: equal content returns early as unchanged
    source: str = ""               # the path relative to the folder: the chunks' context line


@dataclass(frozen=True)
class Loaded:
    file_hash: str
    pages: tuple[PageChunks, ...]
    ocr_pages: tuple[tuple[int, tuple[str, ...]], ...]   # pages still to OCR, with the heading path where they start
    seconds: float
    unchanged: bool = False
    segments: tuple[tuple[Section, ...], ...] = ()     # text still to chunk: one chunk task per group
    doc: Doc | None = None


@dataclass(frozen=True)
class ChunkTask:
    segments: tuple[Section, ...]
    spec: ChunkSpec
    doc: Doc


@dataclass(frozen=True)
class Chunked:
    pages: tuple[PageChunks, ...]  # one per segment
    seconds: float


# -- in the loader worker ------------------------------------------------------------------
def init_loader_process(plugins: tuple[str, ...], memory_mb: int) -> None:
    """Pool initializer: cap the worker's memory, register the built-in loaders and the plugins'."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"      # the chunker's encode_batch: one core per worker
    limit_memory(memory_mb)
    import_plugins(plugins)


def import_plugins(plugins: tuple[str, ...]) -> None:
    """Register the built-in loaders and import the [loaders] plugins; a bad plugin is a one-line
    ConfigError (the run checks them first, so it stops before anything starts)."""
    import ingest.loaders  # noqa: F401  (registers the built-in formats)

    for name in plugins:
        try:
            import_module(name)
        except Exception as exc:
            raise ConfigError(f"plugin module {name!r} in [loaders] plugins failed to import "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); fix it or remove it"
                              ) from None
    for fmt in formats():
        if len(fmt.encode()) > FORMAT_MAX:
            raise ConfigError(f"a plugin registers format {fmt!r}, longer than the store's {FORMAT_MAX} bytes; "
                              "give it a shorter name")


def file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def load_file(task: LoadTask) -> Loaded | Failure:
    start = time.perf_counter()
    try:
        path, digest = remote.local_copy(task.path)       # a URL's object, fetched once per file (ingest/remote.py)
        digest = digest or file_hash(path)
        if digest == task.known_hash:
            return Loaded(digest, (), (), time.perf_counter() - start, unchanged=True)
        pages, ocr, rest = [], [], []
        chunked = 0
        doc, outline = None, Outline()
        for page in loader_for(task.fmt)(Path(path), task.options):
            doc = doc or Doc(task.source, document_title(page, task.source))
            if page.needs_ocr:
                ocr.append((page.number, outline.path))
                continue
            index = 0
            for section in page_sections(page, outline):
                for part in _parts(section, index):
                    if not rest and (not chunked or chunked + len(part.text) <= SEGMENT_CHARS):
                        pages.append(section_chunks(part, task.spec, doc))
                        chunked += len(part.text)
                    else:
                        rest.append(part)
                    index += 1
        doc = doc or Doc(task.source, document_title(Page(None, ""), task.source))
        return Loaded(digest, tuple(pages), tuple(ocr), time.perf_counter() - start, segments=_groups(rest), doc=doc)
    except Exception as exc:
        return task_failure(f"{task.fmt} loader", exc)


def _parts(section: Section, index: int) -> list[Section]:
    """The section cut into parts of about SEGMENT_CHARS at paragraph breaks, numbered on from `index` in its page."""
    points = cut_points(section.text, SEGMENT_CHARS)
    if len(points) == 2:
        return [replace(section, index=index)]
    return [replace(section, index=index + i, text=section.text[a:b],
                    boxes=tuple((s - a, e - a, box) for s, e, box in section.boxes if s < b and e > a))
            for i, (a, b) in enumerate(zip(points, points[1:]))]


def _groups(segments: list[Section]) -> tuple[tuple[Section, ...], ...]:
    """Consecutive segments in groups of up to SEGMENT_CHARS characters (or one bigger segment)."""
    groups: list[list[Section]] = []
    size = 0
    for segment in segments:
        if not groups or size + len(segment.text) > SEGMENT_CHARS:
            groups.append([])
            size = 0
        groups[-1].append(segment)
        size += len(segment.text)
    return tuple(map(tuple, groups))


def chunk_segments(task: ChunkTask) -> Chunked | Failure:
    """In a loader worker: chunk a group of segments."""
    start = time.perf_counter()
    try:
        pages = tuple(section_chunks(s, task.spec, task.doc) for s in task.segments)
        return Chunked(pages, time.perf_counter() - start)
    except Exception as exc:
        return task_failure("chunking", exc)


def task_failure(where: str, exc: BaseException) -> Failure:
    """A worker-side exception as a one-line Failure (the type is named unless it is a LoaderError)."""
    msg = " ".join(str(exc).split())[:300]
    if isinstance(exc, MemoryError):
        msg = "out of memory: the file needs more than [limits] worker_memory_mb; raise the limit to ingest it"
    elif not isinstance(exc, (LoaderError, Unsupported)):
        msg = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return Failure(where=where, error=msg, pid=os.getpid(), traceback=traceback.format_exc(limit=8),
                   skip=isinstance(exc, Unsupported))


def failure_text(f: Failure) -> str:
    """The report's line for a Failure."""
    if f.exitcode is not None and f.pid is not None:
        return f"{f.error} (pid {f.pid}); retried once in a fresh worker"
    return f.error


# -- in the dispatcher's thread ------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """A file the loaders must read, with what the manifest knows of it."""
    ref: FileRef                   # its format sniffed
    old_hash: str | None           # the hash of the version in the store
    known_hash: str                # equal content returns early as unchanged ("": load whatever it holds)
    known_chunks: int


def plan(ref: FileRef, problem: Outcome | None, entry: Entry | None, settings: str,
         max_file_mb: float) -> Finished | Job:
    """A scanned file's way: Finished already (a scan problem; unsupported, too big, or unchanged by
    size and mtime), or a Job for its loader pool."""
    verdict = Finished(ref, problem) if problem else sniff(ref, entry, settings, max_file_mb)
    if isinstance(verdict, Finished):
        return verdict
    same_settings = entry is not None and entry.settings == settings and entry.status == "ingested"
    return Job(verdict, entry.file_hash if entry else None, entry.file_hash if same_settings else "",
               entry.chunks if entry else 0)


def drop_if_skipped(file: Finished, known: Mapping[str, Entry]) -> Finished:
    """A file skipped now (emptied, a link now leading outside) loses the rows of its earlier version."""
    if file.outcome.status == "skipped" and file.ref.source in known:
        note = "its rows from an earlier run were removed"
        return replace(file, drop=True, outcome=replace(file.outcome, warnings=file.outcome.warnings + (note,)))
    return file


def submit(pools: Pools, ref: FileRef, options: LoaderOptions, spec: ChunkSpec, known_hash: str) -> Future:
    """Load `ref` in the pool of its format: a Future of Loaded or Failure."""
    extra_s = options.convert_timeout_s if ref.fmt in LEGACY_FORMATS else 0.0
    task = LoadTask(ref.path, ref.fmt, options, spec, known_hash, ref.source)
    return pools.submit(pool_for(ref.fmt), load_file, task, extra_s)


def fan_out(pools: Pools, fmt: str, groups: tuple[tuple[Section, ...], ...], spec: ChunkSpec,
            doc: Doc) -> list[tuple[int, Future]]:
    """One chunk task per group of segments, in the pool of the file's format: (task, Future of Chunked or Failure)."""
    return [(n, pools.submit(pool_for(fmt), chunk_segments, ChunkTask(group, spec, doc)))
            for n, group in enumerate(groups)]


def after_load(ref: FileRef, result: Loaded | Failure, old_hash: str | None,
               known_chunks: int) -> Finished | Pages:
    """A load task's result as the file's next state: Finished (failed, skipped, unchanged: it keeps the
    `known_chunks` of its manifest entry), or its Pages, still waiting for OCR and chunk tasks if any."""
    if isinstance(result, Failure):
        return Finished(ref, Outcome("skipped" if result.skip else "failed", failure_text(result)))
    if result.unchanged:
        outcome = Outcome("unchanged", chunks=known_chunks, seconds=result.seconds)
        return Finished(replace(ref, file_hash=result.file_hash), outcome, record=True)
    return Pages(ref, result, old_hash)


def load_whole(pools: Pools, job: Job, options: LoaderOptions, ocr_options: OcrOptions, spec: ChunkSpec) -> Finished:
    """Load, OCR and chunk one file in `pools`, waiting for each step: the file's whole journey through
    the loaders in the caller's thread (the Ray engine's load tasks). Every wait is bounded by the
    pools' time limits."""
    from ingest import ocr

    ref = job.ref
    state = after_load(ref, submit(pools, ref, options, spec, job.known_hash).result(), job.old_hash, job.known_chunks)
    if isinstance(state, Finished):
        return state
    parts = ocr.fan_out(pools, ref.path, state.ocr_pages_todo, ocr_options, spec, state.doc)
    for task, future in fan_out(pools, ref.fmt, state.segments, spec, state.doc):
        state.add_chunks(task, future.result())
    for page, future in parts:
        state.add_ocr(page, future.result())
    return state.finish()


class Pages:
    """A loaded file waiting for its OCR pages and chunk tasks; owned by the dispatcher's thread."""

    def __init__(self, ref: FileRef, loaded: Loaded, old_hash: str | None):
        self.ref = replace(ref, file_hash=loaded.file_hash)
        self.old_hash = old_hash
        self.pages = list(loaded.pages)
        self.ocr_pages_todo, self.segments, self.doc = loaded.ocr_pages, loaded.segments, loaded.doc
        self.pending = {("ocr", p) for p, _ in loaded.ocr_pages} | {("chunk", n) for n in range(len(loaded.segments))}
        self.ocr_pages = len(loaded.ocr_pages)
        self.warnings: list[str] = list(ref.warnings)
        self.ocr_failures: list[str] = []
        self.chunk_failure: str | None = None
        self.seconds = loaded.seconds

    def add_ocr(self, page: int, result: OcrDone | Failure) -> None:
        if isinstance(result, Failure):
            self.ocr_failures.append(f"page {page}: OCR failed: {failure_text(result)}")
            self.warnings.append(self.ocr_failures[-1])
        else:
            self.seconds += result.seconds
            self.pages.extend(result.pages)
        self.pending.discard(("ocr", page))

    def add_chunks(self, task: int, result: Chunked | Failure) -> None:
        if isinstance(result, Failure):
            self.chunk_failure = self.chunk_failure or f"chunking failed: {failure_text(result)}"
        else:
            self.seconds += result.seconds
            self.pages.extend(result.pages)
        self.pending.discard(("chunk", task))

    def finish(self) -> Finished:
        """The file once nothing is pending: ingested, or failed when a chunk task failed or OCR gave nothing."""
        pages = tuple(sorted(self.pages, key=lambda p: (-1 if p.page is None else p.page, p.segment)))
        chunks = sum(len(p.chunks) for p in pages)
        if cut := sum(p.cut for p in pages):
            self.warnings.append(f"{cut} chunk(s) longer than the store's {MAX_CHUNK_BYTES:,}-byte text field "
                                 "(text without spaces?) were cut into pieces")
        if junk := sum(p.junk for p in pages):
            self.warnings.append(f"{junk} chunk(s) of non-language text (base64, hex or binary runs) skipped, not embedded")
        warnings = tuple(self.warnings)
        error = self.chunk_failure or (self.ocr_failures[0] if chunks == 0 and self.ocr_failures else None)
        if error:
            return Finished(self.ref, Outcome("failed", error, ocr_pages=self.ocr_pages, warnings=warnings,
                                              seconds=self.seconds))
        if chunks == 0 and not junk:
            warnings += ("no text found",)
        outcome = Outcome("ingested", None, chunks, self.ocr_pages, warnings, self.seconds, junk)
        return Finished(self.ref, outcome, pages, self.old_hash, record=True)
