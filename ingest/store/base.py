"""The store interface: what the run, `ingest search`, `ingest status` and the writer processes ask of a
vector store, whichever it is. A store is one module behind this interface (`ingest.store.milvus`,
`ingest.store.postgres`, `ingest.store.qdrant`, `ingest.store.lancedb`, `ingest.store.null`), chosen by its URI
scheme (`ingest.store.factory`: `open_store`, `store_at`; `ingest.store.uri`: the helpers every store uses).

What differs between stores lives in `Capabilities`, and nowhere else. The steps never ask which
store they have: they ask its capabilities.

NOTE (commit order): a commit replaces the rows of changed files and records them. The default
(`StoreBase.commit`) is store first: fence (still the owner?), delete the versions that the files
replace or abandon, flush, then record the entries in the manifest. A crash between two steps leaves
the old entry and both versions' rows, or, after the delete, the new version's alone: either way a whole
copy, and the next run redoes the file (a full disk there is met by the manifest's reserve:
ingest.store.manifest NOTE: reserve). A transactional store
(`Capabilities.transactional`: PostgreSQL) overrides `commit` to fence, delete and record in one
transaction: nothing of a commit is visible until all of it is.
"""
from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from ingest.store.errors import LeaseLost, StoreError, StoreRejected, one_line, redact  # noqa: F401 (re-exported)
from ingest.store.schema import Columns

if TYPE_CHECKING:
    from ingest.store.manifest import Entry, Manifest, Summary

MODES = ("dense", "bm25", "hybrid")
RRF_K = 60                # reciprocal-rank fusion: a hit's score is the sum of 1 / (RRF_K + its rank) over the lists
ROWS_SOURCES = 1024        # rows(sources=...): sources of one filtered read
SCHEMA_VERSION = 2        # collections of schema 1 (before titles and BM25) are Milvus only


@dataclass(frozen=True)
class Capabilities:
    """What a store can do, in one place."""
    name: str                    # for messages and the docs: "Milvus Lite", "PostgreSQL + pgvector", ...
    embedded: bool               # a file or folder on this machine, flocked by one run (else a server with a lease)
    writers: int | None          # the most writer processes at once (None: as configured)
    modes: tuple[str, ...]       # the search modes it answers (dense always)
    transactional: bool          # `commit` deletes and records in one transaction
    hosted: bool = True          # other processes of the run reach it through `endpoint()` (else the run writes
    #                              in its own process: Qdrant's local mode)
    staged: bool = False         # written rows stay unseen until `commit` publishes them with the removal of the
    #                              versions they replace, in one step (LanceDB): the run does not flush first
    shared_reads: bool = False   # an embedded store that searches read while a run holds it (LanceDB), unlocked
    parallel: bool = True        # "auto" [store] writers may give it several (else 1 unless a number is set)


@dataclass(frozen=True)
class Endpoint:
    """How another process reaches this store: `uri` as the user named it, any password redacted (for
    messages), `address` what its client connects to (the URI, or the Lite host's unix:/.../milvus.sock)."""
    uri: str
    address: str
    collection: str
    timeout_s: float


class Lease(Protocol):
    """A run's hold on a server collection (a Milvus lease row, a PostgreSQL advisory lock, ...)."""

    def check(self) -> None:
        """Raise LeaseLost if it was lost (checked without asking the server)."""

    def release(self) -> None:
        """Give it back (a failure here only lets it expire)."""


class StoreBase:
    """One collection of one store. A subclass is made with (uri, collection, timeout_s, address) and
    implements every method that raises NotImplementedError here; the others are defaults that fit a
    store without a host process. Errors are StoreError (one line; never a password) or StoreRejected."""
    caps: Capabilities
    SCHEMA_VERSION = SCHEMA_VERSION

    def __init__(self, uri: str, collection: str, timeout_s: float = 60.0, address: str | None = None):
        self.uri = redact(uri)               # for messages, reports and status: never a password
        self.collection = collection
        self.timeout_s = timeout_s
        self.address = address or uri        # what the client opens (with the password)

    @classmethod
    def at(cls, endpoint: Endpoint) -> StoreBase:
        """The store another process described with `endpoint()`."""
        store = cls(endpoint.address, endpoint.collection, endpoint.timeout_s, endpoint.address)
        store.uri = endpoint.uri
        return store

    def endpoint(self) -> Endpoint:
        return Endpoint(self.uri, self.address, self.collection, self.timeout_s)

    @property
    def local_path(self) -> Path | None:
        """An embedded store's file or folder (its manifest and lock sit beside it); None for a server."""
        return None

    # -- ownership ------------------------------------------------------------------
    def lock(self) -> None:
        """Own an embedded store exclusively for this process (a no-op for a server: see `own`)."""

    def serve(self, lazy: bool = False) -> None:
        """Start what serves an embedded store to the run's other processes (a no-op if nothing does)."""

    @property
    def serving(self) -> bool:
        return False

    def stop_serving(self) -> None:
        """Stop what `serve` started, keeping the lock."""

    def own(self) -> tuple[Manifest, Lease]:
        """A server collection: take its lease (StoreError naming the holder if another run has it) and open
        its manifest there. Embedded stores keep a SQLite manifest beside their file instead."""
        raise NotImplementedError

    def holder(self) -> str | None:
        """Who owns the collection now ("the run on host (pid n) since ..."), without taking it; None if nobody."""
        return None

    def close(self) -> None:
        """Close the client and give a lock back."""

    def reconnect(self) -> None:
        """Drop this process's client, so the next call makes a new one (a server store that went away:
        ingest.store.errors NOTE: reconnect protocol); nothing to do for an embedded store."""

    # -- collection -----------------------------------------------------------------
    def exists(self) -> bool:
        raise NotImplementedError

    def recorded(self) -> tuple[str, int, str] | None:
        """(model, dim, backend) of a collection ingest made; None if missing or not ingest's."""
        raise NotImplementedError

    def recorded_model(self) -> tuple[str, int] | None:
        recorded = self.recorded()
        return None if recorded is None else recorded[:2]

    def schema(self) -> tuple[int, bool]:
        """(schema version, has BM25) of an existing collection."""
        return SCHEMA_VERSION, "bm25" in self.caps.modes

    def upgrade_message(self) -> str:
        return (f"collection {self.collection!r} in {self.uri} was made by an older ingest; rerun with --reembed "
                "to rebuild it: nothing was changed")

    def ensure_collection(self, model: str, dim: int, backend: str) -> None:
        """Create the collection on first use; refuse one built with another model, dimension or backend."""
        raise NotImplementedError

    def refuse_other(self, recorded: tuple[str, int, str] | None, model: str, dim: int, backend: str) -> None:
        """StoreError (one line) unless `recorded`, what an existing collection holds (`recorded()`), is ingest's
        and of this model, dimension and backend: another tool's collection, or other settings', stays untouched."""
        if recorded is None:
            raise StoreError(f"collection {self.collection!r} in {self.uri} was not made by ingest; "
                             "choose another --collection")
        if recorded != (model, dim, backend):
            raise StoreError(f"collection {self.collection!r} holds {recorded[0]} vectors (dim {recorded[1]}, backend "
                             f"{recorded[2]}), not {model} (dim {dim}, backend {backend}); rerun with --reembed to "
                             "replace them, or use another --collection")

    def drop(self) -> None:
        """Drop the collection's rows and the collection (not the manifest)."""
        raise NotImplementedError

    # -- rows -----------------------------------------------------------------------
    def upsert_columns(self, columns: Columns) -> None:
        """Upsert rows by id (idempotent). Bad rows: StoreRejected; no answer: StoreError."""
        raise NotImplementedError

    def delete_stale(self, keep: Mapping[str, str]) -> None:
        """Remove every row of each source of `keep` but those of the version (file_hash) it maps to ("": all)."""
        raise NotImplementedError

    def flush(self) -> None:
        """Make what was written durable and visible to searches."""

    def finish(self) -> None:
        """At the end of a run that was not stopped: build what is best built once after a bulk load (PostgreSQL's
        HNSW index); a no-op elsewhere."""

    def commit(self, manifest: Manifest, keep: Mapping[str, str], entries: Sequence[Entry],
               removed: Sequence[str]) -> None:
        """Replace changed files' rows and record them (NOTE: commit order): fence, delete_stale(keep), flush,
        then record `entries` and remove the entries of `removed`."""
        if keep or entries or removed:
            manifest.fence()
        if keep:
            self.delete_stale(keep)
            self.flush()
        if entries:
            manifest.record(entries)
        if removed:
            manifest.remove(removed)

    def rows(self, fields: Sequence[str], sources: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """`fields` of every row (for checks on small stores), or of the rows of `sources` (any version: the reuse
        of changed files' vectors, ingest/reuse.py), in a few calls however many (ROWS_SOURCES a filter, never
        one call a source: a Milvus query scans the whole collection); "vector" as a sequence of floats."""
        raise NotImplementedError

    def search(self, vector: Sequence[float] | None, k: int, mode: str = "dense", query: str = "") -> list[dict[str, Any]]:
        """The k best chunks: by cosine to `vector` (dense), by full-text on `query` (bm25), or both fused by
        reciprocal rank (hybrid). Each hit: score, source, page (None when the format has none), chunk, text,
        title, headings, element, bbox ([x0, y0, x1, y1] or None)."""
        raise NotImplementedError

    def sources_like(self, source: str, limit: int) -> list[str]:
        """Up to `limit` distinct sources equal to `source` or ending in "/" + `source` (a few too many is fine)."""
        raise NotImplementedError

    def has_manifest(self) -> bool:
        """Whether a run of ingest opened this collection (its manifest exists): `ingest search` tells an
        empty collection from a missing one. An embedded store's is the SQLite file beside it; a server
        store answers from the server (its override)."""
        from ingest.store.manifest import manifest_path

        if not self.caps.embedded:
            raise NotImplementedError
        return manifest_path(self.uri, self.collection).exists()

    def summary(self) -> Summary | None:
        """The manifest's `Summary` (`ingest status`), None if it has none; reads only."""
        raise NotImplementedError


def hit(e: Mapping[str, Any], score: float) -> dict[str, Any]:
    """A hit as `ingest search` returns it, from a row's fields."""
    box = (e.get("bbox") or "").split(",")
    return {"score": float(score), "source": e["source"], "page": e.get("page") or None, "chunk": e["chunk"],
            "text": e["text"], "title": e.get("title") or "", "headings": e.get("headings") or "",
            "element": e.get("element") or "text", "bbox": [float(v) for v in box] if len(box) == 4 else None}


def flock(path: Path, uri: str, why: str) -> IO[str]:
    """Own the embedded store at `path` for this process: an exclusive flock on `<path>.lock` (held until the
    returned file is closed), or StoreError naming the holder. `why`: the store's reason for one process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(f"{path}.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise StoreError(f"store {uri} is in use by {holder}; wait for that run to finish ({why})") from None
    f.seek(0)
    f.truncate()
    f.write(f"ingest pid {os.getpid()}")
    f.flush()
    return f
