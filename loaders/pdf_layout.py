"""A PDF page's structure from PyMuPDF's text dict: running headers, footers and page numbers removed,
headings (the outline's, else by font size and weight), tables (loaders/pdf_tables.py) and text blocks,
each with its bbox in PDF points.

NOTE (streaming window): `Layout` sees every page's lines when it is read (`scan`) and decides a page
(`blocks`) once WINDOW pages past it are read or the document ends, from the pages within WINDOW before
and after it: which top/bottom lines repeat (running headers and footers), the body font size and the
heading sizes. Only those pages' lines are held, never the document, so big PDFs still stream.
"""
from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .base import Block
from .pdf_tables import PageTables
from .tables import Box

WINDOW = 16                 # pages before and after a page that decide its running lines and font sizes
EDGE_ROWS = 3               # rows at the top and at the bottom of a page where running lines are looked for
REPEAT_SHARE = 0.5          # a top/bottom line repeated on this share of the window's pages is running...
MIN_REPEATS = 3             # ...and on at least this many pages (so documents of < 3 pages keep everything)
BIG = 1.2                   # a heading by size is at least this many times the body size...
BIG_POINTS = 1.0            # ...and this many points bigger
HEADING_WORDS = 12          # a heading line has at most this many words; a heading at most HEADING_LINES lines
HEADING_LINES = 3
_DIGITS = re.compile(r"\d+")
_ROMAN = re.compile(r"(?<!\w)[ivxlcdm]{1,7}(?!\w)")
PAGE_NUMBER = re.compile(r"^(?:page\s+)?[-–—(\s]*(?:\d{1,4}|[ivxlcdm]{1,7}|[a-z]{1,2}-\s?\d{1,3})[-–—)\s]*"
                          r"(?:(?:of|/)\s*\d{1,4})?$", re.I)
_NOT_ALNUM = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class Line:
    text: str
    bbox: Box
    size: float                 # the size of most of its characters
    bold: bool                  # every visible span is bold
    block: int                  # PyMuPDF's block number


@dataclass
class Scan:
    """What the window keeps of one page with a text layer."""
    index: int
    lines: list[Line]
    running: set[int] = field(default_factory=set)     # lines at the top/bottom edge: candidates
    keys: dict[int, str] = field(default_factory=dict)  # their normalized text
    lone: set[int] = field(default_factory=set)         # those alone in their row: a page number stands alone
    sizes: Counter = field(default_factory=Counter)     # characters by font size
    short: set[float] = field(default_factory=set)      # sizes of heading-like lines


def read_lines(page_dict: dict) -> list[Line]:
    """The page's non-empty lines in PyMuPDF's order (the content stream's: reading order for most files)."""
    lines = []
    for block in page_dict["blocks"]:
        for line in block.get("lines", ()):
            if len(line["spans"]) == 1:         # most lines: one span, the same Line for less work
                main = line["spans"][0]
                words = main["text"].split()
                if not words:
                    continue
                text = " ".join(words)
                bold = bool(main["flags"] & 16) or "bold" in main["font"].lower()
            else:
                spans = [s for s in line["spans"] if s["text"].strip()]
                if not spans:               # (a span with visible text makes the joined text non-empty)
                    continue
                text = " ".join("".join(s["text"] for s in line["spans"]).split())
                main = max(spans, key=lambda s: len(s["text"].strip()))
                bold = all(s["flags"] & 16 or "bold" in s["font"].lower() for s in spans)
            lines.append(Line(text, tuple(line["bbox"]), round(main["size"], 1), bold, block["number"]))
    return lines


def rows(lines: Iterable[Line]) -> list[list[Line]]:
    """Lines grouped into rows, top to bottom, each row left to right: a line whose vertical middle lies
    within a row's first line shares that row."""
    out: list[list[Line]] = []
    for line in sorted(lines, key=lambda ln: (ln.bbox[1] + ln.bbox[3]) / 2):
        middle = (line.bbox[1] + line.bbox[3]) / 2
        if out and out[-1][0].bbox[1] <= middle <= out[-1][0].bbox[3]:
            out[-1].append(line)
        else:
            out.append([line])
    return [sorted(row, key=lambda ln: ln.bbox[0]) for row in out]


def _key(text: str) -> str:
    """A line compared across pages: without digits and lone roman numerals (page numbers), so that
    "Form 10-K 30" on even pages and "31" beside "Form 10-K" on odd ones compare equal."""
    return " ".join(_ROMAN.sub("", _DIGITS.sub("", text.lower())).split())


def _heading_like(text: str) -> bool:
    if not 0 < len(text.split()) <= HEADING_WORDS or text.endswith((".", ",", ";")):
        return False                    # the cheap tests first: most lines are longer (the letters not counted)
    letters = sum(map(str.isalpha, text))
    return letters >= 3 and letters >= len(text.replace(" ", "")) / 2


def _norm(text: str) -> str:
    return _NOT_ALNUM.sub("", text.lower())


class Layout:
    """Decides the blocks of a PDF's pages from a window of pages around each (see the module NOTE)."""

    def __init__(self, page_count: int, toc: list, tables: str, get_page: Callable[[int], object]):
        self.page_count = page_count
        self.tables = tables
        self.get_page = get_page
        self.toc: dict[int, list[tuple[int, str]]] = {}
        for level, title, number, *_ in toc:
            if title.strip() and number >= 1:
                self.toc.setdefault(number - 1, []).append((level, " ".join(title.split())))
        self.toc_depth = max((lv for lv, *_ in toc), default=0)
        self.window: deque[Scan] = deque()
        self.last_table: tuple[str, int] | None = None    # (header, columns) of a table ending the last page
        self.running: tuple[str, ...] = ()                # the last page's running lines removed (`blocks`)

    def scan(self, index: int, lines: list[Line]) -> None:
        """Remember a page's lines and statistics (call in page order)."""
        s = Scan(index, lines)
        page_rows = rows(lines)
        edge = page_rows[:EDGE_ROWS] + page_rows[max(EDGE_ROWS, len(page_rows) - EDGE_ROWS):]
        for i, row in enumerate(edge):
            if len(row) == 1:
                s.lone.add(id(row[0]))
            for line in row:
                s.running.add(id(line))
                key = _key(line.text)
                s.keys[id(line)] = ("t" if i < EDGE_ROWS else "b") + key if key else ""
        for line in lines:
            s.sizes[line.size] += len(line.text)
            if line.size not in s.short and _heading_like(line.text):     # a size's first heading-like line
                s.short.add(line.size)
        self.window.append(s)
        while self.window and self.window[0].index < index - 2 * WINDOW:
            self.window.popleft()

    def blocks(self, index: int) -> list[Block]:
        """The blocks of page `index` (scanned, with WINDOW pages past it when there are), in reading order."""
        near = [s for s in self.window if abs(s.index - index) <= WINDOW]
        page = next(s for s in near if s.index == index)
        lines = self._drop_running(page, near)      # sets self.running
        tables = PageTables(lines, self.tables, lambda: self.get_page(index), self.last_table)
        free = [ln for ln in lines if id(ln) not in tables.used]
        heads, skip = self._headings(index, free, self._body_size(near), near)
        placed = {t.first: t for t in tables.tables}
        out: list[Block] = list(heads.pop(None, []))
        text: list[Line] = []
        last_table = None

        def flush() -> None:
            if text:
                out.append(Block("text", "\n".join(ln.text for ln in text), bbox=_union(ln.bbox for ln in text)))
                text.clear()

        for line in lines:
            key = id(line)
            if key in placed or key in heads:
                flush()
                out.append(placed[key].block if key in placed else heads[key])
                last_table = placed.get(key)
            elif key not in tables.used and key not in skip:
                if text and text[-1].block != line.block:
                    flush()
                text.append(line)
                last_table = None
        flush()
        self.last_table = (last_table.block.header, last_table.columns) if last_table else None
        return out

    def _drop_running(self, page: Scan, near: list[Scan]) -> list[Line]:
        """The page's lines without running headers/footers and lone page numbers at its edges."""
        if self.page_count < MIN_REPEATS:
            return page.lines
        seen = Counter(key for s in near for key in set(s.keys.values()) if key)
        need = max(MIN_REPEATS, REPEAT_SHARE * len(near))
        kept = [ln for ln in page.lines
                if id(ln) not in page.running
                or not ((page.keys[id(ln)] and seen[page.keys[id(ln)]] >= need)
                        or (id(ln) in page.lone and PAGE_NUMBER.match(ln.text)))]
        if len(kept) < len(page.lines):     # the running headers and footers removed (their texts: `running`)
            ids = {id(ln) for ln in kept}
            self.running = tuple(ln.text for ln in page.lines if id(ln) not in ids and not PAGE_NUMBER.match(ln.text))
        else:
            self.running = ()
        return kept

    @staticmethod
    def _body_size(near: list[Scan]) -> float:
        sizes: Counter = Counter()
        for s in near:          # as sum(..., Counter()) would: counts all positive, keys in first-seen order
            sizes.update(s.sizes)
        return sizes.most_common(1)[0][0] if sizes else 0.0

    def _headings(self, index: int, lines: list[Line], body: float, near: list[Scan]) -> tuple[dict, set[int]]:
        """({id(first line): heading Block, None: headings placed at the page's top}, ids of the headings'
        other lines) for the outline's entries on the page, and headings by font size and weight."""
        out: dict = {}
        skip: set[int] = set()
        taken: set[int] = set()
        start = 0
        for level, title in self.toc.get(index, []):
            match = self._find(lines, start, _norm(title))
            if match is None:
                out.setdefault(None, []).append(Block("heading", title, level=min(level, 6)))
                continue
            first, last = match
            group = lines[first:last + 1]
            out[id(group[0])] = Block("heading", title, level=min(level, 6), bbox=_union(ln.bbox for ln in group))
            skip.update(id(ln) for ln in group[1:])
            taken.update(id(ln) for ln in group)
            start = last + 1
        big = sorted({size for s in near for size in s.short if size >= body * BIG and size - body >= BIG_POINTS},
                     reverse=True)
        alone = {id(row[0]) for row in rows(lines) if len(row) == 1}
        by_block: dict[int, list[Line]] = {}
        for line in lines:
            by_block.setdefault(line.block, []).append(line)
        for group in by_block.values():
            if len(group) > HEADING_LINES or any(id(ln) in taken or id(ln) not in alone for ln in group):
                continue
            level = self._font_level(group, body, big)
            if level:
                out[id(group[0])] = Block("heading", " ".join(ln.text for ln in group), level=level,
                                          bbox=_union(ln.bbox for ln in group))
                skip.update(id(ln) for ln in group[1:])
        return out, skip

    def _font_level(self, group: list[Line], body: float, big: list[float]) -> int:
        """The level of a block of lines that is a heading by its font, else 0."""
        sizes = {ln.size for ln in group}
        text = " ".join(ln.text for ln in group)
        if (len(sizes) != 1 or not body or not all(_heading_like(ln.text) for ln in group)
                or len(text.split()) > HEADING_WORDS + 8 or text.endswith((".", ",", ";"))):
            return 0
        size = sizes.pop()
        if size in big:
            rank = big.index(size) + 1
        elif all(ln.bold for ln in group) and size >= body * 0.95 and len(group) <= 2:
            rank = len(big) + 1
        else:
            return 0
        return min(6, self.toc_depth + rank)

    @staticmethod
    def _find(lines: list[Line], start: int, title: str) -> tuple[int, int] | None:
        """(first, last) index of the lines from `start` on that spell the outline title `title`."""
        if not title:
            return None
        for first in range(start, len(lines)):
            text = ""
            for last in range(first, min(first + HEADING_LINES, len(lines))):
                text += _norm(lines[last].text)
                if not text or not title.startswith(text):
                    break
                if len(text) >= 0.8 * len(title):
                    return first, last
        return None


def _union(boxes: Iterable[Box]) -> Box:
    x0, y0, x1, y1 = zip(*boxes)
    return (round(min(x0), 1), round(min(y0), 1), round(max(x1), 1), round(max(y1), 1))
