"""The structure step: a loader's pages -> sections, the units the chunker splits, each knowing its
document, heading path, element and page (the junk filter: ingest/junk.py).

NOTE (sections): a file's pages are read in order and one `Outline` follows them, so a heading on
page 3 still heads the text of page 7. Text blocks under the same heading path on one page join
(with blank lines) into one text section, so chunks never straddle two sections; a heading only
moves the path (its text reaches the chunk through the context line, not the chunk's text); each
table is a section of its own, under the current path and the statement title found in its first rows
or its caption ("Consolidated Statements of Cash Flows"); a table that follows it with no heading or text
between (continued on the next page) keeps that title. A page without blocks is one text section under the
current path.
OCR pages and the ranges of big files are chunked in other tasks: they carry the path in effect where
they start. Every chunk's embedded text is its context line (`context_line`: file name > card > title >
headings, cut to the spec's context tokens) and its text; the store keeps the clean text and the
context as fields of their own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import PurePosixPath

from ingest.loaders import Page
from ingest.names import beside, split_name
from ingest.store.schema import HEADINGS_MAX, TITLE_MAX

CAPTION_CHARS = 300                 # a text this short beside a table belongs to it (see _attach_captions)
HEADING_CHARS = 200                 # one heading's characters in a path (a longer one is cut)
MAX_DEPTH = 6
_GENERIC_TITLES = re.compile(r"^(untitled|document|slide \d+|powerpoint presentation|microsoft word - .*|"
                             r"title|no title|\W*)$", re.I)


Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Section:
    """Text to chunk under one heading path: text blocks of one page, a table, or a part of either."""
    page: int | None
    index: int                              # position in its page: the chunks' order
    text: str
    headings: tuple[str, ...] = ()
    element: str = "text"                   # "text" | "table"
    header: str = ""                        # a table's header rows, repeated in each of its chunks
    boxes: tuple[tuple[int, int, Box], ...] = ()     # (start, end, bbox) of each block's span in `text`


@dataclass(frozen=True)
class Doc:
    """What every chunk of a file shares: its source (relative path), its title, its card (JSON,
    ingest/doc_card.py), what the context line says of the card (`label`, "" when none) and whether the card
    names an organisation (`named`: the context line then leaves the file name out)."""
    source: str
    title: str
    card: str = ""
    label: str = ""
    named: bool = False

    def context(self, headings: tuple[str, ...]) -> str:
        return context_line(self.source, self.title, headings, self.label, self.named)


class Outline:
    """The heading path as a document is read: a heading replaces those of its level and below. It also
    remembers the statement title of the last table (`table_title`) until a heading or text comes."""

    def __init__(self, path: tuple[str, ...] = ()):
        self._stack: list[tuple[int, str]] = [(i + 1, h) for i, h in enumerate(path)]
        self.table_title = ""

    def push(self, level: int, text: str) -> None:
        text = " ".join(text.split())[:HEADING_CHARS]
        self.table_title = ""
        if not text:
            return
        level = max(1, min(level, MAX_DEPTH))
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        self._stack.append((level, text))

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(text for _, text in self._stack)


def page_sections(page: Page, outline: Outline) -> list[Section]:
    """The page's sections in reading order; `outline` moves past the page's headings."""
    if not page.blocks:
        return [Section(page.number, 0, page.text, outline.path)] if page.text.strip() else []
    out: list[Section] = []
    texts: list[str] = []
    boxes: list[tuple[int, int, Box]] = []
    size = 0
    before = outline.path

    def close_text() -> None:
        nonlocal size
        if texts:
            out.append(Section(page.number, len(out), "\n\n".join(texts), outline.path, boxes=tuple(boxes)))
        texts.clear()
        boxes.clear()
        size = 0

    for block in page.blocks:
        if block.kind == "heading":
            close_text()
            outline.push(block.level or 1, block.text)
        elif block.kind == "table":
            caption = texts[-1] if len(texts) == 1 and len(texts[0]) <= CAPTION_CHARS else ""
            if texts:                       # text between: not a continued table (a caption may name its own)
                outline.table_title = ""
            close_text()
            if block.text.strip():
                box = ((0, len(block.text), block.bbox),) if block.bbox else ()
                title = statement_title(caption, block.header, block.text) or outline.table_title
                outline.table_title = title
                headings = outline.path + ((title,) if title and title.lower() not in map(str.lower, outline.path)
                                           else ())
                if caption:                 # under the same headings, so that it joins the table
                    out[-1] = replace(out[-1], headings=headings)
                out.append(Section(page.number, len(out), block.text, headings, "table", block.header, box))
        elif block.text.strip():
            start = size + (2 if texts else 0)
            texts.append(block.text)
            size = start + len(block.text)
            if block.bbox:
                boxes.append((start, size, block.bbox))
    close_text()
    if not out:                     # only headings (a title slide, a cover page): their text is the content
        heads = [b for b in page.blocks if b.kind == "heading" and b.text.strip()]
        if heads:
            text = "\n".join(b.text.strip() for b in heads)
            box = union_box([b.bbox for b in heads if b.bbox])
            return [Section(page.number, 0, text, before, boxes=((0, len(text), box),) if box else ())]
    return _attach_captions(out)


# A financial statement's title ("Consolidated Statements of Cash Flows", "CONSOLIDATED BALANCE SHEETS"),
# often set as a table's first rows (or a bold line just above it) rather than as a heading.
_STATEMENT = re.compile(r"(?:(?:consolidated|combined|condensed)\s+(?:and\s+\w+\s+)?)?(?:statements?\s+of\s+"
                        r"[a-z][a-z ,'’]*[a-z]|balance\s+sheets?)", re.I)
TITLE_ROWS_CHARS = 400              # the start of a table searched for its statement title
TITLE_CELL_CHARS = 120              # a longer cell is text, not a title


def statement_title(*parts: str) -> str:
    """The first statement title in a cell (or line) of `parts`' starts (a caption, a table's header rows,
    its text), as written but for spacing; "" if none."""
    for part in parts:
        for cell in re.split(r"[|\n]", part[:TITLE_ROWS_CHARS]):
            cell = " ".join(cell.split())
            found = _STATEMENT.search(cell) if len(cell) <= TITLE_CELL_CHARS and not cell.endswith(".") else None
            if found and found.group(0)[0].isupper():           # a title, not a sentence's "these statements of"
                return found.group(0)[:HEADING_CHARS]
    return ""


def union_box(boxes: list[Box]) -> Box | None:
    """The union of `boxes`; None if there are none."""
    if not boxes:
        return None
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def _attach_captions(sections: list[Section]) -> list[Section]:
    """A short text right before a table under the same headings is its caption ("The following table
    summarizes ...:"): it joins the table's header rows, so every chunk of the table carries it; a short
    text right after a table (a footnote) joins its last rows. Alone, either would be a chunk of a few
    words that outranks real content."""
    out: list[Section] = []
    for s in sections:
        prev = out[-1] if out else None
        if prev and prev.headings == s.headings and s.element == "table" and prev.element == "text" \
                and len(prev.text) <= CAPTION_CHARS:
            out[-1] = replace(s, index=prev.index, header=f"{prev.text}\n{s.header}".strip(), boxes=_joined(prev, s))
        elif prev and prev.headings == s.headings and prev.element == "table" and s.element == "text" \
                and len(s.text) <= CAPTION_CHARS:
            out[-1] = replace(prev, text=f"{prev.text}\n{s.text}", boxes=prev.boxes + tuple(
                (a + len(prev.text) + 1, b + len(prev.text) + 1, box) for a, b, box in s.boxes))
        else:
            out.append(replace(s, index=len(out)))
    return out


def _joined(caption: Section, table: Section) -> tuple[tuple[int, int, Box], ...]:
    """The table's boxes, the first widened to hold its caption's (the caption is in every chunk)."""
    union = union_box([box for _, _, box in caption.boxes + table.boxes[:1]])
    if union is None or not table.boxes:
        return table.boxes
    return ((table.boxes[0][0], table.boxes[0][1], union),) + table.boxes[1:]


def document_title(page: Page, source: str) -> str:
    """The title every chunk carries: the loader's (metadata) title unless it is generic or an
    identifier, else the first heading of the first page, else the file name."""
    for candidate in (page.title, *(b.text for b in page.blocks if b.kind == "heading")):
        title = " ".join((candidate or "").split())
        if title.lower().startswith("microsoft word - "):
            title = title[17:]
        letters = sum(c.isalpha() for c in title)
        if letters >= 3 and letters >= len(title) / 3 and not _GENERIC_TITLES.match(title):
            return _cut(title, TITLE_MAX)
    return _cut(PurePosixPath(source).name, TITLE_MAX)


def context_line(source: str, title: str, headings: tuple[str, ...] | str, card: str = "",
                 named: bool = False) -> str:
    """What a chunk is embedded and indexed under: its file's name (separators as spaces), its card's label
    (who, what kind, when: "Acme Inc. (ACME) annual report FY2021"), the title (unless it is the file name)
    and the heading path, joined by " > ". The file name is the user's word for the document: when the card
    names an organisation (`named`), what the name says beyond the card stays beside it ("board minutes";
    ingest/names.py NOTE: beside the card), and a name that says nothing ("scan_0001", a hash) is left out."""
    label, name = _file_label(source)
    if named and card:
        label = beside(label, card)
    parts = ([label] if label else []) + ([card] if card else []) + ([] if title in ("", name) else [title])
    if isinstance(headings, str):
        headings = tuple(h for h in headings.split(" > ") if h)
    return " > ".join(parts + list(headings))


@lru_cache(maxsize=4096)
def _file_label(source: str) -> tuple[str, str]:
    """(the file's name without its extension, separators as spaces; its name): once a file, not once a section."""
    stem, name, _ = split_name(source)
    return " ".join(stem.replace("_", " ").split()), name


def joined_headings(headings: tuple[str, ...]) -> str:
    """The store's `headings` field: the path joined by " > ", within HEADINGS_MAX bytes (outer headings kept)."""
    return _cut(" > ".join(headings), HEADINGS_MAX)


def _cut(text: str, limit: int) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode(errors="ignore")
