"""`EncodePool`: the encode machinery (ingest.workers.encode) for a model by name, with its backend chosen
and its ONNX export made if needed. The public API (`ingest.api`) re-exports it; the run's encode step
(`ingest.encode`) uses it with the chunker's token ids. This module does not import torch.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ingest.backends import CHOICES as _BACKENDS, choose, model_file
from ingest.model_ref import ModelRef, resolve_model
from ingest.workers.encode import SHAPES, BatchPlan, EncodeEngine, Pretokenized, plan_devices

_DTYPES = (None, "auto", "float32", "float16", "bfloat16")
WARM_UP = ("auto", "always", "never")


class EncodePool:
    """A pool of encode workers, one per device, reused across calls; a context manager.

    devices: "auto" (every visible CUDA device, one worker each; without CUDA one CPU worker
    using all cores), or a list such as ["cuda:0", "cuda:1"] or ["cpu"] * n (n CPU workers
    splitting the cores). dtype: None/"auto" (float16 on CUDA, float32 on CPU), "float32",
    "float16" or "bfloat16". timeout_s bounds each batch from the moment a worker starts it;
    max_attempts bounds the attempts at a chunk whose worker dies or hangs. backend: "torch"
    (the reference), "onnx" (fp32, ONNX Runtime on the CPU, no torch in the workers),
    "openvino" (the same export compiled by OpenVINO: bf16 on CPUs with AMX), "onnx-int8" (int8
    weights: faster, cosine ~0.99 to torch; keep its vectors apart), "null" (no model: constant
    unit rows, to measure the rest of a pipeline), or "auto" (see ingest.backends); the exports
    are made once, guarded against torch, and cached.

    Batches: texts are sorted by length and cut into batches of at most batch_size rows and
    max_batch_tokens padded tokens. None means the device's default: 64 rows and 3,072 tokens on
    the CPU; 512 rows and 65,536 tokens on CUDA. batch_shapes: "bounded" (widths rounded up to a
    multiple of 32, a fixed row count per width: a few dozen shapes in all, as a GPU wants), "exact"
    (each batch padded to its longest row, as a CPU wants) or "auto" (bounded on CUDA or compiled).
    warm_up: "auto" (a CUDA worker runs each shape of a bounded plan once at start, so no cuDNN plan
    is built mid-run), "always" or "never". tokenizer_workers None: 1,
    or every core when the workers run on CUDA. compile: torch.compile the transformer (torch
    backend; the first batches of each shape compile). pretokenized: the caller passes
    Pretokenized groups, so tokenizer processes start only if raw texts come.
    """

    def __init__(self, model: str | ModelRef = "default", *, devices: str | Sequence[str] = "auto",
                 batch_size: int | None = None, max_batch_tokens: int | None = None, dtype: str | None = None,
                 normalize_embeddings: bool = False, tokenizer_workers: int | None = None, timeout_s: float = 300.0,
                 max_attempts: int = 3, show_progress_bar: bool = False, backend: str = "torch",
                 compile: bool = False, pretokenized: bool = False, batch_shapes: str = "auto",
                 warm_up: str = "auto"):
        for name, value in (("batch_size", batch_size), ("max_batch_tokens", max_batch_tokens),
                            ("tokenizer_workers", tokenizer_workers), ("max_attempts", max_attempts)):
            if name != "max_attempts" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(map(repr, _DTYPES))}, got {dtype!r}")
        if batch_shapes not in SHAPES:
            raise ValueError(f"batch_shapes must be one of {', '.join(map(repr, SHAPES))}, got {batch_shapes!r}")
        if warm_up not in WARM_UP:
            raise ValueError(f"warm_up must be one of {', '.join(map(repr, WARM_UP))}, got {warm_up!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, _BACKENDS))}, got {backend!r}")
        self.model = model if isinstance(model, ModelRef) else resolve_model(model)
        self.show_progress_bar = show_progress_bar
        self.normalize_embeddings = normalize_embeddings
        self.backend = choose(backend, self.model, devices=devices)
        specs = plan_devices(devices, self.model.path, None if dtype == "auto" else dtype, normalize_embeddings,
                             self.backend, model_file(self.model, self.backend), self.model.max_seq_length,
                             self.model.dim, compile, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                             batch_shapes=batch_shapes, warm_up=warm_up)
        self._engine = EncodeEngine(specs, self.model.tokenizer_file, batch_size=batch_size,
                                    max_batch_tokens=max_batch_tokens, tokenizer_workers=tokenizer_workers,
                                    timeout_s=float(timeout_s), max_attempts=max_attempts,
                                    lazy_tokenizers=pretokenized)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of `texts`, float32 (len(texts), dim), rows in input order."""
        texts = texts if isinstance(texts, (list, tuple)) else list(texts)
        [(_, rows)] = list(self._stream([(None, texts)], total=len(texts)))
        return rows

    def encode_iter(self, texts: Iterable[str]) -> Iterator[np.ndarray]:
        """One embedding row per text, in order; `texts` is read lazily, so it may be endless."""
        for _, rows in self._stream((None, (text,)) for text in texts):
            yield rows[0]

    def encode_groups(self, groups: Iterable[tuple[Any, Sequence[str] | Pretokenized]],
                      on_failed: Callable[[int, int, BaseException], None] | None = None,
                      stop: threading.Event | None = None) -> Iterator[tuple[Any, np.ndarray | None]]:
        """(key, embeddings of the group's texts, shape (len, dim)) per (key, texts), in input order.
        texts may be Pretokenized (ids made with this model's tokenizer, as the chunker does).

        `groups` is read in a background thread and may block for long stretches: what has
        arrived is encoded once the input stalls ~50 ms. An empty group yields zeros((0, dim)).
        Chunks that cannot be encoded after every retry raise EncodeError, or, given
        `on_failed(first, count, error)` (chunk indices counted over all groups), get NaN rows.
        Once `stop` is set, at most the batch a worker is running finishes: every group not fully
        encoded by then, and every group read after, comes back with None (the input is still read
        to its end, unencoded), so a stop costs at most one batch, not the windows read ahead.
        """
        return self._stream(groups, on_failed=on_failed, stop=stop)

    def _stream(self, groups: Iterable[tuple[Any, Sequence[str]]], total: int | None = None, on_failed=None,
                stop: threading.Event | None = None):
        bar = None
        if self.show_progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, unit="chunk", desc="Encoding")
        try:
            yield from self._engine.encode_groups(groups, bar.update if bar is not None else None, on_failed, stop)
        finally:
            if bar is not None:
                bar.close()

    @property
    def dim(self) -> int:
        """Embedding dimension (waits for the first worker to start)."""
        return self._engine.dim

    @property
    def batch_plan(self) -> BatchPlan:
        """Rows and padded tokens per batch, as the first worker's device decided them."""
        return self._engine.batch_plan

    @property
    def window_size(self) -> int | None:
        """Texts sorted by length and batched together (512 on a CPU, 4,096 on a GPU); None until the
        first worker is up. Never blocks."""
        return self._engine.window_size

    @property
    def startup_seconds(self) -> list[float]:
        """Seconds each worker took from launch to ready (waits for all of them)."""
        return self._engine.startup_seconds

    @property
    def stats(self) -> dict[str, Any]:
        """chunks, batches, tokenize_s, encode_s, retries, splits, worker_restarts so far."""
        return self._engine.stats

    @property
    def worker_pids(self) -> list[int]:
        return self._engine.worker_pids

    def wait_ready(self) -> EncodePool:
        """Block until every worker has started; raises EncodeError if one cannot."""
        self._engine.wait_ready()
        return self

    def close(self) -> None:
        """Stop every process of the pool. Idempotent; also runs at interpreter exit."""
        self._engine.close()

    def __enter__(self) -> EncodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
