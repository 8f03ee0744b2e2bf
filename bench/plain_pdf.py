"""A bench-only loader plugin (bench/retrieval.py): the PDF loader as it was before issue 21, each page's
text layer as one block (no headings, tables or header removal), so the structure step's gain can be
measured alone. It replaces the registered "pdf" loader in the worker that imports it."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from ingest.loaders import LoaderOptions, Page, base, pdf


def load(path: Path, options: LoaderOptions) -> Iterator[Page]:
    import pymupdf

    flags = pymupdf.TEXTFLAGS_TEXT & ~pymupdf.TEXT_PRESERVE_LIGATURES
    with pdf.open_document(path, options.passwords) as doc:
        title = ((doc.metadata or {}).get("title") or "").strip() or None
        for index in range(doc.page_count):
            page = doc[index]
            text = page.get_text(flags=flags)
            ocr = options.pdf_ocr == "always" or (options.pdf_ocr == "auto" and pdf.needs_ocr(page, text))
            yield Page(index + 1, "" if ocr else text, title=title, needs_ocr=ocr)


base._BY_FORMAT["pdf"] = base._Entry("pdf", load, (".pdf",), "pdf")
