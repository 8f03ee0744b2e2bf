"""Builders of REAL documents for the tests (no mocks): text and scanned PDFs, images, DOCX, PPTX,
DOC/PPT (through LibreOffice), broken files, and text in several encodings."""
from __future__ import annotations

import html
import io
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

A4 = (595.0, 842.0)          # page size in points
SCAN_DPI = 200
OCR_FONT_PT = 32             # text meant for OCR is large and clear
TEXT_FONT_PT = 12
MARGIN = 40.0
MB = 1024 * 1024


def _html(text: str, font_pt: float) -> str:
    """Paragraphs (one per line of `text`) in a sans-serif font; insert_htmlbox finds CJK fonts itself."""
    paragraphs = "".join(f"<p>{html.escape(line)}</p>" for line in text.split("\n"))
    return f'<div style="font-family: sans-serif; font-size: {font_pt}pt">{paragraphs}</div>'


def _add_text_page(doc: Any, text: str, size: tuple[float, float] = A4, font_pt: float = TEXT_FONT_PT) -> Any:
    import pymupdf

    page = doc.new_page(width=size[0], height=size[1])
    page.insert_htmlbox(pymupdf.Rect(MARGIN, MARGIN, size[0] - MARGIN, size[1] - MARGIN), _html(text, font_pt))
    return page


def _scan(text: str, size: tuple[float, float]) -> Any:
    """`text` in large type on a white page of `size` points, as a grayscale pixmap at SCAN_DPI."""
    import pymupdf

    with pymupdf.open() as doc:
        page = _add_text_page(doc, text, size, OCR_FONT_PT)
        return page.get_pixmap(dpi=SCAN_DPI, colorspace=pymupdf.csGRAY)


def _add_scanned_page(doc: Any, text: str, size: tuple[float, float] = A4) -> None:
    """A page holding only an image of `text`: no text layer."""
    page = doc.new_page(width=size[0], height=size[1])
    page.insert_image(page.rect, pixmap=_scan(text, size))


def _save_pdf(path: Path, doc: Any, title: str | None = None, **save_args: Any) -> Path:
    if title:
        doc.set_metadata({"title": title})
    doc.subset_fonts()                       # embedded CJK fonts shrink from MBs to KBs
    doc.save(path, garbage=3, deflate=True, **save_args)
    doc.close()
    return path


def _text_doc(pages: Sequence[str]) -> Any:
    import pymupdf

    doc = pymupdf.open()
    for text in pages:
        _add_text_page(doc, text)
    return doc


def make_pdf(path: Path, pages: Sequence[str], title: str | None = None) -> Path:
    """A PDF with a text layer, one page per string (CJK works)."""
    return _save_pdf(path, _text_doc(pages), title)


def make_scanned_pdf(path: Path, pages: Sequence[str], size: tuple[float, float] = A4) -> Path:
    """A PDF of page images only (rendered at 200 dpi), one page per string."""
    import pymupdf

    doc = pymupdf.open()
    for text in pages:
        _add_scanned_page(doc, text, size)
    return _save_pdf(path, doc)


def make_mixed_pdf(path: Path, text_page: str, scanned_page: str, size: tuple[float, float] = A4) -> Path:
    """Page 1 has a text layer, page 2 is a scan."""
    import pymupdf

    doc = pymupdf.open()
    _add_text_page(doc, text_page, size)
    _add_scanned_page(doc, scanned_page, size)
    return _save_pdf(path, doc)


def make_encrypted_pdf(path: Path, pages: Sequence[str], password: str = "secret") -> Path:
    """A text PDF that needs `password` to open (AES-256)."""
    import pymupdf

    return _save_pdf(path, _text_doc(pages), encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw=password, owner_pw=password + "-owner")


def make_truncated_pdf(path: Path, pages: Sequence[str], keep: float = 0.6) -> Path:
    """A text PDF cut after `keep` of its bytes, like an interrupted download."""
    make_pdf(path, pages)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def make_png(path: Path, text: str, size: tuple[float, float] = (595.0, 300.0)) -> Path:
    """A PNG of `text` in large type (`size` in points at 200 dpi)."""
    _scan(text, size).save(path)
    return path


def make_tiff(path: Path, pages: Sequence[str], size: tuple[float, float] = (595.0, 300.0)) -> Path:
    """A multi-page TIFF, one frame per string."""
    frames = [_scan(text, size).pil_image() for text in pages]
    frames[0].save(path, save_all=True, append_images=frames[1:], compression="tiff_deflate")
    return path


def make_docx(path: Path, body_paragraphs: Sequence[str], heading: str | None = None,
              table_rows: Sequence[Sequence[str]] | None = None, header: str | None = None,
              footer: str | None = None, *, after_table: Sequence[str] = (),
              table_style: str = "Light Grid Accent 1", nested_rows: Sequence[Sequence[str]] | None = None,
              content_control: str | None = None, first_page_header: str | None = None,
              title: str | None = None) -> Path:
    """A DOCX: heading, paragraphs, a styled table (optionally a nested table in its last cell),
    `after_table` paragraphs, a block content control (w:sdt), a header (and a different
    first-page header) and a footer; `title` sets the core properties' title."""
    import docx

    doc = docx.Document()
    if title:
        doc.core_properties.title = title
    if heading:
        doc.add_heading(heading, level=1)
    for text in body_paragraphs:
        doc.add_paragraph(text)
    if table_rows:
        table = doc.add_table(rows=len(table_rows), cols=len(table_rows[0]))
        table.style = table_style
        for row, values in zip(table.rows, table_rows):
            for cell, value in zip(row.cells, values):
                cell.text = value
        if nested_rows:
            inner = table.rows[-1].cells[-1].add_table(rows=len(nested_rows), cols=len(nested_rows[0]))
            for row, values in zip(inner.rows, nested_rows):
                for cell, value in zip(row.cells, values):
                    cell.text = value
    for text in after_table:
        doc.add_paragraph(text)
    if content_control:
        _add_content_control(doc, content_control)
    section = doc.sections[0]
    if header:
        section.header.paragraphs[0].text = header
    if footer:
        section.footer.paragraphs[0].text = footer
    if first_page_header:
        section.different_first_page_header_footer = True
        section.first_page_header.paragraphs[0].text = first_page_header
    doc.save(str(path))
    return path


def _add_content_control(doc: Any, text: str) -> None:
    """Append a block-level content control (w:sdt) holding one paragraph of `text`."""
    from docx.oxml import parse_xml

    sdt = parse_xml(
        '<w:sdt xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        '<w:sdtPr><w:alias w:val="Field"/></w:sdtPr>'
        f'<w:sdtContent><w:p><w:r><w:t>{html.escape(text)}</w:t></w:r></w:p></w:sdtContent></w:sdt>')
    body = doc.element.body
    body.insert(len(body) - 1, sdt)          # before the final w:sectPr


@dataclass
class Slide:
    """One slide for make_pptx; every part is optional."""
    title: str | None = None
    body: str | None = None
    group: Sequence[str] = ()                      # texts of text boxes inside one group shape
    table: Sequence[Sequence[str]] | None = None
    notes: str | None = None


def make_pptx(path: Path, slides: Sequence[Slide | Mapping[str, Any]]) -> Path:
    """A PPTX, one slide per Slide (or dict of Slide's fields)."""
    import pptx
    from pptx.util import Inches, Pt

    prs = pptx.Presentation()
    for spec in slides:
        s = spec if isinstance(spec, Slide) else Slide(**spec)
        slide = prs.slides.add_slide(prs.slide_layouts[5 if s.title else 6])   # "Title Only" / "Blank"
        if s.title:
            slide.shapes.title.text = s.title
        if s.body:
            slide.shapes.add_textbox(Inches(0.5), Inches(1.5), Inches(9), Inches(1)).text_frame.text = s.body
        if s.group:
            group = slide.shapes.add_group_shape()
            for i, text in enumerate(s.group):
                box = group.shapes.add_textbox(Inches(0.5 + 3 * i), Inches(2.7), Inches(2.8), Inches(0.8))
                box.text_frame.text = text
        if s.table:
            frame = slide.shapes.add_table(len(s.table), len(s.table[0]), Inches(0.5), Inches(3.8), Inches(9), Inches(2))
            for r, values in enumerate(s.table):
                for c, value in enumerate(values):
                    frame.table.cell(r, c).text = value
                    frame.table.cell(r, c).text_frame.paragraphs[0].font.size = Pt(14)
        if s.notes:
            slide.notes_slide.notes_text_frame.text = s.notes
    prs.save(str(path))
    return path


def _via_libreoffice(path: Path, target: str, build: Any) -> Path:
    """Build a DOCX/PPTX with `build(tmp_path)` and convert it with LibreOffice to `path` (`target` format)."""
    from ingest.loaders.legacy import convert

    with tempfile.TemporaryDirectory(prefix="ingest-test-") as tmp:
        source = build(Path(tmp) / f"source.{target}x")
        shutil.move(convert(source, target, Path(tmp), timeout_s=120), path)
    return path


def make_doc(path: Path, *args: Any, **kwargs: Any) -> Path:
    """A Word 97 .doc: make_docx's arguments, converted by LibreOffice."""
    return _via_libreoffice(path, "doc", lambda src: make_docx(src, *args, **kwargs))


def make_ppt(path: Path, slides: Sequence[Slide | Mapping[str, Any]]) -> Path:
    """A PowerPoint 97 .ppt: make_pptx's slides, converted by LibreOffice."""
    return _via_libreoffice(path, "ppt", lambda src: make_pptx(src, slides))


def make_zip_bomb_docx(path: Path, uncompressed_mb: int) -> Path:
    """A valid small DOCX plus a member of `uncompressed_mb` MB of zeros (compresses ~1000:1)."""
    import docx

    buffer = io.BytesIO()
    docx.Document().save(buffer)
    zero_mb = bytes(MB)
    with zipfile.ZipFile(buffer) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for item in src.infolist():
            out.writestr(item, src.read(item))
        with out.open("word/media/filler.bin", "w", force_zip64=True) as member:
            for _ in range(uncompressed_mb):
                member.write(zero_mb)
    return path


def write_text(path: Path, text: str, encoding: str) -> Path:
    """`text` encoded with a Python codec: "utf-8", "utf-8-sig" (BOM), "utf-16" (BOM), "utf-16-le"
    (no BOM), "utf-32", "gbk", "gb18030", "shift_jis", "cp1252", "latin-1"..."""
    path.write_bytes(text.encode(encoding))
    return path


def make_big_text(path: Path, mb: int) -> Path:
    """A sparse file of `mb` MB: one short line, then zeros; instant to create, never read by a loader."""
    with open(path, "wb") as f:
        f.write(b"a single line\n")
        f.truncate(mb * MB)
    return path
