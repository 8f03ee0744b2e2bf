"""Plain text and Markdown: detect the encoding, return the whole file as one page; a Markdown page
also comes as blocks (ATX headings, pipe tables, paragraphs)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

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


def markdown_blocks(text: str) -> list[Block]:
    """ATX headings (outside fenced code) as headings, pipe tables (a header row, then a |---| line) as
    tables, the rest as text blocks split at blank lines."""
    blocks: list[Block] = []
    para: list[str] = []
    lines = text.split("\n")
    in_fence = False

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
