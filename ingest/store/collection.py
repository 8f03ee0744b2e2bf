"""The collection a run writes to: the Milvus store and its manifest, opened and owned together,
and the settings every row in it shares (model, backend and chunking). A run with other settings
is refused unless it re-embeds, so vectors of two models or two backends never share a collection.

Ownership: a Milvus Lite file allows one process, so the run flocks it, serves it from a host
process of its own (for itself and its writer processes) and keeps the manifest in SQLite beside
it. A server is shared by machines, so the run holds a lease on the collection and keeps the
manifest in the server too (`ingest.store.server_manifest`)."""
from __future__ import annotations

import hashlib
import json
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol

from ingest.backends import choose, model_file
from ingest.store.lite_folder import foreign_folder
from ingest.store.manifest import Entry, Manifest, SqliteManifest, manifest_path
from ingest.model_ref import ModelRef, resolve_model
from ingest.store.base import SCHEMA_VERSION, Lease, StoreBase, StoreError
from ingest.store.factory import open_store
from ingest.store.uri import kind

STORE_META = "store"       # manifest meta of a Lite store: its Trusted, as JSON, after a clean close
LITE_ROWS = 100_000        # rows past which a Lite store warns (docs/scale.md)
QDRANT_LOCAL_ROWS = 20_000     # ... and Qdrant's local mode (its client's own threshold)


class Closing(Protocol):
    def close(self) -> None: ...


@dataclass
class Collection:
    model: ModelRef
    backend: str                   # "torch", "onnx", "onnx-int8" or "openvino" (never "auto")
    settings: str                  # JSON of what must match for rows to be reused
    store: StoreBase
    manifest: Manifest
    known: dict[str, Entry]        # the manifest as the run started
    lease: Lease | None            # a server collection's lease; an embedded store is flocked instead
    trusted: Trusted | None = None     # a Lite store opened on its manifest's word (open_collection)
    warnings: list[str] = field(default_factory=list)     # said at the start of the run and in its report
    rebuilt: bool = False          # --reembed replaced a collection that existed
    reuse: Closing | None = None   # the run's reuse of vectors (ingest/reuse.py: `with_reuse`), closed with it

    def check_lease(self) -> None:
        """Raise LeaseLost (a StoreError, one line) if a server collection's lease was lost: stop the run."""
        if self.lease is not None:
            self.lease.check()

    def prune(self, unseen: Iterable[str], unlisted: Iterable[str] = ()) -> list[str]:
        """Delete the rows and entries of every recorded source that `gone` names (store first)."""
        gone = self.gone(unseen, unlisted)
        if gone:          # fence, delete in a few calls (not one a file), flush, remove the entries
            self.store.commit(self.manifest, dict.fromkeys(gone, ""), [], gone)
        return gone

    def gone(self, unseen: Iterable[str], unlisted: Iterable[str] = ()) -> list[str]:
        """The recorded sources of `unseen` (those no file of the scan settled as) that are not under a folder of
        `unlisted` (folders the scan could not list: what they hold is unknown, so nothing under them is
        gone; "." is the root), sorted."""
        prefixes = tuple("" if d == "." else d + "/" for d in unlisted)
        return sorted(s for s in unseen if s in self.known and not s.startswith(prefixes))

    def close(self, release: bool = True) -> None:
        """Close the manifest, give the lease or lock back, close the store. release=False leaves a
        server lease to expire (the server is not answering: releasing would only wait out timeouts), and
        a Lite store untrusted by the next run (it checks the store itself)."""
        if release and self.store.caps.embedded:
            try:
                _record_trusted(self)
            except StoreError:                 # nothing recorded: the next run checks the store itself
                pass
        if self.reuse is not None:
            self.reuse.close()
        self.manifest.close()
        if self.lease is not None and release:
            self.lease.release()
        self.store.close()


def open_collection(cfg: dict[str, Any], reembed: bool) -> Collection:
    """Resolve the model, own the store (Lite: flock, SQLite manifest; server: lease, manifest in the
    server), refuse a collection of an older schema unless `reembed` (which rebuilds it), choose the
    backend ("auto": the collection's own), then empty both when `reembed`, else refuse other model,
    backend or chunking settings. A Lite store that is provably as its manifest describes it
    (`_trusted`) is checked against the manifest alone and served only once something is written."""
    if foreign := foreign_folder(cfg["store"]["uri"]):     # a folder of documents: nothing written among them
        raise StoreError(foreign)
    model = resolve_model(cfg["model"]["name"])
    ch = cfg["chunking"]
    store = open_store(cfg["store"]["uri"], cfg["store"]["collection"], cfg["store"]["timeout_s"])
    with ExitStack() as undo:                  # on any error, give back what was taken
        undo.callback(store.close)
        store.lock()                           # a no-op for a server
        lease, manifest, trusted = None, None, None
        if store.caps.embedded:
            manifest = SqliteManifest(manifest_path(store.uri, store.collection))
            undo.callback(manifest.close)
            manifest.hold_reserve()            # room for the last record on a disk that fills (NOTE: reserve)
            trusted = None if reembed else _trusted(store, manifest)
        store.serve(lazy=trusted is not None)  # Lite: its server in a host process of its own (ingest.store.lite_host)
        if trusted is None:
            _refuse_foreign(store, reembed)
            if not reembed and store.exists() and store.schema()[0] < SCHEMA_VERSION:
                raise StoreError(store.upgrade_message())      # before the lease, the manifest or the settings check
        recorded = None if reembed else trusted.recorded if trusted else store.recorded()
        backend = choose(cfg["model"]["backend"], model, recorded[2] if recorded else None, cfg["model"]["devices"])
        if recorded and recorded[0] == model.name and recorded[2] != backend:
            raise StoreError(f"collection {store.collection!r} holds {recorded[2]} vectors, not {backend} (backend); "
                             "rerun with --reembed to re-embed everything, or use another --collection")
        if recorded and model.dim and recorded[0] == model.name and recorded[1] != model.dim:
            store.refuse_other(recorded, model.name, model.dim, backend)    # now, before any process starts
        model_file(model, backend)             # an ONNX backend: exported (once) and guarded, or refused now
        shared = {"model": model.name, "chunk_tokens": ch["chunk_tokens"], "overlap_tokens": ch["overlap_tokens"],
                  "max_seq_length": model.max_seq_length, "context_tokens": ch["context_tokens"],
                  "skip_junk": ch["skip_junk"]}
        if not ch["card_context"]:             # the default adds no key: collections made before the cards match
            shared["card_context"] = False
        if backend != "torch":                 # torch collections keep the settings they had before backends
            shared["backend"] = backend
        settings = json.dumps(shared, sort_keys=True)
        if manifest is None:
            manifest, lease = store.own()
            undo.callback(lease.release)
            undo.callback(manifest.close)
        existed = reembed and store.exists()
        _reset_or_match(store, manifest, model.name, settings, reembed, trusted)
        manifest.set_meta("settings", settings)
        if store.caps.embedded:
            manifest.set_meta(STORE_META, "")  # no trust until this run closes the store cleanly (Collection.close)
        known = manifest.all()
        collection = Collection(model, backend, settings, store, manifest, known, lease, trusted,
                                _size_warnings(store, sum(e.chunks for e in known.values())), existed)
        undo.pop_all()
        return collection


def _refuse_foreign(store: StoreBase, reembed: bool) -> None:
    """A collection of that name without ingest's properties is someone else's data: never touch it."""
    if store.exists() and store.recorded_model() is None:
        also = "; --reembed will not drop it" if reembed else ""
        raise StoreError(f"collection {store.collection!r} in {store.uri} was not made by ingest{also}; "
                         "choose another --collection")


def _reset_or_match(store: StoreBase, manifest: Manifest, model: str, settings: str, reembed: bool,
                    trusted: Trusted | None) -> None:
    """Drop the rows and clear the manifest when `reembed`, or when the store has no collection (then
    the manifest describes no rows); else refuse a collection of another model or other settings."""
    if reembed or not (trusted or store.exists()):
        manifest.fence()
        store.drop()
        manifest.clear()
        return
    recorded_model, recorded_settings = trusted.recorded[:2] if trusted else store.recorded_model(), \
        manifest.get_meta("settings")
    if recorded_model and recorded_model[0] != model:
        raise StoreError(f"collection {store.collection!r} holds {recorded_model[0]} vectors, not "
                         f"{model}; rerun with --reembed to re-embed everything, or use another --collection")
    if recorded_settings and recorded_settings != settings:
        raise StoreError(f"model or chunking settings changed since the last run ({recorded_settings} -> "
                         f"{settings}); rerun with --reembed to re-embed everything")


# -- a Lite store as its manifest describes it (reruns that change nothing never open it) ------------
@dataclass(frozen=True)
class Trusted:
    """What a clean close recorded of a Lite store's collection: its files' fingerprint and properties."""
    fingerprint: str
    recorded: tuple[str, int, str]     # (model, dim, backend), as Store.recorded
    schema: int


def fingerprint(root: Path) -> str:
    """Every file and folder of an embedded store (a folder for Milvus Lite 3 and Qdrant, a file before) by path,
    size, mtime and inode: any write, replacement or deletion changes it. "" if the store does not exist."""
    if not root.exists():
        return ""
    h = hashlib.sha256()
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        h.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return h.hexdigest()


def _trusted(store: StoreBase, manifest: SqliteManifest) -> Trusted | None:
    """The recorded Trusted if the store's fingerprint still matches it (and it is of this schema), else None."""
    try:
        t = Trusted(**json.loads(manifest.get_meta(STORE_META) or "null") or {})
    except (TypeError, ValueError):
        return None
    fresh = t.schema == SCHEMA_VERSION and t.fingerprint and t.fingerprint == fingerprint(store.local_path)
    return Trusted(t.fingerprint, tuple(t.recorded), t.schema) if fresh else None


def _record_trusted(collection: Collection) -> None:
    """At a clean close of an embedded store (a Lite host stopped): record what the next run may trust."""
    store, trusted = collection.store, collection.trusted
    if store.serving or trusted is None:
        recorded = store.recorded()
        trusted = Trusted("", recorded, store.schema()[0]) if recorded else None
    store.stop_serving()
    if trusted is not None:
        value = {"fingerprint": fingerprint(store.local_path), "recorded": list(trusted.recorded), "schema": trusted.schema}
        collection.manifest.set_meta(STORE_META, json.dumps(value))


def _size_warnings(store: StoreBase, rows: int) -> list[str]:
    """Item 7 (docs/scale.md): a Lite store past LITE_ROWS (Qdrant's local mode past QDRANT_LOCAL_ROWS), known
    from the manifest without opening it."""
    if kind(store.uri) == "qdrant-local" and rows > QDRANT_LOCAL_ROWS:
        return [f"store {store.uri} is Qdrant's local mode holding {rows:,} rows, past the {QDRANT_LOCAL_ROWS:,} "
                "it serves well (every search scans them all: docs/stores.md); use a Qdrant server "
                "(--store qdrant://host:6333) or PostgreSQL"]
    if kind(store.uri) != "milvus-lite" or rows <= LITE_ROWS:
        return []
    return [f"store {store.uri} is a Milvus Lite store holding {rows:,} rows, past the {LITE_ROWS:,} it serves well "
            "(about 7 KB of memory a row, searches slower than 0.5 s; docs/scale.md): use a Milvus server, "
            "e.g. --store http://localhost:19530 (a new collection there: rerun to ingest into it)"]
