"""What the steps hand the store: `Row`, one chunk as the store keeps it (its file's source, format and hash
travel beside it, in the writer's `Segment`), and `search_text`, what BM25 indexes for a row (its CJK runs
as bigrams: ingest/store/cjk.py NOTE). The store knows nothing of how a row was made: the context line comes
with it."""
from __future__ import annotations

from typing import NamedTuple

from ingest.store.cjk import bigrams
from ingest.store.schema import TEXT_MAX


class Row(NamedTuple):
    """One chunk as the store keeps it."""
    page: int | None
    text: str
    title: str
    headings: str                      # the heading path, joined by " > "
    element: str                       # "text" | "table"
    bbox: str                          # "x0,y0,x1,y1" on its page, or ""
    context: str                       # the context line it is embedded and indexed under (file > title > headings)


def search_text(row: Row) -> str:
    """What BM25 indexes for a row: its context line, then its text, each run of CJK characters as its
    bigrams (ingest/store/cjk.py), within the store's TEXT_MAX bytes."""
    text = bigrams(f"{row.context}\n{row.text}")
    data = text.encode()
    return text if len(data) <= TEXT_MAX else data[:TEXT_MAX].decode(errors="ignore")
