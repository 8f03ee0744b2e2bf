"""Tables of a PDF page ([loaders.pdf] tables). "auto": rows rebuilt from line positions, a row's
label and its figures sharing a baseline (cheap, and it keeps unruled financial statements whole);
"always": PyMuPDF's find_tables first, on every page (measured on 10-K filings: 0.4-1 s a page, and
it loses the spaces between words of HTML-made PDFs), line positions for the rest; "never": no tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .base import Block
from .tables import cell, is_number, looks_like_header, table_block

if TYPE_CHECKING:
    from .pdf_layout import Line

MIN_DATA_ROWS = 2           # a table has at least this many rows with figures
MAX_HEADER_ROWS = 4
ROW_GAP = 2.5               # a vertical gap of this many line heights ends a table
_CURRENCY = {"$", "€", "£", "¥"}


@dataclass(frozen=True)
class Table:
    first: int                  # id() of its first line in reading order: where the block goes
    block: Block
    columns: int


class PageTables:
    """The tables of one page: `tables`, and `used`, the ids of the lines they hold."""

    def __init__(self, lines: list[Line], mode: str, get_page: Callable[[], Any],
                 previous: tuple[str, int] | None):
        self.tables: list[Table] = []
        self.used: set[int] = set()
        if mode == "never" or not lines:
            return
        from .pdf_layout import rows

        page_rows = rows(lines)
        found: list[tuple[list[Line], list[list[str]], int, tuple]] = []
        if mode == "always":
            found = _find_tables(get_page(), lines)
        boxes = [f[3] for f in found]
        found += [t for t in _line_tables(page_rows) if not any(_inside(ln, b) for b in boxes for ln in t[0])]
        order = {id(ln): i for i, ln in enumerate(lines)}
        for held, cells, header_rows, bbox in sorted(found, key=lambda f: min(order[id(ln)] for ln in f[0])):
            first = min(held, key=lambda ln: order[id(ln)])
            columns = max(len(r) for r in cells)
            inherited = ""
            if (not self.tables and previous and header_rows == 0 and previous[1] == columns
                    and order[id(first)] == 0):
                inherited = previous[0]
            block = table_block(cells, header_rows, bbox, inherited)
            if block is not None:
                self.tables.append(Table(id(first), block, columns))
                self.used.update(id(ln) for ln in held)


def _cells(row: list[Line]) -> list[str]:
    """A row's cells left to right, lone currency signs dropped (they belong to the figure beside them)."""
    out = []
    for line in row:
        words = line.text.split()           # a Line's text is already its words joined by single spaces
        text = line.text if _CURRENCY.isdisjoint(words) else " ".join(w for w in words if w not in _CURRENCY)
        if text:
            out.append(cell(text))
    return out


def _line_tables(page_rows: list[list[Line]]) -> list[tuple[list[Line], list[list[str]], int, tuple]]:
    """Tables rebuilt from rows of lines: runs of rows with figures beside a label (a wrapped label's
    first line joins its row), with up to MAX_HEADER_ROWS figure-free rows above as the header."""
    cells = [_cells(r) for r in page_rows]
    kinds = []
    for row in cells:
        if len(row) >= 2 and any(is_number(c) for c in row[1:]):
            kinds.append("data")
        elif looks_like_header(row):
            kinds.append("head")
        elif len(row) == 1 and len(row[0].split()) <= 12:
            kinds.append("label")
        else:
            kinds.append("text")
    out = []
    i = 0
    while i < len(page_rows):
        if kinds[i] != "data":
            i += 1
            continue
        end = i
        j = i + 1
        while j < len(page_rows) and not _gap(page_rows[j - 1], page_rows[j]):
            if kinds[j] == "data":
                end = j
            elif kinds[j] != "label" or j + 1 >= len(page_rows) or kinds[j + 1] not in ("data", "label"):
                break
            j += 1
        start = i
        left = min(ln.bbox[0] for r in page_rows[i:end + 1] for ln in r)
        while (start > 0 and i - start < MAX_HEADER_ROWS and not _gap(page_rows[start - 1], page_rows[start])
               and kinds[start - 1] in ("head", "label")):
            start -= 1
        # Figure-free rows above: column headings, and labels set right of the table's left edge, are its
        # header; a label at the left edge just above the figures is a row of the table when a header sits
        # above it ("Segment Revenues"), else left out (it may be a heading).
        centred = [k == "head" or page_rows[n][0].bbox[0] > left + 40 for n, k in enumerate(kinds[start:i], start)]
        while start < i and not centred[0]:
            start, centred = start + 1, centred[1:]
        while i > start and not centred[-1]:
            i, centred = i - 1, centred[:-1]
        if sum(k == "data" for k in kinds[i:end + 1]) >= MIN_DATA_ROWS:
            held = [ln for r in page_rows[start:end + 1] for ln in r]
            body = _join_wrapped(page_rows[i:end + 1], cells[i:end + 1], kinds[i:end + 1])
            bbox = _box(held)
            out.append((held, cells[start:i] + body, i - start, bbox))
        i = end + 1
    return out


def _join_wrapped(page_rows: list[list[Line]], cells: list[list[str]], kinds: list[str]) -> list[list[str]]:
    """Body rows, a label row joined to the next row when that row's label is indented under it."""
    out: list[list[str]] = []
    carry = ""
    for n, (row, kind) in enumerate(zip(cells, kinds)):
        if (kind == "label" and n + 1 < len(cells) and kinds[n + 1] == "data"
                and page_rows[n + 1][0].bbox[0] > page_rows[n][0].bbox[0] + 2 and not is_number(cells[n + 1][0])):
            carry = row[0] + " "
            continue
        out.append([carry + row[0], *row[1:]] if carry else row)
        carry = ""
    return out


def _gap(above: list[Line], below: list[Line]) -> bool:
    height = max(ln.bbox[3] - ln.bbox[1] for ln in above)
    return min(ln.bbox[1] for ln in below) - max(ln.bbox[3] for ln in above) > ROW_GAP * height


def _find_tables(page: Any, lines: list[Line]) -> list[tuple[list[Line], list[list[str]], int, tuple]]:
    """PyMuPDF's tables: the first row is the header (when PyMuPDF found the header outside the table
    or it is empty, the first row still is), unless it holds figures (a continued table)."""
    out = []
    for table in page.find_tables().tables:
        rows = [[cell(c) for c in row] for row in table.extract()]
        rows = [r for r in rows if any(r)]
        if not rows:
            continue
        bbox = tuple(round(v, 1) for v in table.bbox)
        held = [ln for ln in lines if _inside(ln, bbox)]
        if held:
            out.append((held, rows, 1 if looks_like_header(rows[0]) or len(rows) == 1 else 0, bbox))
    return out


def _inside(line: Line, box: tuple) -> bool:
    x = (line.bbox[0] + line.bbox[2]) / 2
    y = (line.bbox[1] + line.bbox[3]) / 2
    return box[0] - 1 <= x <= box[2] + 1 and box[1] - 1 <= y <= box[3] + 1


def _box(lines: list[Line]) -> tuple:
    return (round(min(ln.bbox[0] for ln in lines), 1), round(min(ln.bbox[1] for ln in lines), 1),
            round(max(ln.bbox[2] for ln in lines), 1), round(max(ln.bbox[3] for ln in lines), 1))
