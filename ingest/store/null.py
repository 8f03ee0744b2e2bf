"""The null store (`null://`): takes every row and discards it. A way to measure a machine: what the
pipeline (scan, load, chunk, encode, the writer processes that build each batch's columns) does when no
store holds it back (docs/stores.md, "Measuring a machine").

    null://            (anything after the scheme is a label, shown in messages and the report)

It keeps nothing, on purpose: no rows, and a manifest in memory that lives as long as the run, so every
run ingests every file again (what a measurement wants; a file skipped as unchanged would measure nothing)
and no vector is reused from the local cache (`ingest.reuse`). It behaves as a server store to the run
(`own()` gives that manifest and a lease that cannot be lost), so nothing is written on disk but the
report. `ingest search` and `ingest eval` refuse it in one line; `ingest status` says it keeps nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ingest.store.base import Capabilities, StoreBase, StoreError

if TYPE_CHECKING:
    from ingest.store.manifest import Entry, Summary
    from ingest.store.schema import Columns

CAPS = Capabilities("the null store", embedded=False, writers=None, modes=("dense",), transactional=False)


def keeps_nothing(uri: str, what: str) -> str:
    """The one line that refuses `what` on a null store."""
    return (f"store {uri} discards every row and keeps no manifest: {what}; it is for measuring a machine "
            "(docs/stores.md): ingest into a real store, such as --store ./ingest.db")


class MemoryManifest:
    """The manifest of one run, in memory (the `Manifest` protocol): gone when the run ends."""

    def __init__(self) -> None:
        self._meta: dict[str, str] = {}
        self._files: dict[str, Entry] = {}

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self._meta[key] = value

    def all(self) -> dict[str, Entry]:
        return dict(self._files)

    def record(self, entries: Iterable[Entry]) -> None:
        self._files.update((e.source, e) for e in entries)

    def remove(self, sources: Iterable[str]) -> None:
        for s in sources:
            self._files.pop(s, None)

    def clear(self) -> None:
        self._meta.clear()
        self._files.clear()

    def close(self) -> None:
        """Nothing to close."""

    def fence(self) -> None:
        """Nothing to check: nobody else can own a collection that exists only in this run."""


class NoLease:
    """The lease of a collection that exists only in this run: never lost."""

    def check(self) -> None:
        """Never lost."""

    def release(self) -> None:
        """Nothing to give back."""


class NullStore(StoreBase):
    """Every write accepted and dropped; every read empty; search refused (module docstring)."""
    caps = CAPS

    def own(self) -> tuple[MemoryManifest, NoLease]:
        return MemoryManifest(), NoLease()

    def exists(self) -> bool:
        return False

    def recorded(self) -> tuple[str, int, str] | None:
        return None

    def ensure_collection(self, model: str, dim: int, backend: str) -> None:
        """Nothing to create."""

    def drop(self) -> None:
        """Nothing to drop."""

    def upsert_columns(self, columns: Columns) -> None:
        """Taken and discarded (the writer process built the columns: that cost is measured)."""

    def delete_stale(self, keep: Mapping[str, str]) -> None:
        """Nothing kept, nothing to delete."""

    def rows(self, fields: Sequence[str], sources: Sequence[str] | None = None) -> list[dict[str, Any]]:
        return []

    def sources_like(self, source: str, limit: int) -> list[str]:
        return []

    def search(self, vector: Sequence[float] | None, k: int, mode: str = "dense", query: str = "") -> list[dict[str, Any]]:
        raise StoreError(keeps_nothing(self.uri, "nothing to search"))

    def has_manifest(self) -> bool:
        """Asked only by a search (`ingest.search.Searcher`): refused in one line."""
        raise StoreError(keeps_nothing(self.uri, "nothing to search"))

    def summary(self) -> Summary | None:
        raise StoreError(keeps_nothing(self.uri, "no status to show (each run's report has its figures)"))
