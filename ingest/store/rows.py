"""What the steps hand the store: `Row`, one chunk as the store keeps it (its file's source, format and hash
travel beside it, in the writer's `Segment`), `Rows`, a run of them as columns, and `search_text`, what BM25
indexes for a row (its CJK runs as bigrams: ingest/store/cjk.py NOTE). The store knows nothing of how a row
was made: the context line comes with it."""
from __future__ import annotations

from itertools import chain, starmap
from typing import Iterator, NamedTuple, Sequence

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


class Rows:
    """Rows as columns, one sequence per Row field: what the supervisor hands on without making a Row object a
    chunk (~0.4 us each, every chunk of a run; a file's page, title, headings and context repeat as one object).
    An index gives a Row, a slice Rows; iterating makes Rows one at a time (the writer process does)."""
    __slots__ = ("columns",)

    def __init__(self, columns: tuple[Sequence, ...] = ((),) * len(Row._fields)):
        self.columns = columns

    @classmethod
    def of(cls, rows: Sequence[Row]) -> Rows:
        return cls(tuple(zip(*rows))) if rows else cls()

    @classmethod
    def join(cls, blocks: Sequence[Rows]) -> Rows:
        """The blocks' rows one after another."""
        if len(blocks) == 1:
            return blocks[0]
        return cls(tuple(list(chain.from_iterable(b.columns[k] for b in blocks)) for k in range(len(Row._fields))))

    @property
    def texts(self) -> Sequence[str]:
        return self.columns[1]

    def __len__(self) -> int:
        return len(self.columns[1])

    def __getitem__(self, index: int | slice) -> Row | Rows:
        if isinstance(index, slice):
            return Rows(tuple(c[index] for c in self.columns))
        return Row(*(c[index] for c in self.columns))

    def __iter__(self) -> Iterator[Row]:
        return starmap(Row, zip(*self.columns))

    def __reduce__(self) -> tuple:
        return Rows, (self.columns,)


def search_text(row: Row) -> str:
    """What BM25 indexes for a row: its context line, then its text, each run of CJK characters as its
    bigrams (ingest/store/cjk.py), within the store's TEXT_MAX bytes."""
    text = bigrams(f"{row.context}\n{row.text}")
    data = text.encode()
    return text if len(data) <= TEXT_MAX else data[:TEXT_MAX].decode(errors="ignore")
