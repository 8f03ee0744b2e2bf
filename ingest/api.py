"""Public API: embed texts with a fault-tolerant pool of processes that keeps a GPU fed.

    from ingest import EncodePool
    with EncodePool("default") as pool:            # starts the workers; reuse it across calls
        vectors = pool.encode(["first text", "second text"])    # float32 (2, pool.dim)

Workers load the model themselves from its local directory (never pickled), tokenizer
processes (no torch) tokenize and sort by length, and a coordinator thread streams results
back in input order, replacing workers that die or hang. This module does not import torch.
How it works, faults included: the NOTEs in workers/encode/__init__.py.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from langchain_core.embeddings import Embeddings

from ingest.encode_pool import EncodePool
from ingest.model_ref import ModelRef
from ingest.workers.encode import EncodeError, Pretokenized

__all__ = ["encode_multi_process", "EncodePool", "IngestEmbeddings", "EncodeError", "Pretokenized"]


def encode_multi_process(texts: Sequence[str], model: str | ModelRef | EncodePool = "default",
                         pool: EncodePool | None = None, *, devices: str | Sequence[str] | None = None,
                         batch_size: int | None = None, chunk_size: int | None = None,
                         normalize_embeddings: bool = False,
                         dtype: str | None = None, timeout_s: float = 300, show_progress_bar: bool = False,
                         backend: str = "torch") -> np.ndarray:
    """Embed `texts`: float32 (len(texts), dim), in input order.

    With a running EncodePool (as `model` or `pool`, like sentence-transformers'
    `encode_multi_process(texts, pool)`), that pool does the work and stays open; its own batch
    size, devices and backend apply, `normalize_embeddings=True` normalizes the result, and
    `chunk_size` is accepted and ignored (the pool streams). Else a pool is started for this call.
    """
    running = model if isinstance(model, EncodePool) else pool
    if running is not None:
        rows = running.encode(texts)
        if normalize_embeddings and not running.normalize_embeddings:
            rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        return rows
    with EncodePool(model, devices=devices or "auto", batch_size=batch_size, dtype=dtype,  # type: ignore[arg-type]
                    normalize_embeddings=normalize_embeddings, timeout_s=timeout_s,
                    show_progress_bar=show_progress_bar, backend=backend) as pool:
        return pool.encode(texts)


class IngestEmbeddings(Embeddings):
    """LangChain embeddings backed by an EncodePool, for any LangChain vector store.

    Pass a running pool (you close it), or a model name plus EncodePool keyword arguments
    (the pool is started here; call close() when done).
    """

    def __init__(self, pool_or_model: EncodePool | str | ModelRef = "default", **pool_kwargs: Any):
        if isinstance(pool_or_model, EncodePool):
            self.pool, self._owns_pool = pool_or_model, False
        else:
            self.pool, self._owns_pool = EncodePool(pool_or_model, **pool_kwargs), True

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.pool.encode(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.pool.encode([text])[0].tolist()

    def close(self) -> None:
        if self._owns_pool:
            self.pool.close()
