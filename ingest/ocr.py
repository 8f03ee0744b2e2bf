"""The OCR fan-out: each page that needs OCR is one task in the OCR pool, so a 300-page scan
spreads over every OCR worker and text files never wait behind scans. In the worker,
`ocr_page` renders and recognizes the page (ingest.loaders.ocr), then chunks its text (with
the chunks' token ids); the pages come back to the file's `ingest.load.Pages`, which puts
them in page order.
"""
from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from ingest import remote
from ingest.chunk import ChunkSpec, PageChunks, section_chunks
from ingest.load import task_failure
from ingest.sections import Doc, Outline, page_sections
from ingest.loaders import OcrOptions
from ingest.workers.failure import Failure
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


def ocr_page(task: OcrTask) -> OcrDone | Failure:
    """In an OCR worker: one page's text, chunked."""
    from ingest.loaders.ocr import ocr_page as recognize

    start = time.perf_counter()
    try:
        page = recognize(Path(remote.local_copy(task.path)[0]), task.page, task.options)   # no new fetch
        sections = page_sections(page, Outline(task.headings))
        return OcrDone(tuple(section_chunks(s, task.spec, task.doc) for s in sections), time.perf_counter() - start)
    except Exception as exc:
        return task_failure(f"OCR of page {task.page}", exc)


def fan_out(pools: Pools, path: str, pages: tuple[tuple[int, tuple[str, ...]], ...], options: OcrOptions,
            spec: ChunkSpec, doc: Doc) -> list[tuple[int, Future]]:
    """One OCR task per (page, its heading path): (page, Future of OcrDone or Failure)."""
    return [(page, pools.submit(POOL, ocr_page, OcrTask(path, page, options, spec, doc, headings)))
            for page, headings in pages]
