"""DOCX: body paragraphs, headings, tables and content controls in document order, plus headers,
footers, footnotes and endnotes, as one page."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .base import LoaderOptions, Page, register
from .ooxml import check_zip, open_error

if TYPE_CHECKING:
    from docx.document import Document
    from lxml.etree import _Element

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_P, _TBL, _TR, _TC, _T = (_W + t for t in ("p", "tbl", "tr", "tc", "t"))
_TXBX = _W + "txbxContent"
_BREAKS = {_W + "br": "\n", _W + "cr": "\n", _W + "tab": "\t", _W + "noBreakHyphen": "-"}
# Wrappers whose children are blocks (or rows, or cells): content controls, custom XML, notes.
_WRAPPERS = {_W + t for t in ("sdt", "sdtContent", "customXml", "footnote", "endnote")}
# Never text: properties, and the VML fallback that repeats a text box's content.
_SKIP = {_W + "pPr", _W + "rPr", "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"}


def _inline(el: _Element, text: list[str], boxes: list[_Element]) -> None:
    """Collect a paragraph's text (runs, hyperlinks, fields, inline controls) and its text boxes."""
    for child in el:
        tag = child.tag
        if tag == _T:
            text.append(child.text or "")
        elif tag in _BREAKS:
            text.append(_BREAKS[tag])
        elif tag == _TXBX:
            boxes.append(child)
        elif tag not in _SKIP:
            _inline(child, text, boxes)


def _children(el: _Element, tag: str) -> Iterator[_Element]:
    """Children of `el` with `tag`, looking through content-control / custom-XML wrappers."""
    for child in el:
        if child.tag == tag:
            yield child
        elif child.tag in _WRAPPERS:
            yield from _children(child, tag)


def _table(tbl: _Element) -> Iterator[str]:
    """One line per row, cells joined by " | " (merged cells appear once; nested tables inline)."""
    for row in _children(tbl, _TR):
        cells = (" ".join(_blocks(cell)) for cell in _children(row, _TC))
        line = " | ".join(c for c in cells if c)
        if line:
            yield line


def _blocks(el: _Element) -> Iterator[str]:
    """Non-empty text blocks under a body-like element, in document order."""
    for child in el:
        if child.tag == _P:
            text: list[str] = []
            boxes: list[_Element] = []
            _inline(child, text, boxes)
            line = "".join(text).strip()
            if line:
                yield line
            for box in boxes:
                yield from _blocks(box)
        elif child.tag == _TBL:
            yield from _table(child)
        elif child.tag in _WRAPPERS:
            yield from _blocks(child)


def _story_blocks(doc: Document, kinds: tuple[str, ...]) -> list[str]:
    """Text of the parts related to the document by a relationship type ending in one of `kinds`
    ("/header", "/footer", ...), one block per part, each distinct text once."""
    from docx.oxml import parse_xml

    rels = [r for r in doc.part.rels.values() if not r.is_external and r.reltype.endswith(kinds)]
    distinct: dict[str, None] = {}
    for rel in sorted(rels, key=lambda r: str(r.target_part.partname)):
        part = rel.target_part
        root = part.element if hasattr(part, "element") else parse_xml(part.blob)
        block = "\n".join(_blocks(root))
        if block:
            distinct.setdefault(block)
    return list(distinct)


def _title(doc: Document) -> str | None:
    title = (doc.core_properties.title or "").strip()
    if title:
        return title
    for paragraph in doc.paragraphs:
        style = paragraph.style.name if paragraph.style is not None else ""
        if style.startswith(("Heading", "Title")) and paragraph.text.strip():
            return paragraph.text.strip()
    return None


def read_docx(path: Path) -> tuple[str, str | None]:
    """(text, title) of a DOCX that passed check_zip."""
    import docx

    try:
        doc = docx.Document(str(path))
        parts = [*_story_blocks(doc, ("/header",)), *_blocks(doc.element.body),
                 *_story_blocks(doc, ("/footer", "/footnotes", "/endnotes"))]
        return "\n".join(parts), _title(doc)
    except Exception as exc:  # python-docx / lxml raise many types for malformed parts
        raise open_error("DOCX", exc) from None


@register("docx", (".docx",), "docx")
def load(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """The whole document as one page (number None)."""
    check_zip(path, options, "DOCX", "word/document.xml")
    text, title = read_docx(path)
    yield Page(None, text, title=title)
