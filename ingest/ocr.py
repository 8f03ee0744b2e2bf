"""The OCR fan-out: each page that needs OCR is one task in the OCR pool, so a 300-page scan
spreads over every OCR worker and text files never wait behind scans. In the worker,
`ocr_page` renders and recognizes the page (ingest.loaders.ocr), then chunks its text (with
the chunks' token ids); the pages come back to the file's `ingest.load.Pages`, which puts
them in page order. A page that fails (an error, a crash, its timeout) comes back as OcrFailed,
with the seconds it cost: the time from its submission, at most the pool's timeout (which pebble
counts from the moment a worker takes the page; a timed-out page cost exactly that).
"""
from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from ingest import remote
from ingest.chunk import ChunkSpec, PageChunks, section_chunks
from ingest.files import Times
from ingest.load import task_failure
from ingest.sections import Doc, Outline, page_sections
from ingest.loaders import OcrOptions
from ingest.workers.failure import Failure
from ingest.workers.limits import keep_heap
from ingest.workers.pool import Pools

POOL = "ocr"


@dataclass(frozen=True)
class OcrTask:
    path: str
    page: int
    options: OcrOptions
    spec: ChunkSpec
    doc: Doc
    headings: tuple[str, ...]       # the heading path in effect where the page starts


@dataclass(frozen=True)
class OcrDone:
    pages: tuple[PageChunks, ...]   # the page's sections, chunked
    seconds: float
    chunk_s: float = 0.0            # of `seconds`, chunking (the rest: rendering and recognizing)
    cpu_s: float = 0.0              # the worker's CPU seconds for it (time.process_time)
    failure: None = None            # (an OcrFailed's is its Failure)

    @property
    def times(self) -> Times:
        return Times(ocr=self.seconds - self.chunk_s, chunk=self.chunk_s)


@dataclass(frozen=True)
class OcrFailed:
    failure: Failure
    seconds: float                  # what the page cost (module docstring)
    cpu_s: float = 0.0              # not known

    @property
    def times(self) -> Times:
        return Times(ocr=self.seconds)


def ocr_page(task: OcrTask) -> OcrDone | Failure:
    """In an OCR worker: one page's text, chunked."""
    from ingest.loaders.ocr import ocr_page as recognize

    keep_heap()
    start, cpu = time.perf_counter(), time.process_time()
    try:
        page = recognize(Path(remote.local_copy(task.path)[0]), task.page, task.options)   # no new fetch
        recognized = time.perf_counter()
        sections = page_sections(page, Outline(task.headings))
        chunks = tuple(section_chunks(s, task.spec, task.doc) for s in sections)
        end = time.perf_counter()
        return OcrDone(chunks, end - start, end - recognized, time.process_time() - cpu)
    except Exception as exc:
        return task_failure(f"OCR of page {task.page}", exc)


def fan_out(pools: Pools, path: str, pages: tuple[tuple[int, tuple[str, ...]], ...], options: OcrOptions,
            spec: ChunkSpec, doc: Doc, timeout_s: float) -> list[tuple[int, Future]]:
    """One OCR task per (page, its heading path) in the OCR pool, whose tasks have `timeout_s`: (page, Future
    of OcrDone or OcrFailed)."""
    return [(page, _timed(pools.submit(POOL, ocr_page, OcrTask(path, page, options, spec, doc, headings)), timeout_s))
            for page, headings in pages]


def _timed(task: Future, timeout_s: float) -> Future:
    """`task`'s OcrDone, or its Failure as OcrFailed with the seconds it cost (module docstring)."""
    out: Future = Future()
    submitted = time.perf_counter()

    def done(f: Future) -> None:
        result = f.result()
        out.set_result(OcrFailed(result, min(time.perf_counter() - submitted, timeout_s))
                       if isinstance(result, Failure) else result)
    task.add_done_callback(done)
    return out
