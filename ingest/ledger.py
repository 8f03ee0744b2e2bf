"""The ledger of a run's writes: files whose rows were all sent, committed store first, then manifest
(ingest.write NOTE: write protocol; ingest.store.base NOTE: commit order). Both engines keep one: the local
Writer (its committer thread), and the Ray engine's driver."""
from __future__ import annotations

from dataclasses import replace

from ingest.files import Finished
from ingest.store import StoreBase
from ingest.store.errors import DiskFull
from ingest.store.manifest import Entry, Manifest, record_cards, release_reserve


class Ledger:
    """Files whose rows were all sent, until the commit that records them."""

    def __init__(self, store: StoreBase, manifest: Manifest, settings: str):
        self.store, self.manifest, self.settings = store, manifest, settings
        self.files: list[Finished] = []      # every batch with their rows answered, or none sent
        self.failed: dict[str, str] = {}     # source -> error, for files failed while being written
        self.touched: set[str] = set()       # sources whose rows may be in the store, file not settled yet
        self.full: DiskFull | None = None    # the full disk a commit was done on the manifest's reserve despite

    def commit(self, files: list[Finished] | None = None) -> list[Finished]:
        """Flush the store, delete what the files (`files`, else the ledger's own, taken) replace or abandon,
        record them; the files as they end. Their batches must all be answered; other threads may add
        answers of other files meanwhile (their sources are other keys of `failed` and `touched`)."""
        self.check_room()
        if files is None:
            files, self.files = self.files, []
        if not self.store.caps.staged and any(f.ref.source in self.touched for f in files):
            self.store.flush()
        done = [self._settle(f) for f in files]
        dropped = [f.ref.source for f in done if f.drop]
        keep = {f.ref.source: f.ref.file_hash for f in done        # a changed file: only its new version
                if f.outcome.status in ("ingested", "empty") and f.old_hash and f.old_hash != f.ref.file_hash}
        keep.update((f.ref.source, f.old_hash or "") for f in done     # failed part-way: only its last good copy
                    if f.outcome.status == "failed" and f.ref.source in self.touched)
        keep.update((source, "") for source in dropped)            # dropped: nothing
        entries = [Entry(f.ref.source, f.ref.size, f.ref.mtime_ns, f.ref.file_hash, "ingested", f.outcome.chunks,
                         f.ref.fmt, self.settings) for f in done if f.record]
        # fence (ingest.write NOTE: fencing), delete in a few calls for the whole commit, flush, record: in one
        # transaction where the store has them (ingest.store.base NOTE: commit order)
        cards = {f.ref.source: f.card for f in done if f.record and f.card}
        for last in (False, True):        # a full disk part-way: once more on the reserve (manifest NOTE: reserve)
            try:
                self.store.commit(self.manifest, keep, entries, dropped)
                record_cards(self.manifest, cards)
                break
            except DiskFull as full:
                if last or not release_reserve(self.manifest):
                    raise
                self.full = full
        self.touched.difference_update(f.ref.source for f in done)
        return done

    def abandon(self) -> None:
        """The run stops before recording them (ingest.write NOTE: stops): the rows sent of files it will not
        record go, each file keeping its entry's version (a new file: none). The manifest read once, one
        commit. A staged store never shows rows it was not asked to publish: nothing to do."""
        if not self.touched or self.store.caps.staged:
            return
        known = self.manifest.all()
        self.store.commit(self.manifest, {s: known[s].file_hash if s in known else "" for s in self.touched}, [], [])
        self.touched.clear()

    def check_room(self) -> None:
        """Raise the DiskFull a commit was done despite (ingest.store.manifest NOTE: reserve): after the files of
        that commit are reported written, before any other commit."""
        if self.full is not None:
            raise self.full

    def _settle(self, file: Finished) -> Finished:
        """The file as it ends: failed if it failed while being written."""
        error = self.failed.pop(file.ref.source, None)
        if error is None:
            return file
        return replace(file, outcome=replace(file.outcome, status="failed", error=error, chunks=0, junk=0), pages=(),
                       record=False)
