"""The events on the local dispatcher's queue (ingest/engines/local.py): small frozen values that pool
callbacks, the encode thread, the writer and the stop handler post, and only the dispatcher reads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ingest import load, ocr
from ingest.files import Finished, Times
from ingest.sniff import Misnamed
from ingest.workers.failure import Failure


@dataclass(frozen=True)
class LoadDone:
    seq: int
    result: load.Loaded | Failure | Misnamed
    part: int = 0                   # a range task's (0: the file's first load task)

    @property
    def times(self) -> Times:
        """The seconds the worker spent (none known for a Failure, or a file it only sniffed)."""
        return self.result.times if isinstance(self.result, load.Loaded) else Times()


@dataclass(frozen=True)
class Loads:
    """A loader batch's files' results at once (ingest/load_batch.py)."""
    done: tuple[LoadDone, ...]


@dataclass(frozen=True)
class OcrPageDone:
    seq: int
    part: int
    page: int
    result: ocr.OcrDone | ocr.OcrFailed


@dataclass(frozen=True)
class PartWritten:
    """The writer holds the rows of a part of a big file (not its last)."""
    seq: int
    chunks: int


@dataclass(frozen=True)
class Accepted:
    """The writer holds all of the files' rows: their chunks no longer count as in flight."""
    files: tuple[tuple[int, int], ...]      # (seq, chunks) of each, a group's files at once


@dataclass(frozen=True)
class Written:
    files: tuple[Finished, ...]          # one commit's, in file order


@dataclass(frozen=True)
class EncodeFailed:
    error: BaseException


@dataclass(frozen=True)
class Stop:
    pass


Event = Union[LoadDone, Loads, OcrPageDone, PartWritten, Accepted, Written, EncodeFailed, Stop]
