"""DOCX: one page of blocks: headers first, then the body in document order (paragraphs styled
"Heading N" or "Title" as headings, other paragraphs and content controls as text, tables as Markdown
tables with their first row as header), then footers, footnotes and endnotes."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .base import Block, LoaderOptions, Page, register
from .ooxml import check_zip, core_meta, open_error
from .tables import page_text, table_block

if TYPE_CHECKING:
    from docx.document import Document
    from lxml.etree import _Element

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_P, _TBL, _TR, _TC, _T = (_W + t for t in ("p", "tbl", "tr", "tc", "t"))
_TXBX = _W + "txbxContent"
_STYLE = f"{_W}pPr/{_W}pStyle"
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


def _paragraph(p: _Element) -> tuple[str, list[_Element]]:
    """A paragraph's text, stripped, and its text boxes."""
    text: list[str] = []
    boxes: list[_Element] = []
    _inline(p, text, boxes)
    return "".join(text).strip(), boxes


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
            line, boxes = _paragraph(child)
            if line:
                yield line
            for box in boxes:
                yield from _blocks(box)
        elif child.tag == _TBL:
            yield from _table(child)
        elif child.tag in _WRAPPERS:
            yield from _blocks(child)


def _body(el: _Element, levels: dict[str, int]) -> Iterator[Block]:
    """The blocks under a body-like element in document order; `levels` maps heading style ids to levels."""
    for child in el:
        if child.tag == _P:
            line, boxes = _paragraph(child)
            style = child.find(_STYLE)
            level = levels.get(style.get(_W + "val", "")) if style is not None else None
            if line:
                yield Block("heading", line, level=level) if level else Block("text", line)
            for box in boxes:
                yield from _body(box, levels)
        elif child.tag == _TBL:
            cells = [[" ".join(_blocks(c)) for c in _children(row, _TC)] for row in _children(child, _TR)]
            block = table_block(cells, header_rows=1)
            if block is not None:
                yield block
        elif child.tag in _WRAPPERS:
            yield from _body(child, levels)


def _heading_levels(doc: Document) -> dict[str, int]:
    """Style id -> heading level: "Title" is 1, "Heading N" is N (by the style's name, any language's id)."""
    levels = {}
    for style in doc.styles:
        name = (style.name or "").strip()
        if name == "Title":
            levels[style.style_id] = 1
        elif name.startswith("Heading ") and name[8:].isdigit():
            levels[style.style_id] = min(6, max(1, int(name[8:])))
    return levels


def _story_blocks(doc: Document, kinds: tuple[str, ...]) -> list[Block]:
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
    return [Block("text", text) for text in distinct]


def _title(doc: Document) -> str | None:
    title = (doc.core_properties.title or "").strip()
    if title:
        return title
    for paragraph in doc.paragraphs:
        style = paragraph.style.name if paragraph.style is not None else ""
        if style.startswith(("Heading", "Title")) and paragraph.text.strip():
            return paragraph.text.strip()
    return None


def read_docx(path: Path) -> tuple[list[Block], str | None, tuple[tuple[str, str], ...]]:
    """(blocks, title, metadata) of a DOCX that passed check_zip."""
    import docx

    try:
        doc = docx.Document(str(path))
        blocks = [*_story_blocks(doc, ("/header",)), *_body(doc.element.body, _heading_levels(doc)),
                  *_story_blocks(doc, ("/footer", "/footnotes", "/endnotes"))]
        return blocks, _title(doc), core_meta(doc.core_properties)
    except Exception as exc:  # python-docx / lxml raise many types for malformed parts
        raise open_error("DOCX", exc) from None


@register("docx", (".docx",), "docx")
def load(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """The whole document as one page (number None)."""
    check_zip(path, options, "DOCX", "word/document.xml")
    blocks, title, meta = read_docx(path)
    yield Page(None, page_text(blocks), title=title, blocks=tuple(blocks), meta=meta)
