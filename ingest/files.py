"""What the pipeline knows about one file, as frozen values that threads hand to each other.

`FileRef` is the file's identity: made by the scan, completed by the sniff (format) and the
load step (content hash) with `dataclasses.replace`. `Outcome` is its line in the report.
`Finished` is a file that needs nothing more from the loaders: identity, outcome and the
chunks to embed and store, in page order, with their token ids. A big file loaded by range
(ingest/load.py) comes as several Finished parts in order: each holds its chunks from `start` on,
and only the `last` carries the file's outcome (the others' say "ingested" and their chunks).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import Any, Iterable

import numpy as np

from ingest.chunk import PageChunks
from ingest.sections import context_line
from ingest.store.rows import Rows


INTERRUPTED = "interrupted before it was written; rerun to ingest it"


def evolve(value: Any, **changes: Any) -> Any:
    """`dataclasses.replace` for the frozen values below, on the dispatcher's per-file path: the same new value,
    without replace's introspection of every field (~10 us a call, nine calls a file). They have no
    __post_init__; a name that is not a field raises TypeError, as replace does."""
    fields_ = type(value).__dataclass_fields__
    if not changes.keys() <= fields_.keys():
        raise TypeError(f"{type(value).__name__} has no field {sorted(changes.keys() - fields_.keys())[0]!r}")
    new = object.__new__(type(value))
    new.__dict__.update(value.__dict__, **changes)
    return new


@dataclass(frozen=True)
class FileRef:
    seq: int                           # position in the scan's sorted order
    source: str                        # path relative to the folder, with "/" separators
    path: str
    size: int = 0
    mtime_ns: int = 0
    fmt: str = ""
    file_hash: str = ""
    warnings: tuple[str, ...] = ()     # noted by the sniff (a misleading extension), reported with the file


@dataclass(frozen=True)
class Times:
    """Seconds each stage worked on a file, summed over processes (encode and write: its chunks' share of
    their batches)."""
    load: float = 0.0
    ocr: float = 0.0
    chunk: float = 0.0
    encode: float = 0.0
    write: float = 0.0

    def __add__(self, other: Times) -> Times:       # per file and part: attrgetter, not astuple's deep copies
        return Times(*map(operator.add, _times(self), _times(other)))

    def items(self) -> list[tuple[str, float]]:
        return list(zip(STAGES, _times(self)))

    @property
    def total(self) -> float:
        return sum(_times(self))

    @property
    def loader_side(self) -> float:
        """Loading, OCR and chunking: the loader and OCR workers' seconds."""
        return self.load + self.ocr + self.chunk


STAGES = tuple(f.name for f in fields(Times))
_times = operator.attrgetter(*STAGES)          # a Times' seconds as a tuple, in STAGES order


@dataclass(frozen=True)
class Outcome:
    status: str                        # ingested | empty (no text: error says why) | unchanged | skipped | failed
    error: str | None = None
    chunks: int = 0
    ocr_pages: int = 0
    warnings: tuple[str, ...] = ()
    times: Times = Times()             # per stage
    junk: int = 0                      # chunks skipped as non-language text (base64, hex, binary)
    encoded: int | None = None         # chunks the encoder embedded for it (None: an engine that does not count: all)
    reused: int = 0                    # chunks that took a vector already made (ingest/reuse.py)
    cpu_s: float = 0.0                 # ingested or empty: its loaders' and OCR's CPU seconds
    read_pages: int = 0                # ingested or empty: the pages its loaders read

    @property
    def seconds(self) -> float:
        return self.times.total

    def plus(self, **seconds: float) -> Outcome:
        """This outcome with `seconds` (per stage) added to its times."""
        return evolve(self, times=self.times + Times(**seconds))


@dataclass(frozen=True)
class Finished:
    ref: FileRef
    outcome: Outcome
    pages: tuple[PageChunks, ...] = ()  # in page order; empty unless ingested
    old_hash: str | None = None         # the manifest's hash of the version in the store
    record: bool = False                # write a manifest entry once the rows are stored
    drop: bool = False                  # remove the rows and entry of an earlier version (now skipped)
    start: int = 0                      # the file's chunk number of the first chunk here
    last: bool = True                   # the file's final part (a small file: its only one)
    card: str = ""                      # the file's card (JSON, ingest/doc_card.py), on its recorded last part

    @property
    def chunk_count(self) -> int:
        """The chunks held here (a part's, not the file's)."""
        return sum(len(p.chunks) for p in self.pages)

    def chunk_texts(self) -> Rows:
        """The store's rows of every chunk, in page order, then chunk order, with its context line (one a page),
        as columns: a page's values repeat as one object, no Row is made a chunk."""
        pages, texts, titles, headings, elements, bboxes, contexts = [], [], [], [], [], [], []
        for p in self.pages:
            title, n = p.title or "", len(p.chunks)
            pages += [p.page] * n
            texts += p.chunks
            titles += [title] * n
            headings += [p.headings] * n
            elements += [p.element] * n
            bboxes += p.bboxes or [""] * n
            contexts += [context_line(self.ref.source, title, p.headings)] * n
        return Rows((pages, texts, titles, headings, elements, bboxes, contexts))

    def token_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(every chunk's ids, one after another; tokens per chunk), both int32, in chunk_texts() order."""
        return token_ids(self.pages)


def token_ids(pages: Iterable[PageChunks]) -> tuple[np.ndarray, np.ndarray]:
    """The pages' chunks' ids, one after another, and their tokens per chunk: int32, joined once."""
    pages, empty = list(pages), np.zeros(0, dtype=np.int32)
    return np.concatenate([empty, *(p.ids for p in pages)]), np.concatenate([empty, *(p.lengths for p in pages)])
