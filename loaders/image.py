"""Images: one page per frame (a multi-page TIFF has several), each to be OCRed."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .base import LoaderError, LoaderOptions, Page, register
from .pdf import damaged, mupdf_errors, open_document

EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
MEGAPIXEL = 1_000_000


@register("image", EXTENSIONS, "pdf")
def load(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Page(n, "", needs_ocr=True) for every frame n (1-based); the text comes from loaders.ocr.

    Every frame's header is read here (its pixels are not decoded), so a damaged image, or a frame
    over [limits] max_image_mp (a decompression bomb), fails now, not in the OCR pool.
    """
    with open_document(path, kind="image") as doc:
        frames = doc.page_count
        for index in range(frames):
            what = "image" if frames == 1 else f"frame {index + 1} of the image"
            try:
                pixels = sum(info["width"] * info["height"] for info in doc.load_page(index).get_image_info())
            except mupdf_errors() as exc:
                raise damaged(f"frame {index + 1} of the image", exc) from None
            check_pixels(what, pixels, options.max_image_mp)
    for number in range(1, frames + 1):
        yield Page(number, "", needs_ocr=True)


def check_pixels(what: str, pixels: int, max_mp: float) -> None:
    """Refuse `what` ("image", "frame 3 of the image") when its `pixels` are over `max_mp` megapixels."""
    if pixels > max_mp * MEGAPIXEL:
        raise LoaderError(f"{what} is {round(pixels / MEGAPIXEL, 1):g} megapixels, over [limits] max_image_mp = "
                          f"{max_mp:g} (a decompression bomb?); raise the limit to ingest it")
