"""What the dispatcher may have in flight: files loading, and chunks loaded but not yet written.

A file is dispatched while fewer than `max_loading` files are loading and fewer than
`max_chunks` chunks wait between loading and the writer (each file counts at least 1 there, so
empty, failed and skipped files are bounded too). Counting chunks, not files, matters: with a
bound of 32 files and one-page documents, the encode window being computed held every file in
flight, and the encoder idled while their successors loaded (bench/pipeline.py: ~65 ms each
1.6 s on a 2-core CPU; a GPU fed 96-chunk batches). A big file's parts count as they are ready
(`loaded`, once per part) until the writer holds them (`written`; `accepted` for the last).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ingest.files import Finished
    from ingest.load import Pages


FILES_PER_WORKER = 32      # "auto" [run] max_files_in_flight: two full batches of small files a loader worker


def files_in_flight(cfg: dict[str, Any]) -> int:
    """[run] max_files_in_flight: "auto" keeps every worker of the largest loader pool busy with batches of small
    files (ingest/load_batch.py) and one on its way, FILES_PER_WORKER a worker, at least 32."""
    setting = cfg["run"]["max_files_in_flight"]
    if setting != "auto":
        return int(setting)
    return max(32, FILES_PER_WORKER * max(int(cfg["loaders"][p]["workers"]) for p in ("txt", "pdf", "docx", "pptx")))


class InFlight:
    def __init__(self, max_loading: int):
        self.max_loading = max_loading
        self.dispatched = 0                  # files dispatched and not yet accepted by the writer
        self.chunks = 0                      # chunks of files loaded and not yet accepted
        self._loaded: dict[int, int] = {}    # file number -> its count in `chunks`

    def may_dispatch(self, max_chunks: int) -> bool:
        return self.dispatched - len(self._loaded) < self.max_loading and self.chunks < max_chunks

    def dispatch(self) -> None:
        self.dispatched += 1

    def loaded(self, seq: int, chunks: int) -> None:
        """File `seq`, or a part of it, is loaded and chunked (or settled without loading)."""
        n = chunks if seq in self._loaded else max(1, chunks)
        self._loaded[seq] = self._loaded.get(seq, 0) + n
        self.chunks += n

    def written(self, seq: int, chunks: int) -> None:
        """The writer holds the rows of a part of file `seq`, not its last."""
        if seq in self._loaded:
            n = min(chunks, self._loaded[seq])
            self._loaded[seq] -= n
            self.chunks -= n

    def accepted(self, seq: int) -> None:
        """The writer holds every row of file `seq` (the rest of its count)."""
        self.dispatched -= 1
        self.chunks -= self._loaded.pop(seq, 0)

    def of(self, seq: int) -> int:
        """File `seq`'s chunks in flight."""
        return self._loaded.get(seq, 0)

    @property
    def empty(self) -> bool:
        return self.dispatched == 0

    @staticmethod
    def most_files(max_loading: int, max_chunks: int) -> int:
        """The most files that can be in flight at once (a bound for the reorder buffer): each loaded
        file counts at least 1 chunk, and a dispatch needs fewer than max_chunks."""
        return max_loading + max_chunks


class Ranged:
    """The big files loaded by range (ingest/load.py NOTE): their ranges, loaded as the budget allows,
    and their ready parts, which wait until their file is next in order (ingest/engines/local.py NOTE)."""

    def __init__(self, in_flight: InFlight, workers: Callable[[str], int], submit: Callable[[Pages], None]):
        self.in_flight = in_flight
        self.workers = workers                               # format -> ranges of one file loading at once
        self.submit = submit                                 # load the file's next range
        self.files: dict[int, Pages] = {}                    # files with ranges still to load
        self.held: dict[int, list[Finished]] = {}            # ready parts of files not yet next

    def hand_on(self, pages: Pages, head: int, feed: Callable[[Finished], None]) -> Finished | None:
        """Feed the file's parts now ready if it is next in order (`head`), else hold them; each counts in
        flight from now. Its last part, if ready, is the caller's."""
        seq, last = pages.ref.seq, None
        for part in pages.ready():
            if part.last:
                last = part
                continue
            self.in_flight.loaded(seq, part.chunk_count)
            if seq == head:
                feed(part)
            else:
                self.held.setdefault(seq, []).append(part)
        return last

    def released(self, seq: int) -> list[Finished]:
        """File `seq` is next in order: its parts that waited."""
        return self.held.pop(seq, []) if self.held else []

    def load(self, room: int, head: int) -> None:
        """Load ranges while chunks in flight are under `room`, no file with more than its pool's workers
        loading. The file next in order (`head`) may have one range loading while its own chunks in flight are
        under `room`, whatever later files hold: they wait for it, so they must not stop it (a deadlock), and
        it must not outrun the writer either (its parts are fed, and leave the count as they are written)."""
        for seq, pages in sorted(self.files.items()):
            while pages.todo and not pages.ended and len(pages.loading) < self.workers(pages.ref.fmt) and (
                    self.in_flight.chunks < room
                    or (seq == head and not pages.loading and self.in_flight.of(seq) < room)):
                self.submit(pages)
            if not pages.todo or pages.ended:
                del self.files[seq]

    def clear(self) -> None:
        self.files.clear()
        self.held.clear()
