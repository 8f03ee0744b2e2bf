"""PDF: one page per PDF page (1-based) with its text layer as blocks (headings, tables, text; running
headers, footers and page numbers left out: loaders/pdf_layout.py); a page with no usable text layer
is yielded empty with needs_ocr=True (options.pdf_ocr: "auto", "always" or "never"). A big PDF is also
read by page range (`load_pages`: ingest/load.py's NOTE on ranges)."""
from __future__ import annotations

import sys
import unicodedata
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from .base import LoaderError, LoaderOptions, Page, register
from .pdf_layout import WINDOW, Layout, read_lines
from .tables import page_text

if TYPE_CHECKING:
    import pymupdf

MIN_CHARS = 20          # a page with fewer non-space characters...
MIN_IMAGE_COVER = 0.5   # ...and at least this share of its area under images is a scan
MAX_UNREADABLE = 0.3    # share of U+FFFD / private-use / control / unassigned characters that marks garbage
_UNREADABLE_CATEGORIES = {"Co", "Cc", "Cn", "Cs"}
RULE_PT = 2.0           # a drawing thinner than this in one direction is a rule or a border, never a glyph to read


def import_pymupdf(layout: bool) -> object:
    """pymupdf; its layout model (the pymupdf_layout package, where installed: an ONNX model that
    `import pymupdf` loads, 0.4 CPU-s and 55 MB in every worker) only when `layout` asks for it. Only
    find_tables uses it ([loaders.pdf] tables = "always"); the text dict the loader reads never does.
    pymupdf4llm, which `import pymupdf` also imports where installed (0.4 CPU-s: ONNX Runtime, its layout
    helpers) for to_markdown and the like, is never imported: nothing here uses it."""
    if "pymupdf" not in sys.modules:
        blocked = [name for name in ("pymupdf4llm",) + (() if layout else ("pymupdf.layout",))
                   if name not in sys.modules]
        for name in blocked:
            sys.modules[name] = None        # pymupdf's own `import` of it fails quietly
        try:
            import pymupdf
        finally:
            for name in blocked:
                if sys.modules.get(name, 0) is None:
                    del sys.modules[name]   # so that `layout=True` may import the layout later
    import pymupdf

    if layout and getattr(pymupdf, "_get_layout", 0) is None:
        try:
            import pymupdf.layout  # noqa: F401  (activates itself, as at pymupdf's import)
        except ImportError:
            pass
    return pymupdf


def mupdf_errors() -> tuple[type[Exception], ...]:
    """What PyMuPDF raises for damaged input (FileDataError is a RuntimeError; page-level errors are FzErrorBase)."""
    pymupdf: Any = import_pymupdf(layout=False)

    return RuntimeError, ValueError, pymupdf.mupdf.FzErrorBase


def damaged(what: str, exc: Exception) -> LoaderError:
    """The LoaderError for `what` ("page 3 of the PDF") failing with a PyMuPDF error."""
    reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    return LoaderError(f"{what} is damaged ({reason}); repair or re-export the file")


def open_document(path: Path, passwords: Iterable[str] = (), kind: str = "PDF") -> pymupdf.Document:
    """Open a PDF or image with PyMuPDF, unlocking an encrypted PDF with the first password that works."""
    pymupdf: Any = import_pymupdf(layout=False)

    pymupdf.TOOLS.mupdf_display_errors(False)      # failures are reported as LoaderError instead
    pymupdf.TOOLS.mupdf_display_warnings(False)
    try:
        doc = pymupdf.open(path)
    except mupdf_errors():
        raise LoaderError(f"cannot open the {kind}: damaged or not a {kind}; re-export or replace the file") from None
    if doc.needs_pass and not any(doc.authenticate(pw) for pw in passwords):
        doc.close()
        raise LoaderError("PDF is encrypted; add its password to [loaders.pdf] passwords")
    return doc


def _check_not_truncated(path: Path) -> None:
    """A complete PDF ends with %%EOF (allowing some trailing junk); MuPDF would silently repair it."""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 1024))
        if b"%%EOF" not in f.read():
            raise LoaderError("PDF is truncated (no %%EOF at its end); download or export it again")


def _image_cover(page: pymupdf.Page) -> float:
    """Share of the page's area under images (overlaps counted twice, capped at 1)."""
    pymupdf: Any = import_pymupdf(layout=False)

    area = page.rect.get_area()
    covered = sum((pymupdf.Rect(info["bbox"]) & page.rect).get_area() for info in page.get_image_info())
    return min(1.0, covered / area) if area else 0.0


def blank(page: pymupdf.Page) -> bool:
    """Whether a page without text holds nothing OCR could read: no image (inline ones included), no
    annotation or form field, and no drawing but thin rules (thinner than RULE_PT one way). Text drawn as
    outlines, a chart, a box or a stamp is not blank. A blank page cost ~2 CPU-s to render and OCR for nothing
    (the development set's filings have four)."""
    if page.get_image_info() or page.first_annot or page.first_widget:
        return False
    return all(min(d["rect"].width, d["rect"].height) < RULE_PT for d in page.get_drawings())


def needs_ocr(page: pymupdf.Page, text: str) -> bool:
    """True when the page has no usable text layer: no text (and not blank), garbage glyphs, or a near-empty
    scan."""
    chars = "".join(text.split())           # str.split and str.isspace agree on what whitespace is
    if not chars:
        return not blank(page)
    # Printable text holds no Cc, Co, Cn or Cs character: the count per character only when it may be non-zero.
    unreadable = 0 if chars.isprintable() and "\ufffd" not in chars else sum(
        1 for c in chars if c == "\ufffd" or unicodedata.category(c) in _UNREADABLE_CATEGORIES)
    if unreadable > MAX_UNREADABLE * len(chars):
        return True
    return len(chars) < MIN_CHARS and _image_cover(page) >= MIN_IMAGE_COVER


def document_meta(metadata: dict) -> tuple[tuple[str, str], ...]:
    """A PDF's metadata values the document card reads (ingest/doc_card.py)."""
    return tuple((k, " ".join(str(metadata.get(k) or "").split())[:300]) for k in ("subject", "author", "keywords")
                 if metadata.get(k))


@register("pdf", (".pdf",), "pdf")
def load(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Every page with its blocks and text; pages without a usable text layer come empty with needs_ocr=True.
    A page is yielded once WINDOW pages past it are read (pdf_layout's NOTE)."""
    return load_pages(path, options)


def load_pages(path: Path, options: LoaderOptions, first: int = 0, stop: int | None = None,
               on_open: Callable[[int, list], None] | None = None) -> Iterator[Page]:
    """Pages [first, stop) (0-based; stop None: to the end) as `load` yields them: the WINDOW pages on
    either side are read too, so running headers and font sizes are decided as in a whole-document
    read. `on_open(page_count, outline)` is called once the document is open."""
    pymupdf: Any = import_pymupdf(layout=options.pdf_tables == "always")
    flags = pymupdf.TEXTFLAGS_TEXT & ~pymupdf.TEXT_PRESERVE_LIGATURES      # "ﬁ" -> "fi"
    mode = options.pdf_ocr
    _check_not_truncated(path)
    with open_document(path, options.passwords) as doc:
        title = ((doc.metadata or {}).get("title") or "").strip() or None
        meta = document_meta(doc.metadata or {})
        try:
            toc = doc.get_toc()
        except mupdf_errors():
            toc = []                                    # a damaged outline costs the headings it held
        if on_open is not None:
            on_open(doc.page_count, toc)
        stop = doc.page_count if stop is None else min(stop, doc.page_count)
        layout = Layout(doc.page_count, toc, options.pdf_tables, lambda index: doc[index])
        pending: deque[tuple[int, bool]] = deque()

        def finish(index: int, ocr: bool) -> Page:
            if ocr:
                return Page(index + 1, "", title=title, needs_ocr=True)
            try:
                blocks = layout.blocks(index)
            except mupdf_errors() as exc:
                raise damaged(f"page {index + 1} of the PDF", exc) from None
            return Page(index + 1, page_text(blocks), title=title, blocks=tuple(blocks), meta=meta,
                        running=layout.running)

        for index in range(max(0, first - WINDOW), min(doc.page_count, stop + WINDOW)):
            try:
                page = doc[index]
                lines = read_lines(page.get_text("dict", flags=flags))
                ocr = mode == "always" or (mode == "auto" and needs_ocr(page, "\n".join(ln.text for ln in lines)))
            except mupdf_errors() as exc:
                raise damaged(f"page {index + 1} of the PDF", exc) from None
            if not ocr:
                layout.scan(index, lines)
            if first <= index < stop:
                pending.append((index, ocr))
            while pending and pending[0][0] <= index - WINDOW:
                yield finish(*pending.popleft())
        while pending:
            yield finish(*pending.popleft())
