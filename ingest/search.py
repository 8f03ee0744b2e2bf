"""`ingest search`: embed the query with the collection's own model, then a COSINE search."""
from __future__ import annotations

from typing import Any

from ingest.model_ref import resolve_model
from ingest.store import Store, StoreError


def search(uri: str, collection: str, query: str, k: int, model: str | None = None) -> list[dict[str, Any]]:
    store = Store(uri, collection)
    store.lock()
    try:
        recorded = store.recorded_model()
        if recorded is None:
            raise StoreError(f"collection {collection!r} in {uri} is empty or missing; run `ingest run FOLDER` first")
        ref = resolve_model(model or recorded[0])
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()

        vector = SentenceTransformer(ref.path, device="cpu").encode([query], normalize_embeddings=True)[0]
        return store.search(vector.tolist(), k)
    finally:
        store.close()
