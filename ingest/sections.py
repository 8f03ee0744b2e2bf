"""The structure step: a loader's pages -> sections, the units the chunker splits, each knowing its
document, heading path, element and page; and the junk filter.

NOTE (sections): a file's pages are read in order and one `Outline` follows them, so a heading on
page 3 still heads the text of page 7. Text blocks under the same heading path on one page join
(with blank lines) into one text section, so chunks never straddle two sections; a heading only
moves the path (its text reaches the chunk through the context line, not the chunk's text); each
table is a section of its own, under the current path and the statement title found in its first rows
or its caption ("Consolidated Statements of Cash Flows"); a table that follows it with no heading or text
between (continued on the next page) keeps that title. A page without blocks is one text section under the
current path.
OCR pages and the ranges of big files are chunked in other tasks: they carry the path in effect where
they start. Every chunk's embedded text is its context line (`context_line`: file name > title >
headings, cut to the spec's context tokens) and its text; the store keeps the clean text and the
context as fields of their own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from operator import eq
from pathlib import PurePosixPath

from ingest.loaders import Page
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
    and the heading path, joined by " > ". When the card names an organisation (`named`), the file name is
    left out: the document says who it is from, and a renamed copy embeds the same text."""
    label, name = _file_label(source)
    parts = ([] if named and card else [label]) + ([card] if card else []) + ([] if title in ("", name) else [title])
    if isinstance(headings, str):
        headings = tuple(h for h in headings.split(" > ") if h)
    return " > ".join(parts + list(headings))


@lru_cache(maxsize=4096)
def _file_label(source: str) -> tuple[str, str]:
    """(the file's name without its extension, separators as spaces; its name): once a file, not once a section."""
    path = PurePosixPath(source)
    return " ".join(re.sub(r"[_]+", " ", str(path.with_suffix("")) if path.suffix else source).split()), path.name


def joined_headings(headings: tuple[str, ...]) -> str:
    """The store's `headings` field: the path joined by " > ", within HEADINGS_MAX bytes (outer headings kept)."""
    return _cut(" > ".join(headings), HEADINGS_MAX)


def _cut(text: str, limit: int) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode(errors="ignore")


# -- the junk filter -----------------------------------------------------------------------
# NOTE (junk): junk is what no language writes - encoded data (base64 with its data: URIs, long hex),
# hex dumps, binary read as text (control characters, U+FFFD) - judged by character classes, never by
# how a language looks. A long run without spaces is no sign by itself: Chinese, Japanese, Thai, Lao,
# Khmer, Myanmar, Tibetan and Javanese write no spaces, OCR runs words together, formulas, table markup
# and links are long runs too. Inside such runs only ASCII stretches of the base64 alphabet are looked
# at (a link's run never), and they are encoded data when, taken together, they show what words and
# identifiers never do (see _base64), or are long hex strings. A hex dump's words are pairs of hex digits
# with letters inside them ("4f", "ff"; not a matrix's "a11 a12"). Control characters are binary's sign
# only where the words around them are not words: inside text they are extraction artefacts (a math
# font's delimiters as \x12 ... \x13, a symbol font's NULs), dropped from the chunk (`drop_controls`),
# never a reason to drop it. When in doubt the chunk is kept: an embedded junk chunk costs a row, a
# dropped one loses text.
JUNK_SHARE = 0.5                    # a chunk is junk when encoded runs make up more than this share of it,
LANGUAGE_CHARS = 100                # and what is left of it is less than this (a sentence or a table row)
LONG_RUN = 40                       # a run of non-spaces this long is looked into
_CODE_RUN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")             # a stretch of the base64(url) alphabet
_NO_UPPER = str.maketrans("", "", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_NO_LOWER = str.maketrans("", "", "abcdefghijklmnopqrstuvwxyz")
_NO_DIGIT = str.maketrans("", "", "0123456789")
_NO_HEX = str.maketrans("", "", "0123456789abcdefABCDEF")
_UPPER_PAIR = re.compile(r"[A-Z](?=[A-Z])")                 # capitals side by side: none in "SunMonTue"
_LOWER_WORD = re.compile(r"[a-z]{4,}")                      # most small letters of words ("XMLHttpRequest")
_SAME_CASE_WORD = re.compile(r"[a-z]{4,}|[A-Z]{4,}")
# a dump's word, 1 to 8 bytes, after a space (searched in " " + chunk: faster than a lookbehind)
_HEX_WORD = re.compile(r"\s((?:0x)?(?:[0-9a-fA-F]{2}){1,8}[,:]?)(?=\s|\Z)")
_NOT_HEXISH = str.maketrans("", "", "0123456789abcdefABCDEFx,:")     # deletes what a _HEX_WORD may hold
_HEXISH_BYTES = b"0123456789abcdefABCDEFx,:"
_ASCII_SPACE = b" \t\n\r\x0b\x0c"                 # where bytes.split splits
_ASCII_CONTROL = bytes([*range(0x00, 0x09), *range(0x0e, 0x1b), 0x7f])   # _CONTROL's ASCII characters
_ASCII_ODD = bytes([*range(0x00, 0x09), *range(0x0e, 0x20), 0x7f])    # controls, and spaces str.split adds
_HEX_LETTER = re.compile(r"[a-fA-F]")
_HEX_INNER = re.compile(r"[0-9a-fA-F][a-fA-F]")             # a letter not leading: "4f", "ff"; none in "a11 b12"
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1a\x7f-\x84\x86-\x9f]")   # Cc but spaces and ESC (colored logs)
_INNER_CONTROLS = re.compile(r"(?<=\w)[\x00-\x08\x0e-\x1a\x7f-\x84\x86-\x9f]+(?=\w)")
_BROKEN = re.compile(r"[\ufffd\ud800-\udfff]")              # a decoder's replacement, a lone surrogate
_EDGES = re.compile(r"^[\W_]+|[\W_]+$")                     # a word's punctuation around it
_JOINERS = re.compile(r"[-'\u2019.]")                       # inside a word: "K-Vektorraum", "don't", "z.B"
_NUMBER = re.compile(r"[\d.,:/%+\u2212\u2013-]+")              # 1,234.5  1995–96  12:30  -3
WORDS_SHARE = 0.3                   # text this much in words is language, whatever controls are in it (binary: < 0.1),
ARTEFACTS = 0.25                    # unless they are this share of it (formula-dense notes: 0.15; binary: most)


def _encoded(runs: list[str]) -> int:
    """The characters of `runs` (long runs of non-spaces) that are encoded data; links are not looked into."""
    hex_chars, codes = 0, []
    for run in runs:
        if "://" in run or run.startswith("www."):
            continue
        for code in _CODE_RUN.findall(run):
            if code.translate(_NO_HEX):
                codes.append(code)
            else:                                            # hex: sha sums, hex-encoded bytes
                n, digits = len(code), len(code) - len(code.translate(_NO_DIGIT))
                hex_chars += n if digits >= 0.3 * n and n - digits >= 0.1 * n else 0
    return hex_chars + (sum(map(len, codes)) if codes and _base64(codes) else 0)


def _base64(codes: list[str]) -> bool:
    """Whether these stretches of the base64 alphabet, taken together, are encoded data, not words run together:
    their letters mix cases at random (capitals side by side, small letters seldom four in a row); or digits
    stand among letters of both cases that make no words (the UTF-8 of CJK, Indic, Thai text); or the same
    characters come back every 4 (the lead bytes of one script's UTF-8, 3 bytes a letter)."""
    joined = " ".join(codes)
    n = len(joined) - len(codes) + 1
    upper, lower = n - len(joined.translate(_NO_UPPER)), n - len(joined.translate(_NO_LOWER))
    if min(upper, lower) >= 0.15 * n and 0 < 20 * len(_UPPER_PAIR.findall(joined)) >= upper \
            and sum(map(len, _LOWER_WORD.findall(joined))) < 0.7 * lower:
        return True
    if min(upper, lower) >= 0.02 * n and n - len(joined.translate(_NO_DIGIT)) >= 0.1 * n \
            and sum(map(len, _SAME_CASE_WORD.findall(joined))) < 0.3 * (upper + lower):
        return True
    flat = "".join(codes)
    return 3 * sum(map(eq, flat, flat[4:])) >= n and len(set(flat)) >= 16


def _ascii_junk(data: bytes) -> bool:
    """`is_junk` of an ASCII chunk without controls or \\x1c-\\x1f (most text), as bytes: bytes.split splits
    it where str.split does, no character is unreadable, and bytes' translate and split are ~2x cheaper (the
    loader's junk check from 18 to 8 us a 1 KB chunk: issue 45). The same answer as the str path."""
    words = data.split()
    visible = len(data.translate(None, _ASCII_SPACE))
    if visible < 16:
        return False
    if max(map(len, words)) >= LONG_RUN:
        encoded = _encoded([w.decode() for w in words if len(w) >= LONG_RUN])
        if encoded > JUNK_SHARE * visible and visible - encoded < LANGUAGE_CHARS:
            return True
    if len(words) < 16 or len(words) - len(data.translate(None, _HEXISH_BYTES).split()) <= 0.6 * len(words):
        return False
    return _hex_dump(" " + data.decode(), len(words))


def _hex_dump(spaced: str, words: int) -> bool:
    """Most of the `words` words of the text (`spaced`: after a space) are hex bytes, enough of them with letters."""
    hex_words = _HEX_WORD.findall(spaced)      # the words that are hex, in one pass over the chunk
    if len(hex_words) <= 0.6 * words:
        return False
    lettered = [w for w in hex_words if w.startswith("0x") or _HEX_LETTER.search(w)]
    inner = sum(1 for w in lettered if w.startswith("0x") or _HEX_INNER.search(w))
    return len(lettered) > 0.2 * words and inner > 0.05 * words


def _words_share(text: str) -> float:
    """The share of the characters of `text`'s words (controls splitting them; those holding a letter or digit)
    that are in words as a language writes them (3 letters or more, in lower case after the first or all
    capitals, maybe joined by hyphens or apostrophes, not over LONG_RUN; a script without case) or numbers.
    Binary read as text: under 10% (its letters come one or two between controls); language: over 40%."""
    total = good = 0
    for w in _CONTROL.sub(" ", text).split():
        core = _EDGES.sub("", w)
        if not core:
            continue
        total += len(core)
        if _NUMBER.fullmatch(core) or 3 <= len(core) <= LONG_RUN and all(
                p.isalpha() and (p[1:] == p[1:].lower() or p.isupper()) for p in _JOINERS.split(core)):
            good += len(core)
    return good / total if total else 0.0


def drop_controls(chunk: str) -> str:
    """The chunk without control characters (extraction artefacts; NOTE): one between two word characters
    stands for a space or a delimiter ("ker\x10f", a glyph for each space) and becomes a space, others go."""
    if chunk.isascii():                         # bytes' translate: ~4x cheaper than the search over ASCII
        data = chunk.encode()
        if len(data.translate(None, _ASCII_CONTROL)) == len(data):
            return chunk
    elif not _CONTROL.search(chunk):
        return chunk
    return _CONTROL.sub("", _INNER_CONTROLS.sub(" ", chunk))


def is_junk(chunk: str) -> bool:
    """Encoded data (base64, data: URIs, long hex), hex dumps and binary read as text: not language,
    never worth a vector. Text in any script, OCR without spaces, formulas, tables and links are kept."""
    if chunk.isascii():
        data = chunk.encode()
        if len(data.translate(None, _ASCII_ODD)) == len(data):
            return _ascii_junk(data)
    words = chunk.split()                      # str.split and str.isspace agree on what is a space
    visible = sum(map(len, words))
    if visible < 16:
        return False
    encoded = _encoded([w for w in words if len(w) >= LONG_RUN]) if max(map(len, words)) >= LONG_RUN else 0
    if encoded > JUNK_SHARE * visible and visible - encoded < LANGUAGE_CHARS:
        return True
    controls = _CONTROL.findall(chunk)           # random bytes hold ~9% of them, of ~23 kinds alike, in any
    unreadable = len(controls)                   # 8-bit decoding; one kind making most of them stands for a
    if controls:                                 # glyph (a PDF's \x03 for each space): text
        top = max(map(controls.count, set(controls)))
        unreadable -= top if top > unreadable / 2 else 0
    if not chunk.isascii():                      # a mis-decoded letter is one U+FFFD: those count a quarter
        unreadable += len(_BROKEN.findall(chunk)) / 4
    if unreadable > 0.03 * visible and (len(controls) > ARTEFACTS * visible or _words_share(chunk) < WORDS_SHARE):
        return True
    if len(words) >= 16:
        # A hex word is a whole word of _HEXISH characters: words holding another are none (3x cheaper than the
        # findall, which prose then need not run: issue 45).
        if len(words) - len(chunk.translate(_NOT_HEXISH).split()) <= 0.6 * len(words):
            return False
        return _hex_dump(" " + chunk, len(words))
    return False
