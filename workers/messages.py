"""Small frozen messages that cross process boundaries. None carries a file's bytes."""
from __future__ import annotations

from dataclasses import dataclass

from .failure import Failure  # noqa: F401


@dataclass(frozen=True)
class LoadTask:
    """Load one file: sent to the loader pool of its format."""
    seq: int
    path: str
    fmt: str
    options: dict
    spec: object               # ingest.chunking.ChunkSpec
    known_hash: str = ""       # the manifest's hash: equal content returns early as unchanged


@dataclass(frozen=True)
class OcrTask:
    """OCR one page of a PDF or image: sent to the OCR pool."""
    seq: int
    path: str
    page: int
    options: dict
    spec: object


@dataclass(frozen=True)
class PageChunks:
    page: int | None
    chunks: tuple[str, ...]
    title: str | None = None


@dataclass(frozen=True)
class Loaded:
    seq: int
    file_hash: str
    pages: tuple[PageChunks, ...]
    ocr_pages: tuple[int, ...]     # pages still to OCR
    seconds: float
    unchanged: bool = False


@dataclass(frozen=True)
class OcrDone:
    seq: int
    page: PageChunks
    seconds: float
