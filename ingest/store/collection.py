"""The collection a run writes to: the Milvus store and its manifest, opened and owned together,
and the settings every row in it shares (model, backend and chunking). A run with other settings
is refused unless it re-embeds, so vectors of two models or two backends never share a collection.

Ownership: a Milvus Lite file allows one process, so the run flocks it, serves it from a host
process of its own (for itself and its writer processes) and keeps the manifest in SQLite beside
it. A server is shared by machines, so the run holds a lease on the collection and keeps the
manifest in the server too (`ingest.store.server_manifest`)."""
from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Iterable

from ingest.backends import choose, model_file
from ingest.store.manifest import Entry, Manifest, SqliteManifest, manifest_path
from ingest.model_ref import ModelRef, resolve_model
from ingest.store.server_manifest import Lease, ServerManifest
from ingest.store import Store, StoreError, is_local


@dataclass
class Collection:
    model: ModelRef
    backend: str                   # "torch", "onnx", "onnx-int8" or "openvino" (never "auto")
    settings: str                  # JSON of what must match for rows to be reused
    store: Store
    manifest: Manifest
    known: dict[str, Entry]        # the manifest as the run started
    lease: Lease | None            # a server collection's lease; a Milvus Lite file is flocked instead

    def check_lease(self) -> None:
        """Raise LeaseLost (a StoreError, one line) if a server collection's lease was lost: stop the run."""
        if self.lease is not None:
            self.lease.check()

    def prune(self, present: Iterable[str], unlisted: Iterable[str] = ()) -> list[str]:
        """Delete the rows and entries of every recorded source that `gone` names (store first)."""
        gone = self.gone(present, unlisted)
        if gone:
            self.manifest.fence()
        for source in gone:
            self.store.delete_source(source)
        if gone:
            self.store.flush()
            self.manifest.remove(gone)
        return gone

    def gone(self, present: Iterable[str], unlisted: Iterable[str] = ()) -> list[str]:
        """Recorded sources that are not in `present` and not under a folder of `unlisted` (folders the
        scan could not list: what they hold is unknown, so nothing under them is gone; "." is the root)."""
        present = set(present)
        prefixes = tuple("" if d == "." else d + "/" for d in unlisted)
        return [s for s in self.known if s not in present and not s.startswith(prefixes)]

    def close(self, release: bool = True) -> None:
        """Close the manifest, give the lease or lock back, close the store. release=False leaves a
        server lease to expire (the server is not answering: releasing would only wait out timeouts)."""
        self.manifest.close()
        if self.lease is not None and release:
            self.lease.release()
        self.store.close()


def open_collection(cfg: dict[str, Any], reembed: bool) -> Collection:
    """Resolve the model, own the store (Lite: flock, SQLite manifest; server: lease, manifest in the
    server), refuse a collection of an older schema unless `reembed` (which rebuilds it), choose the
    backend ("auto": the collection's own), then empty both when `reembed`, else refuse other model,
    backend or chunking settings."""
    model = resolve_model(cfg["model"]["name"])
    ch = cfg["chunking"]
    store = Store(cfg["store"]["uri"], cfg["store"]["collection"], cfg["store"]["timeout_s"])
    with ExitStack() as undo:                  # on any error, give back what was taken
        undo.callback(store.close)
        store.lock()                           # a no-op for a server
        store.serve()                          # Lite: its server in a host process of its own (ingest.store.lite_host)
        _refuse_foreign(store, reembed)
        if not reembed and store.exists() and store.schema()[0] < Store.SCHEMA_VERSION:
            raise StoreError(store.upgrade_message())      # before the lease, the manifest or the settings check
        recorded = None if reembed else store.recorded()
        backend = choose(cfg["model"]["backend"], model, recorded[2] if recorded else None, cfg["model"]["devices"])
        if recorded and recorded[0] == model.name and recorded[2] != backend:
            raise StoreError(f"collection {store.collection!r} holds {recorded[2]} vectors, not {backend} (backend); "
                             "rerun with --reembed to re-embed everything, or use another --collection")
        model_file(model, backend)             # an ONNX backend: exported (once) and guarded, or refused now
        shared = {"model": model.name, "chunk_tokens": ch["chunk_tokens"], "overlap_tokens": ch["overlap_tokens"],
                  "max_seq_length": model.max_seq_length, "context_tokens": ch["context_tokens"],
                  "skip_junk": ch["skip_junk"]}
        if backend != "torch":                 # torch collections keep the settings they had before backends
            shared["backend"] = backend
        settings = json.dumps(shared, sort_keys=True)
        lease = None
        if is_local(store.uri):
            manifest: Manifest = SqliteManifest(manifest_path(store.uri, store.collection))
        else:
            lease = Lease.acquire(store)
            undo.callback(lease.release)
            manifest = ServerManifest(store, lease)
        undo.callback(manifest.close)
        _reset_or_match(store, manifest, model.name, settings, reembed)
        manifest.set_meta("settings", settings)
        collection = Collection(model, backend, settings, store, manifest, manifest.all(), lease)
        undo.pop_all()
        return collection


def _refuse_foreign(store: Store, reembed: bool) -> None:
    """A collection of that name without ingest's properties is someone else's data: never touch it."""
    if store.exists() and store.recorded_model() is None:
        also = "; --reembed will not drop it" if reembed else ""
        raise StoreError(f"collection {store.collection!r} in {store.uri} was not made by ingest{also}; "
                         "choose another --collection")


def _reset_or_match(store: Store, manifest: Manifest, model: str, settings: str, reembed: bool) -> None:
    """Drop the rows and clear the manifest when `reembed`, or when the store has no collection (then
    the manifest describes no rows); else refuse a collection of another model or other settings."""
    if reembed or not store.exists():
        manifest.fence()
        store.drop()
        manifest.clear()
        return
    recorded_model, recorded_settings = store.recorded_model(), manifest.get_meta("settings")
    if recorded_model and recorded_model[0] != model:
        raise StoreError(f"collection {store.collection!r} holds {recorded_model[0]} vectors, not "
                         f"{model}; rerun with --reembed to re-embed everything, or use another --collection")
    if recorded_settings and recorded_settings != settings:
        raise StoreError(f"model or chunking settings changed since the last run ({recorded_settings} -> "
                         f"{settings}); rerun with --reembed to re-embed everything")
