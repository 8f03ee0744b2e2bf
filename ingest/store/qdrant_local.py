"""Qdrant's local mode (qdrant:///dir): its folder's check, and linear changed-file reruns: which points each
source holds, and one SQLite commit a call.

The local client evaluates a filter in Python over every point, and stores each point it writes or deletes in
SQLite in a transaction of its own (~15 ms a point on a disk that syncs). A filtered delete of a commit's stale
versions thus cost points x sources, and the deletes one commit a point: a changed-file rerun cost over 3x its
first ingest. Here:

- `SourceIndex` knows the point ids of every (source, file_hash) of the collection: read once by one scan, then
  kept by this process's own upserts and deletes. Local mode is one process per folder (`QdrantStore.lock`'s
  flock, and the client's own lock), and every call on the client holds the store's mutex, so no other writer
  can change the points behind it. A write that fails forgets the index and the client (the next use reopens
  the folder from SQLite and scans again).
- `one_commit` makes the SQLite writes of one call a single transaction, committed when the call returns.

NOTE (one commit): the client writes a point to SQLite before it applies it in memory, each write in
`with connection:` (a commit). Within `one_commit` the client sees a stand-in connection whose `with` does not
commit, so its writes pile up in one transaction, committed once at the end (durable when the call returns, as
before). If a write or that commit fails, the transaction is rolled back: memory may then hold writes that
SQLite does not, so the store closes its client (`QdrantStore._write`) and the next call reopens the folder
from SQLite, which holds the state before the call; the call raises (StoreError: the run stops; nothing was
recorded in the manifest for those rows, and a rerun does the work again). Without the client's
internals this needs (a collection's `storage.storage`), calls commit point by point as before.
"""
from __future__ import annotations

import os
import sqlite3
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ingest.store.errors import StoreError
from ingest.store.lite_folder import other_files

LOCAL_MARK = "meta.json"  # every Qdrant local folder has it (written on first open)
RETRIEVE_IDS = 1000       # points of one read by id


def foreign_folder(path: Path, uri: str) -> str | None:
    """The one-line refusal of a folder that holds other files and is no Qdrant local store; None if fine."""
    if not other_files(path, lambda p: (p / LOCAL_MARK).is_file()):
        return None
    return (f"store {uri} is a folder of other files, not a Qdrant local store, and ingest would write its files "
            f"among them; pass a folder that does not exist yet, such as qdrant://{path}.qdrant")


# the client's "Local mode is not recommended ... 20,000 points": the run says it once (collection._size_warnings)
warnings.filterwarnings("ignore", message="Local mode is not recommended", category=UserWarning)


class _Deferred:
    """A stand-in for the client's SQLite connection: `with` on it begins nothing and commits nothing."""

    def __init__(self, connection: sqlite3.Connection):
        self._connection = connection

    def __enter__(self) -> sqlite3.Connection:
        return self._connection

    def __exit__(self, *exc: object) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


@contextmanager
def one_commit(client: Any, collection: str) -> Iterator[None]:
    """The SQLite writes of `collection` in the `with` block as one transaction (NOTE: one commit)."""
    local = getattr(getattr(client, "_client", None), "collections", {}).get(collection)
    persistence = getattr(local, "storage", None)
    connection = getattr(persistence, "storage", None)
    if not isinstance(connection, sqlite3.Connection):
        yield                                                   # in memory, or another client: as it is
        return
    persistence.storage = _Deferred(connection)
    try:
        yield
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    finally:
        persistence.storage = connection


class SourceIndex:
    """source -> {file_hash -> point ids} of one local collection (see the module's docstring)."""

    def __init__(self, points: Sequence[tuple[str, str, str]]):
        self._by_source: dict[str, dict[str, set[str]]] = {}
        self.add(points)

    def add(self, points: Sequence[tuple[str, str, str]]) -> None:
        """Points written: (point id, source, file_hash) each (an id is of one version: it hashes both)."""
        for pid, source, file_hash in points:
            self._by_source.setdefault(source, {}).setdefault(file_hash, set()).add(pid)

    def stale(self, keep: Mapping[str, str]) -> list[str]:
        """The ids of every point of each source of `keep` but those of the version it maps to ("": all)."""
        return [pid for source, version in keep.items()
                for file_hash, ids in self._by_source.get(source, {}).items() if not version or file_hash != version
                for pid in ids]

    def ids(self, sources: Sequence[str]) -> list[str]:
        """The ids of every point of `sources`, any version."""
        return [pid for s in sources for ids in self._by_source.get(s, {}).values() for pid in ids]

    def forget(self, keep: Mapping[str, str]) -> None:
        """After `stale(keep)`'s points were deleted: drop them here too."""
        for source, version in keep.items():
            versions = self._by_source.get(source, {})
            for file_hash in [h for h in versions if not version or h != version]:
                del versions[file_hash]
            if not versions:
                self._by_source.pop(source, None)


def read_index(store: Any, collection: str) -> SourceIndex:
    """The SourceIndex of `collection` of `store` (a QdrantStore in local mode), by one scan of every point."""
    count = store.call("count the rows", "count", collection, exact=True).count
    offset, found = None, []
    while True:
        points, offset = store.call("read the sources", "scroll", collection, limit=count + 1, offset=offset,
                                    with_payload=["source", "file_hash"])
        found += [(str(p.id), (p.payload or {}).get("source"), (p.payload or {}).get("file_hash")) for p in points]
        if offset is None:
            return SourceIndex(found)


class LocalMode:
    """QdrantStore's writes and its reads by source, linear in local mode (mixed into QdrantStore, whose `local`,
    `collection`, `client`, `call`, `_classify`, `_mutex`, `_client`, `_pid` and `_sources` they use)."""
    local: bool
    collection: str
    client: Any
    _mutex: Any
    _client: Any
    _pid: int | None
    _sources: SourceIndex | None
    call: Any
    _classify: Any

    def _write(self, what: str, method: str, **kwargs: Any) -> None:
        """One write of the collection, applied when it returns; in local mode in one SQLite commit, and a failure
        closes the client and forgets the source index (NOTE: one commit)."""
        if not self.local:
            self.call(what, method, self.collection, wait=True, **kwargs)
            return
        with self._mutex:
            try:
                with one_commit(self.client, self.collection):
                    self.call(what, method, self.collection, wait=True, **kwargs)
            except Exception as exc:
                self._forget()                  # memory may hold what SQLite does not: reopen from SQLite
                raise exc if isinstance(exc, StoreError) else self._classify(what, exc) from None

    def _forget(self) -> None:
        """Close the client (this process's only) and drop the source index: the next call opens them anew."""
        with self._mutex:
            if self._client is not None and self._pid == os.getpid():
                try:
                    self._client.close()
                except Exception:
                    pass
            self._client, self._sources = None, None

    def _index(self) -> SourceIndex:
        """The points of each source, read by one scan on first use, then kept by this store's writes."""
        with self._mutex:
            if self._sources is None:
                self._sources = read_index(self, self.collection)
            return self._sources

    def _delete_by_index(self, keep: Mapping[str, str]) -> None:
        """Local mode's delete_stale: the stale versions' points by id, in one call and one SQLite commit."""
        with self._mutex:
            index = self._index()
            if ids := index.stale(keep):
                self._write("delete old rows", "delete", points_selector=ids)
            index.forget(keep)

    def _retrieve(self, sources: Sequence[str], payload: Any, vectors: Any) -> list[Any]:
        """Local mode: every point of `sources`, any version, read by id (RETRIEVE_IDS a call)."""
        ids, out = self._index().ids(sources), []
        for i in range(0, len(ids), RETRIEVE_IDS):
            out += self.call("read rows", "retrieve", self.collection, ids=ids[i:i + RETRIEVE_IDS],
                             with_payload=payload, with_vectors=vectors)
        return out
