"""`ingest search`: embed the query with the collection's own model and backend, then a COSINE search.

ONNX and OpenVINO collections embed the query in this process with their own export and runtime:
no torch, no sentence-transformers, so a search answers in about a second. A torch collection uses the ONNX
fp32 export when its guard passed (cosine >= 0.9999 to torch on the probe texts; exported once,
on the first search), else torch itself.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ingest.backends import BackendError, model_file
from ingest.model_ref import ModelRef, resolve_model
from ingest.store import Store, StoreError, is_local


def search(uri: str, collection: str, query: str, k: int, model: str | None = None) -> list[dict[str, Any]]:
    """The k nearest chunks to `query`. A store or collection that does not exist is a StoreError (one
    line), and nothing is created: a Milvus Lite path is checked before the store is opened."""
    if is_local(uri) and not Path(uri).exists():
        raise StoreError(f"no store at {uri}; ingest a folder into it first: ingest run FOLDER --store {uri}")
    store = Store(uri, collection)
    store.lock()
    try:
        recorded = store.recorded()
        if recorded is None and store.exists():
            raise StoreError(f"collection {collection!r} in {uri} was not made by ingest; choose another --collection")
        if recorded is None:
            raise StoreError(f"no collection {collection!r} in {uri}; ingest a folder into it first: "
                             f"ingest run FOLDER --store {uri} --collection {collection}")
        if recorded[2] == "null":
            raise StoreError(f"collection {collection!r} in {uri} holds constant vectors of the null backend (a "
                             "measurement): nothing to search; rerun with --reembed and a real backend")
        ref = resolve_model(model or recorded[0])
        return store.search(embed_query(ref, recorded[2], query).tolist(), k)
    finally:
        store.close()


def embed_query(ref: ModelRef, backend: str, query: str):
    """The normalized embedding of `query` as `backend` makes it (float32, dim)."""
    path = model_file(ref, backend) if backend != "torch" else _fp32_if_exact(ref)
    if path:
        from ingest.workers.encode.onnx_model import OnnxModel, runtime_for, tokenize

        ids, lengths = tokenize(ref.tokenizer_file, ref.max_seq_length, [query])
        model = OnnxModel(path, threads=os.cpu_count() or 1, runtime=runtime_for(backend))
        return model.embed(ids, lengths, normalize=True)[0]
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    return SentenceTransformer(ref.path, device="cpu").encode([query], normalize_embeddings=True)[0]


def _fp32_if_exact(ref: ModelRef) -> str:
    """The ONNX fp32 file standing in for torch if its guard passed, else "" (export failed: torch)."""
    try:
        return model_file(ref, "onnx")
    except BackendError:
        return ""
