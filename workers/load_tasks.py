"""Task functions run inside loader-pool processes (module level, so spawn can import them).

They call the format loaders and the chunker, and return a result message or a Failure
value; exceptions never cross the process boundary with a file's bytes in them.
"""
from __future__ import annotations

import hashlib
import os
import time
import traceback
from importlib import import_module
from pathlib import Path

from .messages import Failure, LoadTask, Loaded, OcrDone, OcrTask, PageChunks
from .spawn import watch_parent


def init_worker(plugins: tuple[str, ...]) -> None:
    """Pebble initializer: watch the parent, register loaders (built-in and plugins)."""
    watch_parent()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ingest import loaders  # noqa: F401  (registers the built-in formats)

    for name in plugins:
        import_module(name)


def file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def load_file(task: LoadTask) -> Loaded | Failure:
    from ingest.chunking import split_text
    from ingest.loaders import loader_for

    start = time.perf_counter()
    try:
        digest = file_hash(task.path)
        if digest == task.known_hash:
            return Loaded(task.seq, digest, (), (), time.perf_counter() - start, unchanged=True)
        pages, ocr = [], []
        for page in loader_for(task.fmt)(Path(task.path), task.options):
            if page.needs_ocr:
                ocr.append(page.number)
            else:
                pages.append(PageChunks(page.number, tuple(split_text(page.text, task.spec)), page.title))
        return Loaded(task.seq, digest, tuple(pages), tuple(ocr), time.perf_counter() - start)
    except Exception as exc:
        return _failure(f"{task.fmt} loader", exc)


def ocr_page(task: OcrTask) -> OcrDone | Failure:
    from ingest.chunking import split_text
    from ingest.loaders.ocr import ocr_page as run_ocr

    start = time.perf_counter()
    try:
        page = run_ocr(Path(task.path), task.page, task.options)
        chunks = PageChunks(task.page, tuple(split_text(page.text, task.spec)), page.title)
        return OcrDone(task.seq, chunks, time.perf_counter() - start)
    except Exception as exc:
        return _failure(f"OCR of page {task.page}", exc)


def _failure(where: str, exc: BaseException) -> Failure:
    from ingest.loaders.base import LoaderError, Unsupported

    msg = " ".join(str(exc).split())[:300]
    if not isinstance(exc, (LoaderError, Unsupported)):
        msg = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return Failure(where=where, error=msg, pid=os.getpid(), traceback=traceback.format_exc(limit=8),
                   skip=isinstance(exc, Unsupported))
