"""Tables as Markdown rows, shared by the loaders: a header row (with its `|---|` line), the body rows,
and the test whether a row of cells is a header or data."""
from __future__ import annotations

import re
from typing import Sequence

from .base import Block

Box = tuple[float, float, float, float]
_NUMBER = re.compile(r"^[(\-–—+]?[$€£¥]?\s*[(\-–]?\d[\d,.]*\s*%?\)?\*?$|^[—–-]+$")
_YEAR = re.compile(r"^(?:19|20)\d\d$|^(?:fy|q[1-4])\s*'?\d{2,4}$", re.I)


def cell(text: str | None) -> str:
    """A cell's text on one line, pipes escaped."""
    return " ".join((text or "").split()).replace("|", "\\|")


def is_number(text: str) -> bool:
    """A figure ("1,234", "(12.5)", "$ 3", "45%", "—"), not a year."""
    text = text.strip()
    return bool(text) and bool(_NUMBER.match(text)) and not _YEAR.match(text)


def md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def looks_like_header(cells: Sequence[str]) -> bool:
    """A header row: at least two non-empty cells and no figures (years are allowed)."""
    filled = [c for c in cells if c.strip()]
    return len(filled) >= 2 and not any(is_number(c) for c in filled)


def table_block(rows: Sequence[Sequence[str]], header_rows: int = 1, bbox: Box | None = None,
                inherited: str = "") -> Block | None:
    """A table Block from rows of cell texts: the first `header_rows` rows are its header (a table of one
    row has none); `inherited` is the header of the part on the previous page, used when it has none."""
    rows = [[cell(c) for c in row] for row in rows]
    rows = [row for row in rows if any(row)]
    if not rows:
        return None
    header_rows = min(header_rows, len(rows) - 1)
    width = max(len(row) for row in rows[:header_rows]) if header_rows else 0
    header = "\n".join([*(md_row(r) for r in rows[:header_rows]), md_row(["---"] * width)]) if width else inherited
    text = "\n".join(md_row(r) for r in rows[header_rows:])
    return Block("table", text, bbox=bbox, header=header)


def page_text(blocks: Sequence[Block]) -> str:
    """A page's text from its blocks, joined by blank lines; a table shows its header rows above its rows."""
    parts = (f"{b.header}\n{b.text}" if b.kind == "table" and b.header else b.text for b in blocks)
    return "\n\n".join(p for p in parts if p.strip())
