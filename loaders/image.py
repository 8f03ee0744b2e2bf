"""Images: one page per frame (a multi-page TIFF has several), each to be OCRed."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .base import LoaderOptions, Page, register
from .pdf import damaged, mupdf_errors, open_document

EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")


@register("image", EXTENSIONS, "pdf")
def load(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Page(n, "", needs_ocr=True) for every frame n (1-based); the text comes from loaders.ocr.

    Every frame is decoded once here, so a damaged image fails now, not in the OCR pool.
    """
    with open_document(path, kind="image") as doc:
        frames = doc.page_count
        for index in range(frames):
            try:
                doc.load_page(index)
            except mupdf_errors() as exc:
                raise damaged(f"frame {index + 1} of the image", exc) from None
    for number in range(1, frames + 1):
        yield Page(number, "", needs_ocr=True)
