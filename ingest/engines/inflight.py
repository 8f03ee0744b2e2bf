"""What the dispatcher may have in flight: files loading, and chunks loaded but not yet written.

A file is dispatched while fewer than `max_loading` files are loading and fewer than
`max_chunks` chunks wait between loading and the writer (each file counts at least 1 there, so
empty, failed and skipped files are bounded too). Counting chunks, not files, matters: with a
bound of 32 files and one-page documents, the encode window being computed held every file in
flight, and the encoder idled while their successors loaded (bench/pipeline.py: ~65 ms each
1.6 s on a 2-core CPU; a GPU fed 96-chunk batches).
"""
from __future__ import annotations


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
        """File `seq` is loaded and chunked (or settled without loading)."""
        self._loaded[seq] = n = max(1, chunks)
        self.chunks += n

    def accepted(self, seq: int) -> None:
        """The writer holds every row of file `seq`."""
        self.dispatched -= 1
        self.chunks -= self._loaded.pop(seq, 0)

    @property
    def empty(self) -> bool:
        return self.dispatched == 0

    @staticmethod
    def most_files(max_loading: int, max_chunks: int) -> int:
        """The most files that can be in flight at once (a bound for the reorder buffer): each loaded
        file counts at least 1 chunk, and a dispatch needs fewer than max_chunks."""
        return max_loading + max_chunks
