"""Plain text and Markdown: detect the encoding, return the whole file as one page; a Markdown page
also comes as blocks (ATX headings, pipe tables, paragraphs). A big file is also read by byte range
(`plan_ranges`, `load_range`: ingest/load.py's NOTE on ranges).

NOTE (ranges): `plan_ranges` reads the file once, block by block, feeding the caller's hash; it
takes the encoding from the file's head (a BOM, else strict UTF-8 of the head, else the guess) and
cuts the file about every `range_bytes` right after the first newline of the first blank line at
or after the mark (else after a newline, else after a space, searched up to the end), so every
range decodes alone: only encodings where those bytes are never part of a character are cut
(UTF-16/32 files are read whole). For Markdown it also notes, at each cut, the heading stack and
whether the cut falls inside a fenced code block. Approximated against a whole-file read: the
encoding is the head's (an invalid byte later becomes U+FFFD instead of changing the guess), a
range cut inside a pipe table starts a new table without its header, and a Markdown title is the
first `# heading` of the first range.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from .base import Block, LoaderError, LoaderOptions, Page, Unsupported, register
from .tables import table_block

MB = 1024 * 1024
HEAD_BYTES = 8192              # how much of a file shows whether it is BOM-less UTF-16
# Byte-order marks, longest first (the UTF-32 LE mark starts with the UTF-16 LE one).
BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)
GUESS_BYTES = 64 * 1024        # charset-normalizer looks at this much of the file
# Encodings text files are actually written in; guessing among all of Python's codecs picks exotic
# ones (hp_roman8, mac_iceland) for short Western text.
COMMON_ENCODINGS = ("utf_8", "cp1252", "latin_1", "iso8859_15", "cp1250", "iso8859_2", "cp1251", "koi8_r",
                    "cp866", "iso8859_5", "cp1253", "iso8859_7", "cp1254", "iso8859_9", "cp1255", "cp1256",
                    "cp1257", "cp1258", "cp874", "gb18030", "big5", "cp932", "euc_jp", "cp949", "euc_kr")
# On a tie (short text decodes plausibly several ways) the more widely used encoding wins.
_BY_POPULARITY = ("cp1252", "gb18030", "cp932", "cp1251", "cp949", "big5")
# How much more chaos than the best guess still ties; charset-normalizer over-counts typographic
# quotes and the euro sign as chaos in cp1252.
_TIE_SLACK = {"cp1252": 0.1}
_H1 = re.compile(r" {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_ATX = re.compile(r" {0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_MD_LINE = re.compile(rb"^[ \t]*(?:```|~~~)|^ {0,3}#{1,6}[ \t]", re.M)   # fence or ATX heading lines (a prefilter)
READ_BYTES = 1 << 20            # the planning pass's block
CUT_SLACK = 1 << 16             # how far past a mark a blank line is looked for before a newline will do


def utf16_without_bom(head: bytes) -> str | None:
    """The UTF-16 byte order when NULs fall on one byte position only (mostly-ASCII UTF-16), else None."""
    sample = head[: len(head) - len(head) % 2]
    if len(sample) < 4:
        return None
    pairs = len(sample) // 2
    even = sample[0::2].count(0) / pairs
    odd = sample[1::2].count(0) / pairs
    if odd > 0.1 and even < 0.02:         # ASCII "A" is 41 00 in UTF-16-LE
        return "utf-16-le"
    if even > 0.1 and odd < 0.02:
        return "utf-16-be"
    return None


def _guess_encoding(data: bytes) -> str | None:
    import charset_normalizer

    sample = data[:GUESS_BYTES]
    if len(data) > GUESS_BYTES and b"\n" in sample:
        sample = sample[: sample.rindex(b"\n") + 1]       # do not cut a multi-byte character
    matches = charset_normalizer.from_bytes(sample, cp_isolation=list(COMMON_ENCODINGS))
    best = matches.best()
    if best is None:
        return None
    ties = {m.encoding for m in matches
            if m.coherence >= best.coherence and m.chaos <= best.chaos + _TIE_SLACK.get(m.encoding, 0.01)}
    return next((enc for enc in _BY_POPULARITY if enc in ties), best.encoding)


def decode(data: bytes) -> str:
    """Decode by BOM, then strict UTF-8, then BOM-less UTF-16, then charset-normalizer, else latin-1."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            return data[len(bom):].decode(encoding, errors="replace")
    candidates = ["utf-8", utf16_without_bom(data[:HEAD_BYTES])]
    for encoding in filter(None, candidates):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            pass
    return data.decode(_guess_encoding(data) or "latin-1", errors="replace")


def markdown_title(text: str) -> str | None:
    """The first level-1 ATX heading (`# Title`) outside fenced code blocks."""
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and (match := _H1.match(line)):
            return match.group(1)
    return None


def _cells(line: str) -> list[str]:
    """A pipe-table row's cells (outer pipes optional, escaped pipes kept)."""
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [c.strip().replace("\\|", "|") for c in _CELL_SPLIT.split(line)]


def markdown_blocks(text: str, in_fence: bool = False) -> list[Block]:
    """ATX headings (outside fenced code) as headings, pipe tables (a header row, then a |---| line) as
    tables, the rest as text blocks split at blank lines; `in_fence`: the text starts inside a fence."""
    blocks: list[Block] = []
    para: list[str] = []
    lines = text.split("\n")

    def flush() -> None:
        if any(p.strip() for p in para):
            blocks.append(Block("text", "\n".join(para).strip("\n")))
        para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and (match := _ATX.match(line)):
            flush()
            blocks.append(Block("heading", match.group(2).strip(), level=len(match.group(1))))
            i += 1
            continue
        elif (not in_fence and "|" in line and i + 1 < len(lines) and _DELIMITER.match(lines[i + 1])
              and "-" in lines[i + 1]):
            flush()
            rows = [_cells(line)]
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append(_cells(lines[i]))
                i += 1
            if (table := table_block(rows, header_rows=1)) is not None:
                blocks.append(table)
            continue
        if line.strip() or in_fence:
            para.append(line)
        else:
            flush()
        i += 1
    flush()
    return blocks


def read_text(path: Path, options: LoaderOptions) -> str:
    """The file's text with newlines normalized; refuses files over [limits] max_text_mb before reading,
    and whitespace-only files (Unsupported: reported as skipped)."""
    limit = options.max_text_mb
    size = path.stat().st_size
    if size > limit * MB:
        raise LoaderError(f"text file is {size / MB:.1f} MB, over [limits] max_text_mb = {limit:g}; "
                          "raise the limit to ingest it")
    text = decode(path.read_bytes()).replace("\r\n", "\n")
    if not text.strip():
        raise Unsupported("empty file")
    return text


@register("txt", (".txt",), "txt")
def load_txt(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """A .txt file as one page."""
    yield Page(None, read_text(path, options))


@register("md", (".md", ".markdown"), "txt")
def load_md(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """A Markdown file as one page, titled by its first `# heading`; its text is the file's, its blocks
    the structure."""
    text = read_text(path, options)
    yield Page(None, text, title=markdown_title(text), blocks=tuple(markdown_blocks(text)))


# -- byte ranges of a big file (module NOTE) -------------------------------------------------
class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


@dataclass(frozen=True)
class TextRange:
    start: int                              # bytes [start, end) of the file
    end: int
    encoding: str
    headings: tuple[tuple[int, str], ...]   # Markdown: the heading stack (level, text) where it starts
    fence: bool                             # Markdown: it starts inside a fenced code block


def range_encoding(head: bytes) -> str | None:
    """The encoding every range of the file is decoded with, from its head; None if byte cuts at
    newlines and spaces could split a character (UTF-16, UTF-32)."""
    for bom, encoding in BOMS:
        if head.startswith(bom):
            return encoding if encoding == "utf-8-sig" else None
    if utf16_without_bom(head[:HEAD_BYTES]):
        return None
    sample = head[: head.rindex(b"\n") + 1] if len(head) >= GUESS_BYTES and b"\n" in head else head
    try:
        sample.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        encoding = _guess_encoding(head) or "latin-1"
    return encoding if codecs.encode("\n \r", encoding) == b"\n \r" else None


def _boundary(f, mark: int) -> int:
    """The cut at or after `mark` (module NOTE): the offset right after it; the file's size if none."""
    f.seek(mark)
    window = f.read(CUT_SLACK)
    blank = [i for i in (window.find(b"\n\n"), window.find(b"\n\r\n")) if i >= 0]
    if blank:
        return mark + min(blank) + 1
    offset = mark
    while window:
        found = [i for i in (window.find(b"\n"), window.find(b" ")) if i >= 0]
        if found:
            return offset + min(found) + 1
        offset += len(window)
        window = f.read(READ_BYTES)
    return offset


def plan_ranges(path: Path, range_bytes: int, markdown: bool, digest: Digest) -> list[TextRange] | None:
    """Read the file once (every byte goes to `digest`) and cut it into ranges of about `range_bytes`;
    None when its encoding cannot be cut (it is then read whole)."""
    with open(path, "rb") as f, open(path, "rb") as probe:
        encoding = range_encoding(probe.read(GUESS_BYTES))
        size = probe.seek(0, 2)
        cuts = [0]
        while encoding and size - cuts[-1] > range_bytes and (cut := _boundary(probe, cuts[-1] + range_bytes)) < size:
            cuts.append(cut)
        states = _markdown_states(f, cuts, encoding, digest) if markdown and encoding else None
        if states is None:
            for block in iter(lambda: f.read(READ_BYTES), b""):
                digest.update(block)
    if encoding is None:
        return None
    states = states or [((), False)] * len(cuts)
    return [TextRange(a, b, encoding, *state) for a, b, state in zip(cuts, cuts[1:] + [size], states)]


def _markdown_states(f, cuts: list[int], encoding: str, digest: Digest) -> list[tuple[tuple[tuple[int, str], ...], bool]]:
    """Feed the whole file to `digest`, following its ATX headings and fences: (heading stack, in a
    fence) at each cut."""
    stack: list[tuple[int, str]] = []
    fence = False
    states: list[tuple[tuple[tuple[int, str], ...], bool]] = []
    carry, base = b"", 0                    # an unfinished line, and its offset
    for block in iter(lambda: f.read(READ_BYTES), b""):
        digest.update(block)
        data = carry + block
        end = data.rfind(b"\n") + 1
        for match in _MD_LINE.finditer(data, 0, end):
            while len(states) < len(cuts) and cuts[len(states)] <= base + match.start():
                states.append((tuple(stack), fence))
            line = data[match.start():data.index(b"\n", match.start())].decode(encoding, "replace").rstrip("\r")
            if line.lstrip().startswith(("```", "~~~")):
                fence = not fence
            elif not fence and (atx := _ATX.match(line)):
                level = len(atx.group(1))
                while stack and stack[-1][0] >= level:
                    stack.pop()
                stack.append((level, atx.group(2).strip()))
        carry, base = data[end:], base + end
        if len(carry) > READ_BYTES:         # a line this long is no heading
            carry, base = b"", base + len(carry)
    while len(states) < len(cuts):
        states.append((tuple(stack), fence))
    return states


def load_range(path: Path, options: LoaderOptions, start: int, end: int, encoding: str, markdown: bool,
               fence: bool = False) -> Iterator[Page]:
    """Bytes [start, end) of a text or Markdown file (cut by `plan_ranges`) as one page; `fence`: a
    Markdown range that starts inside a fenced code block. The file's first range titles a Markdown page."""
    if end - start > options.max_text_mb * MB:
        raise LoaderError(f"the text file has no line break for {(end - start) / MB:.1f} MB, over [limits] "
                          f"max_text_mb = {options.max_text_mb:g}; raise the limit to ingest it")
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode(encoding, errors="replace").replace("\r\n", "\n")
    if not markdown:
        yield Page(None, text)
        return
    yield Page(None, text, title=markdown_title(text) if start == 0 else None,
               blocks=tuple(markdown_blocks(text, fence)))
