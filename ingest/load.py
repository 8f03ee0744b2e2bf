"""The load step: one task per file in the loader pool of its format (a big file's other parts: range tasks). In the
worker (`load_file`), the file is hashed, its format's loader yields pages and the chunker cuts their text; pages
without a usable text layer are only listed, for the OCR fan-out. In the dispatcher's thread, `Pages` gathers each
part's pages and OCR pages and hands the file on in parts, in order (`Finished` values; the last carries the
outcome). A worker task returns a result or a Failure value: exceptions never cross the process boundary with a
file's bytes in them.

NOTE (ranges): a text or Markdown file over RANGE_BYTES and a PDF over RANGE_PAGES pages are loaded by range, so that
no process holds the whole file and its first rows are written while the rest loads. The file's first task hashes it
(ids carry the hash, so it is known before any row) and plans its ranges in that same read: byte ranges of about
RANGE_BYTES cut after a line break (loaders/text.py's NOTE), or pages [k * RANGE_PAGES, (k + 1) * RANGE_PAGES) from
the page count and outline it sees on opening the PDF; it then loads range 0 itself and returns the rest as `Range`s.
Each range task reads only its range (a PDF's: plus WINDOW pages on either side, so running headers, footers and font
sizes are decided as in a whole read; at 128 pages a range those extra reads are a quarter of it, at 64 they were
half, 16% of the PDF loaders' CPU) and starts under the heading path in effect at its start: a Markdown file's
from the planning read, a PDF's from its outline (font-size headings of earlier ranges are not carried, nor a table
continued from the previous range's last page: it starts anew without that header). Chunks never span two ranges,
which only changes the overlap at a range's edges. The dispatcher loads ranges as [run] max_chunks_in_flight allows
(the file next in order always may have one range loading), hands parts on in order, and a failing range fails the
file: its rows of the new version are removed, the last good version stays (ingest/write.py). Environment variables
INGEST_RANGE_BYTES and INGEST_RANGE_PAGES set the sizes (tests, benchmarks). Other formats, and text that cannot be
cut at bytes (UTF-16/32), are loaded whole.
"""
from __future__ import annotations

import hashlib
import os
import time
import traceback
from collections import deque
from itertools import chain, islice
from dataclasses import dataclass, replace
from concurrent.futures import Future
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from ingest import remote
from ingest.chunk import MAX_CHUNK_BYTES, ChunkSpec, PageChunks, section_chunks
from ingest.config import ConfigError
from ingest.doc_card import FIRST_PAGES, file_doc
from ingest.files import FileRef, Finished, Outcome, Times, evolve
from ingest.store.manifest import Entry
from ingest.sections import Doc, Outline, page_sections
from ingest.sniff import Misnamed, sniff, sniffed
from ingest.loaders import LoaderError, LoaderOptions, Page, Unsupported, formats, loader_for, pool_for
from ingest.loaders import pdf as pdf_loader, text as text_loader
from ingest.store import FORMAT_MAX
from ingest.workers.failure import Failure
from ingest.workers.limits import limit_memory
from ingest.workers.pool import Pools

if TYPE_CHECKING:
    from ingest.ocr import OcrDone, OcrFailed

LEGACY_FORMATS = ("doc", "ppt")      # converted by LibreOffice first: their timeout adds the conversion's
RANGE_BYTES = int(os.environ.get("INGEST_RANGE_BYTES", 1 << 20))   # a bigger text file is loaded by byte range
RANGE_PAGES = int(os.environ.get("INGEST_RANGE_PAGES", 128))       # a PDF with more pages is loaded by page range
RANGED = {"txt": text_loader.load_txt, "md": text_loader.load_md, "pdf": pdf_loader.load}   # unless a plugin replaces them


@dataclass(frozen=True)
class Range:
    """Part `part` of a big file: bytes [start, end) of a text file, or pages [start, end) (0-based) of a PDF."""
    part: int
    start: int
    end: int
    headings: tuple[tuple[int, str], ...] = ()     # the heading stack (level, text) where it starts
    encoding: str = ""                             # a text file's
    fence: bool = False                            # a Markdown range that starts inside a fenced code block


@dataclass(frozen=True)
class LoadTask:
    path: str
    fmt: str
    options: LoaderOptions
    spec: ChunkSpec
    known_hash: str = ""           # the manifest's hash: equal content returns early as unchanged
    source: str = ""               # the path relative to the folder: the chunks' context line
    doc: Doc | None = None         # a range task: the file's, from its first task
    range: Range | None = None     # a range task: the part it loads (no hash, no plan)
    sniff: bool = False            # sniffed here first (ingest/sniff.py NOTE: deferred sniff)


@dataclass(frozen=True)
class Loaded:
    file_hash: str                 # "" from a range task
    pages: tuple[PageChunks, ...]
    ocr_pages: tuple[tuple[int, tuple[str, ...]], ...]   # pages still to OCR, with the heading path where they start
    seconds: float
    unchanged: bool = False
    ranges: tuple[Range, ...] = ()     # the file's other parts, for range tasks (from its first task)
    doc: Doc | None = None
    chunk_s: float = 0.0               # of `seconds`, chunking (the rest: loading)
    cpu_s: float = 0.0                 # the worker's CPU seconds for it (time.process_time)
    read_pages: int = 0                # pages its loader read (a range task's: its range's)

    @property
    def times(self) -> Times:
        return Times(load=self.seconds - self.chunk_s, chunk=self.chunk_s)


# -- in the loader worker ------------------------------------------------------------------
def init_loader_process(plugins: tuple[str, ...], memory_mb: int) -> None:
    """Pool initializer: cap the worker's memory, register the built-in loaders and the plugins'."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"      # the chunker's encode_batch: one core per worker
    limit_memory(memory_mb)
    import_plugins(plugins)


def import_plugins(plugins: tuple[str, ...]) -> None:
    """Register the built-in loaders and import the [loaders] plugins; a bad plugin is a one-line ConfigError
    (the run checks them first, so it stops before anything starts)."""
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


def load_file(task: LoadTask) -> Loaded | Failure | Misnamed:
    """A file's first load task (hash, plan, its first part or all of it), or a range task."""
    start, cpu = time.perf_counter(), time.process_time()
    try:
        task = replace(task, path=remote.local_copy(task.path)[0])   # a URL's object: fetched once per file
        if task.sniff and (misnamed := sniffed(task.path, task.source, task.fmt)) is not None:
            return misnamed
        if task.range is not None:
            loaded = _chunked(task, _range_pages(task, task.range), task.doc, task.range.headings)
        else:
            digest, first, rest = _first_part(task)
            if digest == task.known_hash:
                return Loaded(digest, (), (), time.perf_counter() - start, unchanged=True)
            loaded = evolve(_chunked(task, first, None, ()), file_hash=digest, ranges=rest())
        return evolve(loaded, seconds=time.perf_counter() - start, cpu_s=time.process_time() - cpu)
    except Exception as exc:
        return task_failure(f"{task.fmt} loader", exc)


def _first_part(task: LoadTask) -> tuple[str, Iterable[Page], Callable[[], tuple[Range, ...]]]:
    """The file's hash, the pages of its first part (a small file's: all), and, once those are read,
    the ranges of its other parts (module NOTE)."""
    path, fmt, whole = Path(task.path), task.fmt, loader_for(task.fmt)
    if whole is not RANGED.get(fmt):
        return file_hash(task.path), whole(path, task.options), tuple
    if fmt == "pdf":
        plan: list = []
        pages = pdf_loader.load_pages(path, task.options, 0, RANGE_PAGES, on_open=lambda *p: plan.extend(p))
        return file_hash(task.path), pages, lambda: _page_ranges(*plan)
    if path.stat().st_size <= RANGE_BYTES:
        return file_hash(task.path), whole(path, task.options), tuple
    digest = hashlib.sha256()
    cuts = text_loader.plan_ranges(path, RANGE_BYTES, fmt == "md", digest)
    if cuts is None or len(cuts) < 2:
        return digest.hexdigest(), whole(path, task.options), tuple
    ranges = tuple(Range(i, c.start, c.end, c.headings, c.encoding, c.fence) for i, c in enumerate(cuts))
    return digest.hexdigest(), _range_pages(task, ranges[0]), lambda: ranges[1:]


def _page_ranges(page_count: int, toc: list) -> tuple[Range, ...]:
    """Pages past the first RANGE_PAGES in ranges of RANGE_PAGES, each under the outline's heading path at its start."""
    entries = sorted(((n, level, " ".join(title.split())) for level, title, n, *_ in toc if title.strip() and n >= 1),
                     key=lambda e: e[0])
    stack: list[tuple[int, str]] = []
    out, i = [], 0
    for part, first in enumerate(range(RANGE_PAGES, page_count, RANGE_PAGES), 1):
        while i < len(entries) and entries[i][0] <= first:      # 1-based pages before the range
            level = min(entries[i][1], 6)
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, entries[i][2]))
            i += 1
        out.append(Range(part, first, min(first + RANGE_PAGES, page_count), tuple(stack)))
    return tuple(out)


def _range_pages(task: LoadTask, part: Range) -> Iterable[Page]:
    if task.fmt == "pdf":
        return pdf_loader.load_pages(Path(task.path), task.options, part.start, part.end)
    return text_loader.load_range(Path(task.path), task.options, part.start, part.end, part.encoding,
                                  task.fmt == "md", part.fence)


def _chunked(task: LoadTask, pages: Iterable[Page], doc: Doc | None, headings: tuple[tuple[int, str], ...]) -> Loaded:
    """The pages' sections chunked, the pages to OCR, the file's Doc (made from its first page), the seconds spent
    chunking (the pages load lazily, in between) and the pages read, as a Loaded without hash or times."""
    outline = Outline()
    for level, text in headings:
        outline.push(level, text)
    chunks: list[PageChunks] = []
    ocr, chunk_s, read = [], 0.0, 0
    if doc is None:                     # the file's first part: its title and card from its first pages
        pages = iter(pages)
        first = list(islice(pages, FIRST_PAGES))
        doc, pages = file_doc(task.source, task.fmt, first, task.spec.card_context), chain(first, pages)
    for read, page in enumerate(pages, 1):
        if page.needs_ocr:
            ocr.append((page.number, outline.path))
        else:
            start = time.perf_counter()
            chunks.extend(section_chunks(s, task.spec, doc) for s in page_sections(page, outline))
            chunk_s += time.perf_counter() - start
    return Loaded("", tuple(chunks), tuple(ocr), 0.0, doc=doc, chunk_s=chunk_s, read_pages=read)


def task_failure(where: str, exc: BaseException) -> Failure:
    """A worker-side exception as a one-line Failure (the type is named unless it is a LoaderError)."""
    msg = " ".join(str(exc).split())[:300]
    if isinstance(exc, MemoryError):
        msg = "out of memory: the file needs more than [limits] worker_memory_mb; raise the limit to ingest it"
    elif not isinstance(exc, (LoaderError, Unsupported)):
        msg = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return Failure(where=where, error=msg, pid=os.getpid(), traceback=traceback.format_exc(limit=8),
                   skip=isinstance(exc, Unsupported))


# -- in the dispatcher's thread ------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """A file the loaders must read, with what the manifest knows of it."""
    ref: FileRef                   # its format sniffed
    old_hash: str | None           # the hash of the version in the store
    known_hash: str                # equal content returns early as unchanged ("": load whatever it holds)
    known_chunks: int


def plan(ref: FileRef, problem: Outcome | None, entry: Entry | None, settings: str,
         max_file_mb: float, defer: Callable[[FileRef], bool] = lambda ref: False) -> Finished | Job:
    """A scanned file's way: Finished already (a scan problem; unsupported, too big, or unchanged by size and
    mtime), or a Job for its loader pool (its sniff `defer`red to it: ingest/sniff.py NOTE)."""
    verdict = Finished(ref, problem) if problem else sniff(ref, entry, settings, max_file_mb, defer)
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


def submit(pools: Pools, ref: FileRef, options: LoaderOptions, spec: ChunkSpec, known_hash: str,
           sniff: bool = False) -> Future:
    """Load `ref` in the pool of its format (sniffed there first: ingest/sniff.py NOTE): a Future of its result."""
    extra_s = options.convert_timeout_s if ref.fmt in LEGACY_FORMATS else 0.0
    task = LoadTask(ref.path, ref.fmt, options, spec, known_hash, ref.source, sniff=sniff)
    return pools.submit(pool_for(ref.fmt), load_file, task, extra_s)


def submit_range(pools: Pools, pages: Pages, options: LoaderOptions, spec: ChunkSpec) -> tuple[int, Future]:
    """Load the next range of `pages` in the pool of its format: (its part, a Future of Loaded or Failure)."""
    ref, part = pages.ref, pages.next_range()
    task = LoadTask(ref.path, ref.fmt, options, spec, "", ref.source, pages.doc, part)
    return part.part, pools.submit(pool_for(ref.fmt), load_file, task)


def after_load(ref: FileRef, result: Loaded | Failure, old_hash: str | None, known_chunks: int) -> Finished | Pages:
    """A file's first load task's result as its next state: Finished (failed, skipped, unchanged: `known_chunks`
    kept from its manifest entry; a whole file, with no OCR page or range to wait for: its one part, ended), or
    its Pages, waiting for OCR pages and ranges."""
    if isinstance(result, Failure):
        return Finished(ref, Outcome("skipped" if result.skip else "failed", result.line))
    if result.unchanged:
        outcome = Outcome("unchanged", chunks=known_chunks, times=result.times)
        return Finished(replace(ref, file_hash=result.file_hash), outcome, record=True)
    pages = Pages(ref, result, old_hash)
    return pages.ready()[0] if not (result.ranges or result.ocr_pages) else pages


class _Part:
    def __init__(self, loaded: Loaded):       # one part of a loaded file; OCR pages it waits for: pending
        self.pages, self.pending, self.times = list(loaded.pages), {p for p, _ in loaded.ocr_pages}, loaded.times


class Pages:
    """A loaded file's parts (its first task's, then a range's each) as they load and OCR, handed on in order by
    `ready`; owned by the dispatcher's thread."""

    def __init__(self, ref: FileRef, loaded: Loaded, old_hash: str | None):
        self.ref = evolve(ref, file_hash=loaded.file_hash)
        self.old_hash, self.doc = old_hash, loaded.doc
        self.todo = deque(loaded.ranges)         # ranges not yet loading
        self.loading: dict[int, Range] = {}      # ranges loading
        self.total = 1 + len(loaded.ranges)
        self.parts: dict[int, _Part] = {0: _Part(loaded)}
        self.next, self.start = 0, 0             # the next part to hand on; chunks handed on
        self.ocr_pages, self.times, self.cut, self.junk, self.junk_sample = len(loaded.ocr_pages), Times(), 0, 0, ""
        self.cpu_s, self.read_pages = loaded.cpu_s, loaded.read_pages     # the loaders' and OCR's CPU, pages read
        self.warnings: list[str] = list(ref.warnings)
        self.ocr_failures: list[str] = []
        self.failure: str | None = None
        self.ended = False                       # the last part (or the failure) was handed on

    def next_range(self) -> Range:
        part = self.todo.popleft()
        self.loading[part.part] = part
        return part

    def add_part(self, part: int, result: Loaded | Failure) -> None:
        """A range task's result (its OCR pages are the caller's to fan out)."""
        span = self.loading.pop(part)
        if isinstance(result, Failure):
            what = f"pages {span.start + 1}-{span.end}" if self.ref.fmt == "pdf" else f"bytes {span.start:,}-{span.end:,}"
            self.failure = self.failure or f"loading {what} failed: {result.line}"
            return
        self.parts[part] = _Part(result)
        self.ocr_pages += len(result.ocr_pages)
        self.cpu_s, self.read_pages = self.cpu_s + result.cpu_s, self.read_pages + result.read_pages

    def add_ocr(self, part: int, page: int, result: OcrDone | OcrFailed) -> None:
        state = self.parts[part]
        state.times += result.times
        self.cpu_s += result.cpu_s
        if result.failure is not None:
            self.ocr_failures.append(f"page {page}: OCR failed: {result.failure.line}")
            self.warnings.append(self.ocr_failures[-1])
        else:
            state.pages.extend(result.pages)
        state.pending.discard(page)

    def ready(self) -> list[Finished]:
        """The parts now ready to hand on, in order (parts without chunks are left out, except the last):
        each a Finished of `start`, `last`; the last carries the file's outcome. A failure ends the file."""
        if self.ended:
            return []
        if self.failure:
            return [self.fail(self.failure)]
        out: list[Finished] = []
        while (part := self.parts.get(self.next)) is not None and not part.pending:
            del self.parts[self.next]
            self.next += 1
            pages = tuple(sorted(part.pages, key=lambda p: (-1 if p.page is None else p.page, p.segment))
                          if len(part.pages) > 1 else part.pages)
            self.times += part.times
            chunks = 0
            for p in pages:                          # one pass (a small file: one page)
                self.cut, self.junk, chunks = self.cut + p.cut, self.junk + p.junk, chunks + len(p.chunks)
                self.junk_sample = self.junk_sample or p.junk_sample
            if self.next == self.total:
                out.append(self._last(pages, chunks))
            elif chunks:
                outcome = Outcome("ingested", None, chunks)
                out.append(Finished(self.ref, outcome, pages, self.old_hash, start=self.start, last=False))
                self.start += chunks
        return out

    def _last(self, pages: tuple[PageChunks, ...], chunks: int) -> Finished:
        """The file's last part: ingested; empty when it has no text (recorded all the same), failed when OCR
        failed and gave nothing."""
        chunks += self.start
        self.warnings += [f"{self.cut} chunk(s) longer than the store's {MAX_CHUNK_BYTES:,}-byte text field "
                          "(text without spaces?) were cut into pieces"] if self.cut else []
        self.warnings += [f"{self.junk} chunk(s) of non-language text (base64, hex or binary runs) skipped, "
                          f"not embedded; the first began {self.junk_sample}"] if self.junk else []
        if chunks == 0 and self.ocr_failures:
            return self.fail(self.ocr_failures[0])
        self.ended = True
        outcome = Outcome("ingested" if chunks else "empty", None if chunks else self._no_text(), chunks,
                          self.ocr_pages, tuple(self.warnings), self.times, self.junk, cpu_s=self.cpu_s,
                          read_pages=self.read_pages)
        return Finished(self.ref, outcome, pages, self.old_hash, record=True, start=self.start,
                        card=self.doc.card if self.doc else "")

    def fail(self, error: str) -> Finished:
        """The file's last part as a failure: rows of its parts handed on are removed, its last good version
        stays (ingest/write.py)."""
        self.ended = True
        outcome = Outcome("failed", error, ocr_pages=self.ocr_pages, warnings=tuple(self.warnings), times=self.times)
        return Finished(self.ref, outcome, (), self.old_hash, start=self.start)

    def _no_text(self) -> str:
        """Why a file without chunks has none."""
        if self.junk:
            return f"all {self.junk} chunks were skipped as non-language junk"
        n = self.ocr_pages
        return f"no text found on {n} OCRed page{'s' if n > 1 else ''}" if n else "no text found"
