"""The collection a run writes to: the Milvus store and its manifest, opened and locked together,
and the settings every row in it shares (model and chunking). A run with other settings is
refused unless it re-embeds, so vectors of two models never share a collection."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from ingest.chunk import ChunkSpec
from ingest.manifest import Entry, Manifest, manifest_path
from ingest.model_ref import ModelRef, resolve_model
from ingest.store import Store, StoreError


@dataclass
class Collection:
    model: ModelRef
    spec: ChunkSpec
    settings: str                  # JSON of what must match for rows to be reused
    store: Store
    manifest: Manifest
    known: dict[str, Entry]        # the manifest as the run started

    def prune(self, present: Iterable[str]) -> list[str]:
        """Delete the rows and entries of every recorded source not in `present` (store first)."""
        gone = self.gone(present)
        for source in gone:
            self.store.delete_source(source)
        if gone:
            self.store.flush()
            self.manifest.remove(gone)
        return gone

    def gone(self, present: Iterable[str]) -> list[str]:
        """Recorded sources that are not in `present`."""
        present = set(present)
        return [s for s in self.known if s not in present]

    def close(self) -> None:
        self.store.close()
        self.manifest.close()


def open_collection(cfg: dict[str, Any], reembed: bool) -> Collection:
    """Resolve the model, lock the store, open the manifest; drop both first when `reembed`,
    else refuse a collection built with another model or other chunking settings."""
    model = resolve_model(cfg["model"]["name"])
    ch = cfg["chunking"]
    spec = ChunkSpec(model.tokenizer_file, model.max_seq_length, ch["chunk_tokens"], ch["overlap_tokens"])
    settings = json.dumps({"model": model.name, "chunk_tokens": ch["chunk_tokens"],
                           "overlap_tokens": ch["overlap_tokens"], "max_seq_length": model.max_seq_length},
                          sort_keys=True)
    store = Store(cfg["store"]["uri"], cfg["store"]["collection"], cfg["store"]["timeout_s"])
    store.lock()
    manifest = Manifest(manifest_path(cfg["store"]["uri"], cfg["store"]["collection"]))
    recorded_settings = manifest.get_meta("settings")
    recorded_model = store.recorded_model()
    if reembed:
        store.drop()
        manifest.clear()
    elif recorded_model and recorded_model[0] != model.name:
        raise StoreError(f"collection {store.collection!r} holds {recorded_model[0]} vectors, not "
                         f"{model.name}; rerun with --reembed to re-embed everything, or use another --collection")
    elif recorded_settings and recorded_settings != settings:
        raise StoreError(f"model or chunking settings changed since the last run ({recorded_settings} -> "
                         f"{settings}); rerun with --reembed to re-embed everything")
    manifest.set_meta("settings", settings)
    return Collection(model, spec, settings, store, manifest, manifest.all())
