"""The loader contract and the registry.

Every loader has the same signature:

    def load(path: Path, options: LoaderOptions) -> Iterator[Page]

`options` holds the settings loaders read, built once from the config by
ingest.config.loader_options(). A loader knows nothing about processes or the config file;
it raises LoaderError (one-line, user-facing message) for a file it cannot read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator


@dataclass(frozen=True)
class LoaderOptions:
    """What a loader reads from the config: built once by ingest.config.loader_options()."""
    max_text_mb: float                 # [limits] max_text_mb
    max_unzipped_mb: float             # [limits] max_unzipped_mb
    pdf_ocr: str                       # [loaders.pdf] ocr: "auto" | "always" | "never"
    passwords: tuple[str, ...]         # [loaders.pdf] passwords
    convert_timeout_s: float           # [loaders.legacy] convert_timeout_s
    max_image_mp: float                # [limits] max_image_mp: refuse images with more megapixels
    pdf_tables: str = "auto"           # [loaders.pdf] tables: "auto" | "always" | "never"


@dataclass(frozen=True)
class OcrOptions:
    """What OCR reads from the config: built once by ingest.config.ocr_options()."""
    dpi: int
    backend: str                       # "rapidocr" | "paddleocr"
    paddle_model_dir: str
    threads: int                       # ONNX Runtime threads per OCR process
    passwords: tuple[str, ...]         # to reopen encrypted scanned PDFs
    max_image_mp: float                # [limits] max_image_mp: renders are scaled down to stay under it
    model_cache: str = ""              # where RapidOCR's rewritten models are kept ("": its own models)


Loader = Callable[[Path, LoaderOptions], Iterator["Page"]]


@dataclass(frozen=True)
class Block:
    """A piece of a page's content, in reading order."""
    kind: str                   # "text" | "heading" | "table"
    text: str                   # a heading's text; a table's rows in Markdown ("| a | b |"), one row a line
    level: int = 0              # a heading's level: 1 (top) .. 6
    bbox: tuple[float, float, float, float] | None = None     # (x0, y0, x1, y1) in PDF points on its page
    header: str = ""            # a table's header row(s) in Markdown, repeated in each of its chunks


@dataclass(frozen=True)
class Page:
    number: int | None          # 1-based page/slide number; None for plain text
    text: str                   # the page's text: its blocks' texts joined by blank lines when it has blocks
    title: str | None = None    # the document's title (PDF/DOCX/PPTX metadata, a Markdown title), if known
    needs_ocr: bool = False     # the page has no usable text layer: render and OCR it
    blocks: tuple[Block, ...] = ()      # the page's structure, when the loader knows it; () = `text` is one block
    meta: tuple[tuple[str, str], ...] = ()      # the document's metadata (subject, author, keywords, created), if known
    running: tuple[str, ...] = ()       # lines removed from this page as running headers or footers


class Unsupported(Exception):
    """A file no loader handles (reported as skipped). str(exc) is the reason."""


class LoaderError(Exception):
    """A file that cannot be loaded. str(exc) is one line: what failed and what to do."""


@dataclass(frozen=True)
class _Entry:
    fmt: str
    loader: Loader
    extensions: tuple[str, ...]
    pool: str


_BY_FORMAT: dict[str, _Entry] = {}
_BY_EXTENSION: dict[str, str] = {}


def register(fmt: str, extensions: tuple[str, ...], pool: str) -> Callable[[Loader], Loader]:
    """Register `load` for format `fmt`, files ending in `extensions`, run in loader pool `pool`."""
    def deco(fn: Loader) -> Loader:
        if fmt in _BY_FORMAT:
            raise ValueError(f"a loader for format {fmt!r} is already registered")
        exts = tuple(e.lower() for e in extensions)
        for ext in exts:
            if ext in _BY_EXTENSION:
                raise ValueError(f"extension {ext!r} is already registered for {_BY_EXTENSION[ext]!r}")
        _BY_FORMAT[fmt] = _Entry(fmt, fn, exts, pool)
        for ext in exts:
            _BY_EXTENSION[ext] = fmt
        return fn
    return deco


def loader_for(fmt: str) -> Loader:
    return _BY_FORMAT[fmt].loader


def pool_for(fmt: str) -> str:
    return _BY_FORMAT[fmt].pool


def format_for_extension(ext: str) -> str | None:
    return _BY_EXTENSION.get(ext.lower())


def formats() -> tuple[str, ...]:
    return tuple(_BY_FORMAT)
